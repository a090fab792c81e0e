// Device helpers shared by the .cu files: launch error capture, warp and block reductions with a
// fixed combination order (so every result is the same from run to run), grid sizing, and the
// elements of a buffer in any of the float formats.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/lowp_convert.h"
#include "kernels/common/math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_seams.cuh"

namespace packbert::cuda {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit of gridDim.y

// Blocks for a grid-stride loop over n items (capped: each thread then loops).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

// The launch's error (configuration errors show at once; faults show at a later sync).
inline cudaError_t launched() { return cudaGetLastError(); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// scratch: 32 doubles of shared memory. Warps reduce by a fixed xor tree, then warp 0 adds the
// warp sums in the same tree: the same bits every run.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double t = lane < warps ? scratch[lane] : 0.0;
  t = warp_sum(t);
  return t;  // every warp computes the same total from the same scratch
}

// Welford statistics merged over the block; every thread gets the result. scratch: 3 x 32 floats.
__device__ __forceinline__ Welford block_welford(Welford w, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    Welford other;
    other.n = __shfl_xor_sync(kFullMask, w.n, o);
    other.mean = __shfl_xor_sync(kFullMask, w.mean, o);
    other.m2 = __shfl_xor_sync(kFullMask, w.m2, o);
    // Merge in lane order (lower lane first) so both partners compute the same bits.
    w = (lane & o) ? welford_merge(other, w) : welford_merge(w, other);
  }
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = w.n;
    scratch[32 + warp] = w.mean;
    scratch[64 + warp] = w.m2;
  }
  if (!PB_MUTANT(Mutant::layernorm_barrier)) __syncthreads();
  Welford r;
  for (int i = 0; i < warps; ++i) {
    Welford p;
    p.n = scratch[i];
    p.mean = scratch[32 + i];
    p.m2 = scratch[64 + i];
    r = welford_merge(r, p);
  }
  return r;
}

// The value of element i of a buffer in one of the float formats, and its store (rounded to
// nearest even by common/lowp_convert.h, the CPU's very functions).
__device__ __forceinline__ float load_as_float(const void* p, FloatFormat f, int64_t i) {
  if (f == FloatFormat::f32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return f == FloatFormat::bf16 ? lowp::bf16_to_float(h) : lowp::f16_to_float(h);
}
__device__ __forceinline__ void store_from_float(void* p, FloatFormat f, int64_t i, float v) {
  if (f == FloatFormat::f32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] =
        f == FloatFormat::bf16 ? lowp::float_to_bf16(v) : lowp::float_to_f16(v);
  }
}

}  // namespace packbert::cuda
