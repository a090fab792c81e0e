// The optimizer ops: the L2 norm of a flat buffer and LAMB (or AdamW, StableAdamW: the config's
// rule) over the flat parameter table.
#include <algorithm>
#include <cmath>

#include "kernels/common/math.h"
#include "kernels/common/op_checks.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_lowp.h"
#include "kernels/ops/lamb.h"

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

namespace {

// The work items of a LAMB table: the fixed kSumBlock blocks of every row, counted from the
// row's first element (the blocks of sum_squares, so each row's sum is the same fixed-order sum
// as sum_squares gives over the row). first[t]: the first item of row t; first[T]: the count.
struct LambItems {
  const LambTensor* rows;
  const int64_t* first;
  int64_t num_rows;
  int64_t count() const { return first[num_rows]; }
  int64_t row_of(int64_t item) const {  // binary search of first
    return static_cast<int64_t>(std::upper_bound(first, first + num_rows + 1, item) - first) - 1;
  }
  int64_t begin(int64_t item, int64_t row) const { return (item - first[row]) * kSumBlock; }
  int64_t len(int64_t item, int64_t row) const {
    return std::min(kSumBlock, rows[row].size - begin(item, row));
  }
};

// The config's per-step scalars: its step_scalars (host memory here) when given.
LambStepScalars step_scalars(const LambConfig& cfg) {
  if (!cfg.step_scalars.defined()) return lamb_step_scalars(cfg);
  const float* s = cfg.step_scalars.ptr<float>();
  return {s[0], s[1], s[2], s[3]};
}

}  // namespace

void CpuBackend::lamb_update(const Tensor& table, const LambConfig& cfg,
                             const Tensor& global_grad_norm, const Tensor& params,
                             const Tensor& grads, const Tensor& m, const Tensor& v,
                             const Tensor& sums, const Tensor& record) {
  const char* op = "lamb_update";
  const auto [num_tensors, n] =
      checks::lamb_update_args(checks::OpArgs(op, Device::cpu), table, cfg, global_grad_norm,
                               params, grads, m, v, sums, record);
  static_assert(sizeof(LambTensor) == 3 * sizeof(int64_t), "LambTensor is a row of i64 [T, 3]");
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  const LambStepScalars sc = step_scalars(cfg);
  const bool update = lamb_norm_is_finite(global_grad_norm.ptr<float>()[0], sc.grad_scale);
  if (record.defined()) lamb_record_step(record.ptr<int32_t>(), update);
  if (!update) return;

  LambCoeffs c;
  c.beta1 = cfg.beta1;
  c.beta2 = cfg.beta2;
  c.beta3 = 1.0f - cfg.beta1;
  c.bias_correction1 = sc.bias_correction1;
  c.bias_correction2 = sc.bias_correction2;
  c.eps = cfg.eps;
  // The loss scale folds into the clip divisor: u reads grad / (clip * scale). With scale 1
  // both operations are exact, so the fp32 step is unchanged bit for bit.
  c.clip_divisor =
      lamb_clip_divisor(global_grad_norm.ptr<float>()[0] / sc.grad_scale, cfg.max_grad_norm) *
      sc.grad_scale;

  const float* w = params.ptr<float>();
  float* g = grads.ptr<float>();
  float* mp = m.ptr<float>();
  float* vp = v.ptr<float>();
  double* out = sums.ptr<double>();
  // All rows at once, in one parallel region over the blocks of every row, the per-row sums
  // finished between the phases. A region per tensor and phase would be ~4 per tensor (hundreds
  // per step), each a fork/join whose cost is small on an idle machine but grows to a scheduler
  // tick when other processes share it.
  int64_t* first = lamb_blocks(num_tensors);
  first[0] = 0;
  for (int64_t t = 0; t < num_tensors; ++t)
    first[t + 1] = first[t] + (entries[t].size + kSumBlock - 1) / kSumBlock;
  const LambItems items{entries, first, num_tensors};
  double* partial = reduction_scratch(static_cast<size_t>(items.count()));
  auto finish = [&](int64_t column) {
    for (int64_t t = 0; t < num_tensors; ++t) {
      double total = 0.0;
      for (int64_t b = first[t]; b < first[t + 1]; ++b) total += partial[b];
      out[2 * t + column] = total;
    }
  };
  const UpdateRule rule = cfg.rule;
  const bool stable = rule == UpdateRule::stable_adamw;
#pragma omp parallel
  {
    if (!stable) {  // sum of w^2 per row (StableAdamW's column 0 is its RMS terms, below)
#pragma omp for schedule(static)
      for (int64_t item = 0; item < items.count(); ++item) {
        const int64_t t = items.row_of(item);
        partial[item] =
            block_sum_squares(w + entries[t].offset + items.begin(item, t), items.len(item, t));
      }
#pragma omp single
      finish(0);
    }
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items.count(); ++item) {
      const int64_t t = items.row_of(item);
      const int64_t at = entries[t].offset + items.begin(item, t), len = items.len(item, t);
      if (rule == UpdateRule::lamb) {
        const float decay = entries[t].decay == 1 ? cfg.weight_decay : 0.f;
        for (int64_t i = at; i < at + len; ++i)
          g[i] = packbert::lamb_update(g[i], w[i], mp[i], vp[i], c, decay);
        partial[item] = block_sum_squares(g + at, len);
      } else {
        double terms = 0.0;
        float term = 0.f;
        for (int64_t i = at; i < at + len; ++i) {
          g[i] = adam_update(g[i], mp[i], vp[i], c, term);
          terms += term;
        }
        partial[item] = stable ? terms : block_sum_squares(g + at, len);
      }
    }
#pragma omp single
    {
      finish(stable ? 0 : 1);
      if (stable)
        for (int64_t t = 0; t < num_tensors; ++t)
          out[2 * t + 1] = static_cast<double>(entries[t].size);
    }
  }
}

void CpuBackend::lamb_apply(const Tensor& table, const LambConfig& cfg,
                            const Tensor& global_grad_norm, const Tensor& sums,
                            const Tensor& params, const Tensor& grads, const Tensor& params_lowp,
                            const Tensor& norms_ws) {
  const char* op = "lamb_apply";
  const auto [num_tensors, n] = checks::lamb_apply_args(
      checks::OpArgs(op, Device::cpu), table, cfg, global_grad_norm, sums, params, grads, norms_ws);
  if (params_lowp.defined()) {
    PB_REQUIRE(params_lowp.dtype == DType::bf16 || params_lowp.dtype == DType::f16,
               "{}: params_lowp is {}, expected bf16 or f16", op, params_lowp.str());
    cpu::expect(op, "params_lowp", params_lowp, params_lowp.dtype, {n});
  }
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  const LambStepScalars sc = step_scalars(cfg);
  if (!lamb_norm_is_finite(global_grad_norm.ptr<float>()[0], sc.grad_scale)) return;

  const double* in = sums.ptr<double>();
  // Per row: the step size, then (AdamW family) the decay.
  float* step_size = lamb_step_sizes(2 * num_tensors);
  float* decay = step_size + num_tensors;
  for (int64_t t = 0; t < num_tensors; ++t) {
    const auto wnorm = static_cast<float>(std::sqrt(in[2 * t]));
    const auto unorm = static_cast<float>(std::sqrt(in[2 * t + 1]));
    if (norms_ws.defined()) {
      norms_ws.ptr<float>()[t] = wnorm;
      norms_ws.ptr<float>()[num_tensors + t] = unorm;
    }
    decay[t] = entries[t].decay == 1 ? cfg.weight_decay : 0.f;
    if (cfg.rule == UpdateRule::lamb) {
      // apex applies the trust ratio only where weight decay is non-zero (use_nvlamb = false).
      step_size[t] =
          lamb_step_size(sc.lr, wnorm, unorm, entries[t].decay == 1 && cfg.weight_decay != 0.f);
    } else {
      step_size[t] = cfg.rule == UpdateRule::stable_adamw
                         ? stable_adamw_lr(sc.lr, in[2 * t], in[2 * t + 1])
                         : sc.lr;
    }
  }
  const bool adamw_family = cfg.rule != UpdateRule::lamb;
  int64_t* first = lamb_blocks(num_tensors);
  first[0] = 0;
  for (int64_t t = 0; t < num_tensors; ++t)
    first[t + 1] = first[t] + (entries[t].size + kSumBlock - 1) / kSumBlock;
  const LambItems items{entries, first, num_tensors};
  float* w = params.ptr<float>();
  const float* u = grads.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < items.count(); ++item) {
    const int64_t t = items.row_of(item);
    const int64_t at = entries[t].offset + items.begin(item, t), len = items.len(item, t);
    const float st = step_size[t];
    if (adamw_family) {
      for (int64_t i = at; i < at + len; ++i) w[i] = adamw_apply(w[i], u[i], st, decay[t]);
    } else {
      for (int64_t i = at; i < at + len; ++i) w[i] -= st * u[i];
    }
    // The low-precision copy in the same pass, while the block is in cache.
    if (params_lowp.defined())
      cpu::convert(static_cast<uint16_t*>(params_lowp.data) + at, params_lowp.dtype, w + at,
                   DType::f32, len);
  }
}

}  // namespace packbert
