// The linear, cosine and warmup-stable-decay schedules (optim/lr_schedule.h) against naive
// transcriptions of Hugging Face's lr lambdas (transformers/optimization.py:
// get_linear_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup with
// num_cycles 0.5, get_wsd_schedule), evaluated at current_step = k, at every step of fixed and
// fresh random configurations; hand-computed values; and the configuration errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/base/error.h"
#include "measure.h"
#include "optim/lr_schedule.h"
#include "test_util.h"

namespace packbert::test {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Hugging Face's multiplier of base_lr at current_step s, with min_lr_ratio = end_lr / base_lr.
double hf_factor(const LrScheduleConfig& c, int64_t s) {
  const double w = static_cast<double>(c.num_warmup_steps);
  const double total = static_cast<double>(c.max_steps);
  const double min_ratio = c.base_lr > 0 ? c.end_lr / c.base_lr : 0.0;
  const double step = static_cast<double>(s);
  if (step < w) return step / std::max(1.0, w);
  if (c.kind == LrScheduleKind::linear) {  // HF's linear decays to 0; with an end rate:
    const double value = std::max(0.0, (total - step) / std::max(1.0, total - w));
    return value * (1 - min_ratio) + min_ratio;
  }
  if (c.kind == LrScheduleKind::cosine) {
    const double progress = std::min(1.0, (step - w) / std::max(1.0, total - w));
    const double value = 0.5 * (1.0 + std::cos(kPi * 2.0 * 0.5 * progress));
    return value * (1.0 - min_ratio) + min_ratio;
  }
  // wsd: num_stable_steps = total - warmup - decay.
  const double decay = static_cast<double>(c.decay_steps);
  const double stable = total - w - decay;
  if (step < w + stable) return 1.0;
  if (step < w + stable + decay) {
    const double progress = (step - w - stable) / std::max(1.0, decay);
    double value = 0;
    if (c.decay_shape == DecayShape::linear) value = 1.0 - progress;
    if (c.decay_shape == DecayShape::cosine) value = 0.5 * (1.0 + std::cos(kPi * progress));
    if (c.decay_shape == DecayShape::one_minus_sqrt) value = 1.0 - std::sqrt(progress);
    return std::max(0.0, (1.0 - min_ratio) * value + min_ratio);
  }
  return min_ratio;
}

LrScheduleConfig kind(LrScheduleKind k, double lr, int64_t max_steps, int64_t warmup,
                      double end_lr = 0.0, int64_t decay_steps = 0,
                      DecayShape shape = DecayShape::linear) {
  LrScheduleConfig c;
  c.kind = k;
  c.base_lr = lr;
  c.max_steps = max_steps;
  c.num_warmup_steps = warmup;
  c.end_lr = end_lr;
  c.decay_steps = decay_steps;
  c.decay_shape = shape;
  return c;
}

// Every step to 50 past the end: the schedule against the transcription, 1e-12 of base_lr
// (both evaluate the same few double operations in another order: a few ulps, 1e-15). From
// max_steps on the rate is end_lr, as Hugging Face's is except in one corner: cosine with a
// warmup as long as the run gives the peak at current_step = total there.
double worst_against_hf(const LrScheduleConfig& c) {
  const LrSchedule s(c);
  double worst = 0;
  for (int64_t k = 1; k <= c.max_steps + 50; ++k) {
    const double want = k >= c.max_steps ? c.end_lr : c.base_lr * hf_factor(c, k);
    EXPECT_NEAR(s.lr(k), want, 1e-12 * c.base_lr) << s.describe() << " at step " << k;
    worst = std::max(worst, std::abs(s.lr(k) - want) / c.base_lr);
  }
  return worst;
}

TEST(LrScheduleKinds, MatchHuggingFaceAtEveryStep) {
  for (LrScheduleKind k : {LrScheduleKind::linear, LrScheduleKind::cosine}) {
    worst_against_hf(kind(k, 1e-3, 1000, 100));
    worst_against_hf(kind(k, 1e-3, 1000, 0, 1e-5));
    worst_against_hf(kind(k, 5e-4, 37, 37));  // all warmup
  }
  for (DecayShape d : {DecayShape::linear, DecayShape::one_minus_sqrt, DecayShape::cosine}) {
    worst_against_hf(kind(LrScheduleKind::wsd, 8e-4, 1000, 50, 0.0, 200, d));
    worst_against_hf(kind(LrScheduleKind::wsd, 8e-4, 1000, 0, 8e-5, 1000, d));  // all decay
    worst_against_hf(kind(LrScheduleKind::wsd, 8e-4, 300, 299, 0.0, 1, d));
  }
  // Fresh random ones, each kind.
  std::mt19937_64 rng(test_seed());
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    const int64_t max_steps = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    const int64_t warmup = std::uniform_int_distribution<int64_t>(0, max_steps - 1)(rng);
    const double lr = std::uniform_real_distribution<double>(1e-5, 1e-2)(rng);
    const double end = lr * std::uniform_real_distribution<double>(0, 0.5)(rng);
    const int64_t decay = std::uniform_int_distribution<int64_t>(1, max_steps - warmup)(rng);
    const auto shape = static_cast<DecayShape>(rng() % 3);
    worst =
        std::max(worst, worst_against_hf(kind(LrScheduleKind::linear, lr, max_steps, warmup, end)));
    worst =
        std::max(worst, worst_against_hf(kind(LrScheduleKind::cosine, lr, max_steps, warmup, end)));
    worst = std::max(worst, worst_against_hf(kind(LrScheduleKind::wsd, lr, max_steps, warmup, end,
                                                  decay, shape)));
  }
  print_bound("random schedules vs Hugging Face's formulas / base_lr", worst, 1e-12);
}

TEST(LrScheduleKinds, HandComputedValues) {
  const LrSchedule lin(kind(LrScheduleKind::linear, 1.0, 110, 10));
  EXPECT_DOUBLE_EQ(lin.lr(5), 0.5);
  EXPECT_DOUBLE_EQ(lin.lr(10), 1.0);  // the warmup's end: the peak, then 1 - (k - 10) / 100
  EXPECT_DOUBLE_EQ(lin.lr(60), 0.5);
  EXPECT_DOUBLE_EQ(lin.lr(110), 0.0);
  const LrSchedule cos(kind(LrScheduleKind::cosine, 1.0, 110, 10, 0.2));
  EXPECT_DOUBLE_EQ(cos.lr(60), 0.2 + 0.8 * 0.5);  // half-way: cos(pi / 2) = 0
  EXPECT_DOUBLE_EQ(cos.lr(500), 0.2);
  // wsd: warmup 10, stable to step 80, then 20 steps of 1 - sqrt(t).
  LrScheduleConfig w = kind(LrScheduleKind::wsd, 1.0, 100, 10, 0.0, 0, DecayShape::one_minus_sqrt);
  w.decay_fraction = 0.2;
  const LrSchedule wsd(w);
  EXPECT_EQ(wsd.decay_steps(), 20);
  EXPECT_DOUBLE_EQ(wsd.lr(10), 1.0);
  EXPECT_DOUBLE_EQ(wsd.lr(80), 1.0);
  EXPECT_DOUBLE_EQ(wsd.lr(85), 0.5);  // t = 1/4
  EXPECT_DOUBLE_EQ(wsd.lr(100), 0.0);
  EXPECT_DOUBLE_EQ(wsd.lr(101), 0.0);
}

TEST(LrScheduleKinds, RejectsWhatTheyDoNotRead) {
  auto expect_error = [](const LrScheduleConfig& c, const char* names) {
    try {
      LrSchedule s(c);
      ADD_FAILURE() << "accepted: " << s.describe();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  LrScheduleConfig c = kind(LrScheduleKind::cosine, 1.0, 100, 10);
  c.poly_power = 2.0;
  expect_error(c, "poly_power");
  expect_error(kind(LrScheduleKind::linear, 1.0, 100, 10, 0.0, 20), "decay_steps");
  expect_error(kind(LrScheduleKind::poly, 1.0, 100, 10, 0.0, 0, DecayShape::cosine), "decay_shape");
  expect_error(kind(LrScheduleKind::wsd, 1.0, 100, 10), "decay_steps");  // neither given
  c = kind(LrScheduleKind::wsd, 1.0, 100, 10, 0.0, 20);
  c.decay_fraction = 0.2;
  expect_error(c, "decay_fraction");  // both
  expect_error(kind(LrScheduleKind::wsd, 1.0, 100, 10, 0.0, 95), "before the warmup ends");
  c = kind(LrScheduleKind::wsd, 1.0, 100, 0);
  c.decay_fraction = 0.001;
  expect_error(c, "no step");
}

}  // namespace
}  // namespace packbert::test
