#include "data/masking/keyed_rng.h"

namespace packbert {

uint64_t Rng::mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed, std::initializer_list<uint64_t> key) {
  // Each key part goes through the finaliser before it is combined, so nearby keys (doc 7 and
  // doc 8) give unrelated starting states.
  uint64_t h = mix(seed + 0x632BE59BD9B4E019ull);
  for (uint64_t k : key) h = mix(h ^ mix(k + 0x9E3779B97F4A7C15ull));
  state_ = h;
}

uint64_t Rng::below(uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased, one multiplication in the common case.
  uint64_t x = next();
  unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      x = next();
      m = static_cast<unsigned __int128>(x) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace packbert
