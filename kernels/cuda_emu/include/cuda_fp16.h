// __half for the emulated build: the conversions packbert's kernels use, with CUDA's rounding
// (round to nearest even; NaN becomes CUDA's canonical 0x7fff). The arithmetic is GCC's
// _Float16 (IEEE binary16, rounded by the compiler's runtime), an implementation independent of
// kernels/common/lowp_convert.h, which the tests compare against.
#pragma once

#include <cstdint>
#include <cstring>

struct __half {
  uint16_t x;
};
struct alignas(4) __half2 {
  __half x, y;
};

inline __half __float2half_rn(float f) {
  if (f != f) return __half{0x7fffu};
  const _Float16 h = static_cast<_Float16>(f);
  __half r;
  std::memcpy(&r.x, &h, 2);
  return r;
}
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.x, 2);
  return static_cast<float>(v);
}
inline __half2 __floats2half2_rn(float lo, float hi) {
  return __half2{__float2half_rn(lo), __float2half_rn(hi)};
}
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
