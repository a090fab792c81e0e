// The arithmetic of rotary_embedding (kernels/ops/rotary.h), shared by the CPU and CUDA
// backends: the frequency and the angle in double (positions reach thousands of radians, where an
// fp32 angle would be off by ~1e-3 rad), cos and sin rounded once to float, and the pair's
// rotation in fp32.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/common/host_device.h"

namespace packbert {

// theta^(-2i/d): the angular frequency of pair i of a head of dimension d.
PB_HD double rotary_inv_freq(double theta, int64_t i, int64_t d) {
  return pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
}

// cos and sin of pos * inv_freq, each rounded once to float; sin negated for the inverse
// rotation (exact).
PB_HD void rotary_cos_sin(int32_t pos, double inv_freq, bool inverse, float* c, float* s) {
  const double angle = static_cast<double>(pos) * inv_freq;
  *c = static_cast<float>(cos(angle));
  const float sf = static_cast<float>(sin(angle));
  *s = inverse ? -sf : sf;
}

// The pair (x, y) = (x_i, x_{i+d/2}) rotated: (x c - y s, y c + x s), in fp32.
PB_HD void rotary_rotate(float& x, float& y, float c, float s) {
  const float rx = x * c - y * s;
  const float ry = y * c + x * s;
  x = rx;
  y = ry;
}

}  // namespace packbert
