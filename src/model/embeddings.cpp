#include "model/embeddings.h"

namespace packbert {

void Embeddings::forward() {
  StepActivations& a = m_.act;
  m_.backend.embedding_forward(a.layout, a.input_ids, a.segment_ids, m_.weights.embeddings,
                               m_.dropout(DropoutSite::embedding, 0), a.hidden[0],
                               a.embedding.ln_mean, a.embedding.ln_rstd);
}

void Embeddings::backward(const Tensor& dout) {
  const StepActivations& a = m_.act;
  m_.backend.embedding_backward(a.layout, a.input_ids, a.segment_ids, m_.weights.embeddings,
                                m_.dropout(DropoutSite::embedding, 0), a.embedding.ln_mean,
                                a.embedding.ln_rstd, dout, m_.grads.embeddings);
}

void Embeddings::carve(Carver& c, const BatchShape& shape, EmbeddingSaved& saved) {
  saved.ln_mean = c.take(ActivationKind::layernorm, DType::f32, {shape.rows});
  saved.ln_rstd = c.take(ActivationKind::layernorm, DType::f32, {shape.rows});
}

}  // namespace packbert
