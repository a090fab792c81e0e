// The heads: masked-position gather, softmax cross-entropy, the MLM decoder loss and the
// pooler + NSP loss. The two losses run forward and backward in one call because the loss is
// the end of the graph: nothing of the head has to outlive the call.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/mlm_loss_by_ops.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_lowp.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/ops/losses.h"

namespace packbert {

using cpu::exp_shifted_sum;
using cpu::expect;
using cpu::expect_optional;
using cpu::row_max;

namespace {
// The row indices of a gather, each checked to lie in [0, rows) or be -1 (an unused slot).
const int32_t* checked_row_index(const char* op, const Tensor& index, int64_t rows) {
  const int32_t* idx = index.ptr<int32_t>();
  checks::check_indices(op, "index", idx, index.dim(0), rows, true);
  return idx;
}

// The factor a loss gradient is multiplied by: the device copy when there is one (CPU memory).
float grad_scale_of(const GradScale& g) {
  return g.device.defined() ? g.device.ptr<float>()[0] : g.value;
}
}  // namespace

void CpuBackend::gather_rows(const Tensor& x, const Tensor& index, const Tensor& out) {
  if (lowp::any({&x, &out})) return lowp::gather_rows(*this, lowp_, x, index, out);
  const char* op = "gather_rows";
  const auto [rows, h, m] =
      checks::gather_rows_args(checks::OpArgs(op, Device::cpu), "x", x, index, "out", out);
  const int32_t* idx = checked_row_index(op, index, rows);
  const float* src = x.ptr<float>();
  float* dst = out.ptr<float>();
#pragma omp parallel for schedule(static) if (m * h >= 16384)
  for (int64_t i = 0; i < m; ++i) {
    if (idx[i] < 0)
      std::fill(dst + i * h, dst + (i + 1) * h, 0.f);
    else
      std::copy(src + idx[i] * h, src + (idx[i] + 1) * h, dst + i * h);
  }
}

void CpuBackend::gather_rows_backward(const Tensor& dout, const Tensor& index, const Tensor& dx) {
  if (lowp::any({&dout, &dx})) return lowp::gather_rows_backward(*this, lowp_, dout, index, dx);
  const char* op = "gather_rows_backward";
  const auto [rows, h, m] =
      checks::gather_rows_args(checks::OpArgs(op, Device::cpu), "dx", dx, index, "dout", dout);
  const int32_t* idx = checked_row_index(op, index, rows);
  zero(dx);
  const float* src = dout.ptr<float>();
  float* dst = dx.ptr<float>();
  // In order of i, so repeated indices add up in a fixed order (masked positions are unique in
  // BERT, but the contract does not need them to be).
  for (int64_t i = 0; i < m; ++i) {
    if (idx[i] < 0) continue;  // an unused slot
    float* d = dst + idx[i] * h;
    const float* s = src + i * h;
#pragma omp simd
    for (int64_t c = 0; c < h; ++c) d[c] += s[c];
  }
}

void CpuBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& labels,
                                       const GradScale& grad_scale, const Tensor& loss_sum,
                                       const Tensor& num_correct, const Tensor& dlogits) {
  if (lowp::any({&logits, &loss_sum, &dlogits}))
    return lowp::softmax_cross_entropy(*this, lowp_, logits, labels, grad_scale, loss_sum,
                                       num_correct, dlogits);
  const char* op = "softmax_cross_entropy";
  const auto [m, v] = checks::softmax_cross_entropy_args(
      checks::OpArgs(op, Device::cpu), logits, labels, grad_scale, loss_sum, num_correct, dlogits);
  const int32_t* lab = labels.ptr<int32_t>();
  checks::check_indices(op, "labels", lab, m, v, true);
  const float scale = grad_scale_of(grad_scale);

  const float* z = logits.ptr<float>();
  float* dz = dlogits.defined() ? dlogits.ptr<float>() : nullptr;
  double* row_loss = reduction_scratch(2 * static_cast<size_t>(m));
  double* row_correct = row_loss + m;
  // Per row: the max (vectorised), the first index holding it, then one pass of float exp
  // (cpu_simd.h, about 1 ulp) summed in double, written to dlogits when wanted and scaled there.
#pragma omp parallel for schedule(static) if (m * v >= 16384)
  for (int64_t i = 0; i < m; ++i) {
    if (lab[i] < 0) {  // a row left out
      row_loss[i] = row_correct[i] = 0.0;
      if (dz) std::fill(dz + i * v, dz + (i + 1) * v, 0.f);
      continue;
    }
    const float* zi = z + i * v;
    const float mx = row_max(zi, v);
    int64_t argmax = 0;
    while (argmax < v && !(zi[argmax] == mx)) ++argmax;  // first maximum wins ties
    if (argmax == v) {                                   // NaN in the row: the scalar rule
      argmax = 0;
      for (int64_t c = 1; c < v; ++c)
        if (zi[c] > zi[argmax]) argmax = c;
    }
    const float z_label = zi[lab[i]];  // before dlogits (which may alias logits) is written
    float* di = dz ? dz + i * v : nullptr;
    const double sum = exp_shifted_sum(zi, mx, v, di);
    const double lse = mx + std::log(sum);
    row_loss[i] = lse - z_label;
    row_correct[i] = argmax == lab[i] ? 1.0 : 0.0;
    if (di) {  // di = exp(z - mx) now: (softmax - onehot) * grad_scale
      const auto f = static_cast<float>(scale / sum);
      for (int64_t c = 0; c < v; ++c) di[c] *= f;
      di[lab[i]] -= scale;
    }
  }
  double total = 0.0, correct = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    total += row_loss[i];
    correct += row_correct[i];
  }
  loss_sum.ptr<float>()[0] += static_cast<float>(total);
  num_correct.ptr<int32_t>()[0] += static_cast<int32_t>(correct);
}

void CpuBackend::mlm_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                          const GradScale& grad_scale, const Tensor& logits_ws,
                          const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                          const Tensor& dw, const Tensor& db) {
  if (lowp::any({&x, &w, &b, &logits_ws, &loss_sum, &dx, &dw, &db}))
    return lowp::mlm_loss(*this, lowp_, x, w, b, labels, grad_scale, logits_ws, loss_sum,
                          num_correct, dx, dw, db);
  checks::mlm_loss_by_ops(*this, checks::OpArgs("mlm_loss", Device::cpu), x, w, b, labels,
                          grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db);
}

void CpuBackend::nsp_loss(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                          const Tensor& labels, const GradScale& grad_scale,
                          const Tensor& workspace, const Tensor& loss_sum,
                          const Tensor& num_correct, const Tensor& dx, const PoolerParams& grads) {
  if (lowp::any({&x, &params.dense_w, &params.dense_b, &params.cls_w, &params.cls_b, &workspace,
                 &loss_sum, &dx, &grads.dense_w, &grads.dense_b, &grads.cls_w, &grads.cls_b}))
    return lowp::nsp_loss(*this, lowp_, layout, x, params, labels, grad_scale, workspace, loss_sum,
                          num_correct, dx, grads);
  const char* op = "nsp_loss";
  const auto [h, s] = checks::nsp_loss_args(checks::OpArgs(op, Device::cpu), layout, x, params,
                                            labels, workspace, dx, grads);
  cpu::check_layout(op, layout, layout.rows, checks::EmptySeqs::allowed);

  // An empty slot is left out: its [CLS] gathers as 0 (index -1) and its label as -1.
  const int32_t* start = layout.seq_start.ptr<int32_t>();
  const int32_t* len = layout.seq_len.ptr<int32_t>();
  const int32_t* lab = labels.ptr<int32_t>();
  std::vector<int32_t> cls_row(static_cast<size_t>(s)), slot_label(static_cast<size_t>(s));
  for (int64_t i = 0; i < s; ++i) {
    PB_REQUIRE(len[i] == 0 || lab[i] == 0 || lab[i] == 1, "{}: labels[{}] = {} is not 0 or 1", op,
               i, lab[i]);
    cls_row[i] = len[i] > 0 ? start[i] : -1;
    slot_label[i] = len[i] > 0 ? lab[i] : -1;
  }
  const Tensor cls_index = view(cls_row.data(), {s});

  float* ws = workspace.ptr<float>();
  const Tensor cls = view(ws, {s, h});             // each sequence's [CLS] row
  const Tensor pooled = view(ws + s * h, {s, h});  // tanh(cls Wp^T + bp)
  const Tensor dpooled = view(ws + 2 * s * h, {s, h});
  const Tensor dcls = view(ws + 3 * s * h, {s, h});
  const Tensor logits = view(ws + 4 * s * h, {s, 2});  // becomes dlogits in place
  gather_rows(x, cls_index, cls);
  linear_forward(cls, params.dense_w, params.dense_b, Epilogue::bias, pooled, Tensor());
  float* pp = pooled.ptr<float>();
  for (int64_t i = 0; i < s * h; ++i) pp[i] = std::tanh(pp[i]);
  linear_forward(pooled, params.cls_w, params.cls_b, Epilogue::bias, logits, Tensor());
  softmax_cross_entropy(logits, view(slot_label.data(), {s}), grad_scale, loss_sum, num_correct,
                        dx.defined() ? logits : Tensor());
  if (!dx.defined()) return;

  linear_backward(pooled, params.cls_w, logits, dpooled, grads.cls_w, grads.cls_b, {});
  float* dp = dpooled.ptr<float>();
  for (int64_t i = 0; i < s * h; ++i) dp[i] *= 1.0f - pp[i] * pp[i];
  linear_backward(cls, params.dense_w, dpooled, dcls, grads.dense_w, grads.dense_b, {});
  const float* dc = dcls.ptr<float>();
  float* d = dx.ptr<float>();
  for (int64_t i = 0; i < s; ++i)
    if (cls_row[i] >= 0)
      for (int64_t c = 0; c < h; ++c) d[cls_row[i] * h + c] += dc[i * h + c];
}

}  // namespace packbert
