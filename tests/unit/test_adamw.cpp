// Lamb with LambOptions::rule AdamW and StableAdamW on the CPU backend against naive double loops
// of their references, over 7 steps of the schedule with clipped and unclipped gradients:
//   - torch.optim.AdamW (torch/optim/adamw.py, single-tensor path): p *= 1 - lr wd; m, v as Adam;
//     p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps);
//   - optimi's StableAdamW (optimi/stableadamw.py, _single_param_stableadamw), which keeps the
//     moments debiased through debias_beta(beta, t) = (beta^t - beta) / (beta^t - 1):
//     m^ = lerp(m^, g, 1 - beta1^), v^ = beta2^ v^ + (1 - beta2^) g^2,
//     lr_t = lr / max(1, sqrt(mean(g^2 / max(v^, eps^2)))), p *= 1 - lr_t wd (decouple_lr:
//     1 - lr_t / max_lr wd), p -= lr_t m^ / (sqrt(v^) + eps).
// packbert keeps Adam's biased moments (the same state as LAMB's, so checkpoints and sharding
// are shared) and divides by the bias corrections instead: the same numbers in exact arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "measure.h"
#include "ops_test_util.h"  // make_rng, random_floats
#include "optim/lamb.h"
#include "test_util.h"

namespace packbert::test {
namespace {

using Vec = std::vector<double>;

// 8 tensors of random sizes (one past the CPU backend's 8192-element block), every third
// no_decay, gaps between them.
std::vector<LambParam> random_table(std::mt19937_64& rng, int64_t* n) {
  std::vector<LambParam> t;
  std::uniform_int_distribution<int64_t> size(1, 2000), gap(0, 3);
  *n = 0;
  for (int i = 0; i < 8; ++i) {
    *n += gap(rng);
    const int64_t s = i == 3 ? 9000 : size(rng);
    t.push_back({"tensor_" + std::to_string(i), *n, s, i % 3 == 2});
    *n += s;
  }
  return t;
}

double debias_beta(double beta, int64_t step) {
  const double bt = std::pow(beta, static_cast<double>(step));
  return (bt - beta) / (bt - 1);
}

struct Reference {
  UpdateRule rule;
  LambOptions o;
  double max_lr;
  Vec w, m, v;  // torch: biased moments; optimi: debiased
  int64_t step = 0;

  void update(const std::vector<LambParam>& table, const std::vector<float>& grads, double lr) {
    ++step;
    double norm = 0;
    for (float g : grads) norm += static_cast<double>(g) * g;
    norm = std::sqrt(norm);
    const double clip = norm > o.max_grad_norm ? norm / o.max_grad_norm : 1.0;
    const double b1 = o.beta1, b2 = o.beta2, eps = o.eps;
    for (const LambParam& p : table) {
      const double wd = p.no_decay ? 0.0 : o.weight_decay;
      auto at = [&](int64_t i) { return static_cast<size_t>(p.offset + i); };
      if (rule == UpdateRule::adamw) {
        const double bc1 = 1 - std::pow(b1, static_cast<double>(step));
        const double bc2 = 1 - std::pow(b2, static_cast<double>(step));
        for (int64_t i = 0; i < p.size; ++i) {
          const size_t j = at(i);
          const double g = grads[j] / clip;
          w[j] *= 1 - lr * wd;
          m[j] = b1 * m[j] + (1 - b1) * g;
          v[j] = b2 * v[j] + (1 - b2) * g * g;
          w[j] -= lr / bc1 * m[j] / (std::sqrt(v[j]) / std::sqrt(bc2) + eps);
        }
        continue;
      }
      const double b1h = debias_beta(b1, step), b2h = debias_beta(b2, step);
      double terms = 0;
      for (int64_t i = 0; i < p.size; ++i) {
        const size_t j = at(i);
        const double g = grads[j] / clip;
        m[j] += (1 - b1h) * (g - m[j]);
        v[j] = b2h * v[j] + (1 - b2h) * g * g;
        terms += g * g / std::max(v[j], eps * eps);
      }
      const double lr_t = lr / std::max(1.0, std::sqrt(terms / static_cast<double>(p.size)));
      const double decay = o.decouple_lr ? lr_t / max_lr * wd : lr_t * wd;
      for (int64_t i = 0; i < p.size; ++i) {
        const size_t j = at(i);
        w[j] *= 1 - decay;
        w[j] -= lr_t * m[j] / (std::sqrt(v[j]) + eps);
      }
    }
  }
};

// The updates after 7 steps against the reference's: 1e-5 of their size plus the fp32 weights'
// own rounding, at most 2^-24 |w| per step (test_lamb.cpp's bar; the sweep is in
// tests/seed_sweeps.txt).
void expect_steps(UpdateRule rule, bool decouple_lr, const char* name) {
  auto rng = make_rng(static_cast<uint64_t>(rule) * 2 + decouple_lr + 11);
  int64_t n = 0;
  const std::vector<LambParam> table = random_table(rng, &n);
  auto be = make_cpu_backend();
  LrScheduleConfig sc;
  sc.base_lr = 5e-3;
  sc.max_steps = 10;
  sc.num_warmup_steps = 3;
  const LrSchedule schedule(sc);
  LambOptions o;
  o.rule = rule;
  o.decouple_lr = decouple_lr;
  o.weight_decay = decouple_lr ? 1e-4f : 0.05f;  // decouple_lr divides it by lr
  o.beta2 = 0.98f;
  Lamb opt(*be, table, n, schedule, o);
  const std::vector<float> w0 = random_floats(rng, static_cast<size_t>(n), 1.f);
  std::vector<float> w = w0, grads(static_cast<size_t>(n), 0.f);
  Reference ref{rule, o, sc.base_lr, Vec(w0.begin(), w0.end()), Vec(n, 0.0), Vec(n, 0.0)};
  std::vector<bool> covered(static_cast<size_t>(n), false);
  for (const LambParam& p : table)
    for (int64_t i = 0; i < p.size; ++i) covered[static_cast<size_t>(p.offset + i)] = true;
  for (int step = 1; step <= 7; ++step) {
    // Odd steps large (clipped), even steps small.
    const auto g = random_floats(rng, static_cast<size_t>(n), step % 2 ? 0.05f : 2e-4f);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = covered[i] ? g[i] : 0.f;
    const std::vector<float> given = grads;
    opt.step(view(w.data(), {n}), view(grads.data(), {n}));
    ref.update(opt.params(), given, schedule.lr(step));
  }
  double err2 = 0, want2 = 0, w2 = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double got = static_cast<double>(w[i]) - w0[i], want = ref.w[i] - w0[i];
    err2 += (got - want) * (got - want);
    want2 += want * want;
    w2 += static_cast<double>(w[i]) * w[i];
    if (!covered[i]) {
      EXPECT_EQ(w[i], w0[i]) << name << ": gap element " << i << " moved";
    }
  }
  ASSERT_GT(want2, 0);
  const double bar = 1e-5 * std::sqrt(want2) + 7 * std::ldexp(1.0, -24) * std::sqrt(w2);
  expect_measure(std::string(name) + ": weight updates after 7 steps vs double / bar",
                 std::sqrt(err2) / bar, 1.0);
  // The moments: packbert's biased m, v are optimi's debiased ones times the bias corrections.
  std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  opt.save_moments(m.data(), v.data());
  const double bc1 = rule == UpdateRule::adamw ? 1.0 : 1 - std::pow(double{o.beta1}, 7.0);
  const double bc2 = rule == UpdateRule::adamw ? 1.0 : 1 - std::pow(double{o.beta2}, 7.0);
  double em = 0, nm = 0, ev = 0, nv = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    em += std::pow(m[i] - ref.m[i] * bc1, 2), nm += std::pow(ref.m[i] * bc1, 2);
    ev += std::pow(v[i] - ref.v[i] * bc2, 2), nv += std::pow(ref.v[i] * bc2, 2);
  }
  expect_measure(std::string(name) + ": m after 7 steps vs double", std::sqrt(em / nm), 1e-5);
  expect_measure(std::string(name) + ": v after 7 steps vs double", std::sqrt(ev / nv), 1e-5);
}

TEST(AdamW, MatchesTorchAdamWOverSteps) { expect_steps(UpdateRule::adamw, false, "adamw"); }

TEST(AdamW, MatchesOptimiStableAdamWOverSteps) {
  expect_steps(UpdateRule::stable_adamw, false, "stable_adamw");
}

TEST(AdamW, MatchesOptimiStableAdamWWithDecoupledDecay) {
  expect_steps(UpdateRule::stable_adamw, true, "stable_adamw decouple_lr");
}

// The update clipping is in use: a step whose gradient jumps far above its second moment's
// history (100x the gradients of the 19 steps before) takes lr / RMS, RMS = |g| / sqrt(v^) ~ 4.5
// (v^ ~ 0.05 after the jump, beta2 0.999), where AdamW takes lr; the 19 steps before are alike.
TEST(AdamW, StableAdamWClipsTheRateOfAJump) {
  auto be = make_cpu_backend();
  const std::vector<LambParam> table = {{"t", 0, 1000, false}};
  LrScheduleConfig sc;
  sc.base_lr = 1e-3;
  sc.max_steps = 100;
  const LrSchedule schedule(sc);
  std::vector<float> moved;
  for (const UpdateRule rule : {UpdateRule::adamw, UpdateRule::stable_adamw}) {
    LambOptions o;
    o.rule = rule;
    o.weight_decay = 0;
    o.beta2 = 0.999f;
    o.max_grad_norm = std::numeric_limits<float>::infinity();
    Lamb opt(*be, table, 1000, schedule, o);
    std::vector<float> w(1000, 0.f), g(1000);
    for (int step = 1; step <= 20; ++step) {
      const float scale = step == 20 ? 1.f : 0.01f;
      for (size_t i = 0; i < g.size(); ++i) g[i] = (i % 2 ? scale : -scale);
      opt.step(view(w.data(), {1000}), view(g.data(), {1000}));
    }
    moved.push_back(std::abs(w[0]));
  }
  // With a constant sign each of the first 19 steps moves lr_k (m^ / sqrt(v^) = 1) in both, lr_k
  // = 1e-3 (1 - k / 100) (poly decay); the last moves lr_20 d in AdamW and lr_20 d / RMS in
  // StableAdamW, d = m^ / sqrt(v^) = 0.5456, RMS = 4.4468: 0.0175348 and 0.0171965 in all,
  // worked in double and written here to within 5e-8. The fp32 run's own error: each of the 20
  // steps rounds w (half an ulp: <= 2^-30 for |w| < 2^-5) and carries its update's few roundings
  // (~1e-7 relative of <= 1e-3), under 4e-8 in all. 1e-6 is over 10x the two together.
  EXPECT_NEAR(moved[0], 0.0175348, 1e-6);
  EXPECT_NEAR(moved[1], 0.0171965, 1e-6);
}

}  // namespace
}  // namespace packbert::test
