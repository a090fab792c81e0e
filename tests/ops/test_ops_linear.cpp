// linear_forward / linear_backward against double loops and finite differences.
#include <gtest/gtest.h>

#include "kernels/common/math.h"
#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"
#include "reference_ops.h"

namespace packbert::test {
namespace {

using ref::Vec;

const char* name(Epilogue e) {
  return e == Epilogue::none        ? "none"
         : e == Epilogue::bias      ? "bias"
         : e == Epilogue::bias_gelu ? "bias_gelu"
                                    : "bias_gelu_tanh";
}

// The double forward of each epilogue: y = act(x w^T + b).
Vec forward_ref(const Vec& x, const Vec& w, const Vec& b, Epilogue e, int64_t n, int64_t k,
                int64_t m, Vec* pre = nullptr) {
  Vec y = ref::linear(x, w, e == Epilogue::none ? nullptr : &b, n, k, m);
  if (pre) *pre = y;
  if (has_gelu(e))
    for (auto& v : y) v = ref::gelu(v, gelu_of(e));
  return y;
}

TEST(Linear, ForwardMatchesDouble) {
  auto rng = make_rng(11);
  auto be = make_cpu_backend();
  const int64_t shapes[][3] = {{37, 29, 53}, {1, 1, 1}, {130, 768, 96}, {64, 3, 7}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], k = s[1], m = s[2];
    const auto x = random_floats(rng, n * k), w = random_floats(rng, m * k, 0.2f),
               b = random_floats(rng, m);
    for (Epilogue e :
         {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu, Epilogue::bias_gelu_tanh}) {
      Guarded<float> out({n, m}), pre({n, m});
      const bool gelu = has_gelu(e);
      be->linear_forward(view(x.data(), {n, k}), view(w.data(), {m, k}),
                         e == Epilogue::none ? Tensor() : view(b.data(), {m}), e, out.tensor(),
                         gelu ? pre.tensor() : Tensor());
      Vec want_pre;
      const Vec want = forward_ref(to_double(x), to_double(w), to_double(b), e, n, k, m, &want_pre);
      const std::string what = fmt::format("linear_forward {} {}x{}x{}", name(e), n, k, m);
      EXPECT_OUTPUT_OK(out);
      expect_close(what, out.doubles(), want, kTol);
      if (gelu) {
        EXPECT_OUTPUT_OK(pre);
        expect_close(what + " pre", pre.doubles(), want_pre, kTol);
      }
    }
  }
}

// One backward configuration, checked against central differences of the double forward of
// L = sum(r * y) wrt every input.
struct BackwardCase {
  Epilogue epilogue;
  bool x_is_gelu;      // x = gelu(xp): dx must come out wrt xp (options.x_gelu_pre)
  bool dx_accumulate;  // dx += onto random values
  Gelu form = Gelu::erf;  // the GELU of x_is_gelu and options.gelu (the epilogue's, if any)
};

void check_backward(const BackwardCase& c, int64_t n, int64_t k, int64_t m, uint64_t salt) {
  auto rng = make_rng(salt);
  auto be = make_cpu_backend();
  const auto xp = random_floats(rng, n * k, 2.f), w = random_floats(rng, m * k, 0.5f),
             b = random_floats(rng, m), r = random_floats(rng, n * m);
  std::vector<float> x = xp;
  if (c.x_is_gelu)
    for (auto& v : x) v = c.form == Gelu::tanh ? gelu_tanh(v) : gelu(v);
  const bool gelu_out = has_gelu(c.epilogue);
  ASSERT_TRUE(!gelu_out || gelu_of(c.epilogue) == c.form);
  const bool has_bias = c.epilogue != Epilogue::none;

  // Forward (keeps pre for the gelu epilogue), then backward with dout = r.
  std::vector<float> y(n * m), pre(n * m);
  be->linear_forward(view(x.data(), {n, k}), view(w.data(), {m, k}),
                     has_bias ? view(b.data(), {m}) : Tensor(), c.epilogue,
                     view(y.data(), {n, m}), gelu_out ? view(pre.data(), {n, m}) : Tensor());
  std::vector<float> dout = r;  // overwritten in place when out_gelu_pre is given
  const auto dx0 = random_floats(rng, n * k), dw0 = random_floats(rng, m * k),
             db0 = random_floats(rng, m);
  Guarded<float> dx = c.dx_accumulate ? Guarded<float>({n, k}, dx0) : Guarded<float>({n, k});
  Guarded<float> dw({m, k}, dw0), db({m}, db0);
  LinearBackwardOptions opt;
  opt.gelu = c.form;
  if (gelu_out) opt.out_gelu_pre = view(pre.data(), {n, m});
  if (c.x_is_gelu) opt.x_gelu_pre = view(xp.data(), {n, k});
  opt.dx_accumulate = c.dx_accumulate;
  be->linear_backward(view(x.data(), {n, k}), view(w.data(), {m, k}), view(dout.data(), {n, m}),
                      dx.tensor(), dw.tensor(), has_bias ? db.tensor() : Tensor(), opt);

  // The double objective as a function of (xp, w, b).
  const Vec rd = to_double(r);
  Vec xv = to_double(xp), wv = to_double(w), bv = to_double(b);
  auto loss = [&](const Vec& xin, const Vec& win, const Vec& bin) {
    Vec xx = xin;
    if (c.x_is_gelu)
      for (auto& v : xx) v = ref::gelu(v, c.form);
    return dot_d(rd, forward_ref(xx, win, bin, c.epilogue, n, k, m));
  };
  const std::string what = fmt::format("linear_backward {}{}{} {}x{}x{}", name(c.epilogue),
                                       c.x_is_gelu ? c.form == Gelu::tanh ? " +x_gelu_pre (tanh)"
                                                                          : " +x_gelu_pre"
                                                   : "",
                                       c.dx_accumulate ? " +accumulate" : "", n, k, m);
  Vec gx = fd_gradient([&](const Vec& v) { return loss(v, wv, bv); }, xv, all_coords(xv.size()));
  if (c.dx_accumulate)
    for (size_t i = 0; i < gx.size(); ++i) gx[i] += dx0[i];
  Vec gw = fd_gradient([&](const Vec& v) { return loss(xv, v, bv); }, wv, all_coords(wv.size()));
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i];
  EXPECT_OUTPUT_OK(dx);
  EXPECT_OUTPUT_OK(dw);
  expect_close(what + " dx (FD)", dx.doubles(), gx, kTol);
  // Compare the accumulated increments, so the initial values do not hide an error.
  auto minus = [](Vec a, const std::vector<float>& b0) {
    for (size_t i = 0; i < a.size(); ++i) a[i] -= b0[i];
    return a;
  };
  expect_close(what + " dw (FD)", minus(dw.doubles(), dw0), minus(gw, dw0), kTol);
  if (has_bias) {
    const Vec gb = fd_gradient([&](const Vec& v) { return loss(xv, wv, v); }, bv, all_coords(bv.size()));
    EXPECT_OUTPUT_OK(db);
    expect_close(what + " db (FD)", minus(db.doubles(), db0), gb, kTol);
  } else {
    EXPECT_EQ(db.values(), db0);  // not passed: untouched
  }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const BackwardCase cases[] = {
      {Epilogue::none, false, false},     {Epilogue::bias, false, false},
      {Epilogue::bias_gelu, false, false}, {Epilogue::bias, true, false},
      {Epilogue::bias, false, true},      {Epilogue::bias_gelu, true, false},
  };
  uint64_t salt = 100;
  for (const auto& c : cases) check_backward(c, 9, 7, 5, salt++);
  check_backward({Epilogue::bias_gelu, false, false}, 33, 17, 24, salt++);
  // The tanh GELU: out of the epilogue, through x, and both (FFN2 of a tanh model).
  check_backward({Epilogue::bias_gelu_tanh, false, false, Gelu::tanh}, 9, 7, 5, salt++);
  check_backward({Epilogue::bias, true, false, Gelu::tanh}, 9, 7, 5, salt++);
  check_backward({Epilogue::bias_gelu_tanh, true, false, Gelu::tanh}, 33, 17, 24, salt++);
}

TEST(Linear, OptionalGradientsAreSkipped) {
  auto rng = make_rng(12);
  auto be = make_cpu_backend();
  const int64_t n = 6, k = 5, m = 4;
  const auto x = random_floats(rng, n * k), w = random_floats(rng, m * k), g = random_floats(rng, n * m);
  Guarded<float> dx({n, k});
  be->linear_backward(Tensor(), view(w.data(), {m, k}), view(g.data(), {n, m}), dx.tensor(),
                      Tensor(), Tensor(), {});
  EXPECT_OUTPUT_OK(dx);
  const Vec want = [&] {  // dx = g w
    Vec d(n * k, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < k; ++c)
        for (int64_t j = 0; j < m; ++j) d[i * k + c] += static_cast<double>(g[i * m + j]) * w[j * k + c];
    return d;
  }();
  expect_close("linear_backward dx only", dx.doubles(), want, kTol);
  EXPECT_THROW(be->linear_backward(Tensor(), view(w.data(), {m, k}), view(g.data(), {n, m}),
                                   Tensor(), view(dx.data(), {m, k}), Tensor(), {}),
               Error);  // dw needs x
}

}  // namespace
}  // namespace packbert::test
