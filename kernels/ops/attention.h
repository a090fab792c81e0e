// Variable-length multi-head self-attention and its backward. Each op's contract is the comment
// above its entry in PACKBERT_ATTENTION_OPS (the list's form: kernels/ops/op_list.h); the shape
// check both backends share is in packbert::checks below (each backend checks the tensors
// themselves: the CUDA one also picks its kernels by dtype).
#pragma once

#include <algorithm>
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
     window: 0 is global attention (every key of the query's sequence); w > 0 is local attention,  \
     query i of a sequence attends key j of the same sequence only when |i - j| <= w / 2 (integer  \
     division: w = 1 attends the query's own key only, w = 128 the 64 keys on either side), i and  \
     j positions inside the sequence; a window that reaches past the sequence's ends or is wider   \
     than it takes the keys the sequence has. Negative: an Error (checks::attention_half_window).  \
     Work grows with len x min(len, w) per sequence, not len^2. Window 0 gives the same bits as    \
     any window with w / 2 >= max_len - 1.                                                         \
     Saves lse f32 [rows, num_heads]: log-sum-exp of each query row's scaled scores over the keys  \
     it attends (only this backend's attention_backward reads it, so a backend may order it        \
     differently within the same size, e.g. [heads, rows] as FlashAttention does). Rows of no      \
     sequence get out = 0 and lse = 0. Site: attention_probs (position = query, element = key:     \
     the window leaves every kept element's mask as it is).                                        \
     Limits: head dim d any on the CPU; 1..64 on CUDA (bf16 / f16 with d = 64 on tensor cores,     \
     other 16-bit shapes widened onto the fp32 kernels), num_heads <= 65535 there; with dropout    \
     num_heads <= 256 and sequences up to 2^20 tokens (the dropout key's ranges), without it up    \
     to 2^29 (the CPU's BLAS int range). Tested up to 8192 tokens.                                 \
     lowp: qkv, out (lse is f32). */                                                               \
  OP(attention_forward,                                                                            \
     (const SeqLayout& layout, const Tensor& qkv, int num_heads, int64_t window,                   \
      const Dropout& dropout, const Tensor& out, const Tensor& lse),                               \
     (layout, qkv, num_heads, window, dropout, out, lse))                                          \
  /* dqkv [rows, 3H] written (zero in rows of no sequence), from dout [rows, H], the forward's     \
     qkv, out and lse, and the same window and dropout (its mask is recomputed, never stored).     \
     Zero rows of no sequence are what keep padding out of the weight gradients in the padded      \
     layout.                                                                                       \
     CPU: two min(128, max_len) x min(max_len, 128 + 2 (w / 2)) score blocks per thread (w = 0:    \
     max_len; 0.5 MiB at 512 global, 8 MiB at 8192 global, 0.25 MiB at w = 128), kept by the       \
     backend.                                                                                      \
     lowp: qkv, out, dout, dqkv (lse is f32). */                                                   \
  OP(attention_backward,                                                                           \
     (const SeqLayout& layout, const Tensor& qkv, const Tensor& out, const Tensor& lse,            \
      const Tensor& dout, int num_heads, int64_t window, const Dropout& dropout,                   \
      const Tensor& dqkv),                                                                         \
     (layout, qkv, out, lse, dout, num_heads, window, dropout, dqkv))

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

// The half-width of an attention window (kernels/ops/attention.h): query i attends key j of its
// sequence when |i - j| <= half. window > 0: min(window / 2, max_len); window 0 (global):
// max_len, which every pair of positions of a sequence is within. An Error naming the window
// when it is negative.
inline int32_t attention_half_window(const char* op, int64_t window, int32_t max_len) {
  PB_REQUIRE(window >= 0,
             "{}: attention window {} is negative (0: global; w > 0: local, keys "
             "within w / 2 positions of the query)",
             op, window);
  const int64_t m = max_len > 0 ? max_len : 0;
  return static_cast<int32_t>(window == 0 ? m : std::min<int64_t>(window / 2, m));
}

}  // namespace packbert::checks
