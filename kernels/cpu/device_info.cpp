#include "device.h"

#include <fmt/format.h>

#ifdef PACKBERT_HAVE_CUDA
#include "cuda/device_cuda.h"
#endif

namespace packbert {

#ifdef PACKBERT_HAVE_CUDA
bool cuda_built() { return true; }
int cuda_device_count() { return cuda::device_count(); }
std::string describe_devices() { return cuda::describe(); }
#else
bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string describe_devices() { return "cpu only (built without CUDA)"; }
#endif

}  // namespace packbert
