// The optimizer ops: the L2 norm of a flat buffer and LAMB over the flat parameter table.
#include <cmath>

#include "common/math.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_common.h"

namespace packbert {

using cpu::expect;

void CpuBackend::l2_norm(const Tensor& x, const Tensor& out) {
  const char* op = "l2_norm";
  expect(op, "x", x, DType::f32, {kAnyDim});
  expect(op, "out", out, DType::f32, {1});
  out.ptr<float>()[0] = static_cast<float>(std::sqrt(sum_squares(x.ptr<float>(), x.dim(0))));
}

void CpuBackend::lamb_step(const Tensor& table, const LambConfig& cfg,
                           const Tensor& global_grad_norm, const Tensor& params,
                           const Tensor& grads, const Tensor& m, const Tensor& v,
                           const Tensor& norms_ws) {
  const char* op = "lamb_step";
  expect(op, "table", table, DType::i64, {kAnyDim, 3});
  const int64_t num_tensors = table.dim(0);
  expect(op, "params", params, DType::f32, {kAnyDim});
  const int64_t n = params.dim(0);
  expect(op, "grads", grads, DType::f32, {n});
  expect(op, "m", m, DType::f32, {n});
  expect(op, "v", v, DType::f32, {n});
  expect(op, "global_grad_norm", global_grad_norm, DType::f32, {1});
  expect(op, "norms_ws", norms_ws, DType::f32, {2 * num_tensors});
  PB_REQUIRE(cfg.step >= 1 && cfg.beta1 >= 0.f && cfg.beta1 < 1.f && cfg.beta2 >= 0.f &&
                 cfg.beta2 < 1.f && cfg.max_grad_norm > 0.f,
             "{}: step {} (from 1), beta1 {} and beta2 {} in [0, 1), max_grad_norm {} > 0", op,
             cfg.step, cfg.beta1, cfg.beta2, cfg.max_grad_norm);
  static_assert(sizeof(LambTensor) == 3 * sizeof(int64_t), "LambTensor is a row of i64 [T, 3]");
  const auto* entries = static_cast<const LambTensor*>(table.data);
  int64_t end = 0;
  for (int64_t t = 0; t < num_tensors; ++t) {
    const LambTensor& e = entries[t];
    PB_REQUIRE(e.offset >= end && e.size >= 0 && e.offset + e.size <= n &&
                   (e.decay == 0 || e.decay == 1),
               "{}: table row {} (offset {}, size {}, decay {}) overlaps the previous row, leaves "
               "the {} elements or has a decay flag other than 0/1 (rows ascend by offset)",
               op, t, e.offset, e.size, e.decay, n);
    end = e.offset + e.size;
  }

  LambCoeffs c;
  c.beta1 = cfg.beta1;
  c.beta2 = cfg.beta2;
  c.beta3 = 1.0f - cfg.beta1;
  c.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta1), cfg.step));
  c.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta2), cfg.step));
  c.eps = cfg.eps;
  c.clip_divisor = lamb_clip_divisor(global_grad_norm.ptr<float>()[0], cfg.max_grad_norm);

  float* w = params.ptr<float>();
  float* g = grads.ptr<float>();
  float* mp = m.ptr<float>();
  float* vp = v.ptr<float>();
  float* wnorm = norms_ws.ptr<float>();
  float* unorm = wnorm + num_tensors;
  // Per tensor, like apex: ||w|| before the step, u (into the gradient buffer), ||u||, w -= step.
  for (int64_t t = 0; t < num_tensors; ++t) {
    const LambTensor& e = entries[t];
    const bool decays = e.decay == 1;
    const float decay = decays ? cfg.weight_decay : 0.f;
    float* wt = w + e.offset;
    float* gt = g + e.offset;
    float* mt = mp + e.offset;
    float* vt = vp + e.offset;
    wnorm[t] = static_cast<float>(std::sqrt(sum_squares(wt, e.size)));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < e.size; ++i) gt[i] = lamb_update(gt[i], wt[i], mt[i], vt[i], c, decay);
    unorm[t] = static_cast<float>(std::sqrt(sum_squares(gt, e.size)));
    // apex applies the trust ratio only where weight decay is non-zero (use_nvlamb = false).
    const float step = lamb_step_size(cfg.lr, wnorm[t], unorm[t], decays && cfg.weight_decay != 0.f);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < e.size; ++i) wt[i] -= step * gt[i];
  }
}

}  // namespace packbert
