#include "data/loader/batch_warmup.h"

#include "kernels/base/error.h"

namespace packbert {

int64_t warmup_batch_size(const BatchWarmup& w, int64_t final_size, int64_t step,
                          int64_t tokens_before) {
  if (!w.on()) return final_size;
  const int64_t x = w.steps > 0 ? step : tokens_before;
  const int64_t n = w.steps > 0 ? w.steps : w.tokens;
  if (x >= n) return final_size;
  // (final - start) * x can pass 2^63 for a warmup over many tokens: 128-bit.
  const __int128 grown = static_cast<__int128>(final_size - w.start) * x / n;
  return w.start + static_cast<int64_t>(grown / w.multiple) * w.multiple;
}

void check_batch_warmup(const BatchWarmup& w, int64_t final_size, const char* what) {
  if (!w.on()) {
    PB_REQUIRE(w.steps == 0 && w.tokens == 0,
               "{}_steps / {}_tokens: set only with {}_start (the warmup's first size)", what, what,
               what);
    return;
  }
  PB_REQUIRE(w.multiple >= 1, "{}_multiple {} must be >= 1", what, w.multiple);
  PB_REQUIRE(w.start <= final_size,
             "{}_start {} must not exceed the global batch size {} it grows to", what, w.start,
             final_size);
  PB_REQUIRE(w.start % w.multiple == 0 && final_size % w.multiple == 0,
             "{}_start {} and the global batch size {} must be multiples of {}_multiple {} (the "
             "sizes every rank and micro-step divide)",
             what, w.start, final_size, what, w.multiple);
  PB_REQUIRE((w.steps > 0) != (w.tokens > 0) && w.steps >= 0 && w.tokens >= 0,
             "{}: give the warmup's length as {}_steps or as {}_tokens (exactly one, > 0); got "
             "{} and {}",
             what, what, what, w.steps, w.tokens);
}

}  // namespace packbert
