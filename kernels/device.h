// Which compute devices this build and this machine offer.
#pragma once

#include <cstddef>
#include <string>

namespace packbert {

// True when the binary was built with the CUDA backend.
bool cuda_built();
// Number of usable CUDA devices; 0 when the build has no CUDA, or there is no driver or GPU.
// Never throws: a CUDA build must run on a machine without a GPU.
int cuda_device_count();
// One line per device ("cuda:0 NVIDIA H200, sm_90, 139.8 GiB"), or why there is none.
std::string describe_devices();
// Free and total memory of CUDA device `device`; false without CUDA or when it cannot be read.
bool cuda_device_memory(int device, size_t& free, size_t& total);

// The cuBLASLt workspace each CUDA backend allocates when it is made (outside Backend::alloc).
constexpr size_t kCudaGemmWorkspaceBytes = size_t{32} << 20;

}  // namespace packbert
