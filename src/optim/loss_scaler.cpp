#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "kernels/base/error.h"

namespace packbert {

namespace {
bool power_of_two(float x) {
  int e = 0;
  return x > 0.f && std::isfinite(x) && std::frexp(x, &e) == 0.5f;
}
// The largest power of two <= x (x >= 1).
float floor_pow2(float x) {
  int e = 0;
  std::frexp(x, &e);
  return std::ldexp(1.0f, e - 1);
}
}  // namespace

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  PB_REQUIRE(power_of_two(options_.min_scale) && power_of_two(options_.max_scale) &&
                 options_.min_scale <= options_.max_scale,
             "loss scaler: min_scale {} and max_scale {} must be powers of two, min <= max",
             options_.min_scale, options_.max_scale);
  PB_REQUIRE(options_.init_scale >= options_.min_scale && options_.init_scale <= options_.max_scale,
             "loss scaler: init_scale {} outside [{}, {}]", options_.init_scale, options_.min_scale,
             options_.max_scale);
  PB_REQUIRE(options_.growth_interval >= 1, "loss scaler: growth_interval {} must be >= 1",
             options_.growth_interval);
  state_.scale = floor_pow2(options_.init_scale);
}

float LossScaler::update(bool finite) {
  if (!finite) {
    state_.scale = std::max(options_.min_scale, state_.scale * 0.5f);
    state_.clean_steps = 0;
  } else if (++state_.clean_steps >= options_.growth_interval) {
    state_.scale = std::min(options_.max_scale, state_.scale * 2.0f);
    state_.clean_steps = 0;
  }
  return state_.scale;
}

void LossScaler::set_state(const LossScalerState& state) {
  PB_REQUIRE(power_of_two(state.scale) && state.scale >= options_.min_scale &&
                 state.scale <= options_.max_scale && state.clean_steps >= 0,
             "loss scaler: state (scale {}, clean steps {}) is not a power of two in [{}, {}] "
             "with a count >= 0",
             state.scale, state.clean_steps, options_.min_scale, options_.max_scale);
  state_ = state;
}

}  // namespace packbert
