// Bias + dropout + residual add + LayerNorm, fused, and its backward. Each op's contract is the
// comment above its entry in PACKBERT_LAYERNORM_OPS (the list's form: kernels/ops/op_list.h),
// its argument check is in packbert::checks below.
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/layout.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// A LayerNorm's parameters: gamma [H], and beta [H] or none (a norm without a bias, ModernBERT's
// norm_bias = false: nothing is added), with its epsilon. As gradients (dln) eps is unused.
struct LayerNormParams {
  Tensor gamma;
  Tensor beta;
  float eps = kLayerNormEps;
};

// ---- bias + dropout + residual add + LayerNorm -----------------------------------------------
#define PACKBERT_LAYERNORM_OPS(OP)                                                                 \
  /* h = dropout(x + bias) + residual;  out = LayerNorm(h) * gamma + beta, with ln.eps.            \
     x, residual, out: [rows, H]; bias [H], residual and ln.beta optional. Saves ln_in = h         \
     [rows, H] (may alias x, which is then overwritten) and ln_mean, ln_rstd f32 [rows]; out       \
     aliases neither. layout supplies the dropout keys and may be empty when dropout.p == 0 (the   \
     MLM transform's plain LayerNorm: no bias, no residual, p = 0). Padding rows are never         \
     dropped. A pre-norm layer calls it with the next norm's parameters: ln_in is then the         \
     residual stream and out the next block's input.                                               \
     lowp: x, residual, out, ln_in (h is formed in fp32, then stored rounded in ln_in, and the     \
     statistics are those of the fp32 h). */                                                       \
  OP(residual_layernorm_forward,                                                                   \
     (const SeqLayout& layout, const Tensor& x, const Tensor& bias, const Tensor& residual,        \
      const LayerNormParams& ln, const Dropout& dropout, const Tensor& out, const Tensor& ln_in,   \
      const Tensor& ln_mean, const Tensor& ln_rstd),                                               \
     (layout, x, bias, residual, ln, dropout, out, ln_in, ln_mean, ln_rstd))                       \
  /* From dout [rows, H] and the saved ln_in, ln_mean, ln_rstd: dh = LayerNorm backward (+ the     \
     gradient dresidual holds on entry when dresidual_in: what reaches h by the residual stream    \
     of a pre-norm model), dresidual = dh (written, optional; may alias dout unless                \
     dresidual_in), dx = dropout'(dh) (written, required), dbias += column sums of dx,             \
     dln.gamma += sums of dout * xhat, dln.beta += sums of dout (each optional). The same layout   \
     and dropout as the forward.                                                                   \
     lowp: dout, ln_in, dx, dresidual. */                                                          \
  OP(residual_layernorm_backward,                                                                  \
     (const SeqLayout& layout, const Tensor& dout, const Tensor& ln_in, const Tensor& ln_mean,     \
      const Tensor& ln_rstd, const LayerNormParams& ln, const Dropout& dropout, const Tensor& dx,  \
      const Tensor& dresidual, bool dresidual_in, const Tensor& dbias,                             \
      const LayerNormParams& dln),                                                                 \
     (layout, dout, ln_in, ln_mean, ln_rstd, ln, dropout, dx, dresidual, dresidual_in, dbias,      \
      dln))

}  // namespace packbert

namespace packbert::checks {

// A LayerNorm epsilon: finite and > 0 (Error naming the op otherwise).
inline void layernorm_eps(const char* op, float eps) {
  PB_REQUIRE(eps > 0.f && eps < 1.f, "{}: LayerNorm epsilon {} is not in (0, 1)", op, eps);
}

inline RowDims residual_layernorm_forward_args(const OpArgs& a, const Tensor& x, const Tensor& bias,
                                               const Tensor& residual, const LayerNormParams& ln,
                                               const Tensor& out, const Tensor& ln_in,
                                               const Tensor& ln_mean, const Tensor& ln_rstd) {
  a("x", x, DType::f32, {kAnyDim, kAnyDim});
  const int64_t rows = x.dim(0), h = x.dim(1);
  a.optional("bias", bias, DType::f32, {h});
  a.optional("residual", residual, DType::f32, {rows, h});
  a("ln.gamma", ln.gamma, DType::f32, {h});
  a.optional("ln.beta", ln.beta, DType::f32, {h});
  layernorm_eps(a.op, ln.eps);
  a("out", out, DType::f32, {rows, h});
  a("ln_in", ln_in, DType::f32, {rows, h});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  PB_REQUIRE(out.data != ln_in.data && out.data != x.data, "{}: out may not alias x or ln_in",
             a.op);
  return {rows, h};
}

inline RowDims residual_layernorm_backward_args(const OpArgs& a, const Tensor& dout,
                                                const Tensor& ln_in, const Tensor& ln_mean,
                                                const Tensor& ln_rstd, const LayerNormParams& ln,
                                                const Tensor& dx, const Tensor& dresidual,
                                                bool dresidual_in, const Tensor& dbias,
                                                const LayerNormParams& dln) {
  a("dout", dout, DType::f32, {kAnyDim, kAnyDim});
  const int64_t rows = dout.dim(0), h = dout.dim(1);
  a("ln_in", ln_in, DType::f32, {rows, h});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  a("ln.gamma", ln.gamma, DType::f32, {h});
  a("dx", dx, DType::f32, {rows, h});
  a.optional("dresidual", dresidual, DType::f32, {rows, h});
  a.optional("dbias", dbias, DType::f32, {h});
  a.optional("dln.gamma", dln.gamma, DType::f32, {h});
  a.optional("dln.beta", dln.beta, DType::f32, {h});
  PB_REQUIRE(dx.data != dout.data, "{}: dx may not alias dout (dresidual may)", a.op);
  PB_REQUIRE(!dresidual_in || (dresidual.defined() && dresidual.data != dout.data),
             "{}: dresidual_in needs a dresidual that does not alias dout", a.op);
  return {rows, h};
}

}  // namespace packbert::checks
