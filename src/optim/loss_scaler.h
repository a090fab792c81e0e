// Dynamic loss scaling for fp16 mixed precision (BertOptions::precision = fp16). fp16 stores
// values down to 2^-24 only, so small activation gradients would flush to zero: the loss's
// gradient is multiplied by a scale S (ForwardOptions::loss_scale), every gradient of the step
// carries S, and the optimizer divides it out (Lamb::step's grad_scale). Too large an S
// overflows to inf / NaN somewhere; the gradient norm then is not finite, the step is skipped
// (weights, moments and LAMB's step count untouched) and S halves. After growth_interval clean
// steps in a row S doubles again, so it hovers just below the overflow point.
//
// Powers of two only (init_scale is rounded to one): scaling and unscaling are then exact in
// binary floating point, and a scaled step computes what the unscaled one would, up to the
// storage rounding that scaling is there to avoid.
//
// The scale and the count of clean steps are training state: an exact resume restores both
// (state() / set_state(); a checkpoint stores them next to LAMB's step count).
#pragma once

#include <cstdint>

namespace packbert {

struct LossScalerOptions {
  float init_scale = 65536.0f;     // 2^16, as apex and PyTorch's GradScaler
  int64_t growth_interval = 2000;  // clean steps before the scale doubles
  float min_scale = 1.0f;          // never below (a run that overflows at 1 has diverged)
  float max_scale = 16777216.0f;   // 2^24
};

struct LossScalerState {
  float scale = 1.0f;
  int64_t clean_steps = 0;  // finite steps since the last change of the scale
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});

  // The scale for the next step's forward and optimizer.
  float scale() const { return state_.scale; }
  // After a step whose gradient was finite (true) or not (false, the step was skipped).
  // Returns the scale for the next step.
  float update(bool finite);

  LossScalerState state() const { return state_; }
  void set_state(const LossScalerState& state);  // Error unless a power of two in range
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace packbert
