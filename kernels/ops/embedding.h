// The embedding ops: word + position + token type embeddings, LayerNorm and dropout, and their
// gradients. Each op's contract is the comment above its entry in PACKBERT_EMBEDDING_OPS (the
// list's form: kernels/ops/op_list.h), its argument check is in packbert::checks below.
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/layernorm.h"
#include "kernels/ops/layout.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// The tables and the LayerNorm. position, token_type and ln_beta may be none: a model with
// rotary positions, without token types, or whose norms have no bias adds nothing for them.
struct EmbeddingParams {
  Tensor word;                   // [vocab, H]
  Tensor position;               // [max_positions, H] or none
  Tensor token_type;             // [type_vocab, H] or none
  Tensor ln_gamma;               // [H]
  Tensor ln_beta;                // [H] or none
  float ln_eps = kLayerNormEps;  // unused as gradients
};

// ---- embeddings ------------------------------------------------------------------------------
#define PACKBERT_EMBEDDING_OPS(OP)                                                                 \
  /* out = dropout(LayerNorm(word[input_ids] + position[token_pos] + token_type[segment_ids])),    \
     the tables that are given, LayerNorm with ln_eps (and ln_beta when given).                    \
     input_ids, segment_ids: i32 [rows] (padding rows: any valid id, e.g. 0; segment_ids unread    \
     without token_type, and then may be none). out: [rows, H].                                    \
     Saves ln_mean, ln_rstd: f32 [rows] (the sum is re-gathered in backward). Site: embedding.     \
     lowp: out; word, position, token_type (the model passes its 16-bit tables). */                \
  OP(embedding_forward,                                                                            \
     (const SeqLayout& layout, const Tensor& input_ids, const Tensor& segment_ids,                 \
      const EmbeddingParams& params, const Dropout& dropout, const Tensor& out,                    \
      const Tensor& ln_mean, const Tensor& ln_rstd),                                               \
     (layout, input_ids, segment_ids, params, dropout, out, ln_mean, ln_rstd))                     \
  /* Gradients += for all five tensors of grads (each may be none). dout [rows, H] is used as      \
     scratch and overwritten. Padding rows add nothing. Scatter-adds in a fixed row order.         \
     lowp: dout; word, position, token_type. The gradients are f32. */                             \
  OP(embedding_backward,                                                                           \
     (const SeqLayout& layout, const Tensor& input_ids, const Tensor& segment_ids,                 \
      const EmbeddingParams& params, const Dropout& dropout, const Tensor& ln_mean,                \
      const Tensor& ln_rstd, const Tensor& dout, const EmbeddingParams& grads),                    \
     (layout, input_ids, segment_ids, params, dropout, ln_mean, ln_rstd, dout, grads))

}  // namespace packbert

namespace packbert::checks {

struct EmbeddingDims {
  int64_t rows = 0, vocab = 0, h = 0;
};

inline EmbeddingDims embedding_forward_args(const OpArgs& a, const SeqLayout& layout,
                                            const Tensor& input_ids, const Tensor& segment_ids,
                                            const EmbeddingParams& p, const Tensor& out,
                                            const Tensor& ln_mean, const Tensor& ln_rstd) {
  const int64_t rows = layout.rows;
  a("word", p.word, DType::f32, {kAnyDim, kAnyDim});
  const int64_t vocab = p.word.dim(0), h = p.word.dim(1);
  a.optional("position", p.position, DType::f32, {kAnyDim, h});
  a.optional("token_type", p.token_type, DType::f32, {kAnyDim, h});
  a("ln_gamma", p.ln_gamma, DType::f32, {h});
  a.optional("ln_beta", p.ln_beta, DType::f32, {h});
  layernorm_eps(a.op, p.ln_eps);
  a("input_ids", input_ids, DType::i32, {rows});
  if (p.token_type.defined()) a("segment_ids", segment_ids, DType::i32, {rows});
  a("out", out, DType::f32, {rows, h});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  return {rows, vocab, h};
}

inline RowDims embedding_backward_args(const OpArgs& a, const SeqLayout& layout,
                                       const Tensor& input_ids, const Tensor& segment_ids,
                                       const EmbeddingParams& p, const Tensor& ln_mean,
                                       const Tensor& ln_rstd, const Tensor& dout,
                                       const EmbeddingParams& grads) {
  const int64_t rows = layout.rows;
  a("word", p.word, DType::f32, {kAnyDim, kAnyDim});
  const int64_t h = p.word.dim(1);
  a.optional("position", p.position, DType::f32, {kAnyDim, h});
  a.optional("token_type", p.token_type, DType::f32, {kAnyDim, h});
  a("ln_gamma", p.ln_gamma, DType::f32, {h});
  a("input_ids", input_ids, DType::i32, {rows});
  if (p.token_type.defined()) a("segment_ids", segment_ids, DType::i32, {rows});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  a("dout", dout, DType::f32, {rows, h});
  a.optional("grads.word", grads.word, DType::f32, {p.word.dim(0), h});
  PB_REQUIRE((p.position.defined() || !grads.position.defined()) &&
                 (p.token_type.defined() || !grads.token_type.defined()) &&
                 (p.ln_beta.defined() || !grads.ln_beta.defined()),
             "{}: a gradient is given for a table or LayerNorm bias the model does not have", a.op);
  if (grads.position.defined())
    a("grads.position", grads.position, DType::f32, {p.position.dim(0), h});
  if (grads.token_type.defined())
    a("grads.token_type", grads.token_type, DType::f32, {p.token_type.dim(0), h});
  a.optional("grads.ln_gamma", grads.ln_gamma, DType::f32, {h});
  a.optional("grads.ln_beta", grads.ln_beta, DType::f32, {h});
  return {rows, h};
}

}  // namespace packbert::checks
