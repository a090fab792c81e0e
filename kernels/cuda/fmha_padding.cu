// Rows of no sequence in the attention's outputs and gradients: zeroed once per op, before the
// length buckets fork onto their streams (fmha.h), for the fp32 and the tensor-core kernels
// alike, whose work lists write only the rows of their sequences.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fmha.h"

namespace packbert::cuda {
namespace {

// Rows of no sequence: width elements of a [rows, width] buffer set to 0. One warp per row (a
// grid-stride loop over rows): the row's sequence is read once, and only a padding row's warp
// stores, its lanes along the row; no per-element division by the width.
template <typename W>
__global__ void zero_padding_rows_kernel(const int32_t* token_seq, int64_t rows, int64_t width,
                                         W* x) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x >> 5);
  for (int64_t r = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; r < rows; r += warps) {
    if (token_seq[r] >= 0) continue;
    W* row = x + r * width;
    for (int64_t c = lane; c < width; c += 32) row[c] = W(0);
  }
}

}  // namespace

cudaError_t fmha_zero_padding_rows(const DeviceLayout& l, void* x, int64_t width, int elem_bytes,
                                   cudaStream_t s) {
  if (l.rows == 0 || width == 0) return cudaSuccess;
  const unsigned grid = grid_for(l.rows * 32, 256);  // a warp per row
  if (elem_bytes == 2)
    PB_LAUNCH(grid, 256, 0, s, zero_padding_rows_kernel<uint16_t>)(l.token_seq, l.rows, width,
                                                                   static_cast<uint16_t*>(x));
  else if (elem_bytes == 4)
    PB_LAUNCH(grid, 256, 0, s, zero_padding_rows_kernel<uint32_t>)(l.token_seq, l.rows, width,
                                                                   static_cast<uint32_t*>(x));
  else
    return cudaErrorInvalidValue;
  return launched();
}

}  // namespace packbert::cuda
