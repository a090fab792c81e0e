// Where the GPU build and the emulated build (PACKBERT_CUDA=EMULATED: the same kernel sources
// compiled by the host compiler against kernels/cuda_emu, an emulation of the CUDA execution
// model) differ. Everything else in kernels/cuda is the same text for both:
//   - the launch syntax (PB_LAUNCH);
//   - dynamic shared memory (PB_EXTERN_SHARED); the other memory qualifiers are the emulated
//     headers' (kernels/cuda_emu/device.h);
//   - each inline-asm instruction, in one small function with its emulated twin beside it;
//   - the test-only mutation switch (PB_MUTANT), constant false on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/counters.h"
#include "kernels/mutants.h"

#ifdef PACKBERT_CUDA_EMULATION
#include "kernels/cuda_emu/launch.h"
#include "kernels/cuda_emu/ptx.h"
#endif

// kernel<<<grid, block, shared_bytes, stream>>>(args...) is PB_LAUNCH(grid, block, shared_bytes,
// stream, kernel)(args...). The kernel comes last: a template's commas stay inside __VA_ARGS__.
// Each launch is counted (counters.h).
#ifdef PACKBERT_CUDA_EMULATION
#define PB_LAUNCH(grid, block, shared, stream, ...)                                                \
  ::packbert::emu::launcher(#__VA_ARGS__, grid, block, shared,                                     \
                            ::packbert::cuda::counted_launch(stream),                              \
                            [](const auto&... args) { __VA_ARGS__(args...); })
#else
#define PB_LAUNCH(grid, block, shared, stream, ...)                                                \
  __VA_ARGS__<<<grid, block, shared, ::packbert::cuda::counted_launch(stream)>>>
#endif

// extern __shared__ T name[]: the launch's dynamic shared memory.
#ifdef PACKBERT_CUDA_EMULATION
#define PB_EXTERN_SHARED(T, name)                                                                  \
  T* const name = static_cast<T*>(::packbert::emu::dynamic_shared_memory())
#else
#define PB_EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

// The test-only mutation switch (PB_MUTANT, kernels/mutants.h). Why mutants 1-5 sit in the
// kernels' text: each is one precise mistake at one site (one register swap after one load, one
// barrier of several, one lane permutation), and the only ways to plant it from outside are a
// second copy of the kernel, or a coarser mistake planted by the emulator (every mma's
// registers, every barrier of a file), which proves less and, keyed by file and line, breaks
// silently when the kernel is edited. On the GPU the switch is the constant false, so
// `if (!PB_MUTANT(m)) __syncthreads();` is `__syncthreads();` to the compiler.

namespace packbert::cuda {

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 ----------------------------
// c (16 x 8, f32) += a (16 x 16) b (16 x 8) over the warp, every lane holding its fragments as
// the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating point type"):
// a: 4 registers of two 16-bit elements, b: 2, c: 4 floats. All 32 lanes must call.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
#ifdef PACKBERT_CUDA_EMULATION
  ::packbert::emu::mma_m16n8k16(::packbert::emu::MmaType::bf16, c, a, b0, b1);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void mma_m16n8k16_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                 uint32_t b1) {
#ifdef PACKBERT_CUDA_EMULATION
  ::packbert::emu::mma_m16n8k16(::packbert::emu::MmaType::f16, c, a, b0, b1);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 ----------------------------------
// PTX ISA, "Warp-level matrix load instruction: ldmatrix". N (1, 2, 4) 8 x 8 matrices of 16-bit
// elements from shared memory: lane 8 i + r passes the address of row r of matrix i (16 bytes,
// 16-byte aligned; lanes 8 N and up pass any address, unused). Register i of every lane then
// holds, of matrix i, row lane / 4, columns 2 (lane % 4) and + 1 (the lower column in the lower
// 16 bits); with Trans (.trans) column lane / 4, rows 2 (lane % 4) and + 1. So a row-major tile
// gives mma.m16n8k16's A fragments and its B fragments whose k runs along the tile's columns
// without Trans, and B fragments whose k runs along the tile's rows with Trans. All 32 lanes
// must call. In the emulation each lane reads the row it addresses (the sanitizers see that
// read) and the warp exchanges the rows (cuda_emu/ptx.cpp).
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix_m8n8(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef PACKBERT_CUDA_EMULATION
  const unsigned lane = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
  uint32_t words[4] = {0u, 0u, 0u, 0u};
  if (lane < 8u * N) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0)
      ::packbert::emu::device_error("ldmatrix row address not 16-byte aligned");
    std::memcpy(words, row, 16);
  }
  ::packbert::emu::ldmatrix(N, Trans, words, r);
#else
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 1 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
  else if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(a));
  else if constexpr (N == 2 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a));
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a));
  else if constexpr (!Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

// ---- cp.async.cg.shared.global, cp.async.commit_group, cp.async.wait_group ---------------------
// PTX ISA, "Data Movement and Conversion Instructions: cp.async". cp_async_16 starts a copy of
// 16 bytes from global src to shared dst (both 16-byte aligned), of which only the first
// src_bytes (0 or 16 here) are read and the rest are zeros; .cg: cached in L2 only (the tiles
// are read once per block). The copy is complete, and its destination readable by this thread,
// after a cp.async.wait_group that covers its group (cp_async_commit closes the thread's group
// of copies issued since the last one); other threads read it after a barrier that follows that
// wait. The emulation performs each copy at that wait (cuda_emu/ptx.cpp, the latest moment the
// ISA allows), here in the kernel's code so the sanitizers see the accesses, and a thread that
// exits with copies it never waited for is an error.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
#ifdef PACKBERT_CUDA_EMULATION
  ::packbert::emu::cp_async(dst, src, 16, src_bytes);
#else
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :
               : "r"(d), "l"(src), "r"(src_bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef PACKBERT_CUDA_EMULATION
  ::packbert::emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups (the newest) are incomplete.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
#ifdef PACKBERT_CUDA_EMULATION
  const int due = ::packbert::emu::cp_async_due(N);
  const ::packbert::emu::AsyncCopies& q = ::packbert::emu::async_copies();
  for (int i = 0; i < due; ++i) {
    const ::packbert::emu::AsyncCopy& c = q.copy[i];
    std::memcpy(c.dst, c.src, c.src_bytes);
    std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
  }
  ::packbert::emu::cp_async_retire(due);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace packbert::cuda
