// Rows of f32 / bf16 / f16 buffers as fp32, for the CPU ops that take each tensor in its own
// storage dtype (rotary_embedding, glu_forward, glu_backward): a row is widened into fp32
// scratch (exactly), computed in fp32, and rounded back to nearest even (common/lowp_convert.h,
// the functions the CUDA kernels use), one rounding per element written.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/base/tensor.h"
#include "kernels/common/lowp_convert.h"

namespace packbert::cpu {

// dst[0 .. n) = elements [at, at + n) of buffer src (dtype t), as fp32.
inline void widen_row(float* dst, const void* src, DType t, int64_t at, int64_t n) {
  if (t == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(src) + at, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src) + at;
  if (t == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = lowp::bf16_to_float(s[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = lowp::f16_to_float(s[i]);
  }
}

// Elements [at, at + n) of buffer dst (dtype t) = src[0 .. n), rounded to t.
inline void narrow_row(void* dst, DType t, int64_t at, const float* src, int64_t n) {
  if (t == DType::f32) {
    std::memcpy(static_cast<float*>(dst) + at, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst) + at;
  if (t == DType::bf16) {
    for (int64_t i = 0; i < n; ++i) d[i] = lowp::float_to_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = lowp::float_to_f16(src[i]);
  }
}

}  // namespace packbert::cpu
