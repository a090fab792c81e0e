// Lamb (src/optim/lamb.h) on the CPU backend against a naive double-precision loop of NVIDIA apex
// FusedLAMB as MLPerf BERT uses it: one global gradient norm over every tensor, clipping to
// max_grad_norm, Adam moments with grad averaging and bias correction, decoupled weight decay
// and the trust ratio ||w|| / ||u|| only on decayed tensors, the MLPerf learning-rate schedule.
// Several steps, gradients accumulated over micro-steps, a random table with gaps and no_decay
// tensors given out of order; checkpoint resume; NaN gradients; bad tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/base/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "optim/lamb.h"
#include "measure.h"
#include "test_util.h"

namespace packbert::test {
namespace {

using Vec = std::vector<double>;

std::mt19937_64 make_rng(uint64_t salt) {
  return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
}

std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = u(rng);
    while (x == 0.f);
  }
  return v;
}

double rel_l2(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// A random table: 12 tensors of random sizes (one bigger than the CPU backend's 8192-element
// reduction block), every third one no_decay, random gaps between them, then shuffled.
struct Table {
  std::vector<LambParam> params;
  int64_t n = 0;
};

Table random_table(std::mt19937_64& rng) {
  Table t;
  std::uniform_int_distribution<int64_t> size(1, 3000), gap(0, 3);
  for (int i = 0; i < 12; ++i) {
    t.n += gap(rng);
    const int64_t s = i == 4 ? 9000 : size(rng);
    t.params.push_back({"tensor_" + std::to_string(i), t.n, s, i % 3 == 2});
    t.n += s;
  }
  t.n += gap(rng);
  std::shuffle(t.params.begin(), t.params.end(), rng);
  return t;
}

// The naive optimizer: everything in double, straight from the apex formulas.
struct RefLamb {
  Vec w, m, v;
  LambOptions o;
  int64_t step = 0;
  double last_norm = 0;

  void update(const std::vector<LambParam>& table, const std::vector<float>& grads, double lr) {
    ++step;
    double norm = 0;
    for (float g : grads) norm += static_cast<double>(g) * g;
    norm = std::sqrt(norm);
    last_norm = norm;
    const double clip = norm > o.max_grad_norm ? norm / o.max_grad_norm : 1.0;
    const double b1 = o.beta1, b2 = o.beta2;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(step));
    const double bc2 = 1 - std::pow(b2, static_cast<double>(step));
    for (const LambParam& p : table) {
      const double wd = p.no_decay ? 0.0 : o.weight_decay;
      Vec u(static_cast<size_t>(p.size));
      double wn = 0, un = 0;
      for (int64_t i = 0; i < p.size; ++i) {
        const size_t j = static_cast<size_t>(p.offset + i);
        const double g = grads[j] / clip;
        m[j] = b1 * m[j] + (1 - b1) * g;
        v[j] = b2 * v[j] + (1 - b2) * g * g;
        u[i] = (m[j] / bc1) / (std::sqrt(v[j] / bc2) + o.eps) + wd * w[j];
        wn += w[j] * w[j];
        un += u[i] * u[i];
      }
      wn = std::sqrt(wn), un = std::sqrt(un);
      const double ratio = !p.no_decay && wd != 0 && wn > 0 && un > 0 ? wn / un : 1.0;
      for (int64_t i = 0; i < p.size; ++i)
        w[static_cast<size_t>(p.offset + i)] -= lr * ratio * u[i];
    }
  }
};

LrSchedule test_schedule() {
  LrScheduleConfig c;
  c.base_lr = 5e-3;
  c.max_steps = 10;
  c.num_warmup_steps = 3;
  c.start_warmup_step = -1;
  return LrSchedule(c);
}

// Gradients of one micro-step: odd steps large (the global norm is clipped), even steps small.
std::vector<float> micro_grads(std::mt19937_64& rng, int64_t n, int step) {
  return random_floats(rng, static_cast<size_t>(n), step % 2 ? 0.05f : 2e-4f);
}

TEST(Lamb, MatchesApexLoopOverStepsWithAccumulation) {
  auto rng = make_rng(1);
  const Table t = random_table(rng);
  auto be = make_cpu_backend();
  const LrSchedule schedule = test_schedule();
  Lamb lamb(*be, t.params, t.n, schedule);

  const std::vector<float> w0 = random_floats(rng, static_cast<size_t>(t.n), 1.f);
  std::vector<float> w = w0, grads(static_cast<size_t>(t.n), 0.f);
  RefLamb ref{Vec(w0.begin(), w0.end()), Vec(t.n, 0.0), Vec(t.n, 0.0), {}};
  std::vector<bool> covered(static_cast<size_t>(t.n), false);
  for (const LambParam& p : t.params)
    for (int64_t i = 0; i < p.size; ++i) covered[static_cast<size_t>(p.offset + i)] = true;

  for (int step = 1; step <= 7; ++step) {
    // Three micro-steps accumulate (+=) into the buffer, as the backward does; gaps stay 0.
    for (int micro = 0; micro < 3; ++micro) {
      const auto g = micro_grads(rng, t.n, step);
      for (size_t i = 0; i < grads.size(); ++i)
        if (covered[i]) grads[i] += g[i];
    }
    const std::vector<float> accumulated = grads;
    const LambStepInfo info = lamb.step(view(w.data(), {t.n}), view(grads.data(), {t.n}));
    ref.update(lamb.params(), accumulated, schedule.lr(step));
    EXPECT_EQ(info.step, step);
    EXPECT_DOUBLE_EQ(info.lr, schedule.lr(step));
    expect_measure("step " + std::to_string(step) + ": grad norm vs double (rel)",
                   std::abs(info.grad_norm - ref.last_norm) / ref.last_norm, 1e-5);
    EXPECT_EQ(step % 2 == 1, ref.last_norm > 1.0) << "the test means odd steps to clip";
    EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.f; }))
        << "gradients are zero after the step, ready for the next accumulation";
    EXPECT_EQ(lamb.steps_done(), step);
  }
  // The updates against double's to the fp32-vs-fp64 tolerance, plus what no optimizer can
  // avoid: the fp32 weights round w + update to their own ulp at each step, at most 2^-24 |w|
  // (round to nearest), so 7 steps add up to 7 2^-24 ||w|| to the update's error. With updates of
  // ~lr |w| = 5e-3 |w| that alone is ~5e-6 of the update (the plain rel L2 reached 3.7e-6 over
  // 1000 seeds, a margin of 2.7 against 1e-5).
  Vec dw_got, dw_want;
  double err2 = 0, want2 = 0, w2 = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    dw_got.push_back(static_cast<double>(w[i]) - w0[i]);
    dw_want.push_back(ref.w[i] - w0[i]);
    err2 += (dw_got[i] - dw_want[i]) * (dw_got[i] - dw_want[i]);
    want2 += dw_want[i] * dw_want[i];
    w2 += static_cast<double>(w[i]) * w[i];
  }
  const double bar = 1e-5 * std::sqrt(want2) + 7 * std::ldexp(1.0, -24) * std::sqrt(w2);
  expect_measure("weight updates after 7 steps vs double / (1e-5 |dw| + 7 u |w|)",
                 std::sqrt(err2) / bar, 1.0);
  std::vector<float> m(static_cast<size_t>(t.n)), v(static_cast<size_t>(t.n));
  lamb.save_moments(m.data(), v.data());
  expect_measure("m after 7 steps vs double", rel_l2(Vec(m.begin(), m.end()), ref.m), 1e-5);
  expect_measure("v after 7 steps vs double", rel_l2(Vec(v.begin(), v.end()), ref.v), 1e-5);
  for (size_t i = 0; i < w.size(); ++i) {
    if (covered[i]) continue;
    EXPECT_EQ(w[i], w0[i]) << "gap element " << i << " moved";
    EXPECT_EQ(m[i], 0.f) << i;
  }
  // The table comes back sorted by offset.
  for (size_t i = 1; i < lamb.params().size(); ++i)
    EXPECT_LT(lamb.params()[i - 1].offset, lamb.params()[i].offset);
}

// Stop after 3 steps, save (step count, m, v, weights), rebuild, load, continue: bitwise the
// same as 6 uninterrupted steps.
TEST(Lamb, ResumesBitwiseFromSavedState) {
  auto rng = make_rng(2);
  const Table t = random_table(rng);
  auto be = make_cpu_backend();
  const auto w0 = random_floats(rng, static_cast<size_t>(t.n), 1.f);
  std::vector<std::vector<float>> grads_per_step;
  for (int s = 1; s <= 6; ++s) grads_per_step.push_back(micro_grads(rng, t.n, s));
  auto run = [&](Lamb& lamb, std::vector<float>& w, int from, int to) {
    for (int s = from; s < to; ++s) {
      std::vector<float> g = grads_per_step[static_cast<size_t>(s)];
      lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
    }
  };
  std::vector<float> w_full = w0;
  Lamb full(*be, t.params, t.n, test_schedule());
  run(full, w_full, 0, 6);

  std::vector<float> w_part = w0, m(static_cast<size_t>(t.n)), v(static_cast<size_t>(t.n));
  int64_t steps = 0;
  {
    Lamb first(*be, t.params, t.n, test_schedule());
    run(first, w_part, 0, 3);
    first.save_moments(m.data(), v.data());
    steps = first.steps_done();
  }
  Lamb second(*be, t.params, t.n, test_schedule());
  second.load_moments(m.data(), v.data());
  second.set_steps_done(steps);
  run(second, w_part, 3, 6);
  EXPECT_EQ(second.steps_done(), 6);
  EXPECT_EQ(w_part, w_full);
}

TEST(Lamb, NonFiniteGradientNormIsAnErrorAndTouchesNothing) {
  auto rng = make_rng(3);
  const Table t = random_table(rng);
  auto be = make_cpu_backend();
  Lamb lamb(*be, t.params, t.n, test_schedule());
  const auto w0 = random_floats(rng, static_cast<size_t>(t.n), 1.f);
  std::vector<float> w = w0, g = micro_grads(rng, t.n, 1);
  lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
  const std::vector<float> w1 = w;
  std::vector<float> m1(static_cast<size_t>(t.n)), v1(static_cast<size_t>(t.n));
  lamb.save_moments(m1.data(), v1.data());
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    g = micro_grads(rng, t.n, 2);
    g[static_cast<size_t>(t.params[0].offset)] = bad;
    try {
      lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
      FAIL() << "no error for a gradient of " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
    }
    EXPECT_EQ(w, w1);
    std::vector<float> m(static_cast<size_t>(t.n)), v(static_cast<size_t>(t.n));
    lamb.save_moments(m.data(), v.data());
    EXPECT_EQ(m, m1);
    EXPECT_EQ(v, v1);
    EXPECT_EQ(lamb.steps_done(), 1);
  }
}

// skip_nonfinite: the same bad gradient is skipped instead of thrown; nothing but the
// gradients changes, and the next finite step is the second update.
TEST(Lamb, SkipNonFiniteLeavesStateAndZeroesGradients) {
  auto rng = make_rng(4);
  const Table t = random_table(rng);
  auto be = make_cpu_backend();
  LambOptions opt;
  opt.skip_nonfinite = true;
  Lamb lamb(*be, t.params, t.n, test_schedule(), opt);
  std::vector<float> w = random_floats(rng, static_cast<size_t>(t.n), 1.f),
                     g = micro_grads(rng, t.n, 1);
  lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
  const std::vector<float> w1 = w;
  std::vector<float> m1(static_cast<size_t>(t.n)), v1(static_cast<size_t>(t.n));
  lamb.save_moments(m1.data(), v1.data());
  g = micro_grads(rng, t.n, 2);
  g[static_cast<size_t>(t.params[0].offset)] = std::numeric_limits<float>::infinity();
  const LambStepInfo info = lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
  EXPECT_TRUE(info.skipped);
  EXPECT_FALSE(std::isfinite(info.grad_norm));
  EXPECT_EQ(w, w1);
  EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.f; }));
  std::vector<float> m(static_cast<size_t>(t.n)), v(static_cast<size_t>(t.n));
  lamb.save_moments(m.data(), v.data());
  EXPECT_EQ(m, m1);
  EXPECT_EQ(v, v1);
  EXPECT_EQ(lamb.steps_done(), 1);
  g = micro_grads(rng, t.n, 3);
  const LambStepInfo next = lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
  EXPECT_FALSE(next.skipped);
  EXPECT_EQ(next.step, 2);
  EXPECT_NE(w, w1);
}

TEST(Lamb, RejectsBadTablesAndBuffers) {
  auto be = make_cpu_backend();
  const LrSchedule s = test_schedule();
  auto expect_error = [&](std::vector<LambParam> params, int64_t n, const std::string& needle) {
    try {
      Lamb lamb(*be, std::move(params), n, s);
      FAIL() << "no error, expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({{"a", 0, 5, false}, {"b", 4, 3, true}}, 10, "'a'");  // overlap names both
  expect_error({{"b", 4, 3, true}, {"a", 0, 5, false}}, 10, "'b'");  // in any order
  expect_error({{"a", 0, 5, false}, {"b", 6, 5, true}}, 10, "'b'");  // past the end
  expect_error({}, 10, "tensors");
  LambOptions bad;
  bad.beta2 = 1.f;
  EXPECT_THROW(Lamb(*be, {{"a", 0, 4, false}}, 4, s, bad), Error);
  Lamb lamb(*be, {{"a", 0, 4, false}}, 4, s);
  std::vector<float> w(5, 1.f), g(5, 0.1f);
  EXPECT_THROW(lamb.step(view(w.data(), {5}), view(g.data(), {5})), Error);  // wrong size
}

// Steps that do not read back never learn of a non-finite gradient: the op skips the update on
// the device, the step still takes its number, and the next read reports the skipped steps,
// the current run and the longest run (what the trainer of a GPU run does between log steps).
TEST(Lamb, UnreadStepsSkipOnTheDeviceAndTheNextReadReportsThem) {
  auto rng = make_rng(5);
  const Table t = random_table(rng);
  auto be = make_cpu_backend();
  Lamb lamb(*be, t.params, t.n, test_schedule());  // check_finite on, skip_nonfinite off
  std::vector<float> w = random_floats(rng, static_cast<size_t>(t.n), 1.f);
  auto grads = [&](int k, bool bad) {
    auto g = micro_grads(rng, t.n, k);
    if (bad) g[static_cast<size_t>(t.params[0].offset)] = std::nanf("");
    return g;
  };
  std::vector<float> g = grads(1, false);
  const LambStepInfo first = lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}), {}, 1.f,
                                       /*read_back=*/false);
  EXPECT_FALSE(first.read_back);
  EXPECT_EQ(first.grad_norm, -1.f);
  const std::vector<float> w1 = w;
  for (int k = 2; k <= 3; ++k) {  // two non-finite steps, unread: no error, weights kept
    g = grads(k, true);
    const LambStepInfo info =
        lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}), {}, 1.f, false);
    EXPECT_FALSE(info.skipped);  // unknown to the host
    EXPECT_EQ(w, w1);
    EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float x) { return x == 0.f; }));
  }
  EXPECT_EQ(lamb.steps_done(), 3);  // the unread steps took their numbers
  g = grads(4, false);
  const LambStepInfo read = lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
  EXPECT_TRUE(read.read_back);
  EXPECT_FALSE(read.skipped);
  EXPECT_TRUE(std::isfinite(read.grad_norm));
  EXPECT_EQ(read.unread_skips, 2);
  EXPECT_EQ(read.skipped_run, 0);
  EXPECT_EQ(read.longest_skipped_run, 2);
  EXPECT_NE(w, w1);
  g = grads(5, false);
  const LambStepInfo again = lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n}));
  EXPECT_EQ(again.unread_skips, 0);  // reported once
  EXPECT_EQ(again.longest_skipped_run, 2);
  // A read step with a non-finite norm is still the error check_finite asks for.
  g = grads(6, true);
  EXPECT_THROW(lamb.step(view(w.data(), {t.n}), view(g.data(), {t.n})), Error);
}

TEST(Lamb, MlperfNoDecayRule) {
  for (const char* name : {"bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias",
                           "bert.encoder.layer.3.attention.self.query.bias", "cls.predictions.bias",
                           "cls.predictions.transform.LayerNorm.weight",
                           "bert.encoder.layer.0.output.LayerNorm.gamma"})
    EXPECT_TRUE(mlperf_no_decay(name)) << name;
  for (const char* name :
       {"bert.embeddings.word_embeddings.weight", "bert.encoder.layer.11.intermediate.dense.weight",
        "bert.pooler.dense.weight", "cls.seq_relationship.weight"})
    EXPECT_FALSE(mlperf_no_decay(name)) << name;
}

}  // namespace
}  // namespace packbert::test
