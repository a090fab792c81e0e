// Fused multi-head attention on the CUDA backend: the grouped (length-bucketed, multi-stream)
// launch shared by the fp32 kernels (attention_kernels.cu) and the tensor-core bf16/fp16
// kernels (fmha_mma_*.cu), in the style of cuda_kernels.h: raw pointers in, cudaError_t out.
//
// A launch covers one work list: `count` sequences whose indices are seqs[0 .. count) (a device
// array of the bucket, kernels/common/fmha_work_list.h), the longest of them max_len tokens. The
// grid is count x ceil(max_len / query tile) x heads, so a bucket of short sequences never pays for
// the batch's longest. seqs == nullptr means sequences 0 .. count-1 in layout order.
//
// The work-list kernels write only rows of the listed sequences; rows of no sequence are zeroed
// once per op by fmha_zero_padding_rows (before the buckets fork onto their streams).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/common/fmha_work_list.h"
#include "kernels/common/philox.h"
#include "kernels/cuda/cuda_kernels.h"

namespace packbert::cuda {

struct AttnWork {
  const int32_t* seqs = nullptr;  // device, count entries (nullptr: 0 .. count-1)
  int32_t count = 0;
  int32_t max_len = 0;
};

// x[r, 0 .. width) = 0 for every row r with token_seq[r] < 0, elements of elem_bytes (2 or 4)
// (fmha_padding.cu).
cudaError_t fmha_zero_padding_rows(const DeviceLayout& l, void* x, int64_t width, int elem_bytes,
                                   cudaStream_t s);

// ---- fp32 (attention_kernels.cu): head dim <= kAttentionMaxHeadDim ---------------------------
// half: the window's half-width (checks::attention_half_window; max_len for global attention).
cudaError_t attention_forward_work(const DeviceLayout& l, const AttnWork& w, const float* qkv,
                                   int64_t hidden, int heads, int half, const DropoutStream& ds,
                                   float* out, float* lse, cudaStream_t s);
cudaError_t attention_backward_work(const DeviceLayout& l, const AttnWork& w, const float* qkv,
                                    const float* out, const float* lse, const float* dout,
                                    int64_t hidden, int heads, int half, const DropoutStream& ds,
                                    float* dqkv, cudaStream_t s);
// Query (key) rows per block of the fp32 kernels: the grid's tile count per sequence.
constexpr int kAttentionF32Tile = 16;

// ---- bf16 / fp16 tensor cores (fmha_mma_*.cu): head dim exactly kFmhaHeadDim ----------------
enum class FmhaType { bf16, f16 };
constexpr int kFmhaHeadDim = 64;
constexpr int kFmhaTile = 64;  // query rows (forward, dQ) or key rows (dK/dV) per block
// Every pointer 16-byte aligned (checked by the backend). qkv [rows, 3 hidden], out / dout
// [rows, hidden] and dqkv in the type; lse f32 [rows, heads] (the fp32 kernel's order). delta:
// f32 [rows, heads] workspace (D = dO . O of each query row, made and used by the backward).
// What one block of each tensor-core kernel holds (fmha_mma_common.cuh, "Budget" says how the
// tile shape follows from it): threads, static shared memory in bytes, and the registers of fp32
// accumulators and 16-bit fragments each thread keeps live across a tile (a floor under the
// compiler's count, which scripts/kernel_report.py prints with the blocks per SM).
struct FmhaKernelBudget {
  const char* kernel;
  int threads;
  int smem_bytes;
  int live_regs;
};
std::vector<FmhaKernelBudget> fmha_kernel_budget();
// half as the fp32 kernels'.
cudaError_t fmha_forward_work(FmhaType t, const DeviceLayout& l, const AttnWork& w, const void* qkv,
                              int64_t hidden, int heads, int half, const DropoutStream& ds,
                              void* out, float* lse, cudaStream_t s);
cudaError_t fmha_backward_work(FmhaType t, const DeviceLayout& l, const AttnWork& w,
                               const void* qkv, const void* out, const float* lse, const void* dout,
                               int64_t hidden, int heads, int half, const DropoutStream& ds,
                               float* delta, void* dqkv, cudaStream_t s);

// ---- grouped launch (fmha_host.cpp) ---------------------------------------------------------
// The auxiliary streams and events of CudaBackend's attention, and the device copy of the
// current plan's sequence order. Created with the backend (on its device), destroyed with it.
class FmhaStreams {
 public:
  static constexpr int kStreams = 4;
  FmhaStreams();  // throws packbert::Error when a stream or event cannot be created
  ~FmhaStreams();
  FmhaStreams(const FmhaStreams&) = delete;
  FmhaStreams& operator=(const FmhaStreams&) = delete;

  // Runs launch(work, stream) once per bucket of plan: the order is uploaded on main (unless
  // it is the last call's, whose device copy is reused), the buckets fork from main (an
  // event), run on the auxiliary streams (longest bucket first, bucket i of the launch order on
  // stream i % kStreams) and join back into main (one event per used stream) before run
  // returns, so main's later work sees every bucket's results.
  // Every launch is joined even when one fails; the first error is then thrown, naming op.
  template <typename Launch>
  void run(const char* op, const FmhaPlan& plan, cudaStream_t main, Launch&& launch) {
    // An empty order (a fixed launch's plan): sequences in layout order, nothing uploaded.
    const int32_t* order = plan.order.empty() ? nullptr : upload(op, plan, main);
    const int n = static_cast<int>(plan.buckets.size());
    const int used = n < kStreams ? n : kStreams;
    fork(op, main, used);
    cudaError_t first_error = cudaSuccess;
    for (int i = 0; i < n; ++i) {
      const FmhaBucket& b = plan.buckets[static_cast<size_t>(n - 1 - i)];
      const AttnWork w{order ? order + b.first : nullptr, static_cast<int32_t>(b.count), b.max_len};
      const cudaError_t e = launch(w, streams_[i % kStreams]);
      if (e != cudaSuccess && first_error == cudaSuccess) first_error = e;
    }
    join(op, main, used);
    check_error(op, "the bucket launches", first_error);
  }

  // A device workspace of at least n floats (the bf16 / fp16 backward's D), grow-only: a grow
  // first synchronises main, whose earlier attention ops may still use the old one.
  float* workspace(const char* op, size_t n, cudaStream_t main);

  // Throws packbert::Error naming op and what when e is an error.
  static void check_error(const char* op, const char* what, cudaError_t e);
  // Device bytes of the work list and the workspace (Backend::workspace_bytes), and the text an
  // out-of-memory error adds (the backend's plan: Backend::planned_note).
  size_t device_bytes() const { return (order_capacity_ + workspace_capacity_) * 4; }
  std::function<std::string()> oom_note;

 private:
  const int32_t* upload(const char* op, const FmhaPlan& plan, cudaStream_t main);
  // The first `used` auxiliary streams wait for main's work so far (fork), and main for
  // theirs (join). Only the streams a launch uses fork, so that every forked stream is joined:
  // a stream capture (CUDA graphs) refuses to end with a forked stream left unjoined.
  void fork(const char* op, cudaStream_t main, int used);
  void join(const char* op, cudaStream_t main, int used);
  void release();        // destroys what exists (the destructor, and a constructor that failed)
  void release_order();  // frees the work list's buffers (the caller waited for their users)

  cudaStream_t streams_[kStreams] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_[kStreams] = {};
  // The last uploaded plan.order: its device copy and a host copy to compare the next plan with.
  // It is copied from one of two pinned buffers, used in turn, so that the host need not wait
  // for the copy out of the other; uploaded_[i] is recorded after the last copy out of
  // order_h_[i]. Grow-only, order_capacity_ entries each.
  int32_t* order_d_ = nullptr;
  int32_t* order_h_[2] = {};
  cudaEvent_t uploaded_[2] = {};
  int order_next_ = 0;
  bool have_order_ = false;
  std::vector<int32_t> order_last_;
  size_t order_capacity_ = 0;
  float* workspace_d_ = nullptr;
  size_t workspace_capacity_ = 0;
};

}  // namespace packbert::cuda
