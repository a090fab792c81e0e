// Gated MLP activations (GeGLU, SwiGLU: the MLP of ModernBERT-class encoders), forward and
// backward, each one fused pass. Each op's contract is the comment above its entry in
// PACKBERT_GLU_OPS (the list's form: kernels/ops/op_list.h), its argument check is in
// packbert::checks below; the per-element formulas, which both backends share, are
// kernels/common/glu_math.h.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// The activation of the gated half: GeGLU with the exact (erf) GELU (Hugging Face's "gelu",
// ModernBERT's default), GeGLU with the tanh GELU ("gelu_new", "gelu_pytorch_tanh"), SwiGLU
// (SiLU, x sigmoid(x)). The GELUs are kernels/common/math.h's, the linear epilogues' very
// formulas. The values are glu_math.h's kGlu* (the .cu files see no op header).
enum class GluAct { gelu = 0, gelu_tanh = 1, silu = 2 };

// ---- gated MLP activations -------------------------------------------------------------------
#define PACKBERT_GLU_OPS(OP)                                                                       \
  /* x [N, 2I] -> out [N, I] = act(x[:, :I]) * x[:, I:], as Hugging Face's ModernBertMLP:          \
     input, gate = Wi(h).chunk(2, dim=-1); act(input) * gate (the activation on the FIRST half).   \
     One read of x, one write of out; every row (the op knows no layout). out overlaps no part of  \
     x.                                                                                            \
     lowp: x, out (each f32, bf16 or f16 on its own; fp32 math, out rounded once). */              \
  OP(glu_forward, (const Tensor& x, GluAct act, const Tensor& out), (x, act, out))                 \
  /* From dout [N, I] and the forward's x [N, 2I], dx [N, 2I] written: with a = x[:, :I],          \
     g = x[:, I:],  dx[:, :I] = (dout * g) * act'(a),  dx[:, I:] = dout * act(a). Reads x and      \
     dout once, writes dx once; the activation is recomputed from x, so the forward's out is not   \
     needed (dout may even be that buffer). x and dout are read-only; dx overlaps neither (no      \
     in-place backward: x is the Wi GEMM's output, which the weight gradient still needs).         \
     lowp: x, dout, dx (each f32, bf16 or f16 on its own; fp32 math, each dx rounded once). */     \
  OP(glu_backward, (const Tensor& x, const Tensor& dout, GluAct act, const Tensor& dx),            \
     (x, dout, act, dx))

}  // namespace packbert

namespace packbert::checks {

// glu_forward / glu_backward: n rows, i = the width of each half.
struct GluDims {
  int64_t n = 0, i = 0;
};

inline void glu_float_arg(const OpArgs& a, const char* name, const Tensor& t,
                          std::initializer_list<int64_t> dims) {
  PB_REQUIRE(
      t.defined() && (t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16),
      "{}: {} is {}, expected f32, bf16 or f16", a.op, name, t.str());
  a(name, t, t.dtype, dims);
}

inline bool glu_overlap(const Tensor& p, const Tensor& q) {
  const auto* a = static_cast<const char*>(p.data);
  const auto* b = static_cast<const char*>(q.data);
  return a < b + q.bytes() && b < a + p.bytes();
}

inline void glu_act_arg(const OpArgs& a, GluAct act) {
  PB_REQUIRE(act == GluAct::gelu || act == GluAct::gelu_tanh || act == GluAct::silu,
             "{}: act {} is not a GluAct (gelu, gelu_tanh, silu)", a.op, static_cast<int>(act));
}

inline GluDims glu_forward_args(const OpArgs& a, const Tensor& x, GluAct act, const Tensor& out) {
  glu_act_arg(a, act);
  glu_float_arg(a, "x", x, {kAnyDim, kAnyDim});
  const int64_t n = x.dim(0), w = x.dim(1);
  PB_REQUIRE(w % 2 == 0, "{}: x width {} is odd, expected 2I (input | gate)", a.op, w);
  glu_float_arg(a, "out", out, {n, w / 2});
  PB_REQUIRE(!glu_overlap(out, x), "{}: out overlaps x", a.op);
  return {n, w / 2};
}

inline GluDims glu_backward_args(const OpArgs& a, const Tensor& x, const Tensor& dout, GluAct act,
                                 const Tensor& dx) {
  glu_act_arg(a, act);
  glu_float_arg(a, "x", x, {kAnyDim, kAnyDim});
  const int64_t n = x.dim(0), w = x.dim(1);
  PB_REQUIRE(w % 2 == 0, "{}: x width {} is odd, expected 2I (input | gate)", a.op, w);
  glu_float_arg(a, "dout", dout, {n, w / 2});
  glu_float_arg(a, "dx", dx, {n, w});
  PB_REQUIRE(!glu_overlap(dx, x), "{}: dx overlaps x", a.op);
  PB_REQUIRE(!glu_overlap(dx, dout), "{}: dx overlaps dout", a.op);
  return {n, w / 2};
}

}  // namespace packbert::checks
