// Variable-length multi-head self-attention and its backward. Each op's contract is the comment
// above its entry in PACKBERT_ATTENTION_OPS (the list's form: kernels/ops/op_list.h); the shape
// check both backends share is in packbert::checks below (each backend checks the tensors
// themselves: the CUDA one also picks its kernels by dtype).
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/layout.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// ---- attention -------------------------------------------------------------------------------
#define PACKBERT_ATTENTION_OPS(OP)                                                                 \
  /* Variable-length multi-head self-attention within each sequence of layout (never across).      \
     qkv [rows, 3H]: per row q (H) | k (H) | v (H), each head-major (head h at h*d .. h*d+d-1,     \
     d = H / num_heads). out [rows, H] = dropout(softmax(q k^T / sqrt(d))) v, head-major.          \
     Saves lse f32 [rows, num_heads]: log-sum-exp of each query row's scaled scores (only this     \
     backend's attention_backward reads it, so a backend may order it differently within the       \
     same size, e.g. [heads, rows] as FlashAttention does). Rows of no sequence get out = 0 and    \
     lse = 0. Site: attention_probs (position = query, element = key).                             \
     lowp: qkv, out (lse is f32). */                                                               \
  OP(attention_forward,                                                                            \
     (const SeqLayout& layout, const Tensor& qkv, int num_heads, const Dropout& dropout,           \
      const Tensor& out, const Tensor& lse),                                                       \
     (layout, qkv, num_heads, dropout, out, lse))                                                  \
  /* dqkv [rows, 3H] written (zero in rows of no sequence), from dout [rows, H], the forward's     \
     qkv, out and lse, and the same dropout (its mask is recomputed, never stored). Zero rows      \
     of no sequence are what keep padding out of the weight gradients in the padded layout.        \
     CPU: two min(128, max_len) x max_len score blocks per thread (about 0.5 MiB at 512), kept by  \
     the backend.                                                                                  \
     lowp: qkv, out, dout, dqkv (lse is f32). */                                                   \
  OP(attention_backward,                                                                           \
     (const SeqLayout& layout, const Tensor& qkv, const Tensor& out, const Tensor& lse,            \
      const Tensor& dout, int num_heads, const Dropout& dropout, const Tensor& dqkv),              \
     (layout, qkv, out, lse, dout, num_heads, dropout, dqkv))

}  // namespace packbert

namespace packbert::checks {

// An attention qkv row of width ld = 3 x hidden with hidden divisible by num_heads: hidden
// (Error naming the width and the heads otherwise).
inline int64_t qkv_hidden(const char* op, int64_t ld, int num_heads) {
  PB_REQUIRE(ld % 3 == 0 && num_heads >= 1 && (ld / 3) % num_heads == 0,
             "{}: qkv width {} is not 3 x hidden with hidden divisible by {} heads", op, ld,
             num_heads);
  return ld / 3;
}

}  // namespace packbert::checks
