#include "kernels/cuda/device_cuda.h"

#include <cuda_runtime.h>

#include <fmt/format.h>

#include "kernels/base/error.h"
#include "kernels/cuda/device_seams.cuh"

// Every CUDA runtime call is checked; failure names the call, file and line.
#define PB_CUDA_CHECK(call)                                                                        \
  do {                                                                                             \
    cudaError_t err_ = (call);                                                                     \
    if (err_ != cudaSuccess)                                                                       \
      PB_THROW("CUDA error '{}' from {} at {}:{}", cudaGetErrorString(err_), #call, __FILE__,      \
               __LINE__);                                                                          \
  } while (0)

namespace packbert::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

bool memory(int device, size_t& free, size_t& total) {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  if (!ok) cudaGetLastError();
  cudaSetDevice(previous);
  return ok;
}

std::string describe() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no CUDA device ({})", cudaGetErrorString(err));
  }
  std::string out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out += fmt::format("cuda:{} {}, sm_{}{}, {:.1f} GiB, {} SMs\n", i, p.name, p.major, p.minor,
                       p.totalGlobalMem / double(1ull << 30), p.multiProcessorCount);
  }
  return n == 0 ? "no CUDA device" : out;
}

namespace {
__global__ void saxpy_kernel(int n, float a, const float* x, const float* y, float* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
}  // namespace

void saxpy(int n, float a, const float* x_host, const float* y_host, float* out_host) {
  float *x = nullptr, *y = nullptr, *out = nullptr;
  const size_t bytes = size_t(n) * sizeof(float);
  PB_CUDA_CHECK(cudaMalloc(&x, bytes));
  PB_CUDA_CHECK(cudaMalloc(&y, bytes));
  PB_CUDA_CHECK(cudaMalloc(&out, bytes));
  PB_CUDA_CHECK(memcpy_sync(x, x_host, bytes, cudaMemcpyHostToDevice));
  PB_CUDA_CHECK(memcpy_sync(y, y_host, bytes, cudaMemcpyHostToDevice));
  PB_LAUNCH((n + 255) / 256, 256, 0, 0, saxpy_kernel)(n, a, x, y, out);
  PB_CUDA_CHECK(cudaGetLastError());
  PB_CUDA_CHECK(memcpy_sync(out_host, out, bytes, cudaMemcpyDeviceToHost));
  PB_CUDA_CHECK(device_free(x));
  PB_CUDA_CHECK(device_free(y));
  PB_CUDA_CHECK(device_free(out));
}

}  // namespace packbert::cuda
