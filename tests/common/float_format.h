// A binary floating-point storage format described independently of the converters under test
// (kernels/common/lowp_convert.h, kernels/common/fp8_convert.h): its non-negative patterns in
// increasing order with their values in double, and the reference rounding to it, "the nearest
// value, ties to the even pattern", found by a search over that table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace packbert::test {

// The fp32 of a bit pattern.
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

struct FloatFormat {
  const char* name;
  int mantissa_bits, exponent_bits;
  // true (bf16, f16, E5M2): IEEE's top exponent, infinity and NaNs. false (E4M3 of FP8 training,
  // "fn"): no infinity; the top exponent holds finite values, all ones is NaN.
  bool ieee_top;
  // Overflow gives the largest finite value instead of infinity, and a non-finite input NaN
  // (FP8 training's casts).
  bool saturate;
  // values[p] for p = 0 .. max_finite(), then one more: the next step of the top binade, which
  // IEEE's overflow rule rounds to as to infinity.
  std::vector<double> values;

  FloatFormat(const char* n, int mbits, int ebits, bool ieee, bool sat)
      : name(n), mantissa_bits(mbits), exponent_bits(ebits), ieee_top(ieee), saturate(sat) {
    for (uint32_t p = 0; p <= max_finite() + 1; ++p) values.push_back(value_of(p));
  }

  uint32_t sign_bit() const { return 1u << (mantissa_bits + exponent_bits); }
  uint32_t top() const { return ((1u << exponent_bits) - 1) << mantissa_bits; }
  uint32_t max_finite() const { return ieee_top ? top() - 1 : sign_bit() - 2; }
  uint32_t inf_pattern() const { return top(); }  // ieee_top only
  uint32_t nan_pattern() const { return sign_bit() - 1; }
  bool is_nan(uint32_t p) const {
    const uint32_t m = p & (sign_bit() - 1);
    return ieee_top ? m > top() : m == sign_bit() - 1;
  }
  // The magnitude of a pattern without its sign, from its fields (the pattern after the largest
  // finite one valued as its binade's next step).
  double value_of(uint32_t p) const {
    const int bias = (1 << (exponent_bits - 1)) - 1;
    const uint32_t e = p >> mantissa_bits, m = p & ((1u << mantissa_bits) - 1);
    const double frac = static_cast<double>(m) / static_cast<double>(1u << mantissa_bits);
    if (e == 0) return std::ldexp(frac, 1 - bias);
    return std::ldexp(1.0 + frac, static_cast<int>(e) - bias);
  }
  // The value of a pattern: signed, infinity and NaN included.
  double decode(uint32_t p) const {
    if (is_nan(p)) return std::numeric_limits<double>::quiet_NaN();
    const uint32_t m = p & (sign_bit() - 1);
    const double a = ieee_top && m == top() ? std::numeric_limits<double>::infinity() : value_of(m);
    return (p & sign_bit()) ? -a : a;
  }
  // The reference rounding of x (NaN: nan_pattern(), with x's sign).
  uint32_t reference(double x) const {
    const uint32_t sign = std::signbit(x) ? sign_bit() : 0u;
    const double a = std::fabs(x);
    if (std::isnan(x) || (saturate && std::isinf(x))) return sign | nan_pattern();
    if (saturate && a >= values[max_finite()]) return sign | max_finite();
    const auto it = std::lower_bound(values.begin(), values.end(), a);
    if (it == values.end()) return sign | inf_pattern();
    const auto hi = static_cast<uint32_t>(it - values.begin());
    if (values[hi] == a || hi == 0) return sign | hi;
    const uint32_t lo = hi - 1;
    const double dlo = a - values[lo], dhi = values[hi] - a;
    return sign | (dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1u) == 0 ? lo : hi));
  }
};

inline FloatFormat bf16_format() { return FloatFormat("bf16", 7, 8, true, false); }
inline FloatFormat f16_format() { return FloatFormat("f16", 10, 5, true, false); }
inline FloatFormat e4m3_format() { return FloatFormat("e4m3", 3, 4, false, true); }
inline FloatFormat e5m2_format() { return FloatFormat("e5m2", 2, 5, true, true); }

}  // namespace packbert::test
