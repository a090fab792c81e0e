// The heads: the MLM decoder loss (also in chunks) and the pooler + NSP loss, against double
// loops and finite differences (gather_rows and softmax_cross_entropy: the op table,
// op_cases.h, run by test_ops_reference.cpp).
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"
#include "reference_ops.h"

namespace packbert::test {
namespace {

using ref::Vec;

// Everything the MLM loss takes and gives, for one set of inputs.
struct MlmCase {
  int64_t m, h, v;
  std::vector<float> x, w, b;
  std::vector<int32_t> labels;
  float scale;
  MlmCase(std::mt19937_64& rng, int64_t m_, int64_t h_, int64_t v_)
      : m(m_), h(h_), v(v_), x(random_floats(rng, m * h)), w(random_floats(rng, v * h)),
        b(random_floats(rng, v)), labels(random_ints(rng, m, 0, static_cast<int32_t>(v - 1))),
        scale(1.f / static_cast<float>(m + 5)) {}
  // The scaled loss in double: what the gradients are the gradients of.
  double loss(const Vec& xd, const Vec& wd, const Vec& bd, int* correct = nullptr) const {
    return ref::softmax_xent(ref::linear(xd, wd, &bd, m, h, v), labels, m, v, 1.0, correct) * scale;
  }
};

TEST(MlmLoss, MatchesDoubleAndFiniteDifferences) {
  auto rng = make_rng(63);
  auto be = make_cpu_backend();
  const MlmCase c(rng, 13, 16, 97);
  const auto dw0 = random_floats(rng, c.v * c.h), db0 = random_floats(rng, c.v);
  Guarded<float> ws({c.m, c.v}), loss({1}, {0.f}), dx({c.m, c.h}), dw({c.v, c.h}, dw0), db({c.v}, db0);
  Guarded<int32_t> correct({1}, {0});
  be->mlm_loss(view(c.x.data(), {c.m, c.h}), view(c.w.data(), {c.v, c.h}), view(c.b.data(), {c.v}),
               view(c.labels.data(), {c.m}), c.scale, ws.tensor(), loss.tensor(), correct.tensor(),
               dx.tensor(), dw.tensor(), db.tensor());
  Vec xd = to_double(c.x), wd = to_double(c.w), bd = to_double(c.b);
  int want_correct = 0;
  const double want = c.loss(xd, wd, bd, &want_correct) / c.scale;
  expect_close("mlm_loss loss", {loss.data()[0]}, {want}, kTol);
  EXPECT_EQ(correct.data()[0], want_correct);
  EXPECT_OUTPUT_OK(dx);
  for (auto* g : {&ws, &loss, &dw, &db}) EXPECT_TRUE(g->guards_intact());
  EXPECT_TRUE(correct.guards_intact());
  auto inc = [](const Guarded<float>& g, const std::vector<float>& init) {
    Vec r = g.doubles();
    for (size_t i = 0; i < r.size(); ++i) r[i] -= init[i];
    return r;
  };
  expect_close("mlm_loss dx (FD)", dx.doubles(),
               fd_gradient([&](const Vec&) { return c.loss(xd, wd, bd); }, xd, all_coords(xd.size())), kTol);
  expect_close("mlm_loss dw (FD)", inc(dw, dw0),
               fd_gradient([&](const Vec&) { return c.loss(xd, wd, bd); }, wd, all_coords(wd.size())), kTol);
  expect_close("mlm_loss db (FD)", inc(db, db0),
               fd_gradient([&](const Vec&) { return c.loss(xd, wd, bd); }, bd, all_coords(bd.size())), kTol);
}

// MST: the loss over chunks of masked tokens adds up to the loss over all of them.
TEST(MlmLoss, ChunksAddUpToTheWhole) {
  auto rng = make_rng(64);
  auto be = make_cpu_backend();
  const MlmCase c(rng, 40, 32, 301);
  auto run = [&](const std::vector<int64_t>& cuts, std::vector<float>& dx, std::vector<float>& dw,
                 std::vector<float>& db, float& loss, int32_t& correct) {
    dx.assign(c.m * c.h, NAN), dw.assign(c.v * c.h, 0.f), db.assign(c.v, 0.f);
    loss = 0.f, correct = 0;
    std::vector<float> ws(c.m * c.v);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t a = cuts[k], n = cuts[k + 1] - a;
      be->mlm_loss(view(c.x.data() + a * c.h, {n, c.h}), view(c.w.data(), {c.v, c.h}),
                   view(c.b.data(), {c.v}), view(c.labels.data() + a, {n}), c.scale,
                   view(ws.data(), {n, c.v}), view(&loss, {1}), view(&correct, {1}),
                   view(dx.data() + a * c.h, {n, c.h}), view(dw.data(), {c.v, c.h}),
                   view(db.data(), {c.v}));
    }
  };
  std::vector<float> dx1, dw1, db1, dx3, dw3, db3;
  float l1, l3;
  int32_t c1, c3;
  run({0, c.m}, dx1, dw1, db1, l1, c1);
  run({0, 7, 8, c.m}, dx3, dw3, db3, l3, c3);
  EXPECT_EQ(c1, c3);
  // Chunks change only the order of fp32 sums (the loss, dw, db over rows): worst 2.1e-7 over
  // 1000 seeds (dx), margin 4.8.
  expect_close("mlm_loss 3 chunks vs 1: loss", {l3}, {l1}, 1e-6);
  expect_close("mlm_loss 3 chunks vs 1: dx", to_double(dx3), to_double(dx1), 1e-6);
  expect_close("mlm_loss 3 chunks vs 1: dw", to_double(dw3), to_double(dw1), 1e-6);
  expect_close("mlm_loss 3 chunks vs 1: db", to_double(db3), to_double(db1), 1e-6);

  // Forward only (evaluation): the same loss, no gradient touched.
  std::vector<float> ws(c.m * c.v);
  float l0 = 0.f;
  int32_t c0 = 0;
  be->mlm_loss(view(c.x.data(), {c.m, c.h}), view(c.w.data(), {c.v, c.h}), view(c.b.data(), {c.v}),
               view(c.labels.data(), {c.m}), c.scale, view(ws.data(), {c.m, c.v}), view(&l0, {1}),
               view(&c0, {1}), Tensor(), Tensor(), Tensor());
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(c0, c1);
}

TEST(NspLoss, MatchesDoubleAndFiniteDifferences) {
  auto rng = make_rng(65);
  auto be = make_cpu_backend();
  const std::vector<int32_t> lens = {5, 1, 9, 3, 7};
  const HostLayout l = packed(lens, random_sample_ids(rng, lens.size()), 12);
  const int64_t h = 12, s = static_cast<int64_t>(lens.size());
  const auto x = random_floats(rng, l.rows * h), wp = random_floats(rng, h * h, 0.5f),
             bp = random_floats(rng, h), wc = random_floats(rng, 2 * h), bc = random_floats(rng, 2);
  const auto labels = random_ints(rng, s, 0, 1);
  const float scale = 1.f / 9.f;  // 1 / global sample count
  // The gradients are ADDED to these: small, so that rounding the sums to f32 (an ulp of the
  // starting value) stays far below the finite differences' tolerance (starting values of
  // order 1 put it at 1e-5, and one seed in a few hundred over kTol).
  const auto dx0 = random_floats(rng, l.rows * h, 0.01f), dwp0 = random_floats(rng, h * h, 0.01f),
             dbp0 = random_floats(rng, h, 0.01f), dwc0 = random_floats(rng, 2 * h, 0.01f),
             dbc0 = random_floats(rng, 2, 0.01f);
  Guarded<float> ws({nsp_workspace_elems(s, h)}), loss({1}, {0.f}), dx({l.rows, h}, dx0),
      dwp({h, h}, dwp0), dbp({h}, dbp0), dwc({2, h}, dwc0), dbc({2}, dbc0);
  Guarded<int32_t> correct({1}, {0});
  const PoolerParams params{view(wp.data(), {h, h}), view(bp.data(), {h}), view(wc.data(), {2, h}),
                            view(bc.data(), {2})};
  be->nsp_loss(l.view(), view(x.data(), {l.rows, h}), params, view(labels.data(), {s}), scale,
               ws.tensor(), loss.tensor(), correct.tensor(), dx.tensor(),
               PoolerParams{dwp.tensor(), dbp.tensor(), dwc.tensor(), dbc.tensor()});
  Vec xd = to_double(x), wpd = to_double(wp), bpd = to_double(bp), wcd = to_double(wc), bcd = to_double(bc);
  int want_correct = 0;
  const double want = ref::nsp(xd, l, h, wpd, bpd, wcd, bcd, labels, &want_correct);
  expect_close("nsp_loss loss", {loss.data()[0]}, {want}, kTol);
  EXPECT_EQ(correct.data()[0], want_correct);
  for (auto* g : {&ws, &loss, &dx, &dwp, &dbp, &dwc, &dbc}) EXPECT_TRUE(g->guards_intact());
  EXPECT_TRUE(correct.guards_intact());
  auto f = [&](const Vec&) { return scale * ref::nsp(xd, l, h, wpd, bpd, wcd, bcd, labels); };
  auto inc = [](const Guarded<float>& g, const std::vector<float>& init) {
    Vec r = g.doubles();
    for (size_t i = 0; i < r.size(); ++i) r[i] -= init[i];
    return r;
  };
  expect_close("nsp_loss dx (FD)", inc(dx, dx0), fd_gradient(f, xd, all_coords(xd.size())), kTol);
  expect_close("nsp_loss d dense_w (FD)", inc(dwp, dwp0), fd_gradient(f, wpd, all_coords(wpd.size())), kTol);
  expect_close("nsp_loss d dense_b (FD)", inc(dbp, dbp0), fd_gradient(f, bpd, all_coords(bpd.size())), kTol);
  expect_close("nsp_loss d cls_w (FD)", inc(dwc, dwc0), fd_gradient(f, wcd, all_coords(wcd.size())), kTol);
  // cls_b's gradient is scale sum_s (p_s - onehot_s): with p ~ 1/2 its terms carry the labels'
  // signs and cancel when the labels balance, while their fp32 rounding does not (2 seeds in
  // 1000 reached 1.6e-4 of the remainder). Measured against max(its norm, the norm such a sum
  // of s random-sign terms of size scale / 2 has), as the model tests' nsp_bias_error does.
  {
    const Vec got = inc(dbc, dbc0), fd = fd_gradient(f, bcd, all_coords(bcd.size()));
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < got.size(); ++i) d2 += (got[i] - fd[i]) * (got[i] - fd[i]), n2 += fd[i] * fd[i];
    const double floor = 0.5 * scale * std::sqrt(2.0 * static_cast<double>(s));
    expect_measure("nsp_loss d cls_b (FD) / max(|d cls_b|, its noise floor)",
                   std::sqrt(d2) / std::max(std::sqrt(n2), floor), kTol);
  }
}

}  // namespace
}  // namespace packbert::test
