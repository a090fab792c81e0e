// Variable-length multi-head attention in fp32, head dim up to kAttentionMaxHeadDim (64).
//
// Launches take a work list (fmha.h): the backend sorts the sequences into length buckets
// (common/fmha_work_list.h) and launches each bucket as its own grid, sized by that bucket's
// longest sequence, on its own stream; blocks past a sequence's end inside a bucket exit at once.
// bf16 / fp16 activations take the tensor-core kernels of fmha_mma_*.cu instead.
// Any sequence length up to the dropout key's 2^20 positions runs; each block walks its tiles
// one after another. Where these kernels could go faster (FlashAttention-2 tiling, head dim
// 128, one backward kernel) is in docs/performance.md (GPU, fp32 attention).
//
// Kernels (lse is [rows, heads], as the CPU backend's):
//   forward   block = 4 warps x 4 query rows of one (sequence, head); K/V tiles of 32 keys in
//             shared memory; lane j owns key j of the tile; online softmax (running max m and
//             sum l per row, rescaled per tile); out = acc / l, lse = m + log(l).
//   dQ        the same block shape: P = exp(s - lse) recomputed, dP = f * (dO . v),
//             dS = P (dP - D) with D = dO . O, dQ = scale * dS K.
//   dK, dV    block = 4 warps x 4 key rows; query tiles of 32 in shared memory; lane i owns
//             query i of the tile: dV += (P*f)^T dO, dK = scale * dS^T Q.
// Local windows (half-width h = a.half, kernels/ops/attention.h): a block walks only the tiles
// from the one holding max(0, first row - h) to the one holding its last row + h (clipped to the
// sequence), and inside a tile a row (a warp's) that has no key (query) of its window there is
// skipped whole; only the pairs of the remaining rows with |i - j| > h are masked. Global
// attention (h = max_len) walks every tile and masks nothing more, so it keeps its bits.
// Every sum runs in a fixed order (fixed shuffle trees, tiles in order): results are the same
// from run to run. Dropout: the mask of (query i, key j) is dropout_bits4(sample, head, i, j)
// word j % 4 (common/philox.h), exactly the CPU's; one Philox call gives 4 keys, shared across
// lanes by shuffles.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fmha.h"

namespace packbert::cuda {
namespace {

constexpr int kD = kAttentionMaxHeadDim;  // shared-memory row width
constexpr int kS = kD + 1;                // padded stride: lane-indexed rows hit distinct banks
constexpr int kDims = kD / 32;            // output dims per lane
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // 16 query (or key) rows per block
constexpr int kTile = 32;                          // keys (or queries) per tile: one per lane
constexpr int kThreads = kWarps * 32;

struct AttnArgs {
  DeviceLayout l;
  const int32_t* seqs;  // the work list (fmha.h): block row i serves sequence seqs[i]
  const float* qkv;
  int64_t hidden;  // H; qkv rows are 3H wide
  int d;           // head dim (<= kD)
  int heads;
  int blocks_per_seq;  // ceil(work max_len / kBlockRows)
  int half;            // the window's half-width (checks::attention_half_window)
  float scale;
  DropoutStream ds;
};

// The first tile (a multiple of kTile) and the end of the keys that rows [first, first + n)
// attend, or of the queries that attend them (the window is symmetric), in a sequence of len.
__device__ __forceinline__ int window_begin(int first, int half) {
  const int lo = first > half ? first - half : 0;
  return lo - lo % kTile;
}
__device__ __forceinline__ int window_end(int first, int n, int half, int len) {
  const int64_t end = int64_t{first} + n + half;
  return end < len ? static_cast<int>(end) : len;
}
// Whether row i has a partner (key or query) in the tile [t0, t0 + kTile).
__device__ __forceinline__ bool tile_in_window(int i, int t0, int half) {
  return t0 - i <= half && i - (t0 + kTile - 1) <= half;
}
// Whether the pair (i, j) of one sequence lies within the window.
__device__ __forceinline__ bool in_window(int i, int j, int half) {
  return j - i <= half && i - j <= half;
}

// Loads rows [first, first + n) of one head's q (which = 0), k (1) or v (2) slot into
// dst[n][kS], zero outside the sequence and beyond d.
__device__ __forceinline__ void load_rows(const AttnArgs& a, int64_t start, int len, int which,
                                          int head, int first, int n, float* dst) {
  const int64_t ld = 3 * a.hidden;
  const float* base = a.qkv + start * ld + which * a.hidden + static_cast<int64_t>(head) * a.d;
  for (int idx = threadIdx.x; idx < n * kD; idx += blockDim.x) {
    const int r = idx / kD, c = idx - r * kD, i = first + r;
    dst[r * kS + c] = (i < len && c < a.d) ? base[static_cast<int64_t>(i) * ld + c] : 0.0f;
  }
}

// Same for a [rows, H] buffer (out, dout).
__device__ __forceinline__ void load_rows_h(const AttnArgs& a, const float* buf, int64_t start,
                                            int len, int head, int first, int n, float* dst) {
  const float* base = buf + start * a.hidden + static_cast<int64_t>(head) * a.d;
  for (int idx = threadIdx.x; idx < n * kD; idx += blockDim.x) {
    const int r = idx / kD, c = idx - r * kD, i = first + r;
    dst[r * kS + c] = (i < len && c < a.d) ? base[static_cast<int64_t>(i) * a.hidden + c] : 0.0f;
  }
}

__device__ __forceinline__ float dot_rows(const float* x, const float* y, int d) {
  float s = 0.0f;
  for (int c = 0; c < d; ++c) s += x[c] * y[c];
  return s;
}

// The dropout factor of key (k0 + lane) for query position qpos: lanes 0..7 compute the Philox
// words of keys k0 + 4 lane .. + 3; every lane then fetches its word. All 32 lanes must call.
__device__ __forceinline__ float key_dropout_factor(const DropoutStream& ds, uint64_t sample,
                                                    int head, int qpos, int k0, int lane) {
  Philox4x32 b{};
  if (lane < 8)
    b = dropout_bits4(ds, sample, static_cast<uint32_t>(head), static_cast<uint32_t>(qpos),
                      static_cast<uint32_t>(k0 + 4 * lane));
  const int src = lane >> 2;
  const uint32_t w0 = __shfl_sync(kFullMask, b.v[0], src);
  const uint32_t w1 = __shfl_sync(kFullMask, b.v[1], src);
  const uint32_t w2 = __shfl_sync(kFullMask, b.v[2], src);
  const uint32_t w3 = __shfl_sync(kFullMask, b.v[3], src);
  const int word = lane & 3;
  const uint32_t bits = word == 0 ? w0 : word == 1 ? w1 : word == 2 ? w2 : w3;
  return dropout_factor(ds, bits);
}

__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(AttnArgs a, float* out, float* lse) {
  __shared__ float Qs[kBlockRows * kS];
  __shared__ float Ks[kTile * kS];
  __shared__ float Vs[kTile * kS];
  const int item = blockIdx.x / a.blocks_per_seq;
  const int seq = a.seqs ? a.seqs[item] : item;
  const int q0 = (blockIdx.x - item * a.blocks_per_seq) * kBlockRows;
  const int head = blockIdx.y;
  const int len = a.l.seq_len[seq];
  if (q0 >= len) return;  // the whole block
  const int64_t start = a.l.seq_start[seq];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const DropoutStream dstream = dropout_now(a.ds);  // the step of this run
  const bool drop = dropout_enabled(dstream);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[seq]) : 0;
  load_rows(a, start, len, 0, head, q0, kBlockRows, Qs);

  float m[kRowsPerWarp], lsum[kRowsPerWarp], acc[kRowsPerWarp][kDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    lsum[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < kDims; ++t) acc[r][t] = 0.0f;
  }
  const int kend = window_end(q0, kBlockRows, a.half, len);
  for (int k0 = window_begin(q0, a.half); k0 < kend; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_rows(a, start, len, 1, head, k0, kTile, Ks);
    load_rows(a, start, len, 2, head, k0, kTile, Vs);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qr = warp * kRowsPerWarp + r, qi = q0 + qr;
      // Uniform over the warp: a row past the end, or with no key of its window in the tile.
      if (qi >= len || !tile_in_window(qi, k0, a.half)) continue;
      const bool kvalid = k0 + lane < len && in_window(qi, k0 + lane, a.half);
      float s = dot_rows(Qs + qr * kS, Ks + lane * kS, a.d) * a.scale;
      s = kvalid ? s : -INFINITY;
      // Finite: the tile holds a key of the row's window (which ends inside the sequence).
      const float mnew = fmaxf(m[r], warp_max(s));
      const float alpha = expf(m[r] - mnew);  // 0 on the first tile (m = -inf)
      const float p = kvalid ? expf(s - mnew) : 0.0f;
      lsum[r] = lsum[r] * alpha + warp_sum(p);
      const float f = drop ? key_dropout_factor(dstream, sample, head, qi, k0, lane) : 1.0f;
      const float pf = p * f;
#pragma unroll
      for (int t = 0; t < kDims; ++t) acc[r][t] *= alpha;
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        const float pj = __shfl_sync(kFullMask, pf, j);
#pragma unroll
        for (int t = 0; t < kDims; ++t) acc[r][t] += pj * Vs[j * kS + lane + 32 * t];
      }
      m[r] = mnew;
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int qi = q0 + warp * kRowsPerWarp + r;
    if (qi >= len) continue;
    const int64_t row = start + qi;
    const float inv = 1.0f / lsum[r];
#pragma unroll
    for (int t = 0; t < kDims; ++t) {
      const int c = lane + 32 * t;
      if (c < a.d) out[row * a.hidden + static_cast<int64_t>(head) * a.d + c] = acc[r][t] * inv;
    }
    if (lane == 0) lse[row * a.heads + head] = m[r] + logf(lsum[r]);
  }
}

// D_i = dO_i . O_i of query row i (warp-wide; dOs row in shared memory).
__device__ __forceinline__ float row_delta(const AttnArgs& a, const float* dos_row,
                                           const float* out, int64_t row, int head, int lane) {
  float part = 0.0f;
#pragma unroll
  for (int t = 0; t < kDims; ++t) {
    const int c = lane + 32 * t;
    if (c < a.d) part += dos_row[c] * out[row * a.hidden + static_cast<int64_t>(head) * a.d + c];
  }
  return warp_sum(part);
}

__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(AttnArgs a, const float* out, const float* lse, const float* dout,
                        float* dqkv) {
  __shared__ float Qs[kBlockRows * kS];
  __shared__ float dOs[kBlockRows * kS];
  __shared__ float Ks[kTile * kS];
  __shared__ float Vs[kTile * kS];
  const int item = blockIdx.x / a.blocks_per_seq;
  const int seq = a.seqs ? a.seqs[item] : item;
  const int q0 = (blockIdx.x - item * a.blocks_per_seq) * kBlockRows;
  const int head = blockIdx.y;
  const int len = a.l.seq_len[seq];
  if (q0 >= len) return;
  const int64_t start = a.l.seq_start[seq];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const DropoutStream dstream = dropout_now(a.ds);  // the step of this run
  const bool drop = dropout_enabled(dstream);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[seq]) : 0;
  load_rows(a, start, len, 0, head, q0, kBlockRows, Qs);
  load_rows_h(a, dout, start, len, head, q0, kBlockRows, dOs);
  __syncthreads();

  float delta[kRowsPerWarp], lse_r[kRowsPerWarp], dq[kRowsPerWarp][kDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int qr = warp * kRowsPerWarp + r, qi = q0 + qr;
    const bool valid = qi < len;
    delta[r] = valid ? row_delta(a, dOs + qr * kS, out, start + qi, head, lane) : 0.0f;
    lse_r[r] = valid ? lse[(start + qi) * a.heads + head] : 0.0f;
#pragma unroll
    for (int t = 0; t < kDims; ++t) dq[r][t] = 0.0f;
  }
  const int kend = window_end(q0, kBlockRows, a.half, len);
  for (int k0 = window_begin(q0, a.half); k0 < kend; k0 += kTile) {
    __syncthreads();
    load_rows(a, start, len, 1, head, k0, kTile, Ks);
    load_rows(a, start, len, 2, head, k0, kTile, Vs);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qr = warp * kRowsPerWarp + r, qi = q0 + qr;
      if (qi >= len || !tile_in_window(qi, k0, a.half)) continue;  // uniform over the warp
      const bool kvalid = k0 + lane < len && in_window(qi, k0 + lane, a.half);
      const float s = dot_rows(Qs + qr * kS, Ks + lane * kS, a.d) * a.scale;
      const float dp = dot_rows(dOs + qr * kS, Vs + lane * kS, a.d);
      const float p = kvalid ? expf(s - lse_r[r]) : 0.0f;
      const float f = drop ? key_dropout_factor(dstream, sample, head, qi, k0, lane) : 1.0f;
      const float ds = p * (f * dp - delta[r]);
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        const float dsj = __shfl_sync(kFullMask, ds, j);
#pragma unroll
        for (int t = 0; t < kDims; ++t) dq[r][t] += dsj * Ks[j * kS + lane + 32 * t];
      }
    }
  }
  const int64_t ld = 3 * a.hidden;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int qi = q0 + warp * kRowsPerWarp + r;
    if (qi >= len) continue;
#pragma unroll
    for (int t = 0; t < kDims; ++t) {
      const int c = lane + 32 * t;
      if (c < a.d)
        dqkv[(start + qi) * ld + static_cast<int64_t>(head) * a.d + c] = dq[r][t] * a.scale;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(AttnArgs a, const float* out, const float* lse, const float* dout,
                         float* dqkv) {
  __shared__ float Kb[kBlockRows * kS];
  __shared__ float Vb[kBlockRows * kS];
  __shared__ float Qs[kTile * kS];
  __shared__ float dOs[kTile * kS];
  __shared__ float lse_s[kTile];
  __shared__ float delta_s[kTile];
  const int item = blockIdx.x / a.blocks_per_seq;
  const int seq = a.seqs ? a.seqs[item] : item;
  const int kb0 = (blockIdx.x - item * a.blocks_per_seq) * kBlockRows;
  const int head = blockIdx.y;
  const int len = a.l.seq_len[seq];
  if (kb0 >= len) return;
  const int64_t start = a.l.seq_start[seq];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const DropoutStream dstream = dropout_now(a.ds);  // the step of this run
  const bool drop = dropout_enabled(dstream);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[seq]) : 0;
  load_rows(a, start, len, 1, head, kb0, kBlockRows, Kb);
  load_rows(a, start, len, 2, head, kb0, kBlockRows, Vb);
  const int kbase = kb0 + warp * kRowsPerWarp;  // this warp's 4 keys: kbase .. kbase + 3

  float dk[kRowsPerWarp][kDims], dv[kRowsPerWarp][kDims];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < kDims; ++t) dk[r][t] = dv[r][t] = 0.0f;
  const int qend = window_end(kb0, kBlockRows, a.half, len);
  for (int q0 = window_begin(kb0, a.half); q0 < qend; q0 += kTile) {
    __syncthreads();
    load_rows(a, start, len, 0, head, q0, kTile, Qs);
    load_rows_h(a, dout, start, len, head, q0, kTile, dOs);
    __syncthreads();
    // D and lse of the tile's 32 queries: warp w does queries 8w .. 8w + 7.
    for (int k = 0; k < kTile / kWarps; ++k) {
      const int qt = warp * (kTile / kWarps) + k, qi = q0 + qt;
      const bool valid = qi < len;
      const float dlt = valid ? row_delta(a, dOs + qt * kS, out, start + qi, head, lane) : 0.0f;
      if (lane == 0) {
        delta_s[qt] = dlt;
        lse_s[qt] = valid ? lse[(start + qi) * a.heads + head] : 0.0f;
      }
    }
    __syncthreads();
    const int qi = q0 + lane;
    const float lse_i = lse_s[lane], delta_i = delta_s[lane];
    // One Philox call: this query's words for the warp's 4 keys (kbase is a multiple of 4).
    Philox4x32 bits{};
    if (drop)
      bits = dropout_bits4(dstream, sample, static_cast<uint32_t>(head), static_cast<uint32_t>(qi),
                           static_cast<uint32_t>(kbase));
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int kr = warp * kRowsPerWarp + r, kj = kbase + r;
      if (kj >= len || !tile_in_window(kj, q0, a.half)) continue;  // uniform over the warp
      const bool qvalid = qi < len && in_window(qi, kj, a.half);
      const float s = dot_rows(Qs + lane * kS, Kb + kr * kS, a.d) * a.scale;
      const float dp = dot_rows(dOs + lane * kS, Vb + kr * kS, a.d);
      const float p = qvalid ? expf(s - lse_i) : 0.0f;
      const float f = drop ? dropout_factor(dstream, bits.v[r]) : 1.0f;
      const float pf = p * f;
      const float ds = p * (f * dp - delta_i);
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        const float pfi = __shfl_sync(kFullMask, pf, i);
        const float dsi = __shfl_sync(kFullMask, ds, i);
#pragma unroll
        for (int t = 0; t < kDims; ++t) {
          dv[r][t] += pfi * dOs[i * kS + lane + 32 * t];
          dk[r][t] += dsi * Qs[i * kS + lane + 32 * t];
        }
      }
    }
  }
  const int64_t ld = 3 * a.hidden;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int j = kbase + r;
    if (j >= len) continue;
    float* row = dqkv + (start + j) * ld + static_cast<int64_t>(head) * a.d;
#pragma unroll
    for (int t = 0; t < kDims; ++t) {
      const int c = lane + 32 * t;
      if (c < a.d) {
        row[a.hidden + c] = dk[r][t] * a.scale;
        row[2 * a.hidden + c] = dv[r][t];
      }
    }
  }
}

AttnArgs make_args(const DeviceLayout& l, const AttnWork& w, const float* qkv, int64_t hidden,
                   int heads, int half, const DropoutStream& ds) {
  AttnArgs a;
  a.l = l;
  a.seqs = w.seqs;
  a.qkv = qkv;
  a.hidden = hidden;
  a.heads = heads;
  a.d = static_cast<int>(hidden / heads);
  a.blocks_per_seq = (w.max_len + kBlockRows - 1) / kBlockRows;
  a.half = half;
  a.scale = static_cast<float>(1.0 / sqrt(static_cast<double>(a.d)));
  a.ds = ds;
  return a;
}

dim3 work_grid(const AttnWork& w, const AttnArgs& a) {
  return dim3(static_cast<unsigned>(int64_t{w.count} * a.blocks_per_seq),
              static_cast<unsigned>(a.heads));
}

}  // namespace

static_assert(kAttentionF32Tile == kBlockRows, "fmha.h states the fp32 kernels' tile");

cudaError_t attention_forward_work(const DeviceLayout& l, const AttnWork& w, const float* qkv,
                                   int64_t hidden, int heads, int half, const DropoutStream& ds,
                                   float* out, float* lse, cudaStream_t s) {
  if (w.count == 0 || w.max_len <= 0) return cudaSuccess;
  const AttnArgs a = make_args(l, w, qkv, hidden, heads, half, ds);
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, attention_forward_kernel)(a, out, lse);
  return launched();
}

cudaError_t attention_backward_work(const DeviceLayout& l, const AttnWork& w, const float* qkv,
                                    const float* out, const float* lse, const float* dout,
                                    int64_t hidden, int heads, int half, const DropoutStream& ds,
                                    float* dqkv, cudaStream_t s) {
  if (w.count == 0 || w.max_len <= 0) return cudaSuccess;
  const AttnArgs a = make_args(l, w, qkv, hidden, heads, half, ds);
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, attention_dq_kernel)(a, out, lse, dout, dqkv);
  const cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, attention_dkv_kernel)(a, out, lse, dout, dqkv);
  return launched();
}

// The whole layout as one work list on one stream, global attention (the interface of
// cuda_kernels.h).
cudaError_t attention_forward(const DeviceLayout& l, const float* qkv, int64_t hidden, int heads,
                              const DropoutStream& ds, float* out, float* lse, cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  cudaError_t e = fmha_zero_padding_rows(l, out, hidden, 4, s);
  if (e != cudaSuccess) return e;
  if ((e = fmha_zero_padding_rows(l, lse, heads, 4, s)) != cudaSuccess) return e;
  return attention_forward_work(l, AttnWork{nullptr, l.num_seqs, l.max_len}, qkv, hidden, heads,
                                l.max_len, ds, out, lse, s);
}

cudaError_t attention_backward(const DeviceLayout& l, const float* qkv, const float* out,
                               const float* lse, const float* dout, int64_t hidden, int heads,
                               const DropoutStream& ds, float* dqkv, cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  const cudaError_t e = fmha_zero_padding_rows(l, dqkv, 3 * hidden, 4, s);
  if (e != cudaSuccess) return e;
  return attention_backward_work(l, AttnWork{nullptr, l.num_seqs, l.max_len}, qkv, out, lse, dout,
                                 hidden, heads, l.max_len, ds, dqkv, s);
}

}  // namespace packbert::cuda
