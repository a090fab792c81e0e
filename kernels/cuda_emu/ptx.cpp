// mma.sync.aligned.m16n8k16 emulated from the PTX ISA (section "Warp-level Matrix Multiply-
// Accumulate Instructions", subsection "Matrix Fragments for mma.m16n8k16 with floating point
// type"). With groupID = %laneid >> 2 and threadID_in_group = %laneid % 4:
//   A (16 x 16, .row), registers a0..a3 holding elements a_0..a_7 (two per 32-bit register,
//   the lower-numbered element in the lower 16 bits):
//     row = groupID      for a_i with 0 <= i < 2 or 4 <= i < 6, groupID + 8 otherwise
//     col = threadID_in_group * 2 + (i & 1)      for a_i with i < 4, that + 8 for i >= 4
//   B (16 x 8, .col), registers b0, b1 holding b_0..b_3:
//     row = threadID_in_group * 2 + (i & 1)      for b_i with i < 2, that + 8 for i >= 2
//     col = groupID
//   C, D (16 x 8, .f32), c_0..c_3:
//     row = groupID      for c_i with i < 2, groupID + 8 otherwise
//     col = threadID_in_group * 2 + (i & 1)
// The products of two bf16 or f16 values are exact in fp32; the PTX ISA leaves the order and
// internal precision of the sum to the hardware, so this emulation adds the 16 products and c
// in double (exact products, a 53-bit sum) and rounds once to fp32.
#include "cuda_emu/ptx.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "cuda_emu/device.h"

namespace packbert::emu {
namespace {

double element(MmaType type, uint32_t reg, int half) {
  const auto bits = static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffffu);
  if (type == MmaType::bf16) return __bfloat162float(__nv_bfloat16{bits});
  return __half2float(__half{bits});
}

// in[lane]: a0..a3, b0, b1, c0..c3 (as bits); out[lane]: d0..d3.
void mma_combine(unsigned, const uint32_t (*in)[kWarpWords], uint32_t (*out)[kWarpWords],
                 const void* arg) {
  const MmaType type = *static_cast<const MmaType*>(arg);
  double A[16][16], B[16][8], C[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
      const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = element(type, in[lane][i / 2], i & 1);
    }
    for (int i = 0; i < 4; ++i) {
      const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      B[row][group] = element(type, in[lane][4 + i / 2], i & 1);
    }
    for (int i = 0; i < 4; ++i) {
      float c;
      std::memcpy(&c, &in[lane][6 + i], 4);
      C[i < 2 ? group : group + 8][tig * 2 + (i & 1)] = c;
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? group : group + 8, col = tig * 2 + (i & 1);
      double d = C[row][col];
      for (int k = 0; k < 16; ++k) d += A[row][k] * B[k][col];
      const float f = static_cast<float>(d);
      std::memcpy(&out[lane][i], &f, 4);
    }
  }
}

}  // namespace

void mma_m16n8k16(MmaType type, float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                  uint32_t b1) {
  uint32_t in[10], out[4];
  std::memcpy(in, a, 16);
  in[4] = b0;
  in[5] = b1;
  std::memcpy(in + 6, c, 16);
  warp_collective(type == MmaType::bf16 ? "mma.sync.m16n8k16.bf16" : "mma.sync.m16n8k16.f16",
                  0xffffffffu, in, 10, out, 4, mma_combine, &type);
  std::memcpy(c, out, 16);
}

}  // namespace packbert::emu
