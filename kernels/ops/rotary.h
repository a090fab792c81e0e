// Rotary position embeddings (RoPE, as ModernBERT-class encoders use them): the q and k of every
// attention head rotated by their token's position, in place in the qkv buffer. The op's
// contract is the comment above its entry in PACKBERT_ROTARY_OPS (the list's form:
// kernels/ops/op_list.h), its argument check is in packbert::checks below; the rotation's
// arithmetic, which both backends share, is kernels/common/rotary_math.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/layout.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// ---- rotary position embeddings --------------------------------------------------------------
#define PACKBERT_ROTARY_OPS(OP)                                                                    \
  /* In place on the q and k parts of qkv [rows, 3H] (per row q (H) | k (H) | v (H), each          \
     head-major: head h at h*d .. h*d+d-1, d = H / num_heads, d even); v is untouched, and so are  \
     the rows of no sequence (layout.token_seq = -1). Hugging Face's rotate-half form              \
     (apply_rotary_pos_emb, ModernBERT): for a row at position p (layout.token_pos, restarting at  \
     0 in every sequence) and i in [0, d/2), with a = p * theta^(-2i/d), every head of q and of k  \
     has its pair (x_i, x_{i+d/2}) replaced by                                                     \
       (x_i cos a - x_{i+d/2} sin a,  x_{i+d/2} cos a + x_i sin a).                                \
     inverse = true rotates by -a: the backward, applied in place to the gradient dqkv (a          \
     rotation's transpose is its inverse). theta^(-2i/d) and a are computed in double and cos a,   \
     sin a rounded once to float, once per (row, i), for all heads and both of q and k; each       \
     output is then two products and a sum in fp32. Any position an i32 holds (no table sized by   \
     a longest sequence). theta > 0, finite (10000: RoFormer, Llama; 160000: ModernBERT's global   \
     layers).                                                                                      \
     lowp: qkv (read, rotated in fp32, rounded once). */                                           \
  OP(rotary_embedding,                                                                             \
     (const SeqLayout& layout, const Tensor& qkv, int num_heads, float theta, bool inverse),       \
     (layout, qkv, num_heads, theta, inverse))

}  // namespace packbert

namespace packbert::checks {

// rotary_embedding: qkv [rows, 3 * hidden], hidden = num_heads * head_dim, head_dim even.
struct RotaryDims {
  int64_t rows = 0, hidden = 0, head_dim = 0;
};

inline RotaryDims rotary_embedding_args(const OpArgs& a, const Tensor& qkv, int num_heads,
                                        float theta) {
  PB_REQUIRE(qkv.defined() &&
                 (qkv.dtype == DType::f32 || qkv.dtype == DType::bf16 || qkv.dtype == DType::f16),
             "{}: qkv is {}, expected f32, bf16 or f16", a.op, qkv.str());
  a("qkv", qkv, qkv.dtype, {kAnyDim, kAnyDim});
  const int64_t ld = qkv.dim(1);
  PB_REQUIRE(num_heads >= 1 && ld % 3 == 0 && (ld / 3) % num_heads == 0,
             "{}: qkv width {} is not 3 x hidden with hidden divisible by {} heads", a.op, ld,
             num_heads);
  const int64_t hidden = ld / 3, d = hidden / num_heads;
  PB_REQUIRE(d % 2 == 0,
             "{}: head dim {} (hidden {} / {} heads) is odd: rotate-half pairs x_i "
             "with x_(i + d/2)",
             a.op, d, hidden, num_heads);
  PB_REQUIRE(std::isfinite(theta) && theta > 0.f, "{}: theta {} is not a positive finite base",
             a.op, theta);
  return {qkv.dim(0), hidden, d};
}

}  // namespace packbert::checks
