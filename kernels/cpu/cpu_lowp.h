// The CPU backend's mixed-precision emulation: the staging memory and conversions the generic
// adapter (common/lowp_adapter.h) needs, so every op called with bf16 / f16 tensors runs the
// fp32 reference op on widened copies and rounds its outputs back to nearest even. The CPU then
// computes exactly what storage in 16 bits with fp32 arithmetic gives, which is the
// specification the CUDA backend's low-precision ops are compared with, and what lets CI test
// the model's mixed-precision path without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/lowp_adapter.h"

namespace packbert::cpu {

// dst = src converted (f32 <-> bf16 / f16, or a plain copy for equal dtypes), n elements of
// host memory: widening is exact, narrowing rounds to nearest even (common/lowp_convert.h).
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n);

class LowpStaging final : public lowp::Staging {
 public:
  float* scratch(int slot, int64_t n) override;
  void widen(const Tensor& dst, const Tensor& src) override;
  void narrow(const Tensor& dst, const Tensor& src) override;

 private:
  // Grow-only, one buffer per slot: warm after the first step of the largest shape.
  std::vector<std::vector<float>> slots_;
};

}  // namespace packbert::cpu
