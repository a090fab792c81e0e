// The embeddings part: hidden[0] = dropout(LayerNorm(word + position + token type)) over the
// micro-batch's rows (kernels/ops/embedding.h embedding_forward); positions are each row's position
// inside its own sequence (SeqLayout::token_pos), in every layout.
#pragma once

#include "model/activations.h"
#include "model/parts.h"

namespace packbert {

class Embeddings {
 public:
  explicit Embeddings(const ModelRefs& m) : m_(m) {}

  void forward();
  // dout = dL/d(hidden[0]) (used as scratch afterwards) -> the embedding tables' and
  // LayerNorm's gradients +=.
  void backward(const Tensor& dout);

  // What the backward reads: the LayerNorm statistics, [rows] each.
  static void carve(Carver& carver, const BatchShape& shape, EmbeddingSaved& saved);

 private:
  ModelRefs m_;
};

}  // namespace packbert
