// The pretraining heads over the encoder's output y = hidden[L]: the MLM head on the masked rows
// only (transform LayerNorm(gelu(y Wt^T + bt)), then the decoder tied to the word embeddings)
// and the NSP head on each sequence's [CLS] row (tanh pooler, classifier). The loss ends the
// graph, so with gradients each head's backward follows its forward at once: the decoder's
// logits become their gradient chunk by chunk (kernels/ops/losses.h mlm_loss) and are never kept.
// dy = dL/dy receives the masked rows from MLM (written: zero elsewhere) and the [CLS] rows
// from NSP (added).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/activations.h"
#include "model/parts.h"

namespace packbert {

// Called with host copies of the logits of a forward without gradients (Bert's ForwardOptions):
// MLM f32 [n, vocab_size] of the masked tokens first .. first + n - 1 (once per decoder chunk),
// NSP f32 [num_seqs, 2] once.
using MlmLogitsHook =
    std::function<void(int64_t first, const std::vector<float>& logits, int64_t n)>;
using NspLogitsHook = std::function<void(const std::vector<float>& logits, int64_t num_seqs)>;

// The heads' loss sums and correct counts: one-element device tensors (MetricSlots words).
struct HeadSums {
  Tensor loss_sum;  // f32, +=
  Tensor correct;   // i32, +=
};

class MlmHead {
 public:
  explicit MlmHead(const ModelRefs& m) : m_(m) {}
  // scale: the loss's gradient factor (GradScale's value; its device copy is grad_scales[0]).
  void forward(float scale, const HeadSums& sums, const MlmLogitsHook& hook);

 private:
  ModelRefs m_;
};

class NspHead {
 public:
  explicit NspHead(const ModelRefs& m) : m_(m) {}
  // scale: as MlmHead's (its device copy is grad_scales[1]).
  void forward(float scale, const HeadSums& sums, const NspLogitsHook& hook);

 private:
  ModelRefs m_;
};

// Both heads' buffers (the MLM transform's, the logits chunk, NSP's workspace; with gradients
// the transform's gradients).
void carve_heads(Carver& carver, const BertConfig& config, const BatchShape& shape,
                 const ActivationPlan& plan, HeadsActivations& heads);

}  // namespace packbert
