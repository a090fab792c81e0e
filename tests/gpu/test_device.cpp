// gpu label: runs for real on a machine with a CUDA device, otherwise prints
// "skipped: no CUDA device" and ctest marks the test skipped (SKIP_REGULAR_EXPRESSION).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "kernels/device.h"
#include "test_util.h"
#ifdef PACKBERT_HAVE_CUDA
#include "kernels/cuda/device_cuda.h"
#endif

namespace {

bool have_device() {
  if (packbert::cuda_device_count() > 0) return true;
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  return false;
}

TEST(GpuDevice, DescribesEveryDevice) {
  if (!have_device()) GTEST_SKIP() << "skipped: no CUDA device";
  const std::string d = packbert::describe_devices();
  std::cout << d;
  for (int i = 0; i < packbert::cuda_device_count(); ++i)
    EXPECT_NE(d.find("cuda:" + std::to_string(i)), std::string::npos) << d;
}

#ifdef PACKBERT_HAVE_CUDA
TEST(GpuDevice, KernelLaunchMatchesCpu) {
  if (!have_device()) GTEST_SKIP() << "skipped: no CUDA device";
  std::mt19937_64 rng(packbert::test::test_seed());
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int n = 100003;  // not a multiple of the block size
  std::vector<float> x(n), y(n), out(n, NAN);
  for (int i = 0; i < n; ++i) x[i] = u(rng), y[i] = u(rng);
  const float a = u(rng);
  packbert::cuda::saxpy(n, a, x.data(), y.data(), out.data());
  // nvcc fuses a * x + y into one FMA (one rounding); the emulated build's host compiler keeps
  // the multiply and the add (two). Either is the kernel having run.
  for (int i = 0; i < n; ++i) {
    const float fused = std::fma(a, x[i], y[i]), separate = a * x[i] + y[i];
    ASSERT_TRUE(out[i] == fused || out[i] == separate)
        << "element " << i << ": " << out[i] << ", not " << fused << " (fused) or " << separate;
  }
}
#endif

}  // namespace
