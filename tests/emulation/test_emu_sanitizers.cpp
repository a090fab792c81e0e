// What the sanitizer builds of the emulation (PACKBERT_SANITIZE=address|thread) must report, on
// small kernels with the mistakes planted by hand: AddressSanitizer an out-of-bounds access to a
// __shared__ array and to device memory; ThreadSanitizer two CUDA threads of a block touching
// the same shared word without a barrier between them, and nothing once the barrier is there.
// Each report ends the process, so each case runs in a child (a death test; POSIX regular
// expressions, where '.' matches newlines too). Outside its sanitizer's build a case is skipped.
#include <gtest/gtest.h>

#include "kernels/cuda/device_seams.cuh"

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif

__global__ void shared_past_the_end(float* out, int past) {
  __shared__ float tile[128];
  tile[threadIdx.x + past] = 1.f;  // past > 0: the last threads write beyond the array
  __syncthreads();
  out[threadIdx.x] = tile[threadIdx.x];
}

__global__ void global_past_the_end(float* out, int past) { out[threadIdx.x + past] = 1.f; }

// Each thread writes its word, then reads its neighbour's: a race unless a barrier separates them.
__global__ void neighbour_exchange(float* out, int with_barrier) {
  __shared__ float word[64];
  word[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (with_barrier) __syncthreads();
  out[threadIdx.x] = word[(threadIdx.x + 1) % 64];
}

template <typename Kernel>
void run(Kernel launch) {
  float* out = nullptr;
  if (cudaMalloc(&out, 128 * sizeof(float)) != cudaSuccess) std::exit(2);
  launch(out);
  std::exit(cudaDeviceSynchronize() == cudaSuccess ? 0 : 3);
}

TEST(EmuSanitizerDeathTest, AddressSanitizerSeesSharedAndDeviceOverruns) {
  if (!kAsan) GTEST_SKIP() << "not an AddressSanitizer build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run([](float* out) { PB_LAUNCH(1, 128, 0, nullptr, shared_past_the_end)(out, 1); }),
               "global-buffer-overflow.*WRITE of size 4.*global variable 'tile'");
  EXPECT_DEATH(run([](float* out) { PB_LAUNCH(1, 128, 0, nullptr, global_past_the_end)(out, 1); }),
               "heap-buffer-overflow.*0 bytes to the right of 512-byte region");
  EXPECT_EXIT(run([](float* out) { PB_LAUNCH(1, 128, 0, nullptr, global_past_the_end)(out, 0); }),
              testing::ExitedWithCode(0), "");
}

TEST(EmuSanitizerDeathTest, ThreadSanitizerSeesAMissingBarrier) {
  if (!kTsan) GTEST_SKIP() << "not a ThreadSanitizer build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run([](float* out) { PB_LAUNCH(1, 64, 0, nullptr, neighbour_exchange)(out, 0); }),
               "ThreadSanitizer: data race.*neighbour_exchange");
  EXPECT_EXIT(run([](float* out) { PB_LAUNCH(1, 64, 0, nullptr, neighbour_exchange)(out, 1); }),
              testing::ExitedWithCode(0), "");
}

}  // namespace
