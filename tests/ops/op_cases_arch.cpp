// The cases of the ops of ModernBERT-class encoders (kernels/ops/rotary.h, kernels/ops/glu.h):
// rotary_embedding, glu_forward and glu_backward, each against a double reference written here
// from the formulas (long double for the rotation), element by element within an error bound
// derived below from the case's own inputs; the backward ops also against central differences
// of the double forward. Another backend must lie within twice the bound of the CPU's run (both
// lie within the bound of the exact value).
//
// Bounds (u = 2^-24, fp32's unit roundoff; t16(v) = the rounding of v to a 16-bit output:
// 2^-8 |v| for bf16, 2^-11 |v| + 2^-25 for f16, 0 for f32):
// - rotary_embedding: out = x C - y S with C, S the cos and sin of the exact angle. A backend
//   computes the angle in double (relative error a few 2^-53: delta <= 2^-48 (1 + |angle|)
//   absolute after double cos / sin), rounds c = C (1 + e), |e| <= u, then two products and a
//   difference in fp32 (or an FMA: fewer roundings). To first order
//   |out' - out| <= 3 u (|x C| + |y S|) + delta (|x| + |y|); written 3 u (1 + 4 u) (...) +
//   2 delta (...) for the second-order terms, plus t16. Untouched elements (v, and the rows of
//   no sequence, each holding an infinity that a rotation would spread as NaN) have bound 0.
//   Rotary after its inverse: R^-1(A') with A' the computed forward; R^-1 keeps the pair's
//   norm, so |R^-1(A' - A)|_k <= bound_k + bound_partner, plus the inverse's own bound on A'.
//   The inverse's gradient check: the op's output against central differences (at x = 0, step
//   2^-10) of L(x) = sum dout . R(x) in double; R is linear, so a difference is the gradient but
//   for the double roundings of L's two terms and of C, S: 2^-48 (|dout_k| + |dout_partner|).
// - glu: the fp32 activation within E_act(a) = 8 u (|act(a)| + |a|) of the exact one (GELU: erff
//   / tanhf within 2 ulps, their argument's roundings, the 1 + erf or 1 + tanh rounding and the
//   factor 0.5 x, the cancellation of 1 + erf for a << 0 included: fp8_gemm_expect's bound;
//   SiLU: expf, 1 + e and the division, 4 u relative). The derivative within E_grad(a) = 8 u (1
//   + |a|) for GELU (erf; the cdf within 1.8 u, x pdf within 0.4 |x| (x^2 + 4) exp(-x^2 / 2) u <=
//   1.5 u, the sum's rounding) and SiLU (s within 4 u relative, 1 - s within 5 u absolute, times
//   x: 5.5 u |x| + 7 u in all); the tanh GELU's derivative carries 1 - t^2, which cancels where t
//   nears 1 (t within 4.3 u: tanhf's 2 ulps and its argument's 5 roundings times max v sech^2 v
//   = 0.45): 24 u + 5 u |a| (1 + 0.135 a^2). Then out = act(a) g: |g| E_act (1 + u) + u |out|
//   (1 + u); da = (dout g) act'(a): |dout g| E_grad (1 + 2 u) + 2.01 u |da|; dgate = dout act(a):
//   |dout| E_act (1 + u) + u |dgate| (1 + u); each plus t16 and 2^-130 for fp32 underflow.
//   Central differences of f = dout act(a) g (h = 2^-13 from a representable a, so a +- h is
//   exact): truncation |dout g| h^2 / 6 max |act'''| (<= 0.8 for the three activations), and
//   the double roundings of f, 2^-50 |f| / h.
// Swept (tests/seed_sweeps.txt; docs/testing.md, Margins): no failure in 200 seeds of the rotary
// cases and 1000 of the GLU cases; the worst error is 0.87 of its bound for rotary fp32 (three
// roundings, each near its worst at once), 0.2 for GLU fp32, and 0.998 for 16-bit outputs
// (where the final rounding's half ulp dominates).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "measure.h"
#include "op_cases.h"

namespace packbert::test {

namespace {

using Vec = std::vector<double>;

constexpr double kU = 0x1p-24;
constexpr double kFloor = 0x1p-130;

double t16(DType t, double v) {
  return t == DType::bf16  ? std::ldexp(std::abs(v), -8)
         : t == DType::f16 ? std::ldexp(std::abs(v), -11) + std::ldexp(1.0, -25)
                           : 0.0;
}

// Every element of got within factor * bound of want (a zero bound: equal); prints the worst
// error over its bound as a derived measure.
void expect_within(const std::string& what, const Vec& got, const Vec& want, const Vec& bound,
                   double factor) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  size_t bad = 0;
  double worst = 0;
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k] == want[k]) continue;  // (infinities too)
    const double err = std::abs(got[k] - want[k]), b = factor * bound[k];
    if (b > 0) worst = std::max(worst, err / b);
    if (!(err <= b) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << k << " is " << got[k] << ", want " << want[k]
                    << " within " << b;
  }
  EXPECT_EQ(bad, 0u) << what;
  print_bound(what + ": worst error / its derived bound", worst, 1.0);
}

// ---- rotary_embedding -------------------------------------------------------------------------
struct RopeShape {
  int64_t d;  // head dim
  int heads;
};

enum class RopeLayout { packed, padded, unpadded_padding, long_seq };

const char* layout_name(RopeLayout l) {
  switch (l) {
    case RopeLayout::packed: return "packed";
    case RopeLayout::padded: return "padded";
    case RopeLayout::unpadded_padding: return "unpadded+padding";
    case RopeLayout::long_seq: return "8200+5 tokens";
  }
  return "?";
}

// Sequences of different lengths with padding rows in each layout: packed into rows of 96,
// padded to 80, end to end with 7 padding rows and an empty slot; or one sequence of 8200
// tokens (positions past 8192) beside one of 5, then 3 padding rows.
HostLayout rope_layout(RopeLayout kind, std::mt19937_64& g) {
  if (kind == RopeLayout::long_seq) return with_empty_slots(unpadded({8200, 5}, {11, 12}), 3, 0);
  std::vector<int32_t> lens = {1, 2, 80};
  for (int k = 0; k < 5; ++k) lens.push_back(1 + static_cast<int32_t>(g() % 80));
  std::shuffle(lens.begin(), lens.end(), g);
  const std::vector<int64_t> ids = random_sample_ids(g, lens.size());
  switch (kind) {
    case RopeLayout::packed: return packed(lens, ids, 96);
    case RopeLayout::padded: return padded(lens, ids, 80);
    default: return with_empty_slots(unpadded(lens, ids), 7, 1);
  }
}

struct Expect {
  Vec value, bound;
};

// cos and sin of row r's angle for pair i (long double), and delta, the header's bound on a
// backend's angle and double cos / sin error.
struct RopeAngle {
  double c, s, delta;
};
RopeAngle rope_angle(const HostLayout& l, int64_t r, int64_t i, int64_t d, double theta) {
  const long double p = l.token_pos[static_cast<size_t>(r)];
  const long double angle =
      p * std::pow(static_cast<long double>(theta), -2.0L * i / static_cast<long double>(d));
  return {static_cast<double>(std::cos(angle)), static_cast<double>(std::sin(angle)),
          std::ldexp(1.0 + static_cast<double>(angle), -48)};
}

// The exact rotation of x [rows, 3 h] (by -angle with inverse) and the bound on a backend's
// output (the header's derivation).
Expect rope_expect(const Vec& x, const HostLayout& l, int64_t h, const RopeShape& s, double theta,
                   bool inverse, DType t) {
  const int64_t ld = 3 * h, half = s.d / 2;
  Expect e{x, Vec(x.size(), 0.0)};
  for (int64_t r = 0; r < l.rows; ++r) {
    if (l.token_seq[static_cast<size_t>(r)] < 0) continue;
    for (int64_t i = 0; i < half; ++i) {
      const RopeAngle an = rope_angle(l, r, i, s.d, theta);
      const double c = an.c, sn = inverse ? -an.s : an.s;
      for (int64_t head = 0; head < 2 * s.heads; ++head) {
        const auto a = static_cast<size_t>(r * ld + head * s.d + i), b = a + half;
        const double xa = x[a], xb = x[b];
        const double ra = xa * c - xb * sn, rb = xb * c + xa * sn;
        const double ea = 3 * kU * (1 + 4 * kU) * (std::abs(xa * c) + std::abs(xb * sn)) +
                          2 * an.delta * (std::abs(xa) + std::abs(xb)) + kFloor;
        const double eb = 3 * kU * (1 + 4 * kU) * (std::abs(xb * c) + std::abs(xa * sn)) +
                          2 * an.delta * (std::abs(xa) + std::abs(xb)) + kFloor;
        e.value[a] = ra;
        e.value[b] = rb;
        e.bound[a] = ea + t16(t, std::abs(ra) + ea);
        e.bound[b] = eb + t16(t, std::abs(rb) + eb);
      }
    }
  }
  return e;
}

// The partner of element k of a q / k row (its rotation pair), or k itself for v and padding.
size_t rope_partner(size_t k, const HostLayout& l, int64_t h, int64_t d) {
  const int64_t ld = 3 * h, r = static_cast<int64_t>(k) / ld, c = static_cast<int64_t>(k) % ld;
  if (l.token_seq[static_cast<size_t>(r)] < 0 || c >= 2 * h) return k;
  const int64_t half = d / 2;
  return c % d < half ? k + static_cast<size_t>(half) : k - static_cast<size_t>(half);
}

// Central differences (step 2^-10) of L(x) = sum dout . R(x) in double (R the forward rotation)
// wrt every element, and their bound (the header's): the gradient the inverse must give.
Expect rope_fd_gradient(const Vec& dout, const HostLayout& l, int64_t h, const RopeShape& s,
                        double theta) {
  const double step = std::ldexp(1.0, -10);
  const int64_t ld = 3 * h, half = s.d / 2;
  Expect e{Vec(dout.size()), Vec(dout.size())};
  for (size_t k = 0; k < dout.size(); ++k) {
    const size_t p = rope_partner(k, l, h, s.d);
    const int64_t r = static_cast<int64_t>(k) / ld;
    // The loss restricted to the outputs x_k reaches (its pair), with x = xk e_k.
    auto loss = [&](double xk) {
      if (p == k) return dout[k] * xk;
      const RopeAngle an = rope_angle(l, r, static_cast<int64_t>(k) % ld % s.d % half, s.d, theta);
      const bool first = p > k;  // k is x_i, p is x_(i + d/2)
      const double out_k = xk * an.c, out_p = first ? xk * an.s : -xk * an.s;
      return dout[k] * out_k + dout[p] * out_p;
    };
    e.value[k] = (loss(step) - loss(-step)) / (2 * step);
    e.bound[k] = std::ldexp(std::abs(dout[k]) + std::abs(dout[p]), -48);
  }
  return e;
}

struct RopeCase {
  RopeShape shape;
  RopeLayout layout;
  float theta;
  bool inverse;
  bool roundtrip;  // (with inverse false) also rotary then its inverse on a second copy
  DType dtype;
};

OpCase rope_case(const RopeCase& rc) {
  OpCase c;
  c.dtype = rc.dtype;
  const RopeShape s = rc.shape;
  const int64_t h = s.d * s.heads;
  c.name = fmt::format("rotary_embedding {} d{} heads{} {} theta{}{}{}", dtype_name(rc.dtype), s.d,
                       s.heads, layout_name(rc.layout), rc.theta, rc.inverse ? " inverse" : "",
                       rc.roundtrip ? " roundtrip" : "");
  c.run = [=](OpRun& r) {
    const HostLayout hl = rope_layout(rc.layout, r.rng());
    const SeqLayout l = r.layout(hl);
    std::vector<float> x = randn(r.rng(), static_cast<size_t>(hl.rows * 3 * h));
    // An infinity in each row of no sequence: rotating it (even by the angle 0 of position 0)
    // would make its partner NaN, so "untouched" is checked, not only "unchanged by 0".
    for (int64_t row = 0; row < hl.rows; ++row)
      if (hl.token_seq[static_cast<size_t>(row)] < 0)
        x[static_cast<size_t>(row * 3 * h)] = std::numeric_limits<float>::infinity();
    const Tensor qkv = r.acc("qkv", rc.dtype, {hl.rows, 3 * h}, x, Check{});
    r.backend().rotary_embedding(l, qkv, s.heads, rc.theta, rc.inverse);
    if (rc.roundtrip) {
      const Tensor rt = r.acc("qkv roundtrip", rc.dtype, {hl.rows, 3 * h}, x, Check{});
      r.backend().rotary_embedding(l, rt, s.heads, rc.theta, false);
      r.backend().rotary_embedding(l, rt, s.heads, rc.theta, true);
    }
  };
  // The forward's expectation from a run's inputs, and the round trip's from its forward output.
  auto expect = [=](const OpRun& run) {
    return rope_expect(run.initial("qkv"), run.host_layout(0), h, s, rc.theta, rc.inverse,
                       rc.dtype);
  };
  auto roundtrip_bound = [=](const OpRun& run, const Expect& fwd) {
    const HostLayout& l = run.host_layout(0);
    const Vec a = run.doubles("qkv");  // the computed forward (rc.inverse is false here)
    const Expect back = rope_expect(a, l, h, s, rc.theta, true, rc.dtype);
    Vec b(a.size());
    for (size_t k = 0; k < a.size(); ++k) {
      const size_t p = rope_partner(k, l, h, s.d);
      b[k] = back.bound[k] + fwd.bound[k] + (p == k ? 0.0 : fwd.bound[p]);
    }
    return b;
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const Expect e = expect(cpu);
    expect_within(what + " qkv", cpu.doubles("qkv"), e.value, e.bound, 1.0);
    if (rc.roundtrip)
      expect_within(what + " roundtrip to the input", cpu.doubles("qkv roundtrip"),
                    cpu.initial("qkv"), roundtrip_bound(cpu, e), 1.0);
    if (!rc.inverse) return;
    // The inverse is the forward's gradient: against central differences of the forward.
    const Expect fd = rope_fd_gradient(cpu.initial("qkv"), cpu.host_layout(0), h, s, rc.theta);
    Vec b(fd.bound.size());
    for (size_t k = 0; k < b.size(); ++k) b[k] = e.bound[k] + fd.bound[k];
    expect_within(what + " qkv vs central differences of the forward", cpu.doubles("qkv"), fd.value,
                  b, 1.0);
  };
  c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
    const Expect e = expect(want);
    expect_within(what + " qkv", got.doubles("qkv"), want.doubles("qkv"), e.bound, 2.0);
    if (rc.roundtrip) {
      // Each run within its own bound (from its own forward output) of the input.
      Vec b = roundtrip_bound(want, e);
      const Vec bg = roundtrip_bound(got, e);
      for (size_t k = 0; k < b.size(); ++k) b[k] += bg[k];
      expect_within(what + " roundtrip", got.doubles("qkv roundtrip"),
                    want.doubles("qkv roundtrip"), b, 1.0);
    }
  };
  return c;
}

// ---- glu_forward / glu_backward ---------------------------------------------------------------
const char* act_name(GluAct a) {
  return a == GluAct::gelu ? "gelu" : a == GluAct::gelu_tanh ? "gelu_tanh" : "silu";
}

// The activations and their derivatives in double, from the formulas.
double act_d(GluAct a, double x) {
  const double k = std::sqrt(2.0 / M_PI);
  switch (a) {
    case GluAct::gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case GluAct::gelu_tanh: return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
    case GluAct::silu: return x / (1 + std::exp(-x));
  }
  return 0;
}
double act_grad_d(GluAct a, double x) {
  const double k = std::sqrt(2.0 / M_PI);
  switch (a) {
    case GluAct::gelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) * k / 2;
    case GluAct::gelu_tanh: {
      const double t = std::tanh(k * (x + 0.044715 * x * x * x));
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    }
    case GluAct::silu: {
      const double sg = 1 / (1 + std::exp(-x));
      return sg * (1 + x * (1 - sg));
    }
  }
  return 0;
}

// The header's bounds on the fp32 activation and derivative.
double act_error(GluAct a, double x) { return 8 * kU * (std::abs(act_d(a, x)) + std::abs(x)); }
double grad_error(GluAct a, double x) {
  if (a == GluAct::gelu_tanh) return 24 * kU + 5 * kU * std::abs(x) * (1 + 0.135 * x * x);
  return 8 * kU * (1 + std::abs(x));
}

struct GluShape {
  int64_t n, i;
};

// x [n, 2i]: the activation's half normal(0, 2) with saturating values (+-12, +-30) among them,
// the gate normal(0, 1).
std::vector<float> glu_input(std::mt19937_64& g, const GluShape& s) {
  std::vector<float> x = randn(g, static_cast<size_t>(s.n * 2 * s.i));
  const float extremes[] = {12.f, -12.f, 30.f, -30.f};
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t j = 0; j < s.i; ++j) {
      float& a = x[static_cast<size_t>(r * 2 * s.i + j)];
      a *= 2.f;
      if (g() % 16 == 0) a = extremes[g() % 4];
    }
  return x;
}

// The forward's exact out [n, i] and bound on a backend's (the header's).
Expect glu_forward_expect(const Vec& x, GluAct act, const GluShape& s, DType out_t) {
  Expect e{Vec(static_cast<size_t>(s.n * s.i)), Vec(static_cast<size_t>(s.n * s.i))};
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t j = 0; j < s.i; ++j) {
      const auto k = static_cast<size_t>(r * s.i + j), at = static_cast<size_t>(r * 2 * s.i + j);
      const double a = x[at], g = x[at + static_cast<size_t>(s.i)], y = act_d(act, a) * g;
      const double b =
          std::abs(g) * act_error(act, a) * (1 + kU) + kU * std::abs(y) * (1 + kU) + kFloor;
      e.value[k] = y;
      e.bound[k] = b + t16(out_t, std::abs(y) + b);
    }
  return e;
}

// The backward's exact dx [n, 2i] and bound; with `central`, the values are central differences
// of the double forward instead (and the bound adds their error).
Expect glu_backward_expect(const Vec& x, const Vec& dout, GluAct act, const GluShape& s, DType dx_t,
                           bool central) {
  const double step = std::ldexp(1.0, -13);
  Expect e{Vec(x.size()), Vec(x.size())};
  for (int64_t r = 0; r < s.n; ++r)
    for (int64_t j = 0; j < s.i; ++j) {
      const auto k = static_cast<size_t>(r * s.i + j), at = static_cast<size_t>(r * 2 * s.i + j);
      const size_t gt = at + static_cast<size_t>(s.i);
      const double a = x[at], g = x[gt], d = dout[k];
      double da = d * g * act_grad_d(act, a), dg = d * act_d(act, a);
      double ba =
          std::abs(d * g) * grad_error(act, a) * (1 + 2 * kU) + 2.01 * kU * std::abs(da) + kFloor;
      double bg =
          std::abs(d) * act_error(act, a) * (1 + kU) + kU * std::abs(dg) * (1 + kU) + kFloor;
      if (central) {
        auto f = [&](double av, double gv) { return d * act_d(act, av) * gv; };
        const double fa = std::abs(f(a + step, g)) + std::abs(f(a - step, g));
        da = (f(a + step, g) - f(a - step, g)) / (2 * step);
        ba += std::abs(d * g) * step * step / 6 * 0.8 + std::ldexp(fa, -50) / step;
        const double fg = std::abs(f(a, g + step)) + std::abs(f(a, g - step));
        dg = (f(a, g + step) - f(a, g - step)) / (2 * step);
        bg += std::ldexp(fg, -50) / step;
      }
      e.value[at] = da;
      e.value[gt] = dg;
      e.bound[at] = ba + t16(dx_t, std::abs(da) + ba);
      e.bound[gt] = bg + t16(dx_t, std::abs(dg) + bg);
    }
  return e;
}

struct GluCase {
  GluShape shape;
  GluAct act;
  DType x_t, y_t, dout_t;  // x; out (forward) or dx (backward); dout (backward)
};

std::string glu_dtypes(const GluCase& gc, bool backward) {
  if (gc.x_t == gc.y_t && (!backward || gc.dout_t == gc.x_t)) return dtype_name(gc.x_t);
  return backward ? fmt::format("x {} dout {} dx {}", dtype_name(gc.x_t), dtype_name(gc.dout_t),
                                dtype_name(gc.y_t))
                  : fmt::format("x {} out {}", dtype_name(gc.x_t), dtype_name(gc.y_t));
}

// The case's mode: the low-precision runs when any tensor is 16-bit.
DType glu_mode(const GluCase& gc, bool backward) {
  for (DType t : {gc.x_t, gc.y_t, backward ? gc.dout_t : DType::f32})
    if (is_lowp(t)) return t;
  return DType::f32;
}

OpCase glu_forward_case(const GluCase& gc) {
  OpCase c;
  const GluShape s = gc.shape;
  c.dtype = glu_mode(gc, false);
  c.name =
      fmt::format("glu_forward {} {} n{} i{}", act_name(gc.act), glu_dtypes(gc, false), s.n, s.i);
  c.run = [=](OpRun& r) {
    const Tensor x = r.in("x", gc.x_t, {s.n, 2 * s.i}, glu_input(r.rng(), s), unchanged());
    r.backend().glu_forward(x, gc.act, r.out("out", gc.y_t, {s.n, s.i}, Check{}));
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const Expect e = glu_forward_expect(cpu.initial("x"), gc.act, s, gc.y_t);
    expect_within(what + " out", cpu.doubles("out"), e.value, e.bound, 1.0);
  };
  c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
    const Expect e = glu_forward_expect(want.initial("x"), gc.act, s, gc.y_t);
    expect_within(what + " out", got.doubles("out"), want.doubles("out"), e.bound, 2.0);
  };
  return c;
}

OpCase glu_backward_case(const GluCase& gc) {
  OpCase c;
  const GluShape s = gc.shape;
  c.dtype = glu_mode(gc, true);
  c.name =
      fmt::format("glu_backward {} {} n{} i{}", act_name(gc.act), glu_dtypes(gc, true), s.n, s.i);
  c.run = [=](OpRun& r) {
    const Tensor x = r.in("x", gc.x_t, {s.n, 2 * s.i}, glu_input(r.rng(), s), unchanged());
    const Tensor dout = r.in("dout", gc.dout_t, {s.n, s.i},
                             randn(r.rng(), static_cast<size_t>(s.n * s.i)), unchanged());
    r.backend().glu_backward(x, dout, gc.act, r.out("dx", gc.y_t, {s.n, 2 * s.i}, Check{}));
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const Vec x = cpu.initial("x"), dout = cpu.initial("dout"), dx = cpu.doubles("dx");
    const Expect e = glu_backward_expect(x, dout, gc.act, s, gc.y_t, false);
    expect_within(what + " dx", dx, e.value, e.bound, 1.0);
    const Expect fd = glu_backward_expect(x, dout, gc.act, s, gc.y_t, true);
    expect_within(what + " dx vs central differences of the forward", dx, fd.value, fd.bound, 1.0);
  };
  c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
    const Expect e =
        glu_backward_expect(want.initial("x"), want.initial("dout"), gc.act, s, gc.y_t, false);
    expect_within(what + " dx", got.doubles("dx"), want.doubles("dx"), e.bound, 2.0);
  };
  return c;
}

const GluCase* glu_cases(size_t* count) {
  const DType f32 = DType::f32, bf16 = DType::bf16, f16 = DType::f16;
  static const GluCase cases[] = {
      // fp32: each activation over a few shapes (one row of one pair; odd widths; ModernBERT's
      // intermediate 1152 on a few rows)
      {{1, 1}, GluAct::gelu, f32, f32, f32},
      {{37, 64}, GluAct::gelu, f32, f32, f32},
      {{5, 333}, GluAct::gelu_tanh, f32, f32, f32},
      {{37, 64}, GluAct::gelu_tanh, f32, f32, f32},
      {{5, 333}, GluAct::silu, f32, f32, f32},
      {{37, 64}, GluAct::silu, f32, f32, f32},
      {{9, 1152}, GluAct::gelu, f32, f32, f32},
      // 16-bit: every tensor in one dtype, and mixed (each tensor on its own)
      {{37, 64}, GluAct::gelu, bf16, bf16, bf16},
      {{5, 333}, GluAct::gelu_tanh, f16, f16, f16},
      {{37, 64}, GluAct::silu, bf16, bf16, bf16},
      {{5, 333}, GluAct::silu, f16, f16, f16},
      {{13, 96}, GluAct::gelu, bf16, f32, f32},
      {{13, 96}, GluAct::silu, f32, f16, bf16},
  };
  *count = sizeof(cases) / sizeof(cases[0]);
  return cases;
}

}  // namespace

OpCases arch_op_cases_rotary() {
  const DType f32 = DType::f32, bf16 = DType::bf16, f16 = DType::f16;
  const RopeLayout packed_l = RopeLayout::packed, padded_l = RopeLayout::padded,
                   unpadded_l = RopeLayout::unpadded_padding, long_l = RopeLayout::long_seq;
  const RopeCase cases[] = {
      // fp32: head dims 16, 32, 64, 128 (odd head counts among them), every layout, both bases,
      // both directions, and the round trip
      {{16, 3}, packed_l, 10000.f, false, false, f32},
      {{32, 5}, padded_l, 160000.f, false, false, f32},
      {{64, 2}, unpadded_l, 10000.f, true, false, f32},
      {{128, 3}, packed_l, 160000.f, true, false, f32},
      {{64, 4}, unpadded_l, 10000.f, false, true, f32},
      {{128, 1}, padded_l, 160000.f, false, true, f32},
      // positions up to 8204 (one head of 16: few elements per row)
      {{16, 1}, long_l, 10000.f, false, true, f32},
      {{16, 1}, long_l, 160000.f, true, false, f32},
      // bf16 / f16
      {{64, 3}, packed_l, 160000.f, false, false, bf16},
      {{32, 5}, padded_l, 10000.f, true, false, f16},
      {{128, 1}, unpadded_l, 10000.f, false, true, f16},
      {{16, 3}, packed_l, 160000.f, false, true, bf16},
      {{16, 1}, long_l, 10000.f, false, true, bf16},
      {{16, 1}, long_l, 160000.f, true, false, f16},
  };
  OpCases out;
  for (const RopeCase& rc : cases) out.push_back(rope_case(rc));
  return out;
}

OpCases arch_op_cases_glu_forward() {
  size_t n = 0;
  const GluCase* cases = glu_cases(&n);
  OpCases out;
  for (size_t k = 0; k < n; ++k) out.push_back(glu_forward_case(cases[k]));
  return out;
}

OpCases arch_op_cases_glu_backward() {
  size_t n = 0;
  const GluCase* cases = glu_cases(&n);
  OpCases out;
  for (size_t k = 0; k < n; ++k) out.push_back(glu_backward_case(cases[k]));
  return out;
}

}  // namespace packbert::test
