// The device side of the emulated CUDA execution model: what a kernel's source sees in place of
// nvcc's language. Every CUDA thread of a block is a fiber of its own (scheduler.cpp), so
// __syncthreads is a real barrier, __shared__ variables are shared by the block's threads, and
// warp-level operations (shuffles, mma.sync) wait until every lane named in their mask arrives.
//
// The memory qualifiers: __shared__ is `static`. Blocks run one at a time and a block's threads
// all run in one OS thread, so a function-local static is exactly one block's shared array; it
// also sits between AddressSanitizer's redzones, like a global. Dynamic shared memory
// (kernels/cuda/device_seams.cuh, PB_EXTERN_SHARED) is a heap block per launched block.
#pragma once

#include <cuda_runtime.h>  // dim3, uint3 (it includes this header at its end)

#include <cstdint>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
#define __constant__ static

// The built-in variables: set by the scheduler whenever it resumes a thread.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace packbert::emu {

// ---- block- and warp-level synchronisation (scheduler.cpp) -----------------------------------
// Waits until every thread of the block arrives. A thread that exits while others wait, or a
// barrier reached after some thread exited, is an error naming the kernel and the threads.
void syncthreads();

// The warp-collective primitive: the calling lane offers in_words 32-bit words, waits until
// every lane of `mask` offers the same operation, and receives out_words words of result. The
// lane that arrives last runs `combine` once on all lanes' inputs, in[lane][w], writing
// out[lane][w] for the lanes of the mask (arg: that lane's). A lane of the mask that has
// exited, never arrives or arrives at another operation is an error naming the lanes.
constexpr int kWarpWords = 16;
using WarpCombine = void (*)(unsigned mask, const uint32_t (*in)[kWarpWords],
                             uint32_t (*out)[kWarpWords], const void* arg);
void warp_collective(const char* op, unsigned mask, const uint32_t* in, int in_words, uint32_t* out,
                     int out_words, WarpCombine combine, const void* arg);

// An error inside a kernel (an instruction misused: ptx.cpp): recorded for the block with the
// kernel's and the thread's names; the thread never runs again.
[[noreturn]] void device_error(const char* message);

// Dynamic shared memory of the running block (the launch's shared-memory bytes, 16-byte aligned).
void* dynamic_shared_memory();

// The test-only mutation switch (kernels/mutants.h, PB_MUTANT): the value of the environment
// variable PACKBERT_EMU_MUTANT, read once; 0 when unset.
int mutant();

// ---- shuffles ---------------------------------------------------------------------------------
enum class ShflMode { idx, xor_, up, down };
struct ShflArg {
  ShflMode mode;
  int width;
};
void shfl_combine(unsigned mask, const uint32_t (*in)[kWarpWords], uint32_t (*out)[kWarpWords],
                  const void* arg);

template <typename T>
inline T shfl(const char* op, ShflMode mode, unsigned mask, T v, int lane_arg, int width) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of a 1-8 byte value");
  uint32_t in[3] = {0u, 0u, static_cast<uint32_t>(lane_arg)}, out[2] = {0u, 0u};
  std::memcpy(in, &v, sizeof(T));
  const ShflArg arg{mode, width};
  warp_collective(op, mask, in, 3, out, 2, shfl_combine, &arg);
  T r;
  std::memcpy(&r, out, sizeof(T));
  return r;
}

}  // namespace packbert::emu

inline void __syncthreads() { packbert::emu::syncthreads(); }

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize) {
  return packbert::emu::shfl("__shfl_sync", packbert::emu::ShflMode::idx, mask, var, srcLane,
                             width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize) {
  return packbert::emu::shfl("__shfl_xor_sync", packbert::emu::ShflMode::xor_, mask, var, laneMask,
                             width);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return packbert::emu::shfl("__shfl_up_sync", packbert::emu::ShflMode::up, mask, var,
                             static_cast<int>(delta), width);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return packbert::emu::shfl("__shfl_down_sync", packbert::emu::ShflMode::down, mask, var,
                             static_cast<int>(delta), width);
}

// ---- atomics: relaxed read-modify-writes (the GPU's are relaxed too) --------------------------
// The __atomic builtins, so that ThreadSanitizer sees atomics, not races, between threads.
template <typename T>
inline T atomicAdd(T* address, T val) {
  static_assert(std::is_integral_v<T>, "integer atomics only (the kernels add no floats)");
  return __atomic_fetch_add(address, val, __ATOMIC_RELAXED);
}
template <typename T>
inline T atomicMin(T* address, T val) {
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (val < old && !__atomic_compare_exchange_n(address, &old, val, true, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
inline T atomicMax(T* address, T val) {
  T old = __atomic_load_n(address, __ATOMIC_RELAXED);
  while (val > old && !__atomic_compare_exchange_n(address, &old, val, true, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
inline T atomicExch(T* address, T val) {
  return __atomic_exchange_n(address, val, __ATOMIC_RELAXED);
}

// ---- bit casts ----------------------------------------------------------------------------------
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
