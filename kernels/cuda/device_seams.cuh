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

#ifdef PACKBERT_CUDA_EMULATION
#include "cuda_emu/launch.h"
#include "cuda_emu/ptx.h"
#endif

// kernel<<<grid, block, shared_bytes, stream>>>(args...) is PB_LAUNCH(grid, block, shared_bytes,
// stream, kernel)(args...). The kernel comes last: a template's commas stay inside __VA_ARGS__.
#ifdef PACKBERT_CUDA_EMULATION
#define PB_LAUNCH(grid, block, shared, stream, ...)                       \
  ::packbert::emu::launcher(#__VA_ARGS__, grid, block, shared, stream, \
                            [](const auto&... args) { __VA_ARGS__(args...); })
#else
#define PB_LAUNCH(grid, block, shared, stream, ...) __VA_ARGS__<<<grid, block, shared, stream>>>
#endif

// extern __shared__ T name[]: the launch's dynamic shared memory.
#ifdef PACKBERT_CUDA_EMULATION
#define PB_EXTERN_SHARED(T, name) \
  T* const name = static_cast<T*>(::packbert::emu::dynamic_shared_memory())
#else
#define PB_EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

// Planted mistakes that the emulated tests must catch (tests/emulation/CMakeLists.txt runs each
// one and expects failures): set PACKBERT_EMU_MUTANT to the number in the emulated build.
#ifdef PACKBERT_CUDA_EMULATION
#define PB_MUTANT(which) (::packbert::emu::mutant() == static_cast<int>(which))
#else
#define PB_MUTANT(which) false
#endif
namespace packbert::cuda {
enum class Mutant : int {
  fmha_b_halves = 1,           // the two 16-bit halves of an attention B register swapped
  fmha_a1_a2 = 2,              // registers a1 and a2 of an attention A fragment swapped
  fmha_dkv_dropout_words = 3,  // the dK/dV kernel's dropout words permuted among the lanes
  fmha_barrier = 4,            // a __syncthreads removed from the attention forward
  layernorm_barrier = 5,       // a __syncthreads removed from the LayerNorm block reduction
};
}  // namespace packbert::cuda

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

__device__ __forceinline__ void mma_m16n8k16_f16(float (&c)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
#ifdef PACKBERT_CUDA_EMULATION
  ::packbert::emu::mma_m16n8k16(::packbert::emu::MmaType::f16, c, a, b0, b1);
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

}  // namespace packbert::cuda
