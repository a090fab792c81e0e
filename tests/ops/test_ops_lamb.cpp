// lamb_step against a naive double loop of NVIDIA apex FusedLAMB's formulas (adam_w_mode, grad
// averaging, bias correction, global-norm clipping, per-tensor trust ratio only where weight
// decay applies), over several steps (l2_norm and sum_squares: the op table, op_cases.h, run
// by test_ops_reference.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"

namespace packbert::test {
namespace {

using Vec = std::vector<double>;

// sum_squares and norm_from_sum_squares refuse the wrong dtypes (the sums are f64, the norm f32).
TEST(SumSquares, RefusesWrongDtypes) {
  auto be = make_cpu_backend();
  float f = 0;
  std::vector<float> x(4, 1.f);
  EXPECT_THROW(be->sum_squares(view(x.data(), {4}), view(&f, {1})), Error);  // out is f64
  double d = 4;
  EXPECT_THROW(be->norm_from_sum_squares(view(&f, {1}), view(&f, {1})), Error);  // sum is f64
  EXPECT_THROW(be->norm_from_sum_squares(view(&d, {1}), view(&d, {1})), Error);  // out is f32
}

// The state of the naive reference optimizer.
struct RefLamb {
  Vec w, m, v;
  std::vector<double> wnorm, unorm;

  void step(const std::vector<LambTensor>& table, const LambConfig& c, const Vec& g,
            double global_norm) {
    const double clip = global_norm > c.max_grad_norm ? global_norm / c.max_grad_norm : 1.0;
    const double bc1 = 1 - std::pow(static_cast<double>(c.beta1), c.step);
    const double bc2 = 1 - std::pow(static_cast<double>(c.beta2), c.step);
    wnorm.clear(), unorm.clear();
    for (const LambTensor& t : table) {
      const double decay = t.decay ? c.weight_decay : 0.0;
      double pn = 0, un = 0;
      Vec u(t.size);
      for (int64_t i = 0; i < t.size; ++i) pn += w[t.offset + i] * w[t.offset + i];
      for (int64_t i = 0; i < t.size; ++i) {
        const int64_t j = t.offset + i;
        const double sg = g[j] / clip;
        m[j] = c.beta1 * m[j] + (1 - static_cast<double>(c.beta1)) * sg;
        v[j] = c.beta2 * v[j] + (1 - static_cast<double>(c.beta2)) * sg * sg;
        u[i] = (m[j] / bc1) / (std::sqrt(v[j] / bc2) + c.eps) + decay * w[j];
        un += u[i] * u[i];
      }
      pn = std::sqrt(pn), un = std::sqrt(un);
      const bool adapt = t.decay && c.weight_decay != 0 && pn > 0 && un > 0;
      const double ratio = adapt ? c.lr * pn / un : c.lr;
      for (int64_t i = 0; i < t.size; ++i) w[t.offset + i] -= ratio * u[i];
      wnorm.push_back(pn), unorm.push_back(un);
    }
  }
};

TEST(Lamb, MatchesApexFormulasOverSeveralSteps) {
  auto rng = make_rng(72);
  auto be = make_cpu_backend();
  // Varying sizes (one beyond the 8192-element reduction block), decay and no-decay tensors, and
  // gaps between entries that must stay untouched.
  const std::vector<LambTensor> table = {{0, 1, 1},       {3, 700, 1},    {703, 31, 0},
                                         {740, 20000, 1}, {20745, 64, 0}, {20809, 5, 1}};
  const int64_t n = 20820, num = static_cast<int64_t>(table.size());
  const std::vector<float> w_init = random_floats(rng, n);
  // Every buffer the op updates in place is guarded.
  Guarded<float> w({n}, w_init), m({n}, std::vector<float>(n, 0.f)),
      v({n}, std::vector<float>(n, 0.f));
  RefLamb ref{to_double(w_init), Vec(n, 0.0), Vec(n, 0.0), {}, {}};
  LambConfig cfg;
  cfg.lr = 4e-3f;
  cfg.weight_decay = 0.01f;
  cfg.max_grad_norm = 1.0f;
  Guarded<float> norms({2 * num});
  for (int step = 1; step <= 6; ++step) {
    cfg.step = step;
    // Odd steps have large gradients (clipped), even steps small ones (not clipped).
    const auto g0 = random_floats(rng, n, step % 2 ? 0.05f : 1e-4f);
    Guarded<float> g({n}, g0);
    double gn = 0;
    for (float x : g0) gn += static_cast<double>(x) * x;
    gn = std::sqrt(gn);
    ASSERT_EQ(gn > cfg.max_grad_norm, step % 2 == 1);
    const float gnf = static_cast<float>(gn);
    ref.step(table, cfg, to_double(g0), gnf);
    be->lamb_step(lamb_table(table.data(), num), cfg, view(&gnf, {1}), w.tensor(), g.tensor(),
                  m.tensor(), v.tensor(), norms.tensor());
    for (auto* b : {&w, &g, &m, &v}) EXPECT_OUTPUT_OK(*b);
  }
  EXPECT_OUTPUT_OK(norms);
  expect_close("lamb_step 6 steps: weights", w.doubles(), ref.w, kTol);
  expect_close("lamb_step 6 steps: m", m.doubles(), ref.m, kTol);
  expect_close("lamb_step 6 steps: v", v.doubles(), ref.v, kTol);
  // The updates themselves, where the error would show first.
  Vec dw_got, dw_want;
  for (int64_t i = 0; i < n; ++i) {
    dw_got.push_back(static_cast<double>(w.data()[i]) - w_init[i]);
    dw_want.push_back(ref.w[i] - w_init[i]);
  }
  expect_close("lamb_step 6 steps: w - w0", dw_got, dw_want, kTol);
  Vec norms_want = ref.wnorm;
  norms_want.insert(norms_want.end(), ref.unorm.begin(), ref.unorm.end());
  expect_close("lamb_step norms", norms.doubles(), norms_want, kTol);
  // Gaps between table entries: untouched.
  for (int64_t i : {1, 2, 20744, 20814, 20819}) {
    EXPECT_EQ(w.data()[i], w_init[i]) << i;
    EXPECT_EQ(m.data()[i], 0.f) << i;
  }
}

// Trust ratio edge: a decayed tensor with ||w|| = 0 takes the plain step lr * u.
TEST(Lamb, ZeroWeightsTakeThePlainStep) {
  auto be = make_cpu_backend();
  const std::vector<LambTensor> table = {{0, 4, 1}};
  std::vector<float> w(4, 0.f), g = {0.1f, -0.2f, 0.3f, 0.4f}, m(4, 0.f), v(4, 0.f), norms(2);
  const float gn = 0.5f;
  LambConfig cfg;
  cfg.lr = 0.01f;
  cfg.step = 1;
  be->lamb_step(lamb_table(table.data(), 1), cfg, view(&gn, {1}), view(w.data(), {4}),
                view(g.data(), {4}), view(m.data(), {4}), view(v.data(), {4}),
                view(norms.data(), {2}));
  EXPECT_EQ(norms[0], 0.f);
  // Step 1 with bias correction: u = g / (|g| + eps) = sign(g) (to eps).
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(w[i], -0.01f * (g[i] > 0 ? 1.f : -1.f), 1e-6f) << i;
}

// A non-finite global norm (NaN, or infinite; also a finite norm whose loss-scale quotient is
// not) skips the step inside the op: weights, moments and the low-precision copy stay; the
// record counts skipped steps, the current run and the longest run; a finite step ends the run.
TEST(Lamb, NonFiniteNormSkipsInsideTheOpAndIsRecorded) {
  auto be = make_cpu_backend();
  const std::vector<LambTensor> table = {{0, 5, 1}, {5, 3, 0}};
  std::vector<float> w = {0.5f, -1.f, 2.f, 0.25f, 1.f, 0.1f, -0.2f, 0.3f}, m(8, 0.01f), v(8, 0.02f),
                     norms(4);
  std::vector<uint16_t> low(8, 0x1234);
  std::vector<int32_t> record = {0, 0, 0};
  LambConfig cfg;
  cfg.lr = 0.01f;
  cfg.step = 3;
  auto step = [&](float gn) {
    std::vector<float> g(8, 0.1f);
    be->lamb_step(lamb_table(table.data(), 2), cfg, view(&gn, {1}), view(w.data(), {8}),
                  view(g.data(), {8}), view(m.data(), {8}), view(v.data(), {8}),
                  view(norms.data(), {4}), Tensor(low.data(), DType::bf16, {8}),
                  view(record.data(), {3}));
  };
  const auto w0 = w, m0 = m, v0 = v;
  const auto low0 = low;
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), inf, -inf}) step(bad);
  EXPECT_EQ(w, w0);
  EXPECT_EQ(m, m0);
  EXPECT_EQ(v, v0);
  EXPECT_EQ(low, low0);
  EXPECT_EQ(record, (std::vector<int32_t>{3, 3, 3}));
  step(0.5f);  // finite: updates and ends the run
  EXPECT_NE(w, w0);
  EXPECT_NE(low, low0);
  EXPECT_EQ(record, (std::vector<int32_t>{3, 0, 3}));
  cfg.grad_scale = 0.25f;  // 3e38 / 0.25 overflows: skipped although the norm is finite
  const auto w1 = w;
  step(3e38f);
  EXPECT_EQ(w, w1);
  EXPECT_EQ(record, (std::vector<int32_t>{4, 1, 3}));
}

TEST(Lamb, RejectsBadTables) {
  auto be = make_cpu_backend();
  std::vector<float> w(10, 1.f), g(10, 1.f), m(10), v(10), norms(4);
  const float gn = 1.f;
  auto call = [&](std::vector<LambTensor> t) {
    be->lamb_step(lamb_table(t.data(), static_cast<int64_t>(t.size())), LambConfig{},
                  view(&gn, {1}), view(w.data(), {10}), view(g.data(), {10}), view(m.data(), {10}),
                  view(v.data(), {10}), view(norms.data(), {2 * static_cast<int64_t>(t.size())}));
  };
  EXPECT_NO_THROW(call({{0, 4, 1}, {4, 6, 0}}));
  EXPECT_THROW(call({{0, 5, 1}, {4, 6, 0}}), Error);  // overlap
  EXPECT_THROW(call({{0, 4, 1}, {4, 7, 0}}), Error);  // past the end
  EXPECT_THROW(call({{0, 4, 2}, {4, 6, 0}}), Error);  // flag
}

}  // namespace
}  // namespace packbert::test
