// The one place that names the concrete backends: the factory and device discovery know both,
// so neither backend includes the other (kernels/cpu never sees CUDA; kernels/cuda uses the
// CPU backend's shared code through kernels/common only).
#include <fmt/format.h>

#include "kernels/backend.h"
#include "kernels/base/error.h"
#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_cuda.h"
#endif

namespace packbert {

#ifdef PACKBERT_HAVE_CUDA
bool cuda_built() { return true; }
int cuda_device_count() { return cuda::device_count(); }
std::string describe_devices() { return cuda::describe(); }
bool cuda_device_memory(int device, size_t& free, size_t& total) {
  return cuda::memory(device, free, total);
}
#else
bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string describe_devices() { return "cpu only (built without CUDA)"; }
bool cuda_device_memory(int, size_t&, size_t&) { return false; }
#endif

std::unique_ptr<Backend> make_backend(Device device, const BackendOptions& options) {
  if (device == Device::cpu) return make_cpu_backend();
#ifdef PACKBERT_HAVE_CUDA
  CudaBackendOptions co;
  co.validate_indices = options.validate;
  co.validate_pointers = options.validate;
  return make_cuda_backend(options.cuda_device, co);
#else
  (void)options;
  PB_THROW(
      "device cuda asked for, but this build has no CUDA backend (configure with "
      "-DPACKBERT_CUDA=ON)");
#endif
}

}  // namespace packbert
