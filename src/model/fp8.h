// FP8 training's state (BertOptions::precision = fp8; docs/fp8.md): for the four linear layers
// of every encoder layer (QKV, attention output, FFN in, FFN out), the delayed scaling of their
// inputs (E4M3) and of their output gradients (E5M2), the weights' FP8 copies (E4M3, scaled by
// the weights' current amax), and the workspace the FP8 operands of one GEMM live in. All of it
// in the backend's memory (scales and amaxes are read and written where the ops run); the host
// keeps only the count of scale updates, which says whether the scales exist yet (warm()).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/params.h"

namespace packbert {

// FP8 GEMMs take their rows in multiples of this (kernels/backend.h fp8_gemm): the model pads a
// batch's rows, and an MLP chunk's, to it.
constexpr int64_t kFp8Rows = 16;

// The recipe's knobs (train.fp8_history, train.fp8_margin; docs/fp8.md says why the defaults).
struct Fp8Recipe {
  int history = 1024;  // steps of amax history an activation or gradient scale looks back on
  int margin = 0;      // the scale is 2^margin below the largest that does not saturate
};

class Carver;  // model/arena.h

class Fp8State {
 public:
  // The linear layers of an encoder layer, in forward order.
  enum Linear { qkv = 0, attn_out = 1, ffn_in = 2, ffn_out = 3 };
  static constexpr int kLinears = 4;

  // ranks: the data-parallel world (the amax of a step is the maximum over all of them), rank:
  // this one's index.
  Fp8State(Backend& backend, const BertConfig& config, const Fp8Recipe& recipe, int ranks,
           int rank);
  // The bytes of the one buffer such a state allocates (Backend::alloc): the same carve.
  static size_t state_bytes(const BertConfig& config, const Fp8Recipe& recipe, int ranks);
  // The workspace's bytes for one GEMM's FP8 operands over `rows` rows (its backward's dout,
  // dout^T and x^T at most).
  static int64_t workspace_bytes_for(const BertConfig& config, int64_t rows);

  // An operand's scale f32 [2] = {s, 1 / s} and its step amax f32 [1] (views).
  struct Operand {
    Tensor scale, amax;
  };
  Operand input(int64_t layer, Linear j) const { return activation(layer, j, 0); }
  Operand grad(int64_t layer, Linear j) const { return activation(layer, j, 1); }
  Operand weight(int64_t layer, Linear j) const;
  // The weight's FP8 copies: w8 [out, in] (the forward's b) and w8t [in, out] (the input
  // gradient's b), e4m3.
  const Tensor& w8(int64_t layer, Linear j) const { return w8_[index(layer, j)]; }
  const Tensor& w8t(int64_t layer, Linear j) const { return w8t_[index(layer, j)]; }

  // Whether the activation and gradient scales come from an amax history yet: false until the
  // first update(). Until then the model runs the linear layers in bf16 and records the amaxes
  // (docs/fp8.md, "Step 0").
  bool warm() const { return updates_ > 0; }
  int64_t updates() const { return updates_; }

  // Casts layer l's four weight matrices (the bf16 copy the model reads) into their FP8
  // copies: the amax of each, its scale (margin applied, no history), then the cast and
  // transposed cast.
  void cast_weights(int64_t layer, const LayerWeights& weights);

  // The end of a step: this rank's amaxes shared, summed over the ranks by `sum_over_ranks`
  // (an in-place sum of an f64 buffer in the backend's memory; none on one rank), and the
  // scales updated from the histories; the amaxes start again from 0.
  void update(const std::function<void(const Tensor&)>& sum_over_ranks);

  // A workspace of at least `bytes` (grow-only, with 1/16 headroom; its address changes when it
  // grows). reserve_workspace: exactly `bytes` when it holds less (Bert::reserve).
  Tensor workspace(int64_t bytes);
  void reserve_workspace(int64_t bytes);
  size_t workspace_capacity() const { return workspace_.bytes(); }

  // The training state a checkpoint keeps: every activation and gradient operand's history
  // [n, history] and scales [n, 2], and the update count. set_state takes the same back (an
  // Error when the sizes differ: another model shape or history length).
  struct Saved {
    std::vector<float> history, scales;
    int64_t updates = 0;
  };
  Saved state() const;
  void set_state(const Saved& saved);
  int64_t operands() const { return n_act_; }
  int history() const { return recipe_.history; }
  int ranks() const { return ranks_; }

 private:
  Operand activation(int64_t layer, Linear j, int kind) const;
  // Lays the state's views out from v (measuring only when v has no base): into `into`, or
  // nowhere (nullptr).
  static void carve(Carver& v, const BertConfig& config, const Fp8Recipe& recipe, int ranks,
                    Fp8State* into);
  int64_t index(int64_t layer, Linear j) const { return layer * kLinears + j; }

  Backend& backend_;
  BertConfig config_;
  Fp8Recipe recipe_;
  int ranks_, rank_;
  int64_t n_act_, n_w_;  // operands: 2 per linear layer (input, gradient); 1 per weight
  BackendBuffer memory_;
  // Activations and gradients: amax [n], scales [n, 2], history [n, h], fp8 max [n], the
  // shared amaxes f64 [ranks, n]. Weights: the same with h = 1 and one rank.
  Tensor amax_, scales_, history_, fp8_max_, shared_;
  Tensor w_amax_, w_scales_, w_history_, w_fp8_max_, w_shared_;
  std::vector<Tensor> w8_, w8t_;
  BackendBuffer workspace_;
  int64_t updates_ = 0;
};

}  // namespace packbert
