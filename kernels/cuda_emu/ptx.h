// The emulated twins of the inline PTX in kernels/cuda/device_seams.cuh (ptx.cpp), each from
// the PTX ISA's definition of the instruction and its fragment layouts.
#pragma once

#include <cstdint>

namespace packbert::emu {

enum class MmaType : uint32_t { bf16 = 0, f16 = 1 };

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c with d = c: a warp
// collective (all 32 lanes). Each lane's a[4], b0, b1 and c[4] are its fragments; c becomes d.
void mma_m16n8k16(MmaType type, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

}  // namespace packbert::emu
