// glu_forward / glu_backward's kernels (kernels/ops/glu.h): grid-stride loops over the n x i
// elements of out (forward) or of dout (backward), rows along y and columns along x, each
// element one expression of common/glu_math.h with the activation chosen at compile time; every
// tensor f32, bf16 or f16 on its own (fp32 math, one rounding per element written).
#include "kernels/common/glu_math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

// blockIdx.y strides over the rows, x over a row's i columns (no division per element).
dim3 rows_grid(int64_t n, int64_t i) {
  return dim3(grid_for(i, kThreads), static_cast<unsigned>(n < kMaxGridY ? n : kMaxGridY));
}

template <int Act>
__global__ void glu_forward_kernel(const void* x, FloatFormat xf, void* out, FloatFormat of,
                                   int64_t n, int64_t i) {
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y)
    for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < i;
         j += int64_t{gridDim.x} * blockDim.x) {
      const int64_t at = r * 2 * i + j;
      store_from_float(out, of, r * i + j,
                       glu_value<Act>(load_as_float(x, xf, at), load_as_float(x, xf, at + i)));
    }
}

template <int Act>
__global__ void glu_backward_kernel(const void* x, FloatFormat xf, const void* dout, FloatFormat df,
                                    void* dx, FloatFormat gf, int64_t n, int64_t i) {
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y)
    for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < i;
         j += int64_t{gridDim.x} * blockDim.x) {
      const int64_t at = r * 2 * i + j;
      float da, dgate;
      glu_grads<Act>(load_as_float(x, xf, at), load_as_float(x, xf, at + i),
                     load_as_float(dout, df, r * i + j), da, dgate);
      store_from_float(dx, gf, at, da);
      store_from_float(dx, gf, at + i, dgate);
    }
}

}  // namespace

cudaError_t glu_forward(const void* x, FloatFormat xf, void* out, FloatFormat of, int act,
                        int64_t n, int64_t i, cudaStream_t s) {
  if (n * i == 0) return cudaSuccess;
  const dim3 grid = rows_grid(n, i);
  if (act == kGluGelu)
    PB_LAUNCH(grid, kThreads, 0, s, glu_forward_kernel<kGluGelu>)(x, xf, out, of, n, i);
  else if (act == kGluGeluTanh)
    PB_LAUNCH(grid, kThreads, 0, s, glu_forward_kernel<kGluGeluTanh>)(x, xf, out, of, n, i);
  else if (act == kGluSilu)
    PB_LAUNCH(grid, kThreads, 0, s, glu_forward_kernel<kGluSilu>)(x, xf, out, of, n, i);
  else
    return cudaErrorInvalidValue;
  return launched();
}

cudaError_t glu_backward(const void* x, FloatFormat xf, const void* dout, FloatFormat df, void* dx,
                         FloatFormat gf, int act, int64_t n, int64_t i, cudaStream_t s) {
  if (n * i == 0) return cudaSuccess;
  const dim3 grid = rows_grid(n, i);
  if (act == kGluGelu)
    PB_LAUNCH(grid, kThreads, 0, s, glu_backward_kernel<kGluGelu>)(x, xf, dout, df, dx, gf, n, i);
  else if (act == kGluGeluTanh)
    PB_LAUNCH(grid, kThreads, 0, s, glu_backward_kernel<kGluGeluTanh>)(x, xf, dout, df, dx, gf, n,
                                                                       i);
  else if (act == kGluSilu)
    PB_LAUNCH(grid, kThreads, 0, s, glu_backward_kernel<kGluSilu>)(x, xf, dout, df, dx, gf, n, i);
  else
    return cudaErrorInvalidValue;
  return launched();
}

}  // namespace packbert::cuda
