// What the LayerNorm kernels share: the residual LayerNorm's (layernorm_kernels.cu) and the
// embedding's, whose forward fuses the tables' gather and sum with LayerNorm and dropout
// (embedding_kernels.cu). One block per row for the per-token math; the parameter gradients are
// deterministic two-stage column sums (fixed row chunks in order, then the chunks in order),
// never atomics.
//
// Threads walk a row in groups of 4 consecutive columns: one Philox call (dropout_bits4) gives
// the mask words of exactly those 4 elements, as on the CPU.
//
// Mixed precision: the kernels are templates on the storage type (float, __nv_bfloat16, __half)
// of the tensors the ops' "lowp:" lines name (kernels/ops/embedding.h, kernels/ops/layernorm.h).
// They load and widen, compute in fp32 exactly as the fp32 instantiation does, and round once
// where they store (to nearest even), so one pass gives what the CPU's emulation (widen, fp32
// op, round) gives, up to fp32 summation order. Where the fp32 kernel re-reads a value it
// stored (the embedding sum in out, h in ln_in), the low-precision one recomputes it or keeps
// the fp32 value in shared memory instead: the statistics and the normalisation use the
// unrounded value, as the emulation does.
//
// Included by those two files only. Its helpers and kernels have internal linkage, as in a .cu
// file: each of the two compiles its own copy (the CUDA sources are not linked as device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kRowThreads = 128;

// Storage <-> fp32: widening is exact, narrowing rounds to nearest even.
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <typename T>
constexpr bool kIsF32 = std::is_same_v<T, float>;

// The dropout multiplier of element c of a 4-group, 1 when the row is not dropped.
__device__ __forceinline__ float group_factor(const DropoutStream& ds, bool drop,
                                              const Philox4x32& bits, int e) {
  return drop ? dropout_factor(ds, bits.v[e]) : 1.0f;
}

// Whether a row takes dropout, and its key: sample id and position.
struct RowKey {
  bool drop = false;
  uint64_t sample = 0;
  uint32_t pos = 0;
};
__device__ __forceinline__ RowKey row_key(const DeviceLayout& l, const DropoutStream& ds,
                                          int64_t row) {
  RowKey k;
  if (!dropout_enabled(ds)) return k;
  const int32_t seq = l.token_seq[row];
  if (seq < 0) return k;
  k.drop = true;
  k.sample = static_cast<uint64_t>(l.sample_id[seq]);
  k.pos = static_cast<uint32_t>(l.token_pos[row]);
  return k;
}

// Stage 1 of the gamma / beta gradients: per chunk of rows (in order), per column.
template <typename D, typename Input>
__global__ void ln_param_partials_kernel(const D* dy, Input input, const float* mean,
                                         const float* rstd, const int32_t* token_seq, int64_t rows,
                                         int64_t h, double* pg, double* pb) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  const int64_t r0 = blockIdx.y * kColumnChunk;
  const int64_t r1 = r0 + kColumnChunk < rows ? r0 + kColumnChunk : rows;
  double sg = 0.0, sb = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    if (token_seq && token_seq[r] < 0) continue;
    const float d = load(dy, r * h + c);
    const float xhat = (input(r, c) - mean[r]) * rstd[r];
    sg += d * xhat;  // float product, double sum: as the CPU
    sb += d;
  }
  pg[blockIdx.y * h + c] = sg;
  pb[blockIdx.y * h + c] = sb;
}

__global__ void ln_param_finish_kernel(const double* pg, const double* pb, int64_t chunks,
                                       int64_t h, float* dgamma, float* dbeta) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  double sg = 0.0, sb = 0.0;
  for (int64_t k = 0; k < chunks; ++k) sg += pg[k * h + c], sb += pb[k * h + c];
  if (dgamma) dgamma[c] += static_cast<float>(sg);
  if (dbeta) dbeta[c] += static_cast<float>(sb);
}

template <typename D, typename Input>
cudaError_t layernorm_param_grads(const D* dy, Input input, const float* mean, const float* rstd,
                                  const int32_t* token_seq, int64_t rows, int64_t h, float* dgamma,
                                  float* dbeta, double* partial, cudaStream_t s) {
  if (!dgamma && !dbeta) return cudaSuccess;
  if (rows == 0 || h == 0) return cudaSuccess;
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  double* pg = partial;
  double* pb = partial + chunks * h;
  const dim3 grid(static_cast<unsigned>((h + 127) / 128), static_cast<unsigned>(chunks));
  PB_LAUNCH(grid, 128, 0, s, ln_param_partials_kernel)(dy, input, mean, rstd, token_seq, rows, h,
                                                       pg, pb);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(grid.x, 128, 0, s, ln_param_finish_kernel)(pg, pb, chunks, h, dgamma, dbeta);
  return launched();
}

}  // namespace
}  // namespace packbert::cuda
