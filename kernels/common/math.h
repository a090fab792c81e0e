// Per-element math shared by the CPU and CUDA backends: GELU, LayerNorm statistics and gradient,
// the LAMB update. One definition on both sides is what makes "cpu fp32 is the executable
// specification" true for the formulas, not just for the test harness.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/host_device.h"
#include "kernels/common/update_rule.h"

namespace packbert {

// ---- GELU, exact erf form (Hugging Face's "gelu", the default) ----------------------------
PB_HD float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

// d gelu / dx = Phi(x) + x * phi(x).
PB_HD float gelu_grad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

// ---- GELU, tanh approximation (Google's BERT, NVIDIA's MLPerf BERT, cuBLASLt's epilogue) -----
//   gelu_tanh(x) = x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
PB_HD float gelu_tanh(float x) {
  const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu_tanh / dx = (1 + t) / 2 + x / 2 (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2).
PB_HD float gelu_tanh_grad(float x) {
  const float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) +
         0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * x * x);
}

// ---- LayerNorm ------------------------------------------------------------------------------
// Running mean / sum of squared deviations (Welford): stable in fp32 for rows of any offset,
// and mergeable, so a GPU block can combine per-thread partials with welford_merge.
struct Welford {
  float n = 0.f, mean = 0.f, m2 = 0.f;
};

PB_HD void welford_push(Welford& w, float x) {
  w.n += 1.f;
  const float d = x - w.mean;
  w.mean += d / w.n;
  w.m2 += d * (x - w.mean);
}

PB_HD Welford welford_merge(const Welford& a, const Welford& b) {
  Welford r;
  r.n = a.n + b.n;
  if (r.n == 0.f) return r;
  const float d = b.mean - a.mean;
  const float fb = b.n / r.n;
  r.mean = a.mean + d * fb;
  r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
  return r;
}

// 1 / sqrt(biased variance + eps), the normaliser PyTorch's LayerNorm uses.
PB_HD float layernorm_rstd(const Welford& w, float eps) { return 1.0f / sqrtf(w.m2 / w.n + eps); }

// Gradient wrt the LayerNorm input of one element, given g = dy * gamma of that element and the
// row means mean_g = mean(g), mean_gx = mean(g * xhat):
//   dx = rstd * (g - mean_g - xhat * mean_gx).
PB_HD float layernorm_dx(float g, float xhat, float mean_g, float mean_gx, float rstd) {
  return rstd * (g - mean_g - xhat * mean_gx);
}

// ---- LAMB (NVIDIA apex FusedLAMB, decoupled weight decay, grad averaging) -------------------
struct LambCoeffs {
  float beta1, beta2;
  float beta3;             // 1 - beta1 (grad averaging)
  float bias_correction1;  // 1 - beta1^step
  float bias_correction2;  // 1 - beta2^step
  float eps;
  float clip_divisor;  // lamb_clip_divisor(global grad norm, max grad norm)
};

// Whether a LAMB step may update: the global gradient norm over the loss scale is finite
// (x - x is 0 for a finite x, NaN for an infinity or a NaN).
PB_HD bool lamb_norm_is_finite(float global_norm, float grad_scale) {
  const float x = global_norm / grad_scale;
  return x - x == 0.0f;
}

// Backend::lamb_step's record of skipped steps: [0] steps skipped, [1] the current run of
// consecutive skipped steps, [2] the longest run.
PB_HD void lamb_record_step(int32_t* record, bool updated) {
  if (updated) {
    record[1] = 0;
    return;
  }
  record[0] += 1;
  record[1] += 1;
  if (record[1] > record[2]) record[2] = record[1];
}

// Gradients are divided by this: global_norm / max_norm when the norm exceeds max_norm, else 1.
PB_HD float lamb_clip_divisor(float global_norm, float max_norm) {
  return global_norm > max_norm ? global_norm / max_norm : 1.0f;
}

// Updates m and v in place and returns the update direction u = m^ / (sqrt(v^) + eps) + decay * w.
// decay is the weight decay for tensors that take it and 0 for the others.
PB_HD float lamb_update(float grad, float weight, float& m, float& v, const LambCoeffs& c,
                        float decay) {
  const float g = grad / c.clip_divisor;
  m = m * c.beta1 + c.beta3 * g;
  v = v * c.beta2 + (1.0f - c.beta2) * g * g;
  const float m_hat = m / c.bias_correction1;
  const float v_hat = v / c.bias_correction2;
  return m_hat / (sqrtf(v_hat) + c.eps) + decay * weight;
}

// AdamW and StableAdamW (kernels/ops/lamb.h, config.rule): the moments as lamb_update, the
// direction m^ / (sqrt(v^) + eps) without decay, and StableAdamW's term g^2 / max(v^, eps^2) of
// its per-tensor RMS.
PB_HD float adam_update(float grad, float& m, float& v, const LambCoeffs& c, float& rms_term) {
  const float g = grad / c.clip_divisor;
  m = m * c.beta1 + c.beta3 * g;
  v = v * c.beta2 + (1.0f - c.beta2) * g * g;
  const float m_hat = m / c.bias_correction1;
  const float v_hat = v / c.bias_correction2;
  const float floor = c.eps * c.eps;
  rms_term = g * g / (v_hat > floor ? v_hat : floor);
  return m_hat / (sqrtf(v_hat) + c.eps);
}

// StableAdamW's rate for a tensor: lr / max(1, RMS), RMS = sqrt(term sum / count) in double,
// rounded to f32 (as the norms are).
PB_HD float stable_adamw_lr(float lr, double term_sum, double count) {
  const float rms = count > 0 ? static_cast<float>(sqrt(term_sum / count)) : 0.0f;
  return rms > 1.0f ? lr / rms : lr;
}

// torch.optim.AdamW's order: the decay, then the step.
PB_HD float adamw_apply(float w, float u, float lr, float decay) {
  return w * (1.0f - lr * decay) - lr * u;
}

// The step size of one tensor: lr * ||w|| / ||u|| for adapted tensors when both norms are
// non-zero, else lr.
PB_HD float lamb_step_size(float lr, float weight_norm, float update_norm, bool adapt) {
  return adapt && weight_norm != 0.f && update_norm != 0.f ? lr * (weight_norm / update_norm) : lr;
}

}  // namespace packbert
