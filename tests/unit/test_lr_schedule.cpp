// The MLPerf BERT learning-rate schedule against a naive transcription of the reference
// (mlcommons/training language_model/pytorch schedulers.py, LinearWarmupPolyDecayScheduler, and
// run_pretraining.py's choice between warmup_steps and warmup_proportion) at every step of
// several configurations, plus hand-computed values and the edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/base/error.h"
#include "optim/lr_schedule.h"
#include "measure.h"
#include "test_util.h"

namespace packbert::test {
namespace {

// The reference, written the way the Python reads (including its negative rate before a
// positive start_warmup_step, which the schedule clamps to 0).
double reference_lr(const LrScheduleConfig& c, int64_t k) {
  int64_t warmup = c.num_warmup_steps, start = c.start_warmup_step;
  if (warmup == 0) {
    warmup = static_cast<int64_t>(static_cast<double>(c.max_steps) * c.warmup_proportion);
    start = 0;
  }
  const int64_t mod_step = k - start;
  if (mod_step < warmup) return c.base_lr * static_cast<double>(mod_step) / warmup;
  const double progress = std::min(static_cast<double>(k) / c.max_steps, 1.0);
  return (c.base_lr - c.end_lr) * std::pow(1 - progress, c.poly_power) + c.end_lr;
}

LrScheduleConfig config(double lr, int64_t max_steps, int64_t warmup, int64_t start = 0,
                        double proportion = 0.0) {
  LrScheduleConfig c;
  c.base_lr = lr;
  c.max_steps = max_steps;
  c.num_warmup_steps = warmup;
  c.start_warmup_step = start;
  c.warmup_proportion = proportion;
  return c;
}

TEST(LrSchedule, MatchesTheReferenceAtEveryStep) {
  std::vector<LrScheduleConfig> configs = {
      config(4e-3, 1141, 100),             // an MLPerf-sized run
      config(1.7e-3, 7038, 0, 0, 0.2843),  // NVIDIA phase 1 style, warmup from a proportion
      config(2e-3, 600, 50, -25),          // negative start: the ramp starts half-way up
      config(2e-3, 600, 50, -50),          // start exactly -warmup: no warmup left
      config(2e-3, 600, 50, -80),          // further back than the warmup: pure decay
      config(5e-4, 300, 0),                // no warmup at all
      config(1e-3, 40, 60),                // warmup longer than the run
  };
  LrScheduleConfig poly = config(3e-3, 500, 40, -7);
  poly.poly_power = 2.0;
  poly.end_lr = 1e-4;
  configs.push_back(poly);
  // A random one, fresh each run.
  std::mt19937_64 rng(test_seed());
  const int64_t max_steps = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
  const int64_t warmup = std::uniform_int_distribution<int64_t>(0, max_steps)(rng);
  const int64_t start =
      warmup > 0 ? std::uniform_int_distribution<int64_t>(-warmup - 5, 0)(rng) : 0;
  configs.push_back(
      config(std::uniform_real_distribution<double>(1e-5, 1e-2)(rng), max_steps, warmup, start));

  for (const LrScheduleConfig& c : configs) {
    const LrSchedule s(c);
    const bool random_one = &c == &configs.back();
    double worst = 0;
    for (int64_t k = 1; k <= c.max_steps + 50; ++k) {
      const double want = reference_lr(c, k);
      worst = std::max(worst, std::abs(s.lr(k) - want) / c.base_lr);
      ASSERT_NEAR(s.lr(k), want, 1e-12 * c.base_lr) << s.describe() << " at step " << k;
      ASSERT_GE(s.lr(k), 0.0);
      ASSERT_LE(s.lr(k), c.base_lr * (1 + 1e-12));
    }
    if (random_one)
      print_measure("random schedule vs the double reference / base_lr", worst, 1e-12);
  }
}

TEST(LrSchedule, HandComputedValues) {
  const LrSchedule s(config(1.0, 100, 10));
  EXPECT_DOUBLE_EQ(s.lr(1), 0.1);  // the first update already moves (PyTorch reference)
  EXPECT_DOUBLE_EQ(s.lr(9), 0.9);
  EXPECT_DOUBLE_EQ(s.lr(10), 0.9);  // decay from here: 1 - 10/100
  EXPECT_DOUBLE_EQ(s.lr(50), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(100), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(101), 0.0);  // beyond max_steps: stays at end_lr
  EXPECT_DOUBLE_EQ(s.lr(100000), 0.0);

  // start_warmup_step = -5: warmup counts from step -5, so step 1 is 6/10 up the ramp and the
  // decay takes over at step 5.
  const LrSchedule neg(config(1.0, 100, 10, -5));
  EXPECT_DOUBLE_EQ(neg.lr(1), 0.6);
  EXPECT_DOUBLE_EQ(neg.lr(4), 0.9);
  EXPECT_DOUBLE_EQ(neg.lr(5), 0.95);

  // Power 2 with an end rate: (1 - 0.1) * (1 - 50/100)^2 + 0.1.
  LrScheduleConfig p = config(1.0, 100, 0);
  p.poly_power = 2.0;
  p.end_lr = 0.1;
  EXPECT_DOUBLE_EQ(LrSchedule(p).lr(50), 0.9 * 0.25 + 0.1);
  EXPECT_DOUBLE_EQ(LrSchedule(p).lr(500), 0.1);
}

TEST(LrSchedule, WarmupZeroIsPureDecay) {
  const LrSchedule s(config(2.0, 10, 0));
  EXPECT_EQ(s.warmup_steps(), 0);
  for (int64_t k = 1; k <= 12; ++k)
    EXPECT_DOUBLE_EQ(s.lr(k), 2.0 * std::max(0.0, 1.0 - k / 10.0)) << k;
}

TEST(LrSchedule, WarmupProportionTruncatesLikePython) {
  // int(100 * 0.29) == 28 in Python (0.29 * 100 = 28.999999999999996).
  const LrSchedule s(config(1.0, 100, 0, 0, 0.29));
  EXPECT_EQ(s.warmup_steps(), 28);
  EXPECT_EQ(s.warmup_start(), 0);
  EXPECT_DOUBLE_EQ(s.lr(14), 0.5);
  EXPECT_DOUBLE_EQ(s.lr(28), 1.0 - 0.28);
}

TEST(LrSchedule, PositiveStartIsZeroUntilTheWarmupStarts) {
  // The reference would return a negative rate before step 10; nothing moves there instead.
  const LrSchedule s(config(1.0, 100, 10, 10));
  EXPECT_DOUBLE_EQ(s.lr(1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(11), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(20), 0.8);  // decay: 1 - 20/100
}

TEST(LrSchedule, RejectsBadConfigs) {
  EXPECT_THROW(LrSchedule(config(1.0, 0, 0)), Error);    // max_steps
  EXPECT_THROW(LrSchedule(config(-1.0, 10, 0)), Error);  // negative rate
  EXPECT_THROW(LrSchedule(config(NAN, 10, 0)), Error);
  EXPECT_THROW(LrSchedule(config(1.0, 10, -1)), Error);          // negative warmup
  EXPECT_THROW(LrSchedule(config(1.0, 10, 5, 0, 0.1)), Error);   // both warmup keys
  EXPECT_THROW(LrSchedule(config(1.0, 10, 0, -3, 0.1)), Error);  // start without warmup_steps
  EXPECT_THROW(LrSchedule(config(1.0, 10, 0, 0, 1.5)), Error);   // proportion > 1
  LrScheduleConfig c = config(1.0, 10, 0);
  c.poly_power = 0;
  EXPECT_THROW(LrSchedule{c}, Error);
  c = config(1.0, 10, 0);
  c.end_lr = 2.0;
  EXPECT_THROW(LrSchedule{c}, Error);
  try {
    LrSchedule(config(1.0, 10, 5, 0, 0.1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("warmup_proportion"), std::string::npos) << e.what();
  }
  const LrSchedule s(config(1.0, 10, 0));
  EXPECT_THROW(s.lr(0), Error);  // updates count from 1
}

}  // namespace
}  // namespace packbert::test
