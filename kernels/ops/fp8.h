// FP8 training's ops (train.precision = "fp8"; docs/fp8.md): casts into FP8 operands, the FP8
// GEMM, and delayed scaling's bookkeeping. Each op's contract is the comment above its entry in
// PACKBERT_FP8_OPS (the list's form: kernels/ops/op_list.h), after what every FP8 op keeps to
// (below); its argument check is in packbert::checks below.
#pragma once

#include <cstdint>
#include <utility>

#include "kernels/base/error.h"
#include "kernels/base/tensor.h"
#include "kernels/ops/linear.h"
#include "kernels/ops/op_args.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// What Backend::fp8_gemm applies to its product.
struct Fp8GemmOptions {
  // linear_forward's epilogues: bias f32 [m]; the GELUs write pre [n, m] (out's dtype).
  Epilogue epilogue = Epilogue::none;
  Tensor bias, pre;
  // An input gradient through a GELU: out = product * gelu'(dgelu_pre) (dgelu_pre [n, m],
  // out's dtype; the form `gelu`), as linear_backward's x_gelu_pre.
  Tensor dgelu_pre;
  Gelu gelu = Gelu::erf;
  // out += product, added in fp32 and rounded once (Epilogue::none, no dgelu_pre).
  bool accumulate = false;
  // Lets the GPU accumulate in its faster, less exact way (cuBLASLt's FP8 fast accumulation);
  // the CPU ignores it.
  bool fast_accum = false;
};

// ---- FP8 (train.precision = "fp8"; docs/fp8.md) ----------------------------------------------
// An FP8 operand is an e4m3 or e5m2 tensor holding fp8(v * s) of the values v it was cast from
// (common/fp8_convert.h: nearest even, saturating, a non-finite v to NaN) with its scale, an
// f32 [2] tensor in the backend's memory: [0] = s, a power of two, [1] = 1 / s, which the GEMM
// multiplies its products by (both exact). Scales and amaxes are read and written where the
// ops run, so a CUDA graph replays with the values its memory holds then.
#define PACKBERT_FP8_OPS(OP)                                                                       \
  /* fp8_cast: src [n, c] (f32, bf16 or f16) times scale[0] into out [n_out, c] and / or its       \
     transpose out_t [c, n_t] (both of one FP8 dtype), n_out, n_t >= n. Written 0: the rows of     \
     out (columns of out_t) from n on, and the rows whose entry in `rows` (optional, i32 [n],      \
     SeqLayout::token_seq) is negative, padding. amax (optional) f32 [1]:                          \
     amax = max(amax, |v|) over the values of the other rows, compared as IEEE bit patterns (a     \
     NaN above infinity), so that no order of the reduction changes it. With neither output the    \
     op takes the amax only (scale may then be none). */                                           \
  OP(fp8_cast,                                                                                     \
     (const Tensor& src, const Tensor& rows, const Tensor& scale, const Tensor& amax,              \
      const Tensor& out, const Tensor& out_t),                                                     \
     (src, rows, scale, amax, out, out_t))                                                         \
  /* fp8_gemm: out [n, m] = (a [n, k] b [m, k]^T) * a_scale[1] * b_scale[1], fp32 accumulation,    \
     then the options' epilogue, out rounded once. Both operands K-major (the layout cuBLASLt's    \
     FP8 GEMMs take), e4m3 or e5m2, not both e5m2; n, k and m multiples of 16 (the model pads      \
     its rows); out bf16, f16 or f32. The CPU computes exactly that: the operands widened and      \
     de-scaled (exact), an fp32 GEMM, the epilogue in fp32 (linear_forward's order). */            \
  OP(fp8_gemm,                                                                                     \
     (const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,              \
      const Tensor& out, const Fp8GemmOptions& options),                                           \
     (a, a_scale, b, b_scale, out, options))                                                       \
  /* Delayed scaling's bookkeeping over n operands, once per optimizer step (docs/fp8.md).         \
     fp8_amax_share: shared f64 [ranks, n] = 0 but row `rank` = amax f32 [n], widened: summed      \
     over ranks (one small all-reduce) it holds every rank's amax, exactly. */                     \
  OP(fp8_amax_share, (const Tensor& amax, int rank, const Tensor& shared), (amax, rank, shared))   \
  /* fp8_scale_update: per operand i, a = the largest |shared[r, i]| over the ranks (a NaN         \
     above everything). A finite a is pushed into history f32 [n, h] (row i, oldest first: the     \
     row shifts left by one), and then scales f32 [n, 2] = {s, 1 / s} with                         \
     s = fp8_scale(max of the row, fp8_max[i], margin, the previous s) (common/fp8_convert.h). A   \
     non-finite a (a step the overflow check skips) changes neither. amax f32 [n] is set to 0      \
     for the next step. */                                                                         \
  OP(fp8_scale_update,                                                                             \
     (const Tensor& shared, const Tensor& fp8_max, int margin, const Tensor& history,              \
      const Tensor& scales, const Tensor& amax),                                                   \
     (shared, fp8_max, margin, history, scales, amax))

}  // namespace packbert

namespace packbert::checks {

// fp8_cast: src [n, c] f32 / bf16 / f16; out [>= n, c] and / or out_t [c, >= n], one FP8 dtype;
// rows i32 [n], scale f32 [2], amax f32 [1].
struct Fp8CastDims {
  int64_t n = 0, c = 0, n_out = 0, n_t = 0;
};

inline Fp8CastDims fp8_cast_args(const OpArgs& a, const Tensor& src, const Tensor& rows,
                                 const Tensor& scale, const Tensor& amax, const Tensor& out,
                                 const Tensor& out_t) {
  PB_REQUIRE(src.defined() &&
                 (src.dtype == DType::f32 || src.dtype == DType::bf16 || src.dtype == DType::f16),
             "{}: src is {}, expected f32, bf16 or f16", a.op, src.str());
  a("src", src, src.dtype, {kAnyDim, kAnyDim});
  const int64_t n = src.dim(0), c = src.dim(1);
  PB_REQUIRE(out.defined() || out_t.defined() || amax.defined(),
             "{}: neither out, out_t nor amax given", a.op);
  const int64_t n_out = out.defined() ? out.dim(0) : n, n_t = out_t.defined() ? out_t.dim(1) : n;
  if (out.defined() || out_t.defined()) {
    const Tensor& first = out.defined() ? out : out_t;
    PB_REQUIRE(is_fp8(first.dtype), "{}: {} is {}, expected e4m3 or e5m2", a.op,
               out.defined() ? "out" : "out_t", first.str());
    a.optional("out", out, first.dtype, {kAnyDim, c});
    a.optional("out_t", out_t, first.dtype, {c, kAnyDim});
    PB_REQUIRE(n_out >= n && n_t >= n, "{}: {} rows of src, out has {} and out_t {} (>= {})", a.op,
               n, n_out, n_t, n);
    a("scale", scale, DType::f32, {2});
  } else {
    a.optional("scale", scale, DType::f32, {2});
  }
  a.optional("rows", rows, DType::i32, {n});
  a.optional("amax", amax, DType::f32, {1});
  return {n, c, n_out, n_t};
}

// fp8_gemm: out [n, m] = a [n, k] b [m, k]^T, a and b FP8 (not both e5m2), n, k, m % 16 == 0.
inline GemmDims fp8_gemm_args(const OpArgs& a, const Tensor& x, const Tensor& x_scale,
                              const Tensor& w, const Tensor& w_scale, const Tensor& out,
                              const Fp8GemmOptions& o) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"a", &x}, {"b", &w}})
    PB_REQUIRE(t->defined() && is_fp8(t->dtype), "{}: {} is {}, expected e4m3 or e5m2", a.op, name,
               t->str());
  PB_REQUIRE(!(x.dtype == DType::e5m2 && w.dtype == DType::e5m2),
             "{}: a and b are both e5m2 (FP8 GEMMs take e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3)",
             a.op);
  a("a", x, x.dtype, {kAnyDim, kAnyDim});
  const int64_t n = x.dim(0), k = x.dim(1);
  a("b", w, w.dtype, {kAnyDim, k});
  const int64_t m = w.dim(0);
  PB_REQUIRE(n % 16 == 0 && k % 16 == 0 && m % 16 == 0,
             "{}: n {}, k {}, m {}: each must be a multiple of 16 (FP8 GEMMs' tensor-core "
             "layout; the model pads its rows to 16)",
             a.op, n, k, m);
  a("a_scale", x_scale, DType::f32, {2});
  a("b_scale", w_scale, DType::f32, {2});
  PB_REQUIRE(out.defined() &&
                 (out.dtype == DType::f32 || out.dtype == DType::bf16 || out.dtype == DType::f16),
             "{}: out is {}, expected f32, bf16 or f16", a.op, out.str());
  a("out", out, out.dtype, {n, m});
  if (o.epilogue == Epilogue::none) {
    PB_REQUIRE(!o.bias.defined(), "{}: bias given with Epilogue::none", a.op);
  } else if (o.epilogue == Epilogue::bias) {
    a("bias", o.bias, DType::f32, {m});
  } else {
    a.optional("bias", o.bias, DType::f32, {m});  // as linear_forward: GELU without a bias
  }
  if (has_gelu(o.epilogue)) {
    a("pre", o.pre, out.dtype, {n, m});
    PB_REQUIRE(o.pre.data != out.data, "{}: pre may not alias out", a.op);
  } else {
    PB_REQUIRE(!o.pre.defined(), "{}: pre is only written by the GELU epilogues", a.op);
  }
  a.optional("dgelu_pre", o.dgelu_pre, out.dtype, {n, m});
  PB_REQUIRE(!o.dgelu_pre.defined() || o.epilogue == Epilogue::none,
             "{}: dgelu_pre with a forward epilogue", a.op);
  PB_REQUIRE(!o.accumulate || (o.epilogue == Epilogue::none && !o.dgelu_pre.defined()),
             "{}: accumulate with an epilogue or dgelu_pre", a.op);
  return {n, k, m};
}

// fp8_amax_share / fp8_scale_update: n operands, ranks rows, history h.
struct Fp8ScaleDims {
  int64_t n = 0, ranks = 0, h = 0;
};

inline Fp8ScaleDims fp8_amax_share_args(const OpArgs& a, const Tensor& amax, int rank,
                                        const Tensor& shared) {
  a("amax", amax, DType::f32, {kAnyDim});
  const int64_t n = amax.dim(0);
  a("shared", shared, DType::f64, {kAnyDim, n});
  PB_REQUIRE(rank >= 0 && rank < shared.dim(0), "{}: rank {} of {}", a.op, rank, shared.dim(0));
  return {n, shared.dim(0), 0};
}

inline Fp8ScaleDims fp8_scale_update_args(const OpArgs& a, const Tensor& shared,
                                          const Tensor& fp8_max, int margin, const Tensor& history,
                                          const Tensor& scales, const Tensor& amax) {
  a("shared", shared, DType::f64, {kAnyDim, kAnyDim});
  const int64_t ranks = shared.dim(0), n = shared.dim(1);
  a("fp8_max", fp8_max, DType::f32, {n});
  a("history", history, DType::f32, {n, kAnyDim});
  a("scales", scales, DType::f32, {n, 2});
  a("amax", amax, DType::f32, {n});
  PB_REQUIRE(history.dim(1) >= 1, "{}: an empty history", a.op);
  PB_REQUIRE(margin >= 0 && margin <= 64, "{}: margin {} outside [0, 64]", a.op, margin);
  return {n, ranks, history.dim(1)};
}

}  // namespace packbert::checks
