// The fp32 <-> bf16 / f16 converters of kernels/common/lowp_convert.h against an independent
// reference: every 16-bit pattern round-trips; fp32 -> 16 bits is checked against "the nearest
// representable value, ties to the even pattern", found by a search over the table of all
// 16-bit values (infinity stands in as the next value above the largest finite one, which is
// exactly IEEE's overflow rule). Inputs: every exact midpoint and its fp32 neighbours, a stride
// over all 2^32 patterns, random floats, and the specials.
// Then the CPU backend's low-precision adapter (kernels/common/lowp_adapter.h), bit for bit
// against its definition: widen the inputs, run the fp32 op, round the outputs; accumulated
// outputs read-convert-add-round; aliased arguments stay aliased.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "kernels/common/lowp_convert.h"
#include "float_format.h"
#include "kernels/cpu/cpu_backend.h"
#include "test_util.h"

namespace packbert::test {
namespace {

using lowp::bf16_to_float;
using lowp::f16_to_float;
using lowp::float_to_bf16;
using lowp::float_to_f16;

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// A 16-bit format (tests/common/float_format.h) with the converters under test.
struct Format : FloatFormat {
  uint16_t (*narrow)(float);
  float (*widen)(uint16_t);
  Format(FloatFormat f, uint16_t (*nar)(float), float (*wid)(uint16_t))
      : FloatFormat(std::move(f)), narrow(nar), widen(wid) {}
};

Format bf16() { return Format(bf16_format(), float_to_bf16, bf16_to_float); }
Format f16() { return Format(f16_format(), float_to_f16, f16_to_float); }

void check_round_trip(const Format& fmt) {
  int64_t nans = 0;
  for (uint32_t p = 0; p < 65536; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const float f = fmt.widen(h);
    const uint32_t mag = p & 0x7fffu;
    if (mag > fmt.inf_pattern()) {  // NaN: stays NaN, same sign, quiet
      ASSERT_TRUE(std::isnan(f)) << fmt.name << " pattern " << std::hex << p;
      const uint16_t back = fmt.narrow(f);
      ASSERT_GT(back & 0x7fffu, fmt.inf_pattern()) << fmt.name << " NaN " << std::hex << p;
      ASSERT_EQ(back & 0x8000u, p & 0x8000u);
      ++nans;
      continue;
    }
    // Widening is exact: the value the format defines.
    const double expect =
        (p & 0x8000u ? -1.0 : 1.0) *
        (mag == fmt.inf_pattern() ? std::numeric_limits<double>::infinity() : fmt.values[mag]);
    ASSERT_EQ(static_cast<double>(f), expect) << fmt.name << " pattern " << std::hex << p;
    ASSERT_EQ(fmt.narrow(f), h) << fmt.name << " pattern " << std::hex << p;
  }
  EXPECT_GT(nans, 0);
}

void check_rounding(const Format& fmt, float f) {
  const uint16_t got = fmt.narrow(f), want = static_cast<uint16_t>(fmt.reference(f));
  ASSERT_EQ(got, want) << fmt.name << " of " << f << " (0x" << std::hex << to_bits(f) << ")";
}

void check_rounding_everywhere(const Format& fmt) {
  // Midpoints between neighbours (exact in fp32: at most 12 significant bits) and the fp32
  // values on either side of them: the cases a rounding bug shows in.
  for (size_t p = 0; p + 1 < fmt.values.size(); ++p) {
    const auto mid = static_cast<float>((fmt.values[p] + fmt.values[p + 1]) / 2);
    ASSERT_EQ(static_cast<double>(mid), (fmt.values[p] + fmt.values[p + 1]) / 2);
    for (float f : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e30f),
                    static_cast<float>(fmt.values[p])}) {
      check_rounding(fmt, f);
      check_rounding(fmt, -f);
    }
  }
  // A stride over every fp32 pattern (NaNs aside), both signs.
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 1021) {
    const float f = from_bits(static_cast<uint32_t>(u));
    if (!std::isnan(f)) check_rounding(fmt, f);
  }
  std::mt19937_64 rng(test_seed());
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; ++i) {
    const float f = from_bits(bits(rng));
    if (!std::isnan(f)) check_rounding(fmt, f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.f, -0.f, inf, -inf, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  65504.f, 65519.99f, 65520.f, 3.0e38f})
    check_rounding(fmt, f);
}

TEST(LowpConvert, Bf16RoundTripsEveryPattern) { check_round_trip(bf16()); }
TEST(LowpConvert, F16RoundTripsEveryPattern) { check_round_trip(f16()); }
TEST(LowpConvert, Bf16RoundsToNearestEven) { check_rounding_everywhere(bf16()); }
TEST(LowpConvert, F16RoundsToNearestEvenWithSubnormals) { check_rounding_everywhere(f16()); }

TEST(LowpConvert, KnownValues) {
  // bf16: 1 + 2^-8 is the midpoint of 1 and 1 + 2^-7: ties to even (1); a bit above rounds up.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // midpoint of 0x3f81 and 0x3f82: even
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  // f16: the largest finite, overflow at 65520, the smallest subnormal and its halfway point.
  EXPECT_EQ(float_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(float_to_f16(65519.f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.f), 0x7c00);
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);  // tie with 0: even
  EXPECT_EQ(float_to_f16(0x1p-25f * 1.0001f), 0x0001);
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f), 0x0002);         // tie between 1 and 2 ulps: even
  EXPECT_EQ(float_to_f16(-0x1p-14f), 0x8400);            // smallest normal
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x1p-25f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0x0001), 0x1p-24f);
  // NaN with a payload only in the low bits stays NaN (truncation would give infinity).
  const float low_nan = from_bits(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(low_nan))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(-low_nan))));
  EXPECT_TRUE(std::signbit(f16_to_float(float_to_f16(-low_nan))));
}

// ---- the CPU backend's adapter --------------------------------------------------------------

struct Lowp {
  DType t;
  std::vector<uint16_t> bits;
  std::vector<int64_t> dims;
  Lowp(DType type, const std::vector<float>& v, std::vector<int64_t> d)
      : t(type), dims(std::move(d)) {
    for (float x : v) bits.push_back(narrow(x));
  }
  uint16_t narrow(float x) const { return t == DType::bf16 ? float_to_bf16(x) : float_to_f16(x); }
  float widen(uint16_t h) const { return t == DType::bf16 ? bf16_to_float(h) : f16_to_float(h); }
  std::vector<float> wide() const {
    std::vector<float> w;
    for (uint16_t h : bits) w.push_back(widen(h));
    return w;
  }
  Tensor tensor() {
    Tensor v(bits.data(), t, {}, Device::cpu);
    v.ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) v.shape[i] = dims[i];
    return v;
  }
  // The rounded values of an fp32 result, as the adapter must have stored them.
  std::vector<uint16_t> rounded(const std::vector<float>& v) const {
    std::vector<uint16_t> r;
    for (float x : v) r.push_back(narrow(x));
    return r;
  }
};

std::vector<float> randn(std::mt19937_64& rng, size_t n, float s = 1.f) {
  std::normal_distribution<float> nd(0.f, s);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

class LowpAdapter : public ::testing::TestWithParam<DType> {};

TEST_P(LowpAdapter, LinearIsTheFp32OpOnWidenedInputsRounded) {
  const DType t = GetParam();
  std::mt19937_64 rng(test_seed());
  auto be = make_cpu_backend();
  const int64_t n = 37, k = 24, m = 19;
  Lowp x(t, randn(rng, n * k), {n, k}), w(t, randn(rng, m * k, 0.2f), {m, k});
  std::vector<float> bias = randn(rng, m);
  Lowp out(t, std::vector<float>(n * m), {n, m}), pre(t, std::vector<float>(n * m), {n, m});
  be->linear_forward(x.tensor(), w.tensor(), view(bias.data(), {m}), Epilogue::bias_gelu,
                     out.tensor(), pre.tensor());
  std::vector<float> xw = x.wide(), ww = w.wide(), of(n * m), pf(n * m);
  be->linear_forward(view(xw.data(), {n, k}), view(ww.data(), {m, k}), view(bias.data(), {m}),
                     Epilogue::bias_gelu, view(of.data(), {n, m}), view(pf.data(), {n, m}));
  EXPECT_EQ(out.bits, out.rounded(of));
  EXPECT_EQ(pre.bits, pre.rounded(pf));

  // Backward: dout through gelu in place (read and written), dx accumulated (read-convert-
  // add-round), dw and db in fp32.
  Lowp dout(t, randn(rng, n * m), {n, m}), dx(t, randn(rng, n * k), {n, k});
  std::vector<float> dw(m * k, 0.5f), db(m, 0.25f);
  std::vector<float> dof = dout.wide(), dxf = dx.wide(), dwf = dw, dbf = db;
  LinearBackwardOptions o;
  o.out_gelu_pre = pre.tensor();
  o.dx_accumulate = true;
  be->linear_backward(x.tensor(), w.tensor(), dout.tensor(), dx.tensor(), view(dw.data(), {m, k}),
                      view(db.data(), {m}), o);
  std::vector<float> pw = pre.wide();
  LinearBackwardOptions of32 = o;
  of32.out_gelu_pre = view(pw.data(), {n, m});
  be->linear_backward(view(xw.data(), {n, k}), view(ww.data(), {m, k}), view(dof.data(), {n, m}),
                      view(dxf.data(), {n, k}), view(dwf.data(), {m, k}), view(dbf.data(), {m}),
                      of32);
  EXPECT_EQ(dout.bits, dout.rounded(dof));
  EXPECT_EQ(dx.bits, dx.rounded(dxf));
  EXPECT_EQ(0, std::memcmp(dw.data(), dwf.data(), dw.size() * 4));
  EXPECT_EQ(0, std::memcmp(db.data(), dbf.data(), db.size() * 4));
}

TEST_P(LowpAdapter, AliasedArgumentsStayAliased) {
  const DType t = GetParam();
  std::mt19937_64 rng(test_seed() + 1);
  auto be = make_cpu_backend();
  const int64_t rows = 9, h = 32;
  // residual_layernorm_forward with ln_in = x (the model's in-place form).
  Lowp x(t, randn(rng, rows * h), {rows, h}), res(t, randn(rng, rows * h), {rows, h});
  Lowp out(t, std::vector<float>(rows * h), {rows, h});
  std::vector<float> gamma = randn(rng, h), beta = randn(rng, h), bias = randn(rng, h);
  std::vector<float> mean(rows), rstd(rows);
  std::vector<float> xf = x.wide(), rf = res.wide(), of(rows * h), mf(rows), sf(rows);
  const LayerNormParams ln{view(gamma.data(), {h}), view(beta.data(), {h})};
  be->residual_layernorm_forward(SeqLayout{}, x.tensor(), view(bias.data(), {h}), res.tensor(), ln,
                                 Dropout{}, out.tensor(), x.tensor(), view(mean.data(), {rows}),
                                 view(rstd.data(), {rows}));
  be->residual_layernorm_forward(SeqLayout{}, view(xf.data(), {rows, h}), view(bias.data(), {h}),
                                 view(rf.data(), {rows, h}), ln, Dropout{},
                                 view(of.data(), {rows, h}), view(xf.data(), {rows, h}),
                                 view(mf.data(), {rows}), view(sf.data(), {rows}));
  EXPECT_EQ(out.bits, out.rounded(of));
  EXPECT_EQ(x.bits, x.rounded(xf));  // ln_in = h, written over x
  EXPECT_EQ(0, std::memcmp(mean.data(), mf.data(), rows * 4));
  EXPECT_EQ(0, std::memcmp(rstd.data(), sf.data(), rows * 4));
  // softmax_cross_entropy with dlogits = logits, in place.
  const int64_t v = 11;
  Lowp logits(t, randn(rng, rows * v), {rows, v});
  std::vector<int32_t> labels(rows);
  for (int64_t i = 0; i < rows; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % v);
  std::vector<float> lf = logits.wide();
  float loss = 0.f, loss_f = 0.f;
  int32_t ok = 0, ok_f = 0;
  be->softmax_cross_entropy(logits.tensor(), view(labels.data(), {rows}), 0.5f, view(&loss, {1}),
                            view(&ok, {1}), logits.tensor());
  be->softmax_cross_entropy(view(lf.data(), {rows, v}), view(labels.data(), {rows}), 0.5f,
                            view(&loss_f, {1}), view(&ok_f, {1}), view(lf.data(), {rows, v}));
  EXPECT_EQ(logits.bits, logits.rounded(lf));
  EXPECT_EQ(loss, loss_f);
  EXPECT_EQ(ok, ok_f);
}

TEST_P(LowpAdapter, ConvertAndContractErrors) {
  const DType t = GetParam();
  auto be = make_cpu_backend();
  std::vector<float> f = {1.0f, -2.5f, 3.0e-3f, 65504.f, 1e6f};
  Lowp l(t, std::vector<float>(f.size()), {static_cast<int64_t>(f.size())});
  be->convert(l.tensor(), view(f.data(), {static_cast<int64_t>(f.size())}));
  EXPECT_EQ(l.bits, l.rounded(f));
  std::vector<float> back(f.size());
  be->convert(view(back.data(), {static_cast<int64_t>(f.size())}), l.tensor());
  EXPECT_EQ(back, l.wide());
  // LayerNorm statistics stay fp32: a low-precision mean is an error naming it.
  Lowp x(t, std::vector<float>(8), {2, 4}), o(t, std::vector<float>(8), {2, 4}),
      mean(t, {0.f, 0.f}, {2});
  std::vector<float> g(4, 1.f), b(4, 0.f), rstd(2);
  const std::string e = error_of([&] {
    be->residual_layernorm_forward(SeqLayout{}, x.tensor(), Tensor(), Tensor(),
                                   {view(g.data(), {4}), view(b.data(), {4})}, Dropout{},
                                   o.tensor(), x.tensor(), mean.tensor(), view(rstd.data(), {2}));
  });
  EXPECT_NE(e.find("residual_layernorm_forward: ln_mean"), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Cpu, LowpAdapter, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace packbert::test
