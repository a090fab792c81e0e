// Rows by index: the gather out[i, :] = x[index[i], :], the ordered scatter-add of its
// backward, and the add of fp32 rows into distinct rows of a low-precision buffer.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

// out[i, :] = x[index[i], :], elements of T (float, or the 16 bits of bf16 / f16: a copy); an
// index of -1 (an unused slot) gives a row of 0. The scatters below skip such indices.
template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* index, T* out, int64_t m, int64_t h) {
  const int64_t n = m * h;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / h, c = i - row * h;
    const int64_t r = index[row];
    out[i] = r < 0 ? T(0) : x[r * h + c];
  }
}

// The ordered scatter-add dx[index[i]] += dout[i] in three steps, so that the usual case --
// every target row hit once -- runs in parallel and repeated rows still add in order of i:
// first[r] = the smallest i with index[i] == r (atomicMin: the same whatever the timing);
// every element of a first contributor is added in parallel (each target element once); then,
// only if some row repeats (repeated != 0), one thread per column adds the later contributors
// walking i in order.
__global__ void scatter_first_kernel(const int32_t* index, uint32_t* first, int64_t m) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x)
    if (index[i] >= 0) atomicMin(first + index[i], static_cast<uint32_t>(i));
}

__global__ void scatter_repeated_kernel(const int32_t* index, const uint32_t* first,
                                        uint32_t* repeated, int64_t m) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x)
    if (index[i] >= 0 && first[index[i]] != static_cast<uint32_t>(i))
      atomicExch(repeated, 1u);  // many threads may flag it: atomic, not a data race
}

__global__ void scatter_add_first_kernel(const void* dout, const int32_t* index,
                                         const uint32_t* first, void* dx, FloatFormat f, int64_t m,
                                         int64_t h) {
  const int64_t n = m * h;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / h, c = e - i * h;
    const int64_t r = index[i];
    if (r < 0 || first[r] != static_cast<uint32_t>(i)) continue;
    store_from_float(dx, f, r * h + c, load_as_float(dx, f, r * h + c) + load_as_float(dout, f, e));
  }
}

__global__ void scatter_add_rest_kernel(const void* dout, const int32_t* index,
                                        const uint32_t* first, const uint32_t* repeated, void* dx,
                                        FloatFormat f, int64_t m, int64_t h) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h || *repeated == 0) return;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = index[i];
    if (r < 0 || first[r] == static_cast<uint32_t>(i)) continue;
    store_from_float(dx, f, r * h + c,
                     load_as_float(dx, f, r * h + c) + load_as_float(dout, f, i * h + c));
  }
}

__global__ void add_rows_f32_kernel(const float* src, const int32_t* index, void* dx, FloatFormat f,
                                    int64_t m, int64_t h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * h;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / h;
    if (index[r] < 0) continue;
    const int64_t d = int64_t{index[r]} * h + (i - r * h);
    store_from_float(dx, f, d, load_as_float(dx, f, d) + src[i]);
  }
}

}  // namespace

cudaError_t gather_rows(const void* x, const int32_t* index, void* out, FloatFormat f, int64_t m,
                        int64_t h, cudaStream_t s) {
  if (m * h == 0) return cudaSuccess;
  if (f == FloatFormat::f32)
    PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, gather_rows_kernel)(
        static_cast<const float*>(x), index, static_cast<float*>(out), m, h);
  else
    PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, gather_rows_kernel)(
        static_cast<const uint16_t*>(x), index, static_cast<uint16_t*>(out), m, h);
  return launched();
}

cudaError_t scatter_add_rows_ordered(const void* dout, const int32_t* index, void* dx,
                                     FloatFormat f, int64_t m, int64_t h, int64_t rows,
                                     uint32_t* scratch, cudaStream_t s) {
  if (m * h == 0) return cudaSuccess;
  uint32_t* first = scratch;
  uint32_t* repeated = scratch + rows;
  cudaError_t e = memset_async(first, 0xff, static_cast<size_t>(rows) * sizeof(uint32_t), s);
  if (e == cudaSuccess) e = memset_async(repeated, 0, sizeof(uint32_t), s);
  if (e != cudaSuccess) return e;
  PB_LAUNCH(grid_for(m, kThreads), kThreads, 0, s, scatter_first_kernel)(index, first, m);
  PB_LAUNCH(grid_for(m, kThreads), kThreads, 0, s, scatter_repeated_kernel)(index, first, repeated,
                                                                            m);
  PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, scatter_add_first_kernel)(dout, index, first,
                                                                                 dx, f, m, h);
  PB_LAUNCH(grid_for(h, 128), 128, 0, s, scatter_add_rest_kernel)(dout, index, first, repeated, dx,
                                                                  f, m, h);
  return launched();
}

cudaError_t add_rows_f32(const float* src, const int32_t* index, void* dx, FloatFormat f, int64_t m,
                         int64_t h, cudaStream_t s) {
  if (m == 0 || h == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, add_rows_f32_kernel)(src, index, dx, f, m,
                                                                            h);
  return launched();
}

}  // namespace packbert::cuda
