// The pretraining heads' ops: the rows of the masked positions (gather_rows), softmax
// cross-entropy, the MLM decoder with its loss, and the pooler with the NSP loss. Each op's
// contract is the comment above its entry in PACKBERT_LOSS_OPS (the list's form:
// kernels/ops/op_list.h), its argument check is in packbert::checks below.
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/layout.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// The factor a loss's gradient is multiplied by (softmax_cross_entropy, mlm_loss, nsp_loss): the
// step's 1 / global count times the loss scale. Optional: f32 [1] in the backend's memory holding
// the factor (equal to `value` when the op is issued), read when the op runs instead of `value`,
// so that a CUDA graph captured at one step replays with the factor of the step its memory holds
// then (the model uploads it with each batch). A float converts to a factor without one.
struct GradScale {
  float value = 1.f;
  Tensor device;
  GradScale(float v = 1.f) : value(v) {}  // NOLINT: implicit, a plain factor
  GradScale(float v, const Tensor& d) : value(v), device(d) {}
};

struct PoolerParams {
  Tensor dense_w;  // [H, H]   pooler dense
  Tensor dense_b;  // [H]
  Tensor cls_w;    // [2, H]   NSP classifier
  Tensor cls_b;    // [2]
};

// Floats of the workspace nsp_loss needs.
inline int64_t nsp_workspace_elems(int64_t num_seqs, int64_t hidden) {
  return num_seqs * (4 * hidden + 2);
}

// ---- masked positions and losses -------------------------------------------------------------
#define PACKBERT_LOSS_OPS(OP)                                                                      \
  /* out[i] = x[index[i]]: x [rows, H], index i32 [M] (rows of the masked positions), out [M, H].  \
     An index of -1 is a slot of a fixed-capacity batch's masked positions that holds none: its    \
     out row is 0, and the backward adds nothing for it.                                           \
     lowp: x, out (and dout, dx of the backward). */                                               \
  OP(gather_rows, (const Tensor& x, const Tensor& index, const Tensor& out), (x, index, out))      \
  /* dx = 0, then dx[index[i]] += dout[i] in order of i. dx [rows, H] is written whole. */         \
  OP(gather_rows_backward, (const Tensor& dout, const Tensor& index, const Tensor& dx),            \
     (dout, index, dx))                                                                            \
  /* Per row: loss = logsumexp(logits) - logits[label]; correct = (first argmax == label).         \
     logits [m, V], labels i32 [m] in [0, V), or -1: a row that is left out (no loss, never        \
     correct, its dlogits 0; a fixed-capacity batch's unused masked slot). loss_sum f32 [1] += sum \
     of row losses (unscaled); num_correct i32 [1] += correct rows. dlogits [m, V] (optional, may  \
     alias logits) = (softmax - onehot(label)) * grad_scale.                                       \
     lowp: logits, dlogits (loss_sum is f32). */                                                   \
  OP(softmax_cross_entropy,                                                                        \
     (const Tensor& logits, const Tensor& labels, const GradScale& grad_scale,                     \
      const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dlogits),                   \
     (logits, labels, grad_scale, loss_sum, num_correct, dlogits))                                 \
  /* The MLM decoder and loss over a chunk of m masked tokens, forward and backward at once (the   \
     loss is the graph's end, so the logits never outlive the chunk -- the MST feature calls it    \
     per chunk). logits = x w^T + b with x [m, H] (the transform's output), w [V, H] (tied word    \
     embeddings), b [V]; logits_ws [m, V] is the workspace. loss_sum, num_correct as above;        \
     grad_scale = 1 / global masked-token count; a label of -1 leaves its row out (as in           \
     softmax_cross_entropy). If dx [m, H] is given: dx written, dw += and                          \
     db += (both optional); if dx is none, forward only.                                           \
     lowp: x, w, dx; b, logits_ws, dw, db are f32 (the logits never leave fp32; CUDA rounds        \
     their gradient to the operands' type for the two backward GEMMs, the CPU does not). */        \
  OP(mlm_loss,                                                                                     \
     (const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,                     \
      const GradScale& grad_scale, const Tensor& logits_ws, const Tensor& loss_sum,                \
      const Tensor& num_correct, const Tensor& dx, const Tensor& dw, const Tensor& db),            \
     (x, w, b, labels, grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db))                  \
  /* Pooler + NSP over each sequence's first token: pooled = tanh(x[cls] Wp^T + bp),               \
     logits = pooled Wc^T + bc, cross-entropy with labels i32 [num_seqs] in {0, 1}.                \
     x [rows, H]; loss_sum, num_correct accumulate as above; grad_scale = 1 / global sample        \
     count. An empty slot (seq_len 0) is left out: no loss, not counted, no gradient, its label    \
     not read. workspace f32 [nsp_workspace_elems(num_seqs, H)]; when dx is none the logits        \
     f32 [num_seqs, 2] are left at workspace offset 4 * num_seqs * H (read by evaluation           \
     hooks; with dx that memory holds their gradient). If dx [rows, H] is given, the               \
     gradient is ADDED into dx's [CLS] rows (after gather_rows_backward wrote dx) and the          \
     defined tensors of grads accumulate (+=).                                                     \
     lowp: x, dx, params.dense_w, params.cls_w; the biases, workspace and grads are f32. */        \
  OP(nsp_loss,                                                                                     \
     (const SeqLayout& layout, const Tensor& x, const PoolerParams& params, const Tensor& labels,  \
      const GradScale& grad_scale, const Tensor& workspace, const Tensor& loss_sum,                \
      const Tensor& num_correct, const Tensor& dx, const PoolerParams& grads),                     \
     (layout, x, params, labels, grad_scale, workspace, loss_sum, num_correct, dx, grads))

}  // namespace packbert

namespace packbert::checks {

// gather_rows (out = x[index]) and its backward (dx from dout): x / dx [rows, h], index i32 [m],
// out / dout [m, h]. `table` names x or dx, `rows_out` out or dout.
struct GatherDims {
  int64_t rows = 0, h = 0, m = 0;
};

inline GatherDims gather_rows_args(const OpArgs& a, const char* table_name, const Tensor& table,
                                   const Tensor& index, const char* rows_name,
                                   const Tensor& rows_out) {
  a(table_name, table, DType::f32, {kAnyDim, kAnyDim});
  const int64_t rows = table.dim(0), h = table.dim(1);
  a("index", index, DType::i32, {kAnyDim});
  const int64_t m = index.dim(0);
  a(rows_name, rows_out, DType::f32, {m, h});
  return {rows, h, m};
}

// logits [m, v], labels [m], loss_sum f32 [1], num_correct i32 [1], dlogits [m, v] optional.
struct SoftmaxDims {
  int64_t m = 0, v = 0;
};

inline SoftmaxDims softmax_cross_entropy_args(const OpArgs& a, const Tensor& logits,
                                              const Tensor& labels, const GradScale& grad_scale,
                                              const Tensor& loss_sum, const Tensor& num_correct,
                                              const Tensor& dlogits) {
  a.optional("grad_scale.device", grad_scale.device, DType::f32, {1});
  a("logits", logits, DType::f32, {kAnyDim, kAnyDim});
  const int64_t m = logits.dim(0), v = logits.dim(1);
  a("labels", labels, DType::i32, {m});
  a("loss_sum", loss_sum, DType::f32, {1});
  a("num_correct", num_correct, DType::i32, {1});
  a.optional("dlogits", dlogits, DType::f32, {m, v});
  PB_REQUIRE(v >= 1, "{}: {} classes", a.op, v);
  return {m, v};
}

// mlm_loss's shapes beyond the ops it is made of: x [m, h], w [v, h], logits_ws [m, v]; dw and
// db only with dx. (The ops check the rest: b, labels, loss_sum, num_correct, dx, dw, db.)
struct MlmDims {
  int64_t m = 0, h = 0, v = 0;
};

inline MlmDims mlm_loss_args(const OpArgs& a, const Tensor& x, const Tensor& w,
                             const Tensor& logits_ws, const Tensor& dx, const Tensor& dw,
                             const Tensor& db) {
  a("x", x, DType::f32, {kAnyDim, kAnyDim});
  a("w", w, DType::f32, {kAnyDim, x.dim(1)});
  const int64_t m = x.dim(0), v = w.dim(0);
  a("logits_ws", logits_ws, DType::f32, {m, v});
  PB_REQUIRE(dx.defined() || (!dw.defined() && !db.defined()),
             "{}: dw / db without dx (forward-only calls pass none for all three)", a.op);
  return {m, x.dim(1), v};
}

// nsp_loss: x [rows, h] with rows = layout.rows; returns h and the sequence count.
struct NspDims {
  int64_t h = 0, s = 0;
};

inline NspDims nsp_loss_args(const OpArgs& a, const SeqLayout& layout, const Tensor& x,
                             const PoolerParams& params, const Tensor& labels,
                             const Tensor& workspace, const Tensor& dx, const PoolerParams& grads) {
  a("x", x, DType::f32, {layout.rows, kAnyDim});
  const int64_t h = x.dim(1), s = layout.num_seqs;
  a("labels", labels, DType::i32, {s});
  a("params.dense_w", params.dense_w, DType::f32, {h, h});
  a("params.dense_b", params.dense_b, DType::f32, {h});
  a("params.cls_w", params.cls_w, DType::f32, {2, h});
  a("params.cls_b", params.cls_b, DType::f32, {2});
  a("workspace", workspace, DType::f32, {nsp_workspace_elems(s, h)});
  a.optional("dx", dx, DType::f32, {layout.rows, h});
  PB_REQUIRE(dx.defined() || (!grads.dense_w.defined() && !grads.dense_b.defined() &&
                              !grads.cls_w.defined() && !grads.cls_b.defined()),
             "{}: parameter gradients without dx", a.op);
  return {h, s};
}

}  // namespace packbert::checks
