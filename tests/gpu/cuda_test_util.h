// Helpers for the CUDA backend tests (label gpu): the skip rule, device buffers with NaN-pattern
// guard regions on both sides (and NaN-prefilled outputs), device copies of a HostLayout.
// Only meaningful in a CUDA build; every test file includes it under PACKBERT_HAVE_CUDA.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

#include "../ops/ops_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"

namespace packbert::test {

// The emulated CUDA build (PACKBERT_CUDA=EMULATED) runs these tests on the CPU, one fiber per
// CUDA thread, where an attention over a 512-token sequence takes tens of seconds: there the
// tests that would take minutes use shorter sequences that still cover tile tails, several
// tiles per sequence, both dropouts and every dtype. Tolerances are the same everywhere.
#ifdef PACKBERT_CUDA_EMULATION
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// True when a CUDA device is present; otherwise prints the skip line ctest looks for.
inline bool have_cuda_device() {
  if (cuda_device_count() > 0) return true;
  std::cout << "skipped: no CUDA device (" << describe_devices() << ")" << std::endl;
  return false;
}

#define PB_REQUIRE_CUDA_DEVICE()                                                                   \
  if (!::packbert::test::have_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device"

inline void cuda_ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// Device memory for the guarded buffers of ops_test_util.h (cudaMemcpy: the copies wait for
// the backends' blocking streams, so a read sees every op issued so far).
inline const Memory& cuda_memory() {
  static const Memory m{Device::cuda, [](size_t bytes) { return cuda_alloc(bytes); },
                        [](void* p) { cuda_free(p); },
                        [](void* d, const void* s, size_t b) {
                          cuda_ok(cudaMemcpy(d, s, b, cudaMemcpyHostToDevice), "upload");
                        },
                        [](void* d, const void* s, size_t b) {
                          cuda_ok(cudaMemcpy(d, s, b, cudaMemcpyDeviceToHost), "download");
                        }};
  return m;
}

// A guarded buffer (ops_test_util.h) in device memory: NaN-filled (written outputs) or set.
template <typename T>
class DevBuf : public Guarded<T> {
 public:
  explicit DevBuf(std::initializer_list<int64_t> dims) : Guarded<T>(cuda_memory(), dims) {}
  DevBuf(std::initializer_list<int64_t> dims, const std::vector<T>& init)
      : Guarded<T>(cuda_memory(), dims, init) {}
};

// A bf16 / f16 guarded buffer in device memory: NaN-filled (0x7FC1, a NaN in both formats) or
// set from 16-bit values. The 64 guard elements keep data() 16-byte aligned, as the tensor-core
// kernels require.
struct Dev16 : Guarded<uint16_t> {
  Dev16(DType t, std::vector<int64_t> dims)
      : Guarded<uint16_t>(cuda_memory(), std::move(dims), t) {}
  Dev16(DType t, std::vector<int64_t> dims, const std::vector<uint16_t>& bits)
      : Guarded<uint16_t>(cuda_memory(), std::move(dims), bits, t) {}
  std::vector<uint16_t> bits() const { return values(); }
  std::vector<float> floats() const { return widen16(dtype(), values()); }
};

// The CPU backend and a CUDA backend that synchronizes after each op (a fault names its op).
struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu;
  explicit Backends(bool validate_indices = true) {
    CudaBackendOptions o;
    o.sync_each_op = true;
    o.validate_indices = validate_indices;
    gpu = make_cuda_backend(0, o);
  }
};

// A HostLayout's arrays on the device.
struct DevLayout : LayoutOn {
  explicit DevLayout(const HostLayout& h) : LayoutOn(cuda_memory(), h) {}
};

inline std::vector<double> dbl(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline std::vector<uint16_t> read16(const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  cuda_ok(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost), "read16");
  return h;
}

}  // namespace packbert::test
