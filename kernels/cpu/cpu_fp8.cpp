// FP8 on the CPU backend (kernels/ops/fp8.h): the cast into FP8 operands with its amax, the FP8
// GEMM emulated exactly as its contract reads -- the operands widened and de-scaled (exact:
// power-of-two scales), then linear_forward's fp32 GEMM and epilogue, the output rounded once --
// and delayed scaling's bookkeeping. So FP8 training runs and is tested on any machine, and the
// CUDA backend is compared with it.
#include <algorithm>
#include <cstring>

#include "kernels/common/fp8_convert.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/ops/fp8.h"

namespace packbert {

namespace {

float load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::bf16: return lowp::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::f16: return lowp::f16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

float widen_fp8(uint8_t q, DType t) {
  return t == DType::e4m3 ? fp8::e4m3_to_float(q) : fp8::e5m2_to_float(q);
}

}  // namespace

void CpuBackend::fp8_cast(const Tensor& src, const Tensor& rows, const Tensor& scale,
                          const Tensor& amax, const Tensor& out, const Tensor& out_t) {
  const checks::OpArgs args("fp8_cast", Device::cpu);
  const auto [n, c, n_out, n_t] = checks::fp8_cast_args(args, src, rows, scale, amax, out, out_t);
  const bool cast = out.defined() || out_t.defined();
  const bool e4m3 = cast && (out.defined() ? out : out_t).dtype == DType::e4m3;
  const float s = cast ? scale.ptr<float>()[0] : 1.f;
  const int32_t* row_seq = rows.defined() ? rows.ptr<int32_t>() : nullptr;
  uint8_t* o = out.defined() ? static_cast<uint8_t*>(out.data) : nullptr;
  uint8_t* ot = out_t.defined() ? static_cast<uint8_t*>(out_t.data) : nullptr;
  uint32_t top = amax.defined() ? fp8::amax_bits(amax.ptr<float>()[0]) : 0;
#pragma omp parallel for schedule(static) reduction(max : top) if (n * c >= 65536)
  for (int64_t r = 0; r < n; ++r) {
    const bool keep = !row_seq || row_seq[r] >= 0;
    for (int64_t j = 0; j < c; ++j) {
      uint8_t q = 0;
      if (keep) {
        const float v = load(src.data, src.dtype, r * c + j);
        top = std::max(top, fp8::amax_bits(v));
        if (cast) q = fp8::fp8_cast_value(v, s, e4m3);
      }
      if (o) o[r * c + j] = q;
      if (ot) ot[j * n_t + r] = q;
    }
  }
  if (o && n_out > n) std::memset(o + n * c, 0, static_cast<size_t>((n_out - n) * c));
  if (ot && n_t > n)
    for (int64_t j = 0; j < c; ++j) std::memset(ot + j * n_t + n, 0, static_cast<size_t>(n_t - n));
  if (amax.defined()) amax.ptr<float>()[0] = lowp::bits_float(top);
}

void CpuBackend::fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b,
                          const Tensor& b_scale, const Tensor& out, const Fp8GemmOptions& o) {
  const checks::OpArgs args("fp8_gemm", Device::cpu);
  const auto [n, k, m] = checks::fp8_gemm_args(args, a, a_scale, b, b_scale, out, o);
  if (n == 0 || m == 0) return;
  // Grow-only: the de-scaled operands, then (16-bit out) the fp32 out and pre.
  const bool narrow = out.dtype != DType::f32;
  const size_t need = static_cast<size_t>((n + m) * k + (narrow ? 2 * n * m : 0));
  if (fp8_scratch_.size() < need) fp8_scratch_.resize(need);
  float* wa = fp8_scratch_.data();
  float* wb = wa + n * k;
  const float inv_a = a_scale.ptr<float>()[1], inv_b = b_scale.ptr<float>()[1];
  const auto* qa = static_cast<const uint8_t*>(a.data);
  const auto* qb = static_cast<const uint8_t*>(b.data);
#pragma omp parallel for schedule(static) if ((n + m) * k >= 65536)
  for (int64_t i = 0; i < (n + m) * k; ++i)
    wa[i] =
        i < n * k ? widen_fp8(qa[i], a.dtype) * inv_a : widen_fp8(qb[i - n * k], b.dtype) * inv_b;
  const Tensor fa = view(wa, {n, k}), fb = view(wb, {m, k});
  float* f_out = narrow ? wb + m * k : out.ptr<float>();
  float* f_pre = f_out + n * m;  // 16-bit out only
  if (o.accumulate) {
    if (narrow) cpu::convert(f_out, DType::f32, out.data, out.dtype, n * m);
    cpu::gemm(false, true, n, m, k, 1.f, wa, k, wb, k, 1.f, f_out, m);
  } else if (o.dgelu_pre.defined()) {
    cpu::gemm(false, true, n, m, k, 1.f, wa, k, wb, k, 0.f, f_out, m);
    const float* pre = narrow ? f_pre : o.dgelu_pre.ptr<float>();
    if (narrow) cpu::convert(f_pre, DType::f32, o.dgelu_pre.data, o.dgelu_pre.dtype, n * m);
#pragma omp parallel for schedule(static) if (n * m >= 16384)
    for (int64_t r = 0; r < n; ++r) {
      if (o.gelu == Gelu::tanh)
        cpu::mul_gelu_tanh_grad(f_out + r * m, pre + r * m, m);
      else
        cpu::mul_gelu_grad(f_out + r * m, pre + r * m, m);
    }
  } else {
    const Tensor fp = has_gelu(o.epilogue) ? (narrow ? view(f_pre, {n, m}) : o.pre) : Tensor();
    linear_forward(fa, fb, o.bias, o.epilogue, view(f_out, {n, m}), fp);
    if (narrow && fp.defined()) cpu::convert(o.pre.data, o.pre.dtype, f_pre, DType::f32, n * m);
  }
  if (narrow) cpu::convert(out.data, out.dtype, f_out, DType::f32, n * m);
}

void CpuBackend::fp8_amax_share(const Tensor& amax, int rank, const Tensor& shared) {
  const checks::OpArgs args("fp8_amax_share", Device::cpu);
  const auto d = checks::fp8_amax_share_args(args, amax, rank, shared);
  double* out = shared.ptr<double>();
  std::fill(out, out + d.ranks * d.n, 0.0);
  for (int64_t i = 0; i < d.n; ++i) out[rank * d.n + i] = amax.ptr<float>()[i];
}

void CpuBackend::fp8_scale_update(const Tensor& shared, const Tensor& fp8_max, int margin,
                                  const Tensor& history, const Tensor& scales, const Tensor& amax) {
  const checks::OpArgs args("fp8_scale_update", Device::cpu);
  const auto d =
      checks::fp8_scale_update_args(args, shared, fp8_max, margin, history, scales, amax);
  for (int64_t i = 0; i < d.n; ++i)
    fp8::fp8_update_operand(shared.ptr<double>() + i, d.n, d.ranks, fp8_max.ptr<float>()[i], margin,
                            history.ptr<float>() + i * d.h, d.h, scales.ptr<float>() + 2 * i,
                            amax.ptr<float>() + i);
}

}  // namespace packbert
