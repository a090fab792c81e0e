// The FP8 ops' cases (backend.h, FP8): fp8_cast and fp8_gemm, with their references. The cast is
// checked byte for byte against tests/common/float_format.h's nearest-value search (independent of
// common/fp8_convert.h) and its amax against a plain maximum; every backend must write the CPU's
// bytes. The GEMM is checked element by element against a double-loop product of the de-scaled
// operands within the bound derived in fp8_gemm_expect; another backend against the CPU within
// twice that bound (both lie within it of the exact value).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "float_format.h"
#include "measure.h"
#include "kernels/common/fp8_convert.h"
#include "op_cases.h"

namespace packbert::test {

namespace {

using Vec = std::vector<double>;

const FloatFormat& format8(DType t) {
  static const FloatFormat e4m3 = e4m3_format(), e5m2 = e5m2_format();
  return t == DType::e4m3 ? e4m3 : e5m2;
}

// A scale tensor's values: {2^e, 2^-e}.
std::vector<float> scale_pair(int e) { return {std::ldexp(1.f, e), std::ldexp(1.f, -e)}; }

// Values of a wide dynamic range: normal(0, 1) times 2^u, u uniform in [-spread, spread].
std::vector<float> wide_values(std::mt19937_64& g, size_t n, int spread) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ue(-spread, spread);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(nd(g), ue(g));
  return v;
}

// ---- fp8_cast ---------------------------------------------------------------------------------
struct CastShape {
  int64_t n, c, n_out, n_t;  // n_out / n_t 0: that output not given
  bool rows;                 // with a padding mask
};

// The bytes and the amax the cast must give, from the inputs alone.
void expect_cast(const std::string& what, const OpRun& cpu, DType t, const CastShape& s) {
  const Vec src = cpu.doubles("src");
  const float scale = floats_of(cpu.buf("scale").bytes())[0];
  std::vector<int32_t> rows(static_cast<size_t>(s.n), 0);
  if (s.rows) {
    const std::vector<uint8_t> b = cpu.buf("rows").bytes();
    std::memcpy(rows.data(), b.data(), b.size());
  }
  uint32_t top = fp8::amax_bits(static_cast<float>(cpu.initial("amax")[0]));
  std::vector<uint8_t> want(static_cast<size_t>(s.n * s.c), 0);
  for (int64_t r = 0; r < s.n; ++r) {
    if (rows[static_cast<size_t>(r)] < 0) continue;
    for (int64_t j = 0; j < s.c; ++j) {
      const auto v = static_cast<float>(src[static_cast<size_t>(r * s.c + j)]);
      top = std::max(top, fp8::amax_bits(v));
      // The contract's product: v * s rounded once to fp32 (exact here: a power of two).
      want[static_cast<size_t>(r * s.c + j)] =
          static_cast<uint8_t>(format8(t).reference(static_cast<double>(v * scale)));
    }
  }
  auto same = [&](uint8_t got, uint8_t w) {
    return format8(t).is_nan(w) ? format8(t).is_nan(got) : got == w;
  };
  // out [n_out, c] and out_t [c, n_t]: element (r, j) at r * c + j, and at j * n_t + r.
  size_t bad = 0;
  auto check = [&](const char* name, int64_t n_rows, auto at) {
    const std::vector<uint8_t> got = cpu.buf(name).bytes();
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t j = 0; j < s.c; ++j) {
        const uint8_t w = r < s.n ? want[static_cast<size_t>(r * s.c + j)] : 0;
        const uint8_t g = got[static_cast<size_t>(at(r, j))];
        if (!same(g, w) && bad++ < 5)
          ADD_FAILURE() << what << ": " << name << " at row " << r << ", column " << j << " = 0x"
                        << std::hex << int(g) << ", want 0x" << int(w);
      }
  };
  if (s.n_out) check("out", s.n_out, [&](int64_t r, int64_t j) { return r * s.c + j; });
  if (s.n_t) check("out_t", s.n_t, [&](int64_t r, int64_t j) { return j * s.n_t + r; });
  EXPECT_EQ(bad, 0u) << what;
  uint32_t got_top;
  std::memcpy(&got_top, cpu.buf("amax").bytes().data(), 4);
  EXPECT_EQ(got_top, top) << what << ": amax " << lowp::bits_float(got_top) << ", want "
                          << lowp::bits_float(top);
}

OpCases fp8_cast_cases() {
  OpCases cases;
  const CastShape shapes[] = {
      {45, 40, 48, 48, true},  // rows padded to 16 both ways, a padding mask
      {45, 40, 45, 0, false},  // out only
      {70, 33, 0, 80, true},   // out_t only, odd widths (partial tiles)
      {1, 16, 16, 16, false},  // one row padded to 16
      {45, 40, 0, 0, true},    // the amax only
  };
  for (DType src_t : {DType::f32, DType::bf16})
    for (DType t : {DType::e4m3, DType::e5m2})
      for (const CastShape& s : shapes) {
        OpCase c;
        c.dtype = src_t;
        c.name = fmt::format("fp8_cast {} to {} n{} c{} out{} out_t{}{}", dtype_name(src_t),
                             dtype_name(t), s.n, s.c, s.n_out, s.n_t, s.rows ? " rows" : "");
        c.run = [=](OpRun& r) {
          auto& g = r.rng();
          // Scaled values from far below the smallest subnormal to beyond the largest finite.
          const std::vector<float> v = wide_values(g, static_cast<size_t>(s.n * s.c), 14);
          const int e = t == DType::e4m3 ? 3 : 1;
          std::vector<int32_t> rows(static_cast<size_t>(s.n));
          for (auto& x : rows) x = g() % 5 == 0 ? -1 : static_cast<int32_t>(g() % 7);
          const Tensor src = r.in("src", src_t, {s.n, s.c}, v, unchanged());
          const Tensor trows = s.rows ? r.in("rows", {s.n}, rows, unchanged()) : Tensor();
          const Tensor scale = r.in("scale", DType::f32, {2}, scale_pair(e), unchanged());
          const Tensor amax = r.acc("amax", DType::f32, {1}, {0.25f}, bits());
          const Tensor out = s.n_out ? r.out("out", t, {s.n_out, s.c}, bits()) : Tensor();
          const Tensor out_t = s.n_t ? r.out("out_t", t, {s.c, s.n_t}, bits()) : Tensor();
          r.backend().fp8_cast(src, trows, scale, amax, out, out_t);
        };
        c.reference = [=](const std::string& what, const OpRun& cpu) {
          expect_cast(what, cpu, t, s);
        };
        cases.push_back(std::move(c));
      }
  // Non-finite values: each becomes NaN and makes the amax non-finite (NaN above infinity),
  // except in a padding row, which is left out. Outputs start at 0 (out_any would not tell a
  // written NaN from the NaN pre-fill).
  for (DType t : {DType::e4m3, DType::e5m2}) {
    OpCase c;
    c.name = fmt::format("fp8_cast f32 to {} infinities and NaN", dtype_name(t));
    const CastShape s{4, 16, 4, 16, true};
    c.run = [=](OpRun& r) {
      std::vector<float> v = wide_values(r.rng(), 64, 4);
      const float inf = std::numeric_limits<float>::infinity();
      v[3] = inf;                                           // row 0: infinity
      v[16 + 5] = -inf;                                     // row 1
      v[32 + 7] = std::numeric_limits<float>::quiet_NaN();  // row 2: padding, left out
      const std::vector<int32_t> rows = {0, 0, -1, 1};
      const Tensor src = r.in("src", DType::f32, {4, 16}, v, unchanged());
      const Tensor trows = r.in("rows", {4}, rows, unchanged());
      const Tensor scale = r.in("scale", DType::f32, {2}, scale_pair(0), unchanged());
      const Tensor amax = r.acc("amax", DType::f32, {1}, {0.f}, bits());
      const std::vector<uint8_t> zeros(64, 0);
      const Tensor out = r.in_bits("out", t, {4, 16}, zeros.data(), bits());
      const Tensor out_t =
          r.in_bits("out_t", t, {16, 16}, std::vector<uint8_t>(256, 0).data(), bits());
      r.backend().fp8_cast(src, trows, scale, amax, out, out_t);
    };
    c.reference = [=](const std::string& what, const OpRun& cpu) {
      expect_cast(what, cpu, t, s);
      const float a = floats_of(cpu.buf("amax").bytes())[0];
      EXPECT_TRUE(std::isinf(a)) << what << ": amax " << a << " (infinity, the NaN left out)";
    };
    cases.push_back(std::move(c));
  }
  return cases;
}

// ---- fp8_gemm ---------------------------------------------------------------------------------
// The exact value of each output element and a bound on any backend's error, from the inputs.
// The operands are FP8 values times powers of two, so every product of two is exact in fp32
// (at most 4 x 4 significant bits) and the de-scaling too; what rounds is
// - the fp32 sum over k (any order): |error| <= gamma_k S, S = sum |products|, gamma_k =
//   k u / (1 - k u) with u = 2^-24; with the bias (or the accumulated value) one more term and
//   one more rounding: gamma_(k+1) (S + |b|) <= (k + 2) u (S + |b|);
// - the GELU in fp32 (common/math.h): |gelu'| <= 1.13 carries the error above, and erff / tanhf
//   and the few roundings of the formula add at most 8 u (|y| + |x|) (their absolute error near
//   zero is relative to x, where 1 + erf cancels);
// - the final rounding to out's type: half an ulp, <= 2^-8 |v| for bf16 (8 significant bits)
//   and 2^-11 |v| + 2^-25 for f16 (11 bits; half its smallest subnormal); fp32 outputs have it
//   inside the (k + 2) u term.
// The emulated cuBLASLt sums in double and rounds to fp32 and then to bf16: within the same.
struct GemmExpect {
  Vec out, pre, out_bound, pre_bound;
};

double round_bound(DType t, double v) {
  return t == DType::bf16  ? std::ldexp(std::abs(v), -8)
         : t == DType::f16 ? std::ldexp(std::abs(v), -11) + std::ldexp(1.0, -25)
                           : 0.0;
}

GemmExpect fp8_gemm_expect(const OpRun& r, DType ta, DType tb, DType out_t, Epilogue ep,
                           bool accumulate, bool dgelu, Gelu form, int64_t n, int64_t k,
                           int64_t m) {
  const std::vector<uint8_t> qa = r.buf("a").bytes(), qb = r.buf("b").bytes();
  const double ia = floats_of(r.buf("a_scale").bytes())[1];
  const double ib = floats_of(r.buf("b_scale").bytes())[1];
  const Vec bias = ep == Epilogue::none ? Vec() : r.doubles("bias");
  const Vec init = accumulate ? r.initial("out") : Vec();
  const Vec dpre = dgelu ? r.doubles("dgelu_pre") : Vec();
  const double u = std::ldexp(1.0, -24);
  auto widen = [](uint8_t q, DType t) {
    return static_cast<double>(t == DType::e4m3 ? fp8::e4m3_to_float(q) : fp8::e5m2_to_float(q));
  };
  GemmExpect e;
  const auto nm = static_cast<size_t>(n * m);
  e.out.resize(nm), e.out_bound.resize(nm), e.pre.resize(nm), e.pre_bound.resize(nm);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0, abs_sum = 0;
      for (int64_t q = 0; q < k; ++q) {
        const double p = widen(qa[static_cast<size_t>(i * k + q)], ta) * ia *
                         widen(qb[static_cast<size_t>(j * k + q)], tb) * ib;
        s += p;
        abs_sum += std::abs(p);
      }
      const size_t at = static_cast<size_t>(i * m + j);
      const double add = !bias.empty() ? bias[static_cast<size_t>(j)] : accumulate ? init[at] : 0.0;
      const double x = s + add;
      const double ex = static_cast<double>(k + 2) * u * (abs_sum + std::abs(add));
      double y = x, ey = ex;
      if (dgelu) {  // |gelu''| <= 0.6 is not needed: the derivative is taken at a given point
        const double p = dpre[at], c = 0.7978845608028654;
        double d;
        if (form == Gelu::tanh) {
          const double t = std::tanh(c * (p + 0.044715 * p * p * p));
          d = 0.5 * (1 + t) + 0.5 * p * (1 - t * t) * c * (1 + 3 * 0.044715 * p * p);
        } else {
          d = 0.5 * (1 + std::erf(p / std::sqrt(2.0))) +
              p * std::exp(-0.5 * p * p) / std::sqrt(2 * 3.141592653589793);
        }
        // |gelu'| <= 1.13 carries the product's error; the derivative's own fp32 error (erf /
        // tanh, exp and a few roundings) is at most 8 u (1 + |p|) absolute, times |x|.
        y = x * d;
        ey = 1.13 * ex + 8 * u * (1 + std::abs(p)) * std::abs(x) + u * std::abs(y);
      }
      if (has_gelu(ep)) {
        const double c = 0.7978845608028654;  // sqrt(2 / pi)
        y = gelu_of(ep) == Gelu::tanh ? 0.5 * x * (1 + std::tanh(c * (x + 0.044715 * x * x * x)))
                                      : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
        ey = 1.13 * ex + 8 * u * (std::abs(y) + std::abs(x));
        e.pre[at] = x;
        e.pre_bound[at] = ex + round_bound(out_t, std::abs(x) + ex);
      }
      e.out[at] = y;
      e.out_bound[at] = ey + round_bound(out_t, std::abs(y) + ey);
    }
  return e;
}

void expect_within(const std::string& what, const Vec& got, const Vec& want, const Vec& bound,
                   double factor) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]), b = factor * bound[i];
    if (b > 0) worst = std::max(worst, err / b);
    if (!(err <= b) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i]
                    << " within " << b;
  }
  EXPECT_EQ(bad, 0u) << what;
  print_bound(what + ": worst error / its derived bound", worst, 1.0);
}

struct GemmShape {
  int64_t n, k, m;
};

// FP8 bytes of random values cast with scale 2^e (as fp8_cast would write them; never NaN).
std::vector<uint8_t> fp8_operand(std::mt19937_64& g, DType t, size_t count, int e) {
  const std::vector<float> v = wide_values(g, count, 3);
  std::vector<uint8_t> q(count);
  for (size_t i = 0; i < count; ++i)
    q[i] = fp8::fp8_cast_value(v[i], std::ldexp(1.f, e), t == DType::e4m3);
  return q;
}

OpCases fp8_gemm_cases() {
  OpCases cases;
  struct Kind {
    const char* what;
    DType ta, tb, out;
    bool accumulate;
    bool dgelu = false;
    Gelu gelu = Gelu::erf;
  };
  // The three GEMMs of an FP8 linear layer: forward X W^T (E4M3 x E4M3, bf16 out), input
  // gradient dY W (E5M2 x E4M3), weight gradient dY^T X (E5M2 x E4M3, fp32 accumulated); and
  // E4M3 x E5M2 into f16.
  const Kind kinds[] = {
      {"forward", DType::e4m3, DType::e4m3, DType::bf16, false},
      {"dgrad", DType::e5m2, DType::e4m3, DType::bf16, false},
      {"wgrad", DType::e5m2, DType::e4m3, DType::f32, true},
      {"e4m3 x e5m2", DType::e4m3, DType::e5m2, DType::f16, false},
      // dx += (the residual's share first) and dx through the GELUs
      {"dgrad accumulate", DType::e5m2, DType::e4m3, DType::bf16, true},
      {"dgrad dgelu", DType::e5m2, DType::e4m3, DType::bf16, false, true},
      {"dgrad dgelu_tanh", DType::e5m2, DType::e4m3, DType::bf16, false, true, Gelu::tanh}};
  // Multiples of 16 (the op's contract); 48 rows and 80 columns are partial 32-wide tiles.
  const GemmShape shapes[] = {{48, 64, 48}, {16, 16, 16}, {128, 96, 80}};
  for (const Kind& kind : kinds)
    for (const GemmShape& s : shapes)
      for (Epilogue ep :
           {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu, Epilogue::bias_gelu_tanh}) {
        if (ep != Epilogue::none && std::string(kind.what) != "forward") continue;
        for (bool fast : {false, true}) {
          if (fast && (ep != Epilogue::none || s.n != 48)) continue;
          OpCase c;
          c.dtype = kind.out;
          c.name = fmt::format("fp8_gemm {} {} x {} to {} n{} k{} m{} {}{}", kind.what,
                               dtype_name(kind.ta), dtype_name(kind.tb), dtype_name(kind.out), s.n,
                               s.k, s.m, ep_name(ep), fast ? " fast_accum" : "");
          c.run = [=](OpRun& r) {
            auto& g = r.rng();
            const int ea = static_cast<int>(g() % 5) - 2, eb = static_cast<int>(g() % 5) - 1;
            const auto qa = fp8_operand(g, kind.ta, static_cast<size_t>(s.n * s.k), ea);
            const auto qb = fp8_operand(g, kind.tb, static_cast<size_t>(s.m * s.k), eb);
            const Tensor a = r.in_bits("a", kind.ta, {s.n, s.k}, qa.data(), unchanged());
            const Tensor b = r.in_bits("b", kind.tb, {s.m, s.k}, qb.data(), unchanged());
            const Tensor sa = r.in("a_scale", DType::f32, {2}, scale_pair(ea), unchanged());
            const Tensor sb = r.in("b_scale", DType::f32, {2}, scale_pair(eb), unchanged());
            const Tensor bias = ep == Epilogue::none
                                    ? Tensor()
                                    : r.in("bias", DType::f32, {s.m},
                                           randn(g, static_cast<size_t>(s.m)), unchanged());
            // Checked by compare (derived bounds), the guards by the runner.
            Fp8GemmOptions o;
            o.epilogue = ep;
            o.bias = bias;
            o.accumulate = kind.accumulate;
            o.fast_accum = fast;
            o.gelu = kind.gelu;
            if (kind.dgelu)
              o.dgelu_pre = r.in("dgelu_pre", kind.out, {s.n, s.m},
                                 randn(g, static_cast<size_t>(s.n * s.m), 2.f), unchanged());
            const Tensor out = kind.accumulate
                                   ? r.acc("out", kind.out, {s.n, s.m},
                                           randn(g, static_cast<size_t>(s.n * s.m)), Check{})
                                   : r.out("out", kind.out, {s.n, s.m}, Check{});
            if (has_gelu(ep)) o.pre = r.out("pre", kind.out, {s.n, s.m}, Check{});
            r.backend().fp8_gemm(a, sa, b, sb, out, o);
          };
          c.reference = [=](const std::string& what, const OpRun& cpu) {
            const GemmExpect e =
                fp8_gemm_expect(cpu, kind.ta, kind.tb, kind.out, ep, kind.accumulate, kind.dgelu,
                                kind.gelu, s.n, s.k, s.m);
            expect_within(what + " out", cpu.doubles("out"), e.out, e.out_bound, 1.0);
            if (has_gelu(ep))
              expect_within(what + " pre", cpu.doubles("pre"), e.pre, e.pre_bound, 1.0);
          };
          c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
            const GemmExpect e =
                fp8_gemm_expect(want, kind.ta, kind.tb, kind.out, ep, kind.accumulate, kind.dgelu,
                                kind.gelu, s.n, s.k, s.m);
            expect_within(what + " out", got.doubles("out"), want.doubles("out"), e.out_bound, 2.0);
            if (has_gelu(ep))
              expect_within(what + " pre", got.doubles("pre"), want.doubles("pre"), e.pre_bound,
                            2.0);
          };
          cases.push_back(std::move(c));
        }
      }
  return cases;
}

// ---- delayed scaling's bookkeeping --------------------------------------------------------------
// fp8_amax_share's one-hot rows, and fp8_scale_update against the rule computed in double with
// logarithms (common/fp8_convert.h computes it in integers): amaxes of every kind (0, tiny,
// huge, infinity, NaN) over three ranks, histories of 1 and 4, margins 0 and 2.
OpCases fp8_scaling_cases() {
  OpCases cases;
  for (int64_t h : {1, 4})
    for (int margin : {0, 2}) {
      OpCase c;
      c.name = fmt::format("fp8_scale_update ranks3 n40 history{} margin{}", h, margin);
      const int64_t n = 40, ranks = 3;
      c.run = [=](OpRun& r) {
        auto& g = r.rng();
        std::vector<float> amax = wide_values(g, static_cast<size_t>(n), 40);
        for (float& x : amax) x = std::abs(x);
        amax[0] = 0.f;
        amax[1] = std::numeric_limits<float>::infinity();
        amax[2] = std::numeric_limits<float>::quiet_NaN();
        amax[3] = 1e-40f;  // subnormal
        amax[4] = 3e38f;
        // The shared rows as the sum over ranks leaves them: rank 1's row from fp8_amax_share
        // on this backend, the other two drawn.
        const Tensor mine = r.in("amax", DType::f32, {n}, amax, Check{Check::exact, 0});
        const Tensor shared = r.out_any("shared", DType::f64, {ranks, n}, bits());
        r.backend().fp8_amax_share(mine, 1, shared);
        std::vector<double> others(static_cast<size_t>(ranks * n), 0.0);
        for (int64_t i = 0; i < n; ++i) {
          others[static_cast<size_t>(i)] = std::abs(std::ldexp(randn(g, 1)[0], 5));
          others[static_cast<size_t>(2 * n + i)] = i % 3 == 0 ? 0.0 : std::ldexp(1.0, -20);
        }
        std::vector<double> sum(static_cast<size_t>(ranks * n));
        r.backend().synchronize();
        const std::vector<uint8_t> sb = r.buf("shared").bytes();
        std::memcpy(sum.data(), sb.data(), sb.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += others[i];
        const Tensor summed = r.in_bits("summed", DType::f64, {ranks, n}, sum.data(), unchanged());
        std::vector<float> fmax(static_cast<size_t>(n)), hist(static_cast<size_t>(n * h)),
            scales(static_cast<size_t>(2 * n));
        for (int64_t i = 0; i < n; ++i) {
          fmax[static_cast<size_t>(i)] = i % 2 ? fp8::kE4M3Max : fp8::kE5M2Max;
          const int e = static_cast<int>(g() % 21) - 10;
          scales[static_cast<size_t>(2 * i)] = std::ldexp(1.f, e);
          scales[static_cast<size_t>(2 * i + 1)] = std::ldexp(1.f, -e);
          for (int64_t j = 0; j < h; ++j)
            hist[static_cast<size_t>(i * h + j)] =
                j == 0 && i % 5 == 0
                    ? 0.f
                    : std::ldexp(std::abs(randn(g, 1)[0]), static_cast<int>(g() % 9) - 4);
        }
        const Tensor tmax = r.in("fp8_max", DType::f32, {n}, fmax, unchanged());
        const Tensor th = r.acc("history", DType::f32, {n, h}, hist, bits());
        const Tensor ts = r.acc("scales", DType::f32, {n, 2}, scales, bits());
        const Tensor ta = r.acc("step amax", DType::f32, {n}, amax, bits());
        r.backend().fp8_scale_update(summed, tmax, margin, th, ts, ta);
      };
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        const Vec shared = cpu.doubles("shared"), summed = cpu.doubles("summed");
        const Vec amax = cpu.doubles("amax");
        for (int64_t q = 0; q < ranks * n; ++q) {
          const double want = q / n == 1 ? amax[static_cast<size_t>(q % n)] : 0.0;
          const double got = shared[static_cast<size_t>(q)];
          EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want) << what << " shared " << q;
        }
        const Vec fmax = cpu.doubles("fp8_max"), h0 = cpu.initial("history"),
                  s0 = cpu.initial("scales");
        const Vec h1 = cpu.doubles("history"), s1 = cpu.doubles("scales"),
                  a1 = cpu.doubles("step amax");
        for (int64_t i = 0; i < n; ++i) {
          double a = 0;
          bool nan = false;
          for (int64_t rk = 0; rk < ranks; ++rk) {
            const double v = std::abs(summed[static_cast<size_t>(rk * n + i)]);
            nan |= std::isnan(v);
            a = std::max(a, v);
          }
          std::vector<double> hist(h0.begin() + i * h, h0.begin() + (i + 1) * h);
          double scale = s0[static_cast<size_t>(2 * i)];
          if (!nan && std::isfinite(a)) {
            hist.erase(hist.begin());
            hist.push_back(a);
            const double top = *std::max_element(hist.begin(), hist.end());
            if (top > 0) {
              const double e = std::floor(std::log2(fmax[static_cast<size_t>(i)] / top)) - margin;
              scale = std::ldexp(1.0, static_cast<int>(std::clamp(e, -126.0, 126.0)));
            }
          }
          for (int64_t j = 0; j < h; ++j)
            EXPECT_EQ(h1[static_cast<size_t>(i * h + j)], hist[static_cast<size_t>(j)])
                << what << " operand " << i << " history " << j;
          EXPECT_EQ(s1[static_cast<size_t>(2 * i)], scale) << what << " operand " << i;
          EXPECT_EQ(s1[static_cast<size_t>(2 * i + 1)], 1.0 / scale) << what << " operand " << i;
          EXPECT_EQ(a1[static_cast<size_t>(i)], 0.0) << what << " amax reset " << i;
        }
      };
      cases.push_back(std::move(c));
    }
  return cases;
}

}  // namespace

OpCases fp8_op_cases_cast() { return fp8_cast_cases(); }
OpCases fp8_op_cases_gemm() { return fp8_gemm_cases(); }
OpCases fp8_op_cases_scaling() { return fp8_scaling_cases(); }

}  // namespace packbert::test
