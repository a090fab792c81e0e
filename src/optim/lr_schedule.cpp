#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/base/error.h"

namespace packbert {

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
}

double LrSchedule::lr(int64_t k) const {
  PB_REQUIRE(k >= 1, "lr schedule: update index {} must be >= 1 (the first update is 1)", k);
  const LrScheduleConfig& c = config_;
  const int64_t into_warmup = k - warmup_start_;
  if (into_warmup < warmup_steps_) {
    return c.base_lr * static_cast<double>(std::max<int64_t>(into_warmup, 0)) /
           static_cast<double>(warmup_steps_);
  }
  const double progress = std::min(static_cast<double>(k) / static_cast<double>(c.max_steps), 1.0);
  return (c.base_lr - c.end_lr) * std::pow(1.0 - progress, c.poly_power) + c.end_lr;
}

std::string LrSchedule::describe() const {
  return fmt::format("lr {:g}, warmup {} steps from step {}, poly {:g} decay to {:g} at step {}",
                     config_.base_lr, warmup_steps_, warmup_start_, config_.poly_power,
                     config_.end_lr, config_.max_steps);
}

}  // namespace packbert
