// rotary_embedding's kernel (kernels/ops/rotary.h): a grid-stride loop over (row, pair i), so
// consecutive threads take consecutive pairs of one row (coalesced loads of each head's two
// halves). A thread computes its pair's cos / sin once, in double (common/rotary_math.h), and
// rotates that pair in every head of q and k; storage f32, bf16 or f16, fp32 math, one rounding.
#include "kernels/common/rotary_math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rotary_kernel(const int32_t* token_seq, const int32_t* token_pos, void* qkv,
                              FloatFormat f, int64_t rows, int64_t hidden, int64_t d, int heads,
                              double theta, bool inverse) {
  const int64_t half = d / 2, items = rows * half, ld = 3 * hidden;
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < items;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = item / half, i = item - r * half;
    if (token_seq[r] < 0) continue;
    float c, s;
    rotary_cos_sin(token_pos[r], rotary_inv_freq(theta, i, d), inverse, &c, &s);
    for (int64_t head = 0; head < 2 * heads; ++head) {  // q's heads, then k's
      const int64_t at = r * ld + head * d + i;
      float x = load_as_float(qkv, f, at), y = load_as_float(qkv, f, at + half);
      rotary_rotate(x, y, c, s);
      store_from_float(qkv, f, at, x);
      store_from_float(qkv, f, at + half, y);
    }
  }
}

}  // namespace

cudaError_t rotary_embedding(const DeviceLayout& l, void* qkv, FloatFormat f, int64_t hidden,
                             int heads, float theta, bool inverse, cudaStream_t s) {
  const int64_t items = l.rows * (hidden / heads / 2);
  if (items == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(items, kThreads), kThreads, 0, s, rotary_kernel)(
      l.token_seq, l.token_pos, qkv, f, l.rows, hidden, hidden / heads, heads,
      static_cast<double>(theta), inverse);
  return launched();
}

}  // namespace packbert::cuda
