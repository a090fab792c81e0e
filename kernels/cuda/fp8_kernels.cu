// FP8 kernels (kernels/ops/fp8.h): the cast of a buffer into an FP8 operand and / or its transpose,
// with the amax of the rows it keeps, and the epilogue of an FP8 GEMM that wrote fp32. The
// per-element arithmetic is common/fp8_convert.h's and common/math.h's, the CPU backend's very
// functions, so both write the same bytes.
#include "kernels/common/fp8_convert.h"
#include "kernels/common/math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

// A 32 x 32 tile per block of 32 x 8 threads, each thread 4 rows of it: the rows are read and
// out written along the columns, the tile goes through shared memory, and out_t is written
// along its rows (coalesced both ways).
constexpr int kTile = 32, kTileRows = 8;
constexpr int kThreads = 256;

__global__ void fp8_cast_kernel(const void* src, FloatFormat sf, const int32_t* rows,
                                const float* scale, unsigned* amax, uint8_t* out, uint8_t* out_t,
                                int64_t n, int64_t c, int64_t n_out, int64_t n_t, int e4m3,
                                int64_t row_tiles) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  __shared__ unsigned block_top[kTile * kTileRows];
  const float s = scale != nullptr ? scale[0] : 1.f;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c0 = int64_t{blockIdx.x} * kTile;
  unsigned top = 0;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTile;
    for (int i = ty; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, j = c0 + tx;
      uint8_t q = 0;
      if (r < n && j < c && (rows == nullptr || rows[r] >= 0)) {
        const float v = load_as_float(src, sf, r * c + j);
        const unsigned b = fp8::amax_bits(v);
        top = b > top ? b : top;
        q = fp8::fp8_cast_value(v, s, e4m3 != 0);
      }
      if (out != nullptr && r < n_out && j < c) out[r * c + j] = q;
      tile[tx][i] = q;  // [column][row]
    }
    if (out_t != nullptr) {
      __syncthreads();
      for (int i = ty; i < kTile; i += kTileRows) {
        const int64_t j = c0 + i, r = r0 + tx;
        if (j < c && r < n_t) out_t[j * n_t + r] = tile[i][tx];
      }
      __syncthreads();  // the tile is rewritten by the next row tile
    }
  }
  if (amax == nullptr) return;
  const int t = ty * kTile + tx;
  block_top[t] = top;
  __syncthreads();
  if (t == 0) {
    unsigned m = 0;
    for (int i = 0; i < kTile * kTileRows; ++i) m = block_top[i] > m ? block_top[i] : m;
    atomicMax(amax, m);  // unsigned: order-independent, as the bit patterns compare
  }
}

// mode 0: bias only (may be null); 1 / 2: bias, then the erf / tanh GELU, writing pre first;
// 3 / 4: times the erf / tanh GELU's derivative at pre (an input gradient through a GELU).
template <int Mode>
__global__ void fp8_epilogue_kernel(const float* acc, const float* bias, void* out, void* pre,
                                    FloatFormat f, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float x = acc[i];
    if (Mode <= 2 && bias != nullptr) x += bias[i % cols];
    if (Mode == 1 || Mode == 2) {
      store_from_float(pre, f, i, x);
      x = Mode == 2 ? gelu_tanh(x) : gelu(x);
    } else if (Mode == 3 || Mode == 4) {
      const float p = load_as_float(pre, f, i);
      x *= Mode == 4 ? gelu_tanh_grad(p) : gelu_grad(p);
    }
    store_from_float(out, f, i, x);
  }
}

__global__ void fp8_amax_share_kernel(const float* amax, int64_t rank, double* shared, int64_t n,
                                      int64_t ranks) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * ranks;
       i += int64_t{gridDim.x} * blockDim.x)
    shared[i] = i / n == rank ? static_cast<double>(amax[i % n]) : 0.0;
}

__global__ void fp8_scale_update_kernel(const double* shared, const float* fp8_max, int margin,
                                        float* history, float* scales, float* amax, int64_t n,
                                        int64_t ranks, int64_t h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    fp8::fp8_update_operand(shared + i, n, ranks, fp8_max[i], margin, history + i * h, h,
                            scales + 2 * i, amax + i);
}

}  // namespace

cudaError_t fp8_cast(const void* src, FloatFormat src_format, const int32_t* rows,
                     const float* scale, float* amax, uint8_t* out, uint8_t* out_t, int64_t n,
                     int64_t c, int64_t n_out, int64_t n_t, bool e4m3, cudaStream_t s) {
  const int64_t written = n_out > n_t ? n_out : n_t, all_rows = written > n ? written : n;
  if (all_rows == 0 || c == 0) return cudaSuccess;
  const int64_t row_tiles = (all_rows + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned>((c + kTile - 1) / kTile),
                  static_cast<unsigned>(row_tiles < kMaxGridY ? row_tiles : kMaxGridY));
  const dim3 block(kTile, kTileRows);
  PB_LAUNCH(grid, block, 0, s, fp8_cast_kernel)(src, src_format, rows, scale,
                                                reinterpret_cast<unsigned*>(amax), out, out_t, n, c,
                                                n_out, n_t, e4m3 ? 1 : 0, row_tiles);
  return launched();
}

cudaError_t fp8_epilogue(const float* acc, const float* bias, void* out, void* pre, FloatFormat f,
                         int64_t rows, int64_t cols, int mode, cudaStream_t s) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const unsigned grid = grid_for(n, kThreads);
  switch (mode) {
    case 0:
      PB_LAUNCH(grid, kThreads, 0, s, fp8_epilogue_kernel<0>)(acc, bias, out, pre, f, rows, cols);
      break;
    case 1:
      PB_LAUNCH(grid, kThreads, 0, s, fp8_epilogue_kernel<1>)(acc, bias, out, pre, f, rows, cols);
      break;
    case 2:
      PB_LAUNCH(grid, kThreads, 0, s, fp8_epilogue_kernel<2>)(acc, bias, out, pre, f, rows, cols);
      break;
    case 3:
      PB_LAUNCH(grid, kThreads, 0, s, fp8_epilogue_kernel<3>)(acc, bias, out, pre, f, rows, cols);
      break;
    default:
      PB_LAUNCH(grid, kThreads, 0, s, fp8_epilogue_kernel<4>)(acc, bias, out, pre, f, rows, cols);
      break;
  }
  return launched();
}

cudaError_t fp8_amax_share(const float* amax, int64_t rank, double* shared, int64_t n,
                           int64_t ranks, cudaStream_t s) {
  if (n * ranks == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n * ranks, kThreads), kThreads, 0, s, fp8_amax_share_kernel)(amax, rank,
                                                                                  shared, n, ranks);
  return launched();
}

cudaError_t fp8_scale_update(const double* shared, const float* fp8_max, int margin, float* history,
                             float* scales, float* amax, int64_t n, int64_t ranks, int64_t h,
                             cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, fp8_scale_update_kernel)(
      shared, fp8_max, margin, history, scales, amax, n, ranks, h);
  return launched();
}

}  // namespace packbert::cuda
