// The FP8 converters of kernels/common/fp8_convert.h against an independent reference
// (tests/common/float_format.h: the formats' values from their fields, the nearest value with
// ties to the even pattern, saturation at the largest finite value, NaN for a non-finite input):
// every pattern widens to its value and narrows back; fp32 -> FP8 on every midpoint between
// neighbours and its fp32 neighbours, a stride over all 2^32 patterns, random patterns and the
// specials. Then the delayed-scaling scale against its definition, the largest k with
// amax * 2^k <= fp8_max, found by a search in exact double arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "float_format.h"
#include "kernels/common/fp8_convert.h"
#include "test_util.h"

namespace packbert::test {
namespace {

struct Fp8 : FloatFormat {
  uint8_t (*narrow)(float);
  float (*widen)(uint8_t);
  Fp8(FloatFormat f, uint8_t (*n)(float), float (*w)(uint8_t))
      : FloatFormat(std::move(f)), narrow(n), widen(w) {}
};
Fp8 e4m3() { return Fp8(e4m3_format(), fp8::float_to_e4m3, fp8::e4m3_to_float); }
Fp8 e5m2() { return Fp8(e5m2_format(), fp8::float_to_e5m2, fp8::e5m2_to_float); }

void check_every_pattern(const Fp8& f) {
  int nans = 0;
  for (uint32_t p = 0; p < 256; ++p) {
    const float w = f.widen(static_cast<uint8_t>(p));
    const double want = f.decode(p);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(w)) << f.name << " pattern " << p;
      ASSERT_TRUE(f.is_nan(f.narrow(w))) << f.name << " NaN " << p << " narrowed back";
      ++nans;
      continue;
    }
    ASSERT_EQ(static_cast<double>(w), want) << f.name << " pattern " << p;
    ASSERT_EQ(std::signbit(w), (p & 0x80u) != 0) << f.name << " pattern " << p;
    if (std::isinf(want)) {  // E5M2's infinity: a non-finite input casts to NaN
      ASSERT_TRUE(f.is_nan(f.narrow(w))) << f.name << " infinity " << p;
      continue;
    }
    ASSERT_EQ(f.narrow(w), p) << f.name << " pattern " << p << " narrowed back";
  }
  EXPECT_EQ(nans, f.ieee_top ? 6 : 2);  // E5M2 0x7D-0x7F, E4M3 0x7F, each with both signs
}

void check_rounding(const Fp8& f, float x) {
  const uint8_t got = f.narrow(x);
  const uint32_t want = f.reference(x);
  if (f.is_nan(want)) {
    ASSERT_TRUE(f.is_nan(got)) << f.name << " of " << x;
    ASSERT_EQ(got & 0x80u, want & 0x80u) << f.name << " of " << x << ": the sign";
    return;
  }
  ASSERT_EQ(got, want) << f.name << " of " << std::hexfloat << x;
}

void check_rounding_everywhere(const Fp8& f) {
  for (size_t p = 0; p + 1 < f.values.size(); ++p) {
    const double mid = (f.values[p] + f.values[p + 1]) / 2;
    const auto m = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(m), mid);  // exact: at most 5 significant bits
    for (float x :
         {m, std::nextafter(m, 0.f), std::nextafter(m, 1e30f), static_cast<float>(f.values[p])}) {
      check_rounding(f, x);
      check_rounding(f, -x);
    }
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 997)
    check_rounding(f, from_bits(static_cast<uint32_t>(u)));
  std::mt19937_64 rng(test_seed());
  for (int i = 0; i < 1000000; ++i) check_rounding(f, from_bits(static_cast<uint32_t>(rng())));
  // Values of the FP8 range's scale, where training's scaled casts land.
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int i = 0; i < 200000; ++i)
    check_rounding(f, u(rng) * static_cast<float>(f.values[f.max_finite()]) * 1.5f);
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.f, -0.f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min()})
    check_rounding(f, x);
}

TEST(Fp8Convert, E4M3EveryPattern) { check_every_pattern(e4m3()); }
TEST(Fp8Convert, E5M2EveryPattern) { check_every_pattern(e5m2()); }
TEST(Fp8Convert, E4M3RoundsToNearestEvenAndSaturates) { check_rounding_everywhere(e4m3()); }
TEST(Fp8Convert, E5M2RoundsToNearestEvenAndSaturates) { check_rounding_everywhere(e5m2()); }

// Values from the formats' definitions, by hand.
TEST(Fp8Convert, KnownValues) {
  using fp8::float_to_e4m3;
  using fp8::float_to_e5m2;
  // E4M3: 448 = 2^8 * 1.75 is 0 1111 110; 464 is halfway to the NaN slot's 480: saturates, as
  // does everything above; 2^-9 is the smallest subnormal, 2^-10 the tie with 0 (even: 0).
  EXPECT_EQ(float_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7f);
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);  // tie between 1 and 2 subnormal steps: even
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);          // 0 0111 000
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);       // halfway to 1.125: even (1.0)
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);       // halfway between 1.125 and 1.25: even (1.25)
  EXPECT_EQ(fp8::e4m3_to_float(0x7e), 448.f);
  EXPECT_TRUE(std::isnan(fp8::e4m3_to_float(0xff)));
  // E5M2: 57344 = 2^15 * 1.75 is 0 11110 11; 61440 is halfway to infinity: saturates.
  EXPECT_EQ(float_to_e5m2(57344.f), 0x7b);
  EXPECT_EQ(float_to_e5m2(61440.f), 0x7b);
  EXPECT_EQ(float_to_e5m2(-1e30f), 0xfb);
  EXPECT_EQ(float_to_e5m2(-std::numeric_limits<float>::infinity()), 0xff);
  EXPECT_EQ(float_to_e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3c);  // 0 01111 00
  EXPECT_TRUE(std::isinf(fp8::e5m2_to_float(0x7c)));
}

// The definition: the largest k with amax * 2^k <= fp8_max (double arithmetic with powers of
// two is exact here), less the margin, within [-126, 126].
float scale_by_search(float amax, float fp8_max, int margin) {
  int k = -400;
  while (std::ldexp(static_cast<double>(amax), k + 1) <= fp8_max) ++k;
  k -= margin;
  k = std::max(-126, std::min(126, k));
  return static_cast<float>(std::ldexp(1.0, k));
}

TEST(Fp8Scale, MatchesItsDefinition) {
  std::mt19937_64 rng(test_seed());
  for (float fmax : {fp8::kE4M3Max, fp8::kE5M2Max}) {
    std::vector<float> amaxes = {fmax,
                                 std::nextafter(fmax, 0.f),
                                 std::nextafter(fmax, 1e30f),
                                 1.f,
                                 0.5f,
                                 std::numeric_limits<float>::min(),
                                 std::numeric_limits<float>::denorm_min(),
                                 std::numeric_limits<float>::max(),
                                 fmax / 1024,
                                 fmax * 3};
    for (int i = 0; i < 20000; ++i) {
      const float a = std::fabs(from_bits(static_cast<uint32_t>(rng())));
      if (std::isfinite(a) && a > 0) amaxes.push_back(a);
    }
    for (float a : amaxes)
      for (int margin : {0, 1, 3}) {
        const float s = fp8::fp8_scale(a, fmax, margin, 7.f);
        ASSERT_EQ(s, scale_by_search(a, fmax, margin))
            << "amax " << std::hexfloat << a << " max " << fmax << " margin " << margin;
        int e = 0;
        ASSERT_EQ(std::frexp(s, &e), 0.5f) << "not a power of two: " << s;
      }
  }
  // No usable amax: the previous scale stays.
  for (float a :
       {0.f, -0.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(fp8::fp8_scale(a, fp8::kE4M3Max, 0, 0.25f), 0.25f) << a;
  // With margin 0 the scaled amax uses the top binade: in (fp8_max / 2, fp8_max].
  const float s = fp8::fp8_scale(3.7f, fp8::kE4M3Max, 0, 1.f);
  EXPECT_LE(3.7f * s, fp8::kE4M3Max);
  EXPECT_GT(3.7f * s, fp8::kE4M3Max / 2);
}

}  // namespace
}  // namespace packbert::test
