// The optimizer's update rule (optim.name), shared by the op list (kernels/ops/lamb.h) and the
// kernels' math (kernels/common/math.h); the formulas are PACKBERT_LAMB_OPS's.
#pragma once

#include <stdint.h>

namespace packbert {

enum class UpdateRule : int32_t { lamb = 0, adamw = 1, stable_adamw = 2 };

}  // namespace packbert
