// The two FP8 formats of FP8 training, on raw bits, shared by the CPU backend and the CUDA
// kernels (PB_HD), so that both produce the same bytes:
//   E4M3  1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, 0x7F / 0xFF are NaN;
//         the largest finite value is 448 (0x7E). The forward's activations and weights.
//   E5M2  1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like (0x7C infinity, above it
//         NaN); the largest finite value is 57344 (0x7B). The gradients.
// Both are NVIDIA's __nv_fp8_e4m3 / __nv_fp8_e5m2 (and the OCP FP8 formats).
//
// Casting rounds to nearest even and saturates: a finite value beyond the largest finite one
// becomes it (with its sign); a non-finite input (NaN, infinity) becomes NaN, so that a step
// that overflowed stays visible to the overflow check. Subnormals are kept (E4M3 down to 2^-9,
// E5M2 to 2^-16); below half the smallest one a value is a signed zero. Widening is exact.
// The scaled cast fp8(x * scale) with a power-of-two scale is exact up to that rounding, and
// x * scale and the de-scaling q / scale are exact in fp32 (fp8_scale).
#pragma once

#include <stdint.h>

#include "kernels/common/host_device.h"
#include "kernels/common/lowp_convert.h"

namespace packbert::fp8 {

constexpr float kE4M3Max = 448.f;
constexpr float kE5M2Max = 57344.f;

// Rounds |x| (fp32 bits a, finite, not NaN) to a format of M mantissa bits and exponent bias B
// whose largest finite magnitude pattern is max_bits: the magnitude pattern.
template <int M, int B>
PB_HD uint32_t round_magnitude(uint32_t a, uint32_t max_bits) {
  const uint32_t e = a >> 23;                 // fp32's biased exponent
  if (e >= static_cast<uint32_t>(128 - B)) {  // a normal of the format (>= 2^(1 - B))
    const uint32_t shift = 23 - M;
    const uint32_t r = a - (static_cast<uint32_t>(127 - B) << 23);  // rebias the exponent
    const uint32_t q = (r + ((1u << (shift - 1)) - 1u) + ((r >> shift) & 1u)) >> shift;
    return q > max_bits ? max_bits : q;  // a carry past the top saturates
  }
  // A subnormal (or zero): |x| in units of 2^(1 - B - M), rounded to nearest even; a carry to
  // 2^M is the smallest normal, which is right.
  const int shift = 150 - (B + M - 1) - static_cast<int>(e);  // >= 24 - M
  if (shift > 25) return 0;                                   // below half the smallest subnormal
  const uint32_t m = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return q;
}

PB_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = lowp::float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN, infinity: NaN
  return static_cast<uint8_t>(sign | round_magnitude<3, 7>(a, 0x7eu));
}

PB_HD uint8_t float_to_e5m2(float x) {
  const uint32_t u = lowp::float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);  // NaN, infinity: NaN
  return static_cast<uint8_t>(sign | round_magnitude<2, 15>(a, 0x7bu));
}

// Exact: the value of a pattern of M mantissa bits and bias B, NaN for nan_from and above.
template <int M, int B>
PB_HD float widen(uint8_t p, uint32_t nan_from, uint32_t inf_at) {
  const uint32_t sign = static_cast<uint32_t>(p & 0x80u) << 24, mag = p & 0x7fu;
  if (mag >= nan_from) return lowp::bits_float(sign | 0x7fc00000u);
  if (mag == inf_at) return lowp::bits_float(sign | 0x7f800000u);
  const uint32_t e = mag >> M, m = mag & ((1u << M) - 1u);
  if (e == 0) {  // subnormal: m * 2^(1 - B - M), exact in fp32
    float v = static_cast<float>(m);
    for (int i = 0; i < B + M - 1; ++i) v *= 0.5f;
    return lowp::bits_float(sign | lowp::float_bits(v));
  }
  return lowp::bits_float(sign | ((e + 127u - B) << 23) | (m << (23 - M)));
}

PB_HD float e4m3_to_float(uint8_t p) { return widen<3, 7>(p, 0x7fu, 0x100u); }
PB_HD float e5m2_to_float(uint8_t p) { return widen<2, 15>(p, 0x7du, 0x7cu); }

// The byte of v in an FP8 operand of scale s (Backend::fp8_cast): fp8(v * s), the product
// rounded once to fp32 (exact for a power-of-two s, barring overflow or fp32 subnormals).
PB_HD uint8_t fp8_cast_value(float v, float s, bool e4m3) {
  const float x = v * s;
  return e4m3 ? float_to_e4m3(x) : float_to_e5m2(x);
}

// |v| as the bits an amax is compared by (fp8_cast): IEEE bit patterns of non-negative values
// order as the values do, with infinity above every finite value and NaN above infinity.
PB_HD uint32_t amax_bits(float v) { return lowp::float_bits(v) & 0x7fffffffu; }

// The binary exponent and the mantissa bits (of the value normalised to [1, 2)) of a positive
// finite fp32's bits, subnormals included.
PB_HD int binary_exponent(uint32_t b) {
  if (b >= 0x800000u) return static_cast<int>(b >> 23) - 127;
  int e = -126;  // a subnormal b * 2^-149: normalise
  while (!(b & 0x800000u)) b <<= 1, --e;
  return e;
}
PB_HD uint32_t mantissa_bits(uint32_t b) {
  if (b < 0x800000u)
    while (!(b & 0x800000u)) b <<= 1;
  return b & 0x7fffffu;
}

// The delayed-scaling scale of an operand: 2^(floor(log2(fp8_max / amax)) - margin), from the
// amax of the steps before (the history's maximum). An amax of 0 or one that is not finite keeps
// `previous`. The exponent is kept within [-126, 126], so the scale and its inverse are normal
// fp32 powers of two and multiplying by either is exact (barring overflow of the product).
PB_HD float fp8_scale(float amax, float fp8_max, int margin, float previous) {
  const uint32_t a = lowp::float_bits(amax) & 0x7fffffffu;
  if (a == 0 || a >= 0x7f800000u) return previous;
  // floor(log2(fp8_max / amax)) = E(fp8_max) - E(amax) - [mantissa(fp8_max) < mantissa(amax)]:
  // exact, no division or logarithm.
  const uint32_t m = lowp::float_bits(fp8_max);
  int k = binary_exponent(m) - binary_exponent(a) - (mantissa_bits(m) < mantissa_bits(a) ? 1 : 0) -
          margin;
  k = k < -126 ? -126 : k > 126 ? 126 : k;
  return lowp::bits_float(static_cast<uint32_t>(k + 127) << 23);
}

// One operand's delayed-scaling update (Backend::fp8_scale_update), the same code on every
// backend: the step's amax is the largest over the ranks' shared values (a NaN above all); a
// finite one shifts into the history (oldest first) and the scale pair {s, 1 / s} follows the
// history's maximum; a non-finite one changes nothing. The amax is reset for the next step.
PB_HD void fp8_update_operand(const double* shared, int64_t stride, int64_t ranks, float fp8_max,
                              int margin, float* history, int64_t h, float* scale_pair,
                              float* amax) {
  uint32_t top = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    const uint32_t b = amax_bits(static_cast<float>(shared[r * stride]));
    top = b > top ? b : top;
  }
  if (top < 0x7f800000u) {
    float largest = lowp::bits_float(top);
    for (int64_t j = 0; j + 1 < h; ++j) {
      history[j] = history[j + 1];
      largest = history[j] > largest ? history[j] : largest;
    }
    history[h - 1] = lowp::bits_float(top);
    const float s = fp8_scale(largest, fp8_max, margin, scale_pair[0]);
    scale_pair[0] = s;
    scale_pair[1] = 1.f / s;  // exact: a power of two within [2^-126, 2^126]
  }
  *amax = 0.f;
}

}  // namespace packbert::fp8
