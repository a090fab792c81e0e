// The encoder's linear layers (QKV, attention output, FFN in, FFN out of every layer): the
// backend's linear_forward / linear_backward, or under precision fp8 their FP8 form once the
// scales are warm (before that the same 16-bit ops, recording the amaxes). It owns the FP8
// state (model/fp8.h) and knows which layers' FP8 weight copies predate the master weights.
// docs/fp8.md has the recipe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/fp8.h"
#include "model/params.h"

namespace packbert {

class EncoderLinears {
 public:
  // fp8: precision fp8 (an Error when the backend cannot run it). act: the micro-batch in
  // flight, whose token_seq masks the padding rows out of the FP8 amaxes.
  EncoderLinears(Backend& backend, const BertConfig& config, bool fp8, const Fp8Recipe& recipe,
                 const StepActivations& act);

  Fp8State* fp8() const { return fp8_.get(); }
  // The data-parallel world the FP8 amaxes are shared over (a new state: it resets the scales).
  void set_data_parallel(int ranks, int rank);
  // The master weights changed: every FP8 weight copy is cast again before it is read.
  void weights_changed();
  // The end of an optimizer step: the scales updated from the step's amaxes (Fp8State::update).
  void end_step(const std::function<void(const Tensor&)>& sum_over_ranks);
  // Before layer l's first op: its FP8 weight copies cast from `weights` (the bf16 copy the
  // model reads) when they are stale and the scales warm (outside any recorded graph: a replay
  // would not cast them).
  void cast_weights(int64_t l, const LayerWeights& weights);

  // Linear j of encoder layer l, as Backend::linear_forward / linear_backward. `first`: the row
  // of x / dout within the batch (an MLP chunk's), for the padding mask.
  void forward(int64_t l, Fp8State::Linear j, int64_t first, const Tensor& x, const Tensor& w,
               const Tensor& bias, Epilogue epilogue, const Tensor& out, const Tensor& pre);
  void backward(int64_t l, Fp8State::Linear j, int64_t first, const Tensor& x, const Tensor& w,
                const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& db,
                const LinearBackwardOptions& options);

 private:
  Backend& backend_;
  BertConfig config_;
  Fp8Recipe recipe_;
  const StepActivations& act_;
  std::unique_ptr<Fp8State> fp8_;
  std::vector<char> stale_;  // per layer: its FP8 weight copies predate the masters
};

}  // namespace packbert
