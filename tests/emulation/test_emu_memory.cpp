// The emulated GPU's memory size (PACKBERT_EMU_DEVICE_BYTES, kernels/cuda_emu/runtime.h) and
// what the CUDA backend says when an allocation does not fit: through Backend::alloc, the
// buffer's name, the bytes asked, the device's free and total memory and what the backend's
// buffers hold; through an op's grow-only scratch, the op and the same figures.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/backend.h"
#include "kernels/base/error.h"
#include "test_util.h"

namespace packbert {
namespace {

using test::error_of;

struct DeviceBytes {
  explicit DeviceBytes(size_t n) {
    setenv("PACKBERT_EMU_DEVICE_BYTES", std::to_string(n).c_str(), 1);
  }
  ~DeviceBytes() { unsetenv("PACKBERT_EMU_DEVICE_BYTES"); }
};

TEST(EmuMemory, AllocationPastTheDeviceSizeNamesTheBuffer) {
  auto be = make_backend(Device::cuda);
  const size_t mib = size_t{1} << 20;
  const DeviceBytes size(256 * mib);
  const Backend::MemoryInfo m = be->memory_info();
  EXPECT_EQ(m.total, 256 * mib);
  BackendBuffer a = be->alloc(m.free - 8 * mib, "most of it");
  EXPECT_EQ(be->allocated_bytes(), m.free - 8 * mib);
  const std::string e = error_of([&] { (void)be->alloc(16 * mib, "activation arena"); });
  EXPECT_NE(e.find("out of cuda memory: activation arena asked 16777216 bytes (16.0 MiB)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("free of 256.0 MiB"), std::string::npos) << e;
  EXPECT_NE(e.find(std::to_string((m.free - 8 * mib) >> 20)), std::string::npos) << e;
  // An op's grow-only scratch that does not fit (fp8_gemm with a bias: an fp32 product of
  // 2048 x 1024, 10 MiB with the growth margin, where 4 MiB remain): the op named.
  BackendBuffer x8_memory = be->alloc(DType::e4m3, {2048, 16}, "x8");
  BackendBuffer w8_memory = be->alloc(DType::e4m3, {1024, 16}, "w8");
  const Tensor x8 = x8_memory.tensor(), w8 = w8_memory.tensor();
  BackendBuffer tensors = be->alloc(DType::f32, {2 + 1024}, "scale and bias");
  be->zero(tensors.tensor());
  const Tensor scale(tensors.data(), DType::f32, {2}, Device::cuda);
  Fp8GemmOptions o;
  o.epilogue = Epilogue::bias;
  o.bias = Tensor(static_cast<float*>(tensors.data()) + 2, DType::f32, {1024}, Device::cuda);
  BackendBuffer out = be->alloc(DType::bf16, {2048, 1024}, "out");
  const std::string s = error_of([&] { be->fp8_gemm(x8, scale, w8, scale, out.tensor(), o); });
  EXPECT_NE(s.find("out of cuda memory: fp8_gemm's scratch asked"), std::string::npos) << s;
  EXPECT_NE(s.find("free of 256.0 MiB"), std::string::npos) << s;
  a.reset();
  be->fp8_gemm(x8, scale, w8, scale, out.tensor(), o);  // the device still works
  be->synchronize();
}

}  // namespace
}  // namespace packbert
