// Host side of CudaBackend's attention ops (plain C++, with the CUDA runtime): which kernels a
// dtype takes, the argument checks of the bf16 / fp16 path, and the one host copy of the
// layout that the grouped launch (cuda/fmha.h, common/fmha_work_list.h) needs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/backend.h"
#include "kernels/common/fmha_work_list.h"
#include "kernels/cuda/fmha.h"

namespace packbert::cuda {

// The kernels' type of a 16-bit dtype (bf16, else f16).
FmhaType fmha_type(DType t);
// Whether the tensor-core kernels take the call: qkv bf16 / f16, every tensor of `same` defined
// in qkv's dtype, all 16-byte aligned (the kernels move 16 bytes at a time), and qkv
// [*, 3 x num_heads x kFmhaHeadDim]. Other shapes, dtype mixes and alignments go through the
// low-precision adapter (whose fp32 call then reports any shape error).
bool fmha_native(const Tensor& qkv, int num_heads, std::initializer_list<const Tensor*> same);

struct FmhaShape {
  int64_t rows, hidden, heads;
};
// The bf16 / f16 path's shape checks: qkv [layout.rows, 3H], H = num_heads x kFmhaHeadDim,
// heads within the grid, the largest grid (num_seqs x ceil(max_len / kFmhaTile)) within CUDA's.
FmhaShape fmha_attention_shape(const char* op, const SeqLayout& layout, const Tensor& qkv,
                               int num_heads);
// Each bucket's grid (count x ceil(max_len / tile) blocks) fits CUDA's grid.
void fmha_check_grid(const char* op, const FmhaPlan& plan, int tile);

// The layout's seq_len on the host: the caller's layout.host_seq_len when given (no copy, no
// wait), else copied on stream s, which is then synchronised. With validate the arrays are
// always copied and checked by common/op_checks.h exactly as device_layout would (one host copy
// of the layout per op), and host_seq_len, when given, must equal seq_len.
std::vector<int32_t> fmha_host_lengths(const char* op, const SeqLayout& layout, bool validate,
                                       cudaStream_t s);

// Sets a flag to false for a scope (device_layout's own validation, replaced by
// fmha_host_lengths' single copy), restoring it on every exit.
class ScopedClear {
 public:
  explicit ScopedClear(bool& flag) : flag_(flag), saved_(flag) { flag_ = false; }
  ~ScopedClear() { flag_ = saved_; }
  ScopedClear(const ScopedClear&) = delete;
  ScopedClear& operator=(const ScopedClear&) = delete;

 private:
  bool& flag_;
  bool saved_;
};

}  // namespace packbert::cuda
