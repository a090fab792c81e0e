// Host conversions between f32 and bf16 / f16, and the staging of the low-precision adapter.
#include "kernels/cpu/cpu_lowp.h"

#include <cstring>

#include "kernels/common/lowp_convert.h"
#include "kernels/base/error.h"

namespace packbert::cpu {

namespace {

template <typename F>
void parallel_map(int64_t n, F f) {
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  if (n == 0) return;
  if (dst_dtype == src_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dst_dtype));
    return;
  }
  const auto* s16 = static_cast<const uint16_t*>(src);
  const auto* s32 = static_cast<const float*>(src);
  auto* d16 = static_cast<uint16_t*>(dst);
  auto* d32 = static_cast<float*>(dst);
  if (src_dtype == DType::f32 && dst_dtype == DType::bf16) {
    parallel_map(n, [&](int64_t i) { d16[i] = lowp::float_to_bf16(s32[i]); });
  } else if (src_dtype == DType::f32 && dst_dtype == DType::f16) {
    parallel_map(n, [&](int64_t i) { d16[i] = lowp::float_to_f16(s32[i]); });
  } else if (src_dtype == DType::bf16 && dst_dtype == DType::f32) {
    parallel_map(n, [&](int64_t i) { d32[i] = lowp::bf16_to_float(s16[i]); });
  } else if (src_dtype == DType::f16 && dst_dtype == DType::f32) {
    parallel_map(n, [&](int64_t i) { d32[i] = lowp::f16_to_float(s16[i]); });
  } else {
    PB_THROW("convert: {} to {} is not a conversion (f32 <-> bf16 / f16 only)",
             dtype_name(src_dtype), dtype_name(dst_dtype));
  }
}

float* LowpStaging::scratch(int slot, int64_t n) {
  PB_CHECK(slot >= 0 && slot < lowp::kMaxStaged, "staging slot {}", slot);
  if (slots_.size() <= static_cast<size_t>(slot)) slots_.resize(static_cast<size_t>(slot) + 1);
  std::vector<float>& s = slots_[static_cast<size_t>(slot)];
  if (s.size() < static_cast<size_t>(n)) s.resize(static_cast<size_t>(n));
  return s.data();
}

void LowpStaging::widen(const Tensor& dst, const Tensor& src) {
  PB_CHECK(dst.dtype == DType::f32 && lowp::is_lowp(src.dtype) && dst.numel() == src.numel(),
           "widen {} into {}", src.str(), dst.str());
  convert(dst.data, dst.dtype, src.data, src.dtype, src.numel());
}

void LowpStaging::narrow(const Tensor& dst, const Tensor& src) {
  PB_CHECK(src.dtype == DType::f32 && lowp::is_lowp(dst.dtype) && dst.numel() == src.numel(),
           "narrow {} into {}", src.str(), dst.str());
  convert(dst.data, dst.dtype, src.data, src.dtype, src.numel());
}

}  // namespace packbert::cpu
