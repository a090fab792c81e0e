// __nv_bfloat16 for the emulated build: the conversions packbert's kernels use, with CUDA's
// rounding (round to nearest even; NaN becomes CUDA's canonical 0x7fff). bf16 is the upper half
// of an fp32, so widening is a shift.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t x;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fffu};
  // Round to nearest even on the 16 dropped bits: below half down, above half up, a tie to the
  // even kept value.
  const uint32_t kept = u >> 16, dropped = u & 0xffffu;
  const bool up = dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u));
  return __nv_bfloat16{static_cast<uint16_t>(kept + (up ? 1u : 0u))};
}
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
