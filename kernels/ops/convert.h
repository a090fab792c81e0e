// Precision: a float tensor into another float dtype. The op's contract is the comment above
// its entry in PACKBERT_CONVERT_OPS (the list's form: kernels/ops/op_list.h); each backend checks
// its arguments itself.
#pragma once

#include "kernels/base/tensor.h"
#include "kernels/ops/op_list.h"

namespace packbert {

// ---- precision -------------------------------------------------------------------------------
#define PACKBERT_CONVERT_OPS(OP)                                                                   \
  /* dst = src in another float dtype, same element count, no overlap: f32 -> bf16 / f16 rounds    \
     to nearest even (NaN kept, overflow to infinity), bf16 / f16 -> f32 is exact; equal dtypes    \
     copy. The model fills its low-precision weight copy with it (after initialisation or a        \
     checkpoint load; afterwards lamb_step keeps it current). */                                   \
  OP(convert, (const Tensor& dst, const Tensor& src), (dst, src))

}  // namespace packbert
