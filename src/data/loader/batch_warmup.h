// Batch-size warmup: the global batch of a step grows linearly from `start` samples to the final
// size (train.global_batch_size) over `steps` optimizer steps or `tokens` real tokens trained,
// in multiples of `multiple` (every size is one all ranks and micro-steps divide when the
// multiple is). With x the step's index (steps) or the tokens trained before it (tokens) and N
// the warmup's length:
//
//   B(x) = final                                                          x >= N
//   B(x) = start + floor((final - start) * x / N / multiple) * multiple   x <  N
//
// (integer division throughout, so every rank computes the same size). start and final are
// multiples of `multiple`, so B never passes final and reaches it at the warmup's end. The size
// depends only on the step and the tokens before it, never on the ranks, so a run at any rank
// count and a resumed run see the same sizes.
#pragma once

#include <cstdint>

namespace packbert {

struct BatchWarmup {
  int64_t start = 0;     // samples of step 0; 0 = no warmup
  int64_t steps = 0;     // the warmup's length in optimizer steps, or
  int64_t tokens = 0;    //   in tokens trained (exactly one of the two when start > 0)
  int64_t multiple = 1;  // every size is a multiple of it

  bool on() const { return start > 0; }
};

// The global batch of the step with index `step` (0-based) after `tokens_before` tokens trained.
int64_t warmup_batch_size(const BatchWarmup& w, int64_t final_size, int64_t step,
                          int64_t tokens_before);

// Throws Error, naming `what` (the config keys' prefix), unless the warmup is off or consistent:
// 1 <= start <= final, both multiples of `multiple`, exactly one of steps and tokens positive.
void check_batch_warmup(const BatchWarmup& w, int64_t final_size, const char* what);

}  // namespace packbert
