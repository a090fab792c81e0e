// The activation arena's bytes per kind (model/arena.h ActivationKind) in closed form, derived
// by hand from what the model must keep -- independent of model/activations.cpp, which carves
// the arena: test_model_mst asserts that the two agree to the byte, bench_mst prints the
// formula for models too large to run here (24-layer BERT-Large).
//
// For a batch of `rows` token rows, `s` sequences and `masked` masked tokens, every buffer
// rounded up to Carver::kAlign = 256 bytes (f below), with S = L sets of layer buffers (S = 1
// with recompute = layer), MLP chunks of c = ceil(rows / M) rows when M > 1 or recompute = mlp,
// and MLM chunks of ceil(masked / M) rows (mlm_chunk_rows when given):
//   batch        4 i32 [rows] + 3 i32 [s] + i64 [s] + 2 i32 [masked]
//   hidden       (L + 1) [rows, H] layer inputs/outputs + S x h1 [rows, H]
//   attention    S x (qkv [rows, 3H] + ctx [rows, H] + lse [rows, heads])
//   layernorm    embedding mean/rstd [rows] + S x (2 saved inputs [rows, H] + 4 stats [rows])
//   mlp          S x 2 [rows, I] (pre-GELU and GELU kept per layer), or with chunks:
//                pre, act, d(pre) [c, I] -- one chunk for the whole model
//   mlm_logits   [mlm chunk, V]
//   heads        7 [masked, H] (MLM transform forward and gradient) + 2 [masked] + NSP
//                workspace [s (4H + 2)] (the loss sums live outside the arena, in the model)
//   grad_scratch 4 [rows, H] + [rows, max(I, 3H)] (d(FFN pre) / d(qkv)), or [rows, 3H] with
//                MLP chunks (d(FFN pre) is then per chunk, in mlp)
// All f32 unless said. Forward only (gradients = false, evaluation) keeps nothing for a
// backward: S = 1 whatever the recompute mode, two [rows, H] layer inputs/outputs (alternating)
// instead of L + 1, no grad_scratch, no MLP chunk d(pre), 4 [masked, H] heads buffers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "model/arena.h"
#include "model/bert.h"
#include "model/config.h"

namespace packbert::test {

inline size_t aligned_bytes(int64_t elems, size_t elem_bytes = 4) {
  const size_t b = static_cast<size_t>(elems) * elem_bytes;
  return (b + Carver::kAlign - 1) / Carver::kAlign * Carver::kAlign;
}

inline ActivationBytes predicted_activation_bytes(const BertConfig& c, int64_t rows, int64_t s,
                                                  int64_t masked, int64_t chunks, Recompute r,
                                                  int64_t mlm_chunk_rows = 0,
                                                  bool gradients = true) {
  auto f = [](int64_t elems, size_t elem_bytes = 4) { return aligned_bytes(elems, elem_bytes); };
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t h = c.hidden, in = c.intermediate;
  const int64_t sets = r == Recompute::layer || !gradients ? 1 : c.layers;
  const int64_t ios = gradients ? c.layers + 1 : 2;  // layer inputs/outputs
  const bool mlp_chunked = chunks > 1 || r == Recompute::mlp;
  const int64_t mlp_rows = std::min(rows, ceil_div(rows, chunks));
  const int64_t mlm_rows = mlm_chunk_rows > 0 ? std::min(mlm_chunk_rows, masked)
                           : chunks > 1       ? std::min(masked, ceil_div(masked, chunks))
                                              : masked;
  ActivationBytes k{};
  auto at = [&](ActivationKind kind) -> size_t& { return k[static_cast<int>(kind)]; };
  at(ActivationKind::hidden) = ios * f(rows * h) + sets * f(rows * h);
  at(ActivationKind::attention) = sets * (f(rows * 3 * h) + f(rows * h) + f(rows * c.heads));
  at(ActivationKind::layernorm) = 2 * f(rows) + sets * (2 * f(rows * h) + 4 * f(rows));
  at(ActivationKind::mlp) =
      mlp_chunked ? (gradients ? 3 : 2) * f(mlp_rows * in) : sets * 2 * f(rows * in);
  at(ActivationKind::mlm_logits) = f(mlm_rows * c.vocab_size);
  at(ActivationKind::heads) =
      (gradients ? 7 : 4) * f(masked * h) + 2 * f(masked) + f(s * (4 * h + 2));
  at(ActivationKind::grad_scratch) =
      gradients ? 4 * f(rows * h) + f(rows * (mlp_chunked ? 3 * h : std::max(in, 3 * h))) : 0;
  return k;
}

inline size_t total_bytes(const ActivationBytes& k) {
  size_t t = 0;
  for (size_t b : k) t += b;
  return t;
}

// The MST target's measure: the MLP intermediate plus the MLM logits.
inline size_t intermediate_bytes(const ActivationBytes& k) {
  return k[static_cast<int>(ActivationKind::mlp)] + k[static_cast<int>(ActivationKind::mlm_logits)];
}

}  // namespace packbert::test
