// The linear layers: a GEMM with its epilogue (bias, GELU) and its backward. Each op's contract
// is the comment above its entry in PACKBERT_LINEAR_OPS (the list's form: kernels/ops/op_list.h),
// its argument check is in packbert::checks below.
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// The two GELUs BERT checkpoints are trained with: the exact x Phi(x) (erf; Hugging Face's
// "gelu", the default) and the tanh approximation of Google's original BERT and NVIDIA's MLPerf
// implementation (Hugging Face's "gelu_new"), which cuBLASLt's GELU epilogues compute. Formulas:
// kernels/common/math.h.
enum class Gelu { erf, tanh };

// Linear epilogues: what is applied to x * w^T before it is written. bias_gelu is the erf GELU,
// bias_gelu_tanh the tanh approximation.
enum class Epilogue { none, bias, bias_gelu, bias_gelu_tanh };
inline bool has_gelu(Epilogue e) {
  return e == Epilogue::bias_gelu || e == Epilogue::bias_gelu_tanh;
}
inline Gelu gelu_of(Epilogue e) { return e == Epilogue::bias_gelu_tanh ? Gelu::tanh : Gelu::erf; }
inline Epilogue bias_gelu_epilogue(Gelu g) {
  return g == Gelu::tanh ? Epilogue::bias_gelu_tanh : Epilogue::bias_gelu;
}

struct LinearBackwardOptions {
  // The forward used a GELU epilogue with this pre-activation [N, M]: dout is the gradient
  // wrt gelu(pre) and is turned into the gradient wrt pre IN PLACE before anything else.
  Tensor out_gelu_pre;
  // The input x was gelu(x_gelu_pre) [N, K] (FFN2 after FFN1): dx is written as the gradient
  // wrt x_gelu_pre, i.e. (dout * w) * gelu'(x_gelu_pre) -- the dGELU fused into the dx GEMM.
  Tensor x_gelu_pre;
  // Which GELU the two pre-activations above went through.
  Gelu gelu = Gelu::erf;
  // dx += instead of dx = (where a residual branch already wrote its share).
  bool dx_accumulate = false;
};

// ---- linear layers (GEMM + epilogue) ---------------------------------------------------------
#define PACKBERT_LINEAR_OPS(OP)                                                                    \
  /* out = x * w^T (+ bias) (then gelu), PyTorch nn.Linear: x [N, K], w [M, K] (out_features x     \
     in_features), bias [M], out [N, M], all row-major; fp32 accumulation. For bias_gelu and       \
     bias_gelu_tanh, pre [N, M] keeps x * w^T + bias for backward, and bias may be none (a layer   \
     without a bias: pre = x * w^T).                                                               \
     lowp: x, w, out, pre; bias is f32. pre = round(x w^T + bias), out = round(gelu(.)) of the     \
     fp32 pre-activation on the CPU, of the rounded one on CUDA (a difference of one rounding of   \
     the argument, inside the precision's tolerance). */                                           \
  OP(linear_forward,                                                                               \
     (const Tensor& x, const Tensor& w, const Tensor& bias, Epilogue epilogue, const Tensor& out,  \
      const Tensor& pre),                                                                          \
     (x, w, bias, epilogue, out, pre))                                                             \
  /* Given dout [N, M]: dx = dout * w [N, K] (written, or see options), dw += dout^T * x [M, K],   \
     db += column sums of dout [M]. dx, dw, db are each optional; x is needed only for dw.         \
     Saves nothing; dout is read-only unless options.out_gelu_pre is given.                        \
     lowp: x, w, dout, dx, options.out_gelu_pre, options.x_gelu_pre; dw and db are f32 (the        \
     weight gradients read low-precision operands and accumulate in fp32). */                      \
  OP(linear_backward,                                                                              \
     (const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx, const Tensor& dw,    \
      const Tensor& db, const LinearBackwardOptions& options = {}),                                \
     (x, w, dout, dx, dw, db, options))

}  // namespace packbert

namespace packbert::checks {

// out [n, m] = x [n, k] w [m, k]^T (+ epilogue).
struct GemmDims {
  int64_t n = 0, k = 0, m = 0;
};

inline GemmDims linear_forward_args(const OpArgs& a, const Tensor& x, const Tensor& w,
                                    const Tensor& bias, Epilogue epilogue, const Tensor& out,
                                    const Tensor& pre) {
  a("x", x, DType::f32, {kAnyDim, kAnyDim});
  a("w", w, DType::f32, {kAnyDim, x.dim(1)});
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  a("out", out, DType::f32, {n, m});
  if (epilogue == Epilogue::none) {
    PB_REQUIRE(!bias.defined(), "{}: bias given with Epilogue::none", a.op);
  } else if (epilogue == Epilogue::bias) {
    a("bias", bias, DType::f32, {m});
  } else {
    a.optional("bias", bias, DType::f32, {m});  // the GELU epilogues without a bias: gelu(x w^T)
  }
  if (has_gelu(epilogue)) {
    a("pre", pre, DType::f32, {n, m});
  } else {
    PB_REQUIRE(!pre.defined(), "{}: pre is only written by the GELU epilogues", a.op);
  }
  return {n, k, m};
}

inline GemmDims linear_backward_args(const OpArgs& a, const Tensor& x, const Tensor& w,
                                     const Tensor& dout, const Tensor& dx, const Tensor& dw,
                                     const Tensor& db, const LinearBackwardOptions& opt) {
  a("w", w, DType::f32, {kAnyDim, kAnyDim});
  const int64_t m = w.dim(0), k = w.dim(1);
  a("dout", dout, DType::f32, {kAnyDim, m});
  const int64_t n = dout.dim(0);
  PB_REQUIRE(x.defined() || !dw.defined(), "{}: dw needs the forward input x", a.op);
  a.optional("x", x, DType::f32, {n, k});
  a.optional("dx", dx, DType::f32, {n, k});
  a.optional("dw", dw, DType::f32, {m, k});
  a.optional("db", db, DType::f32, {m});
  a.optional("options.out_gelu_pre", opt.out_gelu_pre, DType::f32, {n, m});
  a.optional("options.x_gelu_pre", opt.x_gelu_pre, DType::f32, {n, k});
  PB_REQUIRE(!opt.x_gelu_pre.defined() || (dx.defined() && !opt.dx_accumulate),
             "{}: options.x_gelu_pre needs dx and excludes dx_accumulate", a.op);
  return {n, k, m};
}

}  // namespace packbert::checks
