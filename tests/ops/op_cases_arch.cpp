// The cases of the ops of ModernBERT-class encoders (kernels/ops/rotary.h): rotary_embedding
// against a double reference written here from the formulas (long double for the rotation),
// element by element within an error bound derived below from the case's own inputs; its
// inverse (the backward) also against central differences of the double forward. Another
// backend must lie within twice the bound of the CPU's run (both lie within the bound of the
// exact value).
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

}  // namespace packbert::test
