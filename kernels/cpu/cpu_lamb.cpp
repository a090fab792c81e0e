// The optimizer ops: the L2 norm of a flat buffer and LAMB over the flat parameter table.
#include <algorithm>
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/common/op_args.h"
#include "kernels/common/op_checks.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_lowp.h"

namespace packbert {

using cpu::block_sum_squares;
using cpu::expect;
using cpu::kSumBlock;

void CpuBackend::l2_norm(const Tensor& x, const Tensor& out) {
  const char* op = "l2_norm";
  expect(op, "x", x, DType::f32, {kAnyDim});
  expect(op, "out", out, DType::f32, {1});
  out.ptr<float>()[0] = static_cast<float>(std::sqrt(sum_squares(x.ptr<float>(), x.dim(0))));
}

void CpuBackend::sum_squares(const Tensor& x, const Tensor& out) {
  const char* op = "sum_squares";
  expect(op, "x", x, DType::f32, {kAnyDim});
  expect(op, "out", out, DType::f64, {1});
  out.ptr<double>()[0] = sum_squares(x.ptr<float>(), x.dim(0));
}

void CpuBackend::norm_from_sum_squares(const Tensor& sum, const Tensor& out) {
  const char* op = "norm_from_sum_squares";
  expect(op, "sum", sum, DType::f64, {1});
  expect(op, "out", out, DType::f32, {1});
  out.ptr<float>()[0] = static_cast<float>(std::sqrt(sum.ptr<double>()[0]));
}

void CpuBackend::lamb_step(const Tensor& table, const LambConfig& cfg,
                           const Tensor& global_grad_norm, const Tensor& params,
                           const Tensor& grads, const Tensor& m, const Tensor& v,
                           const Tensor& norms_ws, const Tensor& params_lowp,
                           const Tensor& record) {
  const char* op = "lamb_step";
  const auto [num_tensors, n] = checks::lamb_step_args(checks::OpArgs(op, Device::cpu), table, cfg,
                                                       global_grad_norm, params, grads, m, v,
                                                       norms_ws, record);
  if (params_lowp.defined()) {
    PB_REQUIRE(params_lowp.dtype == DType::bf16 || params_lowp.dtype == DType::f16,
               "{}: params_lowp is {}, expected bf16 or f16", op, params_lowp.str());
    cpu::expect(op, "params_lowp", params_lowp, params_lowp.dtype, {n});
  }
  static_assert(sizeof(LambTensor) == 3 * sizeof(int64_t), "LambTensor is a row of i64 [T, 3]");
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  const bool update = lamb_norm_is_finite(global_grad_norm.ptr<float>()[0], cfg.grad_scale);
  if (record.defined()) lamb_record_step(record.ptr<int32_t>(), update);
  if (!update) return;

  LambCoeffs c;
  c.beta1 = cfg.beta1;
  c.beta2 = cfg.beta2;
  c.beta3 = 1.0f - cfg.beta1;
  c.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta1), cfg.step));
  c.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta2), cfg.step));
  c.eps = cfg.eps;
  // The loss scale folds into the clip divisor: u reads grad / (clip * scale). With scale 1
  // both operations are exact, so the fp32 step is unchanged bit for bit.
  c.clip_divisor = lamb_clip_divisor(global_grad_norm.ptr<float>()[0] / cfg.grad_scale,
                                     cfg.max_grad_norm) *
                   cfg.grad_scale;

  float* w = params.ptr<float>();
  float* g = grads.ptr<float>();
  float* mp = m.ptr<float>();
  float* vp = v.ptr<float>();
  float* wnorm = norms_ws.ptr<float>();
  float* unorm = wnorm + num_tensors;
  // Per tensor, like apex: ||w|| before the step, u (into the gradient buffer), ||u||, w -= step.
  // All tensors at once, in one parallel region: the work items are the fixed kSumBlock blocks
  // of every tensor (the blocks of sum_squares, so each norm is the same fixed-order sum as
  // sum_squares gives), and the per-tensor norms are finished between the phases. A region per
  // tensor and phase would be ~4 per tensor (hundreds per step), each a fork/join whose cost
  // is small on an idle machine but grows to a scheduler tick when other processes share it.
  int64_t* first = lamb_blocks(num_tensors);  // first[t]: the first item of tensor t
  first[0] = 0;
  for (int64_t t = 0; t < num_tensors; ++t)
    first[t + 1] = first[t] + (entries[t].size + kSumBlock - 1) / kSumBlock;
  const int64_t items = first[num_tensors];
  double* partial = reduction_scratch(static_cast<size_t>(items));
  float* step_size = lamb_step_sizes(num_tensors);
  // The tensor of each item (binary search of first).
  auto tensor_of = [&](int64_t item) {
    return static_cast<int64_t>(std::upper_bound(first, first + num_tensors + 1, item) - first) - 1;
  };
  auto finish_norms = [&](float* norms) {
    for (int64_t t = 0; t < num_tensors; ++t) {
      double total = 0.0;
      for (int64_t b = first[t]; b < first[t + 1]; ++b) total += partial[b];
      norms[t] = static_cast<float>(std::sqrt(total));
    }
  };
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = tensor_of(item), i0 = (item - first[t]) * kSumBlock;
      const float* wt = w + entries[t].offset;
      partial[item] = block_sum_squares(wt + i0, std::min(kSumBlock, entries[t].size - i0));
    }
#pragma omp single
    finish_norms(wnorm);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = tensor_of(item), i0 = (item - first[t]) * kSumBlock;
      const LambTensor& e = entries[t];
      const float decay = e.decay == 1 ? cfg.weight_decay : 0.f;
      const int64_t len = std::min(kSumBlock, e.size - i0);
      float* wt = w + e.offset + i0;
      float* gt = g + e.offset + i0;
      float* mt = mp + e.offset + i0;
      float* vt = vp + e.offset + i0;
      for (int64_t i = 0; i < len; ++i) gt[i] = lamb_update(gt[i], wt[i], mt[i], vt[i], c, decay);
      partial[item] = block_sum_squares(gt, len);
    }
#pragma omp single
    {
      finish_norms(unorm);
      // apex applies the trust ratio only where weight decay is non-zero (use_nvlamb = false).
      for (int64_t t = 0; t < num_tensors; ++t)
        step_size[t] = lamb_step_size(cfg.lr, wnorm[t], unorm[t],
                                      entries[t].decay == 1 && cfg.weight_decay != 0.f);
    }
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = tensor_of(item), i0 = (item - first[t]) * kSumBlock;
      const int64_t len = std::min(kSumBlock, entries[t].size - i0);
      const float st = step_size[t];
      float* wt = w + entries[t].offset + i0;
      const float* gt = g + entries[t].offset + i0;
      for (int64_t i = 0; i < len; ++i) wt[i] -= st * gt[i];
      // The low-precision copy in the same pass, while the block is in cache.
      if (params_lowp.defined())
        cpu::convert(static_cast<uint16_t*>(params_lowp.data) + entries[t].offset + i0,
                     params_lowp.dtype, wt, DType::f32, len);
    }
  }
}

}  // namespace packbert
