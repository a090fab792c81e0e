// The learning-rate schedules: MLPerf BERT's (kind poly: linear warmup, then polynomial decay to
// end_lr at max_steps) and, below, linear, cosine and warmup-stable-decay. Poly follows the MLPerf
// PyTorch reference (mlcommons/training language_model/pytorch, LinearWarmupPolyDecayScheduler,
// from NVIDIA's run_pretraining.py), so a configuration copied from an MLPerf BERT submission
// gives the same learning rates:
//
//   k = 1-based index of the optimizer update (the first update is k = 1)
//   warmup:  k - start_warmup_step <  W:  lr = base_lr * (k - start_warmup_step) / W
//   decay:   otherwise                    lr = (base_lr - end_lr) * (1 - min(k / max_steps, 1))^p
//                                                  + end_lr,   p = poly_power
//
// where W = num_warmup_steps, or floor(max_steps * warmup_proportion) with start_warmup_step
// taken as 0 when num_warmup_steps is 0 (as the reference picks between the two). A negative
// start_warmup_step (MLPerf's "start_warmup_step" key) starts the warmup part-way up the ramp.
//
// Deliberate differences from the reference, all outside every MLPerf configuration:
// - a positive start_warmup_step makes the reference return a negative learning rate before the
//   warmup starts; here the rate is 0 there;
// - the reference divides by zero for W = 0 when k <= start_warmup_step; here W = 0 means no
//   warmup at all (pure decay);
// - start_warmup_step without num_warmup_steps (the reference ignores it) and both warmup keys
//   at once (the reference takes num_warmup_steps) are configuration errors.
// The TensorFlow reference (language_model/tensorflow/bert) evaluates the same formulas at its
// global_step, which is k - 1 for the k-th update: lr_tf(k) = lr(k - 1) here.
//
// The other kinds keep that warmup and replace the decay (docs/training.md, "Learning-rate
// schedules"). E = warmup_start + W is the update where the warmup ends; f(t) is 1 - t, 1 -
// sqrt(t) or (1 + cos(pi t)) / 2; t is clamped to [0, 1], so every kind ends at end_lr:
//   linear, cosine (f: 1 - t, cosine), Hugging Face's decay from the warmup's end:
//     k >= E:  lr = end_lr + (base_lr - end_lr) f(t),  t = (k - E) / (max_steps - E)
//   wsd (warmup-stable-decay; Hu et al. 2024; 1-sqrt: Hägele et al. 2024), f = decay_shape:
//     k >= E:  lr = base_lr up to D = max_steps - decay_steps, then
//              lr = end_lr + (base_lr - end_lr) f(t),  t = (k - D) / decay_steps
//
// Unit tokens (optim.schedule_unit): the same formulas with k the real tokens trained up to and
// including the update, and every length (max_steps, the warmup, decay_steps) counted in tokens.
#pragma once

#include <cstdint>
#include <string>

namespace packbert {

enum class LrScheduleKind { poly, linear, cosine, wsd };
enum class DecayShape { linear, one_minus_sqrt, cosine };
enum class ScheduleUnit { steps, tokens };
const char* lr_schedule_kind_name(LrScheduleKind k);  // "poly", "linear", "cosine", "wsd"
const char* decay_shape_name(DecayShape s);           // "linear", "1-sqrt", "cosine"
const char* schedule_unit_name(ScheduleUnit u);       // "steps", "tokens"

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::poly;
  double base_lr = 0.0;          // peak rate (MLPerf opt_base_learning_rate)
  int64_t max_steps = 0;         // the rate reaches end_lr here (opt_learning_rate_training_steps)
  int64_t num_warmup_steps = 0;  // opt_learning_rate_warmup_steps; 0: use warmup_proportion
  double warmup_proportion = 0.0;  // in [0, 1]; used only when num_warmup_steps is 0
  int64_t start_warmup_step = 0;   // MLPerf start_warmup_step (may be negative); with
                                   // num_warmup_steps only, as in the reference
  double poly_power = 1.0;         // opt_lamb_learning_rate_decay_poly_power (poly only)
  double end_lr = 0.0;
  // wsd only: the decay's length, decay_steps or else floor(max_steps * decay_fraction), and
  // its shape.
  int64_t decay_steps = 0;
  double decay_fraction = 0.0;
  DecayShape decay_shape = DecayShape::linear;
  // What k and the lengths above count: updates, or real tokens trained (then max_steps,
  // num_warmup_steps, start_warmup_step and decay_steps are token counts).
  ScheduleUnit unit = ScheduleUnit::steps;
};

class LrSchedule {
 public:
  // Throws Error naming the offending key (negative or non-finite values, max_steps < 1, both
  // num_warmup_steps and warmup_proportion given; for wsd, both or neither of decay_steps and
  // decay_fraction, or a decay that starts before the warmup ends; decay keys or a poly_power
  // other than 1 given to a kind that does not read them).
  explicit LrSchedule(const LrScheduleConfig& config);

  // The rate at position k >= 1 (throws Error otherwise): the k-th optimizer update, or with unit
  // tokens the update after which k tokens are trained. Beyond max_steps the rate stays at
  // end_lr.
  double lr(int64_t k) const;

  const LrScheduleConfig& config() const { return config_; }
  // The warmup actually used (after resolving warmup_proportion) and where it starts.
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t warmup_start() const { return warmup_start_; }
  int64_t decay_steps() const { return decay_steps_; }  // wsd: the decay's length (resolved)
  // One line for the log: "lr 4e-3, warmup 100 steps from step 0, poly 1 decay to 0 at step
  // 1141" (the other kinds name theirs; "tokens" for unit tokens).
  std::string describe() const;

 private:
  LrScheduleConfig config_;
  int64_t warmup_steps_ = 0;
  int64_t warmup_start_ = 0;
  int64_t decay_steps_ = 0;
  double decay(double t) const;  // f(t) of the kind (linear, cosine) or of decay_shape (wsd)
  std::string describe_in_steps() const;
};

}  // namespace packbert
