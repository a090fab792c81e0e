// The attention block of an encoder layer, post-LN (BERT's):
//   h1 = LN(x + dropout(attention(x Wqkv^T + bqkv) Wo^T + bo))
// with x = hidden[l]; or pre-LN (ModernBERT's), with the stream s (s_0 = hidden[0]):
//   s' = s + dropout(attention(x Wqkv^T + bqkv) Wo^T + bo),  h1 = LN_mlp(s')
// with x = hidden[l] = LN_attn(s) (layer 0: x = s). With rotary positions q and k are turned
// by their position in their own sequence before the attention. Attention runs over each
// sequence's own rows (SeqLayout): it never crosses a sequence boundary, whatever the layout.
#pragma once

#include <cstdint>

#include "model/activations.h"
#include "model/parts.h"

namespace packbert {

class AttentionBlock {
 public:
  explicit AttentionBlock(const ModelRefs& m) : m_(m) {}

  // hidden[l] -> layers[l].attention.h1 (pre-norm: and .ln_in, the stream).
  void forward(int64_t l);
  // dh1 = dL/dh1 -> dx = dL/d(hidden[l]): the residual share written (=), the projection's
  // added (+=); the block's parameter gradients +=. Uses the encoder scratch's dtmp, dctx and
  // dwide. Pre-norm: the residual share goes into scratch.dstream (+=, the stream's gradient),
  // dx gets the projection's (=), and layer 0 adds it to dstream instead (its input is the
  // stream).
  void backward(int64_t l, const Tensor& dh1, const Tensor& dx);

  static void carve(Carver& carver, const BertConfig& config, const BatchShape& shape,
                    const ActivationPlan& plan, AttentionSaved& saved);

 private:
  const Tensor& residual(int64_t l) const;
  bool rotary() const;  // rotary positions (BertConfig::position)
  ModelRefs m_;
};

}  // namespace packbert
