#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/base/error.h"

namespace packbert {

namespace {
constexpr double kPi = 3.14159265358979323846;
}

const char* lr_schedule_kind_name(LrScheduleKind k) {
  switch (k) {
    case LrScheduleKind::poly: return "poly";
    case LrScheduleKind::linear: return "linear";
    case LrScheduleKind::cosine: return "cosine";
    case LrScheduleKind::wsd: return "wsd";
  }
  return "?";
}

const char* decay_shape_name(DecayShape s) {
  switch (s) {
    case DecayShape::linear: return "linear";
    case DecayShape::one_minus_sqrt: return "1-sqrt";
    case DecayShape::cosine: return "cosine";
  }
  return "?";
}

const char* schedule_unit_name(ScheduleUnit u) {
  return u == ScheduleUnit::tokens ? "tokens" : "steps";
}

LrSchedule::LrSchedule(const LrScheduleConfig& c) : config_(c) {
  PB_REQUIRE(std::isfinite(c.base_lr) && c.base_lr >= 0,
             "lr schedule: learning_rate {} must be finite and >= 0", c.base_lr);
  PB_REQUIRE(c.max_steps >= 1, "lr schedule: max_steps {} must be >= 1", c.max_steps);
  PB_REQUIRE(c.num_warmup_steps >= 0, "lr schedule: warmup_steps {} must be >= 0",
             c.num_warmup_steps);
  PB_REQUIRE(
      std::isfinite(c.warmup_proportion) && c.warmup_proportion >= 0 && c.warmup_proportion <= 1,
      "lr schedule: warmup_proportion {} must be in [0, 1]", c.warmup_proportion);
  // The reference silently prefers warmup_steps; two answers to one question is a config error.
  PB_REQUIRE(c.num_warmup_steps == 0 || c.warmup_proportion == 0,
             "lr schedule: both warmup_steps ({}) and warmup_proportion ({}) are set; give one",
             c.num_warmup_steps, c.warmup_proportion);
  // The reference ignores start_warmup_step with warmup_proportion; a value given there would
  // be silently dropped, so it is an error here.
  PB_REQUIRE(c.num_warmup_steps > 0 || c.start_warmup_step == 0,
             "lr schedule: start_warmup_step {} applies to warmup_steps only, and warmup_steps is "
             "not set",
             c.start_warmup_step);
  PB_REQUIRE(std::isfinite(c.poly_power) && c.poly_power > 0,
             "lr schedule: poly_power {} must be > 0", c.poly_power);
  PB_REQUIRE(std::isfinite(c.end_lr) && c.end_lr >= 0 && c.end_lr <= c.base_lr,
             "lr schedule: end_learning_rate {} must be in [0, learning_rate {}]", c.end_lr,
             c.base_lr);
  if (c.num_warmup_steps > 0) {
    warmup_steps_ = c.num_warmup_steps;
    warmup_start_ = c.start_warmup_step;
  } else {
    // Python's int(max_steps * warmup_proportion): the same double product, truncated.
    warmup_steps_ = static_cast<int64_t>(static_cast<double>(c.max_steps) * c.warmup_proportion);
    warmup_start_ = 0;
  }
  const char* kind = lr_schedule_kind_name(c.kind);
  PB_REQUIRE(c.kind == LrScheduleKind::poly || c.poly_power == 1.0,
             "lr schedule: poly_power {} applies to the poly schedule, not to {}", c.poly_power,
             kind);
  const bool wsd = c.kind == LrScheduleKind::wsd;
  PB_REQUIRE(
      wsd || (c.decay_steps == 0 && c.decay_fraction == 0 && c.decay_shape == DecayShape::linear),
      "lr schedule: decay_steps, decay_fraction and decay_shape apply to the wsd schedule, "
      "not to {}",
      kind);
  if (!wsd) return;
  PB_REQUIRE(c.decay_steps >= 0, "lr schedule: decay_steps {} must be >= 0", c.decay_steps);
  PB_REQUIRE(std::isfinite(c.decay_fraction) && c.decay_fraction >= 0 && c.decay_fraction <= 1,
             "lr schedule: decay_fraction {} must be in [0, 1]", c.decay_fraction);
  PB_REQUIRE((c.decay_steps > 0) != (c.decay_fraction > 0),
             "lr schedule: wsd needs one of decay_steps ({}) and decay_fraction ({})",
             c.decay_steps, c.decay_fraction);
  decay_steps_ = c.decay_steps > 0
                     ? c.decay_steps
                     : static_cast<int64_t>(static_cast<double>(c.max_steps) * c.decay_fraction);
  PB_REQUIRE(decay_steps_ >= 1, "lr schedule: decay_fraction {} of {} steps is no step",
             c.decay_fraction, c.max_steps);
  PB_REQUIRE(c.max_steps - decay_steps_ >= warmup_start_ + warmup_steps_,
             "lr schedule: the decay of {} steps starts at step {}, before the warmup ends at "
             "step {}",
             decay_steps_, c.max_steps - decay_steps_, warmup_start_ + warmup_steps_);
}

double LrSchedule::decay(double t) const {
  const DecayShape shape = config_.kind == LrScheduleKind::wsd      ? config_.decay_shape
                           : config_.kind == LrScheduleKind::cosine ? DecayShape::cosine
                                                                    : DecayShape::linear;
  switch (shape) {
    case DecayShape::linear: return 1.0 - t;
    case DecayShape::one_minus_sqrt: return 1.0 - std::sqrt(t);
    case DecayShape::cosine: return 0.5 * (1.0 + std::cos(kPi * t));
  }
  return 0.0;
}

double LrSchedule::lr(int64_t k) const {
  PB_REQUIRE(k >= 1, "lr schedule: update index {} must be >= 1 (the first update is 1)", k);
  const LrScheduleConfig& c = config_;
  const int64_t into_warmup = k - warmup_start_;
  if (into_warmup < warmup_steps_) {
    return c.base_lr * static_cast<double>(std::max<int64_t>(into_warmup, 0)) /
           static_cast<double>(warmup_steps_);
  }
  if (c.kind == LrScheduleKind::poly) {
    const double progress =
        std::min(static_cast<double>(k) / static_cast<double>(c.max_steps), 1.0);
    return (c.base_lr - c.end_lr) * std::pow(1.0 - progress, c.poly_power) + c.end_lr;
  }
  // The decay's first update and length: from the warmup's end, or the last decay_steps.
  const int64_t from =
      c.kind == LrScheduleKind::wsd ? c.max_steps - decay_steps_ : warmup_start_ + warmup_steps_;
  if (k >= c.max_steps) return c.end_lr;
  if (k <= from) return c.base_lr;
  const double t = static_cast<double>(k - from) / static_cast<double>(c.max_steps - from);
  return c.end_lr + (c.base_lr - c.end_lr) * decay(t);
}

std::string LrSchedule::describe() const {
  std::string d = describe_in_steps();
  if (config_.unit == ScheduleUnit::steps) return d;
  // The same sentence counted in tokens.
  for (const char* from : {" steps", " step "}) {
    const std::string to = std::string(from) == " steps" ? " tokens" : " token ";
    for (size_t at = d.find(from); at != std::string::npos; at = d.find(from, at + to.size()))
      d.replace(at, std::string(from).size(), to);
  }
  return d;
}

std::string LrSchedule::describe_in_steps() const {
  if (config_.kind == LrScheduleKind::wsd)
    return fmt::format(
        "lr {:g}, warmup {} steps from step {}, stable to step {}, {} decay over {} steps to {:g} "
        "at step {}",
        config_.base_lr, warmup_steps_, warmup_start_, config_.max_steps - decay_steps_,
        decay_shape_name(config_.decay_shape), decay_steps_, config_.end_lr, config_.max_steps);
  if (config_.kind != LrScheduleKind::poly)
    return fmt::format("lr {:g}, warmup {} steps from step {}, {} decay to {:g} at step {}",
                       config_.base_lr, warmup_steps_, warmup_start_,
                       lr_schedule_kind_name(config_.kind), config_.end_lr, config_.max_steps);
  return fmt::format("lr {:g}, warmup {} steps from step {}, poly {:g} decay to {:g} at step {}",
                     config_.base_lr, warmup_steps_, warmup_start_, config_.poly_power,
                     config_.end_lr, config_.max_steps);
}

}  // namespace packbert
