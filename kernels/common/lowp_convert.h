// Conversions between fp32 and the two 16-bit storage formats of mixed precision (bf16, IEEE
// binary16 "f16"), on raw bits, shared by the CPU backend's emulation and the CUDA backend's
// convert kernels (PB_HD): both round the same way, so the CPU emulation of a low-precision
// step is the specification the GPU is compared with.
//
// Rounding is IEEE round-to-nearest-even in both directions that round (fp32 -> 16 bits);
// widening is exact. Specials:
// - NaN stays NaN, quieted, with the sign and the top payload bits kept (truncating a NaN whose
//   payload sits in the low bits only would otherwise make an infinity).
// - Overflow rounds to infinity by the IEEE rule (bf16: beyond 0x1.fep127 + half an ulp; f16:
//   from 65520 up, the midpoint above the largest finite 65504).
// - f16 keeps its subnormals (down to 2^-24), rounded to nearest even too; results below half
//   of 2^-24 are signed zeros. fp32 subnormals are far below f16's range and give zero.
// No C++ type is involved: storage is uint16_t, which is what kernels/base/tensor.h's DType::bf16 /
// f16 buffers hold, and the CUDA side reinterprets the same bits as __nv_bfloat16 / __half.
#pragma once

#include <stdint.h>
#include <string.h>

#include "kernels/common/host_device.h"

namespace packbert::lowp {

PB_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

PB_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// ---- bf16: the top 16 bits of an fp32 ---------------------------------------------------------
PB_HD uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry runs into the exponent
  // (and from the largest finite values into infinity), which is the correct rounding too.
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

PB_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// ---- f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits
// -----------------------------------------
PB_HD uint16_t float_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u)  // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (a >= 0x38800000u) {  // normal f16 (>= 2^-14): rebias the exponent by 127 - 15 = 112
    const uint32_t r = a - (112u << 23);
    return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal f16 (or zero): the value in units of 2^-24, rounded to nearest even. A carry to
  // 1024 is the smallest normal, 0x0400, which is right.
  const uint32_t e = a >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;   // value = m * 2^(e - 150)
  const uint32_t shift = 126u - e;                  // 14 .. 24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

PB_HD float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in fp32
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace packbert::lowp
