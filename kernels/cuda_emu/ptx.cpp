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
//
// ldmatrix emulated from the PTX ISA (section "Warp-level matrix load instruction: ldmatrix"):
// .m8n8 .b16 matrices of 8 rows of 8 16-bit elements; for .x1 / .x2 / .x4 (num = 1, 2, 4), lanes
// 8 i .. 8 i + 7 give the addresses of rows 0..7 of matrix i (lanes 0-7 for .x1, 0-15 for .x2,
// all for .x4; 16-byte aligned rows). Destination register i of every lane holds two elements
// of matrix i: row %laneid / 4, columns 2 (%laneid % 4) and + 1 (the lower column in the lower
// 16 bits). With .trans the matrix is loaded in column-major order: the same lane receives
// column %laneid / 4, rows 2 (%laneid % 4) and + 1 of the matrix as stored.
//
// cp.async emulated from the PTX ISA (section "Data Movement and Conversion Instructions:
// cp.async", cp.async.commit_group, cp.async.wait_group): the copy is asynchronous to the
// issuing thread and ordered only by the wait on its group; a src-size below cp-size fills the
// rest of the destination with zeros. Here every copy is deferred until its group is waited
// for, the latest moment the ISA allows, so that a premature read shows.
//
// The products of two bf16 or f16 values are exact in fp32; the PTX ISA leaves the order and
// internal precision of the sum to the hardware, so this emulation adds the 16 products and c
// in double (exact products, a 53-bit sum) and rounds once to fp32.
#include "kernels/cuda_emu/ptx.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "kernels/cuda_emu/device.h"

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

struct LdmatrixArg {
  int num;
  bool trans;
};

// Element col of a row of 8 16-bit elements held in 4 words.
uint32_t half_of(const uint32_t* row, int col) {
  return (row[col / 2] >> (16 * (col & 1))) & 0xffffu;
}

// in[lane][0..3]: the row that lane addresses; out[lane][i]: register i.
void ldmatrix_combine(unsigned, const uint32_t (*in)[kWarpWords], uint32_t (*out)[kWarpWords],
                      const void* arg) {
  const LdmatrixArg a = *static_cast<const LdmatrixArg*>(arg);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < a.num; ++i) {
      const uint32_t(*m)[kWarpWords] = in + 8 * i;  // rows 0..7 of matrix i
      const int r = lane / 4, c = 2 * (lane % 4);
      out[lane][i] = a.trans ? half_of(m[c], r) | (half_of(m[c + 1], r) << 16) : m[r][lane % 4];
    }
}

}  // namespace

void ldmatrix(int num, bool trans, const uint32_t (&row)[4], uint32_t* out) {
  static const char* const names[2][3] = {
      {"ldmatrix.m8n8.x1", "ldmatrix.m8n8.x2", "ldmatrix.m8n8.x4"},
      {"ldmatrix.m8n8.x1.trans", "ldmatrix.m8n8.x2.trans", "ldmatrix.m8n8.x4.trans"}};
  if (num != 1 && num != 2 && num != 4) device_error("ldmatrix with .num other than 1, 2, 4");
  const LdmatrixArg arg{num, trans};
  uint32_t got[4];
  warp_collective(names[trans][num == 4 ? 2 : num - 1], 0xffffffffu, row, 4, got, num,
                  ldmatrix_combine, &arg);
  std::memcpy(out, got, sizeof(uint32_t) * static_cast<size_t>(num));
}

void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
  AsyncCopies& q = async_copies();
  if (bytes != 4 && bytes != 8 && bytes != 16) device_error("cp.async cp-size not 4, 8 or 16");
  if (src_bytes < 0 || src_bytes > bytes) device_error("cp.async src-size outside 0..cp-size");
  if (reinterpret_cast<uintptr_t>(dst) % static_cast<uintptr_t>(bytes) != 0 ||
      reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(bytes) != 0)
    device_error("cp.async address not aligned to cp-size");
  if (q.count == AsyncCopies::kMax) device_error("more cp.async copies in flight than emulated");
  q.copy[q.count++] =
      AsyncCopy{dst, src, static_cast<uint32_t>(bytes), static_cast<uint32_t>(src_bytes)};
}

void cp_async_commit() {
  AsyncCopies& q = async_copies();
  const uint64_t seq = q.committed++;
  const int last_end = q.groups > 0 ? q.group_end[q.groups - 1] : 0;
  if (q.count == last_end) return;  // an empty group: complete already, it only takes a place
  // Each kept group holds at least one of at most kMax copies, so there is room for it.
  q.group_end[q.groups] = q.count;
  q.group_seq[q.groups] = seq;
  ++q.groups;
}

int cp_async_due(int n) {
  if (n < 0) device_error("cp.async.wait_group with a negative N");
  const AsyncCopies& q = async_copies();
  // Groups committed before the newest n: those whose place is below committed - n.
  int due = 0;
  for (int g = 0; g < q.groups && q.group_seq[g] + static_cast<uint64_t>(n) < q.committed; ++g)
    due = q.group_end[g];
  return due;
}

void cp_async_retire(int k) {
  AsyncCopies& q = async_copies();
  if (k <= 0) return;  // nothing performed: every kept group holds a copy, so none is complete
  int g = 0;
  while (g < q.groups && q.group_end[g] <= k) ++g;  // the groups now complete
  for (int i = k; i < q.count; ++i) q.copy[i - k] = q.copy[i];
  q.count -= k;
  for (int i = g; i < q.groups; ++i) {
    q.group_end[i - g] = q.group_end[i] - k;
    q.group_seq[i - g] = q.group_seq[i];
  }
  q.groups -= g;
}

void mma_m16n8k16(MmaType type, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
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
