// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11) and the
// dropout keying of DESIGN.md. A counter-based generator is a pure function of (counter, key), so
// a kernel can compute any element's mask bit where it needs it, forward or backward, on any
// device, without storing masks or carrying generator state.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace packbert {

struct Philox4x32 {
  uint32_t v[4];
};

namespace philox_detail {
constexpr uint32_t kM0 = 0xD2511F53u;  // round multipliers
constexpr uint32_t kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u;  // Weyl key increments (golden ratio, sqrt(3) - 1)
constexpr uint32_t kW1 = 0xBB67AE85u;

PB_HD void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;  // nvcc turns this into mul.hi / mul.lo
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

PB_HD Philox4x32 round(Philox4x32 c, uint32_t k0, uint32_t k1) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kM0, c.v[0], hi0, lo0);
  mulhilo(kM1, c.v[2], hi1, lo1);
  return Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
}
}  // namespace philox_detail

// Philox4x32 with 10 rounds: the key is bumped between rounds (9 bumps).
PB_HD Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  Philox4x32 c = counter;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key0 += philox_detail::kW0;
      key1 += philox_detail::kW1;
    }
    c = philox_detail::round(c, key0, key1);
  }
  return c;
}

// A uniform float in [0, 1) from the top 24 bits (every value exactly representable).
PB_HD float philox_uniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// ---- dropout keying ----------------------------------------------------------------------
// A mask bit is a function of (seed, step, sample id, layer, site, head, position inside the
// sample, element) and never of where the token sits in the batch, so padded, packed and
// unpadded layouts, and any rank assignment, drop the same elements (DESIGN.md, Equivalence).
//
//   key     = seed (64 bits)
//   ctr[0]  = element / 4 bits 0..15 (bits 0..15) | position bits 0..15 (bits 16..31)
//   ctr[1]  = layer (bits 0..7) | site (8..11) | head (12..19) | sample id bits 32..43 (20..31)
//   ctr[2]  = sample id bits 0..31
//   ctr[3]  = step (bits 0..23) | position bits 16..19 (24..27) | element / 4 bits 16..19
//             (28..31)
// One Philox call gives the bits of 4 consecutive elements (element % 4 picks the word). Each
// field has a range (the limits below, checked on the host) so distinct tuples never share a
// counter. For attention probabilities: position = query position, element = key position,
// head = the head; for hidden states head = 0 and element = the hidden index. The high bits of
// position and element (sequences beyond 65536 tokens, for long-sequence MST runs) sit above
// the step: for a position < 2^16 and an element < 2^18 they are zero, and ctr[0] and ctr[3]
// hold the low fields alone.
constexpr uint32_t kDropoutMaxPosition = 1u << 20;
constexpr uint32_t kDropoutMaxElement = 1u << 22;
constexpr uint32_t kDropoutMaxStep = 1u << 24;
constexpr uint32_t kDropoutMaxHead = 1u << 8;
constexpr uint32_t kDropoutMaxLayer = 1u << 8;
constexpr uint32_t kDropoutMaxSite = 1u << 4;
constexpr uint64_t kDropoutMaxSampleId = uint64_t{1} << 44;

// Everything a kernel needs for one dropout site in one step (per-token parts come separately).
struct DropoutStream {
  uint32_t key0 = 0, key1 = 0;  // seed
  uint32_t step = 0;
  uint32_t layer_site = 0;  // layer | site << 8
  uint32_t threshold = 0;   // element dropped iff its bits < threshold; 0 = keep all
  float scale = 1.0f;       // 1 / (1 - p): kept elements are scaled so E[out] = in
  // Where set, the step is this word of the op's memory as it is when a kernel runs, not `step`
  // (dropout_now): a CUDA graph's replay then draws the masks of the step of the moment.
  const uint32_t* step_at = nullptr;
};

// p in [0, 1); layer < kDropoutMaxLayer, site < kDropoutMaxSite (the backend checks ranges).
inline DropoutStream make_dropout_stream(float p, uint64_t seed, uint32_t step, uint32_t layer,
                                         uint32_t site) {
  DropoutStream s;
  s.key0 = static_cast<uint32_t>(seed);
  s.key1 = static_cast<uint32_t>(seed >> 32);
  s.step = step;
  s.layer_site = layer | (site << 8);
  // P(bits < threshold) = threshold / 2^32 = p (to 2^-32); the comparison is exact integer math
  // on every device, so CPU and CUDA drop exactly the same elements.
  const double t = static_cast<double>(p) * 4294967296.0 + 0.5;
  s.threshold = t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
  s.scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  return s;
}

PB_HD bool dropout_enabled(const DropoutStream& s) { return s.threshold != 0; }

// s with the step it has now: read from step_at where it has one. Every kernel that draws masks
// calls it once, at its start; the functions below read `step`.
PB_HD DropoutStream dropout_now(DropoutStream s) {
  if (s.step_at != nullptr) {
    s.step = *s.step_at;
    s.step_at = nullptr;
  }
  return s;
}

// The Philox counter of elements [4 * (element / 4), +4) of one (sample, head, position).
PB_HD Philox4x32 dropout_counter(const DropoutStream& s, uint64_t sample_id, uint32_t head,
                                 uint32_t position, uint32_t element) {
  const uint32_t word = element >> 2;
  return Philox4x32{{(word & 0xFFFFu) | (position << 16),
                     s.layer_site | (head << 12) | (static_cast<uint32_t>(sample_id >> 32) << 20),
                     static_cast<uint32_t>(sample_id),
                     s.step | ((position >> 16) << 24) | ((word >> 16) << 28)}};
}

// The 4 words for elements [4 * (element / 4), +4) of one (sample, head, position).
PB_HD Philox4x32 dropout_bits4(const DropoutStream& s, uint64_t sample_id, uint32_t head,
                               uint32_t position, uint32_t element) {
  return philox4x32_10(dropout_counter(s, sample_id, head, position, element), s.key0, s.key1);
}

PB_HD bool dropout_keep_bits(const DropoutStream& s, uint32_t bits) { return bits >= s.threshold; }

// The definition of one element's mask: kernels may compute 4 at a time with dropout_bits4.
PB_HD bool dropout_keep(const DropoutStream& s, uint64_t sample_id, uint32_t head,
                        uint32_t position, uint32_t element) {
  return dropout_keep_bits(s, dropout_bits4(s, sample_id, head, position, element).v[element & 3]);
}

// The multiplier dropout applies to one element: scale when kept, 0 when dropped.
PB_HD float dropout_factor(const DropoutStream& s, uint32_t bits) {
  return dropout_keep_bits(s, bits) ? s.scale : 0.0f;
}

}  // namespace packbert
