// Deterministic reductions: column sums (the bias gradients) and sums of squares (L2 norms).
// Each adds in a fixed order: in sequence per thread, in a fixed tree per block (sums of
// squares), then the partials in order in a second kernel.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

// Stage 1: partial[chunk, c] = sum of its kColumnChunk rows, in row order (double).
__global__ void column_partials_kernel(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                       double* partial) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * kColumnChunk;
  const int64_t r1 = r0 + kColumnChunk < rows ? r0 + kColumnChunk : rows;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += x[r * ld + c];
  partial[blockIdx.y * cols + c] = acc;
}

// Stage 2: out[c] += the chunks' partials, in chunk order.
__global__ void column_finish_kernel(const double* partial, int64_t chunks, int64_t cols,
                                     float* out) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  double acc = 0.0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + c];
  out[c] += static_cast<float>(acc);
}

__global__ void sum_squares_chunks_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  const int64_t i0 = blockIdx.x * kNormChunk;
  const int64_t i1 = i0 + kNormChunk < n ? i0 + kNormChunk : n;
  double s = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The partials' sum in order: its root rounded to f32 into root, or (root null) the sum itself.
__global__ void finish_sum_of_squares_kernel(const double* partial, int64_t k, float* root,
                                             double* sum) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x != 0) return;
  if (root) {
    root[0] = static_cast<float>(sqrt(s));
  } else {
    sum[0] = s;
  }
}

}  // namespace

cudaError_t add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, double* partial,
                            float* out, cudaStream_t s) {
  if (cols == 0 || rows == 0) return cudaSuccess;
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(chunks));
  PB_LAUNCH(grid, kThreads, 0, s, column_partials_kernel)(x, rows, cols, ld, partial);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(grid.x, kThreads, 0, s, column_finish_kernel)(partial, chunks, cols, out);
  return launched();
}

cudaError_t sum_of_squares(const float* x, int64_t n, double* partial, float* root, double* sum,
                           cudaStream_t s) {
  const int64_t k = l2_norm_partials(n);
  if (k > 0) {
    PB_LAUNCH(static_cast<unsigned>(k), kThreads, 0, s, sum_squares_chunks_kernel)(x, n, partial);
    cudaError_t e = launched();
    if (e != cudaSuccess) return e;
  }
  PB_LAUNCH(1, kThreads, 0, s, finish_sum_of_squares_kernel)(partial, k, root, sum);
  return launched();
}

cudaError_t root_of_sums(const double* sums, int64_t k, float* root, cudaStream_t s) {
  PB_LAUNCH(1, kThreads, 0, s, finish_sum_of_squares_kernel)(sums, k, root, nullptr);
  return launched();
}

}  // namespace packbert::cuda
