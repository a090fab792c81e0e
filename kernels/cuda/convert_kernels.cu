// The float-format conversions of mixed precision: a buffer, or a block of rows of one, widened
// or rounded (to nearest even, the CPU's very functions) into another format, optionally scaled.
// Grid-stride kernels.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void convert_kernel(const void* src, FloatFormat sf, void* dst, FloatFormat df,
                               int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float x = load_as_float(src, sf, i);
    store_from_float(dst, df, i, scale == 1.f ? x : x * scale);  // NaN payloads kept at 1
  }
}

// The same per element over a rows x cols block of two row-major buffers with their own
// leading dimensions (blockIdx.y strides over the rows).
__global__ void convert_rows_kernel(const void* src, FloatFormat sf, int64_t src_ld, void* dst,
                                    FloatFormat df, int64_t dst_ld, int64_t rows, int64_t cols,
                                    float scale) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
         c += int64_t{gridDim.x} * blockDim.x) {
      const float x = load_as_float(src, sf, r * src_ld + c);
      store_from_float(dst, df, r * dst_ld + c, scale == 1.f ? x : x * scale);
    }
}

}  // namespace

cudaError_t convert(const void* src, FloatFormat src_format, void* dst, FloatFormat dst_format,
                    int64_t n, cudaStream_t s, float scale) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, convert_kernel)(src, src_format, dst, dst_format,
                                                                   n, scale);
  return launched();
}

cudaError_t convert_rows(const void* src, FloatFormat src_format, int64_t src_ld, void* dst,
                         FloatFormat dst_format, int64_t dst_ld, int64_t rows, int64_t cols,
                         cudaStream_t s, float scale) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(grid_for(cols, kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  PB_LAUNCH(grid, kThreads, 0, s, convert_rows_kernel)(src, src_format, src_ld, dst, dst_format,
                                                       dst_ld, rows, cols, scale);
  return launched();
}

}  // namespace packbert::cuda
