// The emulated twins of the inline PTX in kernels/cuda/device_seams.cuh (ptx.cpp), each from
// the PTX ISA's definition of the instruction and its fragment layouts.
#pragma once

#include <cstdint>

namespace packbert::emu {

enum class MmaType : uint32_t { bf16 = 0, f16 = 1 };

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c with d = c: a warp
// collective (all 32 lanes). Each lane's a[4], b0, b1 and c[4] are its fragments; c becomes d.
void mma_m16n8k16(MmaType type, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16: a warp collective (all 32 lanes).
// The caller (device_seams.cuh) has read the 16-byte row its lane addresses into row (lanes
// 8 num and up: zeros, unused); this exchanges the rows and gives each lane its num registers.
void ldmatrix(int num, bool trans, const uint32_t (&row)[4], uint32_t* out);

// cp.async: a CUDA thread's copies issued and not yet complete, oldest first, and the committed
// groups that hold them. The copies are performed at the cp.async.wait_group that completes
// their group, by the caller (device_seams.cuh), so a read of the destination before that wait
// sees the old contents.
// Groups as the PTX ISA defines them: cp.async.commit_group closes the copies issued since the
// last commit into a group, an empty one when there are none, and an empty group is complete at
// once; cp.async.wait_group N waits until all groups but the N most recently committed are
// complete, empty ones counting among those N. So only the groups that hold copies are kept
// (at most one per copy: kMax bounds both), each with its place in the thread's commit order,
// and `committed` counts every commit.
struct AsyncCopy {
  void* dst;
  const void* src;
  uint32_t bytes, src_bytes;  // src_bytes < bytes: the rest of dst is zero-filled
};
struct AsyncCopies {
  static constexpr int kMax = 64;
  AsyncCopy copy[kMax];
  int count = 0;             // copies after the last group's end are not committed yet
  int group_end[kMax];       // where each kept group ends in copy[] (exclusive)
  uint64_t group_seq[kMax];  // its place in the commit order: 0 for the thread's first commit
  int groups = 0;
  uint64_t committed = 0;  // commits so far, empty groups included
};
AsyncCopies& async_copies();  // the running CUDA thread's (scheduler.cpp)
void cp_async(void* dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();
// The number of leading copies that cp.async.wait_group n completes (those of every group
// committed before the newest n); cp_async_retire drops them once the caller has performed them.
int cp_async_due(int n);
void cp_async_retire(int k);

}  // namespace packbert::emu
