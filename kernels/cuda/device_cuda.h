// Host-side view of the CUDA runtime: device discovery that never throws, a check macro.
#pragma once

#include <cstddef>
#include <string>

namespace packbert::cuda {

int device_count();      // 0 when there is no driver or no device
std::string describe();  // one line per device, or the runtime's reason for none
// Free and total memory of `device` (cudaMemGetInfo there); false when it cannot be read.
bool memory(int device, size_t& free, size_t& total);

// Runs a small kernel on the current device: out[i] = a * x[i] + y[i] for n elements.
// Exists so that the gpu tests can prove the runtime, the launch and the copies work.
void saxpy(int n, float a, const float* x_host, const float* y_host, float* out_host);

}  // namespace packbert::cuda
