// Compiled as a kernels file is (kernels_see_only_their_root): the kernels' own headers resolve.
#include "kernels/backend.h"
#include "kernels/base/error.h"

int kernels_root_ok() { return static_cast<int>(packbert::DType::f32); }
