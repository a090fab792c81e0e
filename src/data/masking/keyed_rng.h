// A random stream keyed by what it is for: SplitMix64 whose start is a hash of (seed, key...).
// Cheap to create, so every document, instance or served sample gets its own stream, and what
// it draws cannot depend on how work is split between threads, ranks or steps.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace packbert {

class Rng {
 public:
  Rng(uint64_t seed, std::initializer_list<uint64_t> key);
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ull;
    return mix(state_);
  }
  uint64_t below(uint64_t n);                // uniform in [0, n), n > 0 (unbiased)
  int64_t between(int64_t lo, int64_t hi) {  // uniform in [lo, hi], like Python's randint
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  bool coin() {  // p = 0.5, one bit of a draw at a time (truncation flips many coins)
    if (bits_left_ == 0) {
      bits_ = next();
      bits_left_ = 64;
    }
    const bool b = bits_ & 1u;
    bits_ >>= 1;
    --bits_left_;
    return b;
  }
  static uint64_t mix(uint64_t z);

 private:
  uint64_t state_;
  uint64_t bits_ = 0;
  int bits_left_ = 0;
};

}  // namespace packbert
