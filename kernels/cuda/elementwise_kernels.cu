// Elementwise epilogues: the GELU (fp32, and bf16 / f16 storage with fp32 math) and tanh
// activations forward and backward, the bias add of the GEMM fallback, an in-place add.
// Grid-stride kernels.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

// The GELU of the form chosen at compile time (common/math.h).
template <bool Tanh>
__device__ float gelu_of(float x) {
  return Tanh ? gelu_tanh(x) : gelu(x);
}
template <bool Tanh>
__device__ float gelu_grad_of(float x) {
  return Tanh ? gelu_tanh_grad(x) : gelu_grad(x);
}

template <bool Tanh>
__global__ void gelu_forward_kernel(const float* pre, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = gelu_of<Tanh>(pre[i]);
}

template <bool Tanh>
__global__ void gelu_backward_kernel(float* g, const float* pre, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    g[i] *= gelu_grad_of<Tanh>(pre[i]);
}

template <bool Tanh>
__global__ void gelu_forward_lowp_kernel(const void* pre, void* out, FloatFormat f, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store_from_float(out, f, i, gelu_of<Tanh>(load_as_float(pre, f, i)));
}

template <bool Tanh>
__global__ void gelu_backward_lowp_kernel(void* g, const void* pre, FloatFormat f, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store_from_float(g, f, i,
                     load_as_float(g, f, i) * gelu_grad_of<Tanh>(load_as_float(pre, f, i)));
}

__global__ void add_bias_rows_kernel(float* c, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    c[i] += bias[i % cols];
}

__global__ void add_inplace_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] += src[i];
}

__global__ void tanh_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = tanhf(x[i]);
}

__global__ void tanh_backward_kernel(float* dp, const float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dp[i] *= 1.0f - p[i] * p[i];
}

}  // namespace

cudaError_t gelu_forward_lowp(const void* pre, void* out, FloatFormat f, int64_t n, bool tanh_form,
                              cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_lowp_kernel<true>)(pre, out, f,
                                                                                     n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_lowp_kernel<false>)(pre, out, f,
                                                                                      n);
  return launched();
}

cudaError_t gelu_backward_inplace_lowp(void* g, const void* pre, FloatFormat f, int64_t n,
                                       bool tanh_form, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_lowp_kernel<true>)(g, pre, f, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_lowp_kernel<false>)(g, pre, f,
                                                                                       n);
  return launched();
}

cudaError_t gelu_forward(const float* pre, float* out, int64_t n, bool tanh_form, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_kernel<true>)(pre, out, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_kernel<false>)(pre, out, n);
  return launched();
}

cudaError_t gelu_backward_inplace(float* g, const float* pre, int64_t n, bool tanh_form,
                                  cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_kernel<true>)(g, pre, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_kernel<false>)(g, pre, n);
  return launched();
}

cudaError_t add_bias_rows(float* c, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(rows * cols, kThreads), kThreads, 0, s, add_bias_rows_kernel)(c, bias, rows,
                                                                                   cols);
  return launched();
}

cudaError_t add_inplace(float* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, add_inplace_kernel)(dst, src, n);
  return launched();
}

cudaError_t tanh_inplace(float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, tanh_kernel)(x, n);
  return launched();
}

cudaError_t tanh_backward_inplace(float* dp, const float* p, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, tanh_backward_kernel)(dp, p, n);
  return launched();
}

}  // namespace packbert::cuda
