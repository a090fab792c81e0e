// Variable-length multi-head attention on tensor cores: bf16 or fp16 q/k/v/out/dout/dqkv, fp32
// accumulation and softmax statistics, head dim 64, FlashAttention-2 tiling. The kernels are in
// fmha_mma_forward.cu and fmha_mma_backward.cu, each with its launch; this header is what they
// share: the tiles and the kernels' arguments, the element types, the fragment loads, the
// dropout words' exchange among lanes and the quad reductions.
//
// Products: mma.sync.aligned.m16n8k16 (row.col, f32 accumulators; device_seams.cuh). The layout
// facts the code relies on are the PTX ISA's fragment layouts of m16n8k16 for 16-bit types and
// of ldmatrix. With g = lane / 4 and t = lane % 4:
//   A (16 x 16, row): a0 = (row g,   k 2t, 2t+1)   a1 = (row g+8, k 2t, 2t+1)
//                     a2 = (row g,   k 2t+8, +9)   a3 = (row g+8, k 2t+8, +9)
//   B (16 x 8, col):  b0 = (k 2t, 2t+1; col g)      b1 = (k 2t+8, 2t+9; col g)
//   C (16 x 8, f32):  c0, c1 = (row g, cols 2t, 2t+1)   c2, c3 = (row g+8, cols 2t, 2t+1)
// (the lower 16 bits of a register hold the lower k). So two C tiles side by side (16 x 16) are
// exactly the A fragment of the next product: P never leaves registers.
//
// Shared memory tiles are row-major [64 rows][72] (stride 72 = 36 words: the 8 rows of an
// ldmatrix phase, 16 bytes each, land in distinct banks). B operands come from them by
// ldmatrix.x4 (4 registers, two n8 tiles or two k16 chunks, per instruction): plain where k runs
// along the tile's columns (K in Q K^T: an 8 x 8 block's row g, columns 2t, 2t+1 is b0), .trans
// where k runs along the tile's rows (V in P V, K in dS K, Q and dO in the dK / dV products: the
// transposed block gives column g, rows 2t, 2t+1), so no transposed copy is kept. The A
// fragments of Q (K, V; dO) are read once per block from global memory into registers.
//
// Tiles are double-buffered: the next K / V tile (Q / dO in dK / dV) is copied by cp.async while
// the current one computes; one barrier per tile both publishes the landed tile and retires the
// buffer the next copies overwrite.
//
// Kernels (block = 4 warps, each warp 16 rows of a 64-row tile of one (sequence, head)):
//   forward  (fmha_mma_forward.cu) query tile; Q fragments in registers; loops over K/V tiles
//            of 64 keys in shared memory: S = Q K^T, online softmax (running max and sum per
//            row, in log2 units; the sum is kept per thread and reduced once at the end),
//            O += (P * dropout) V; out = O / l, lse = (m + log2 l) ln 2 in fp32 [rows, heads]
//            (the fp32 kernel's order).
//   dQ       (fmha_mma_backward.cu) query tile; Q and dO fragments in registers, D = dO . O per
//            row, also stored f32 [rows, heads] for the dK / dV kernel; per K/V tile:
//            S = Q K^T, dP = dO V^T, P = exp(S - lse), dS = P (f dP - D); dQ += dS K.
//   dK, dV   (fmha_mma_backward.cu) key tile; K and V fragments in registers; per Q/dO tile
//            (64 queries in shared memory with their lse and D): S^T = K Q^T, dP^T = V dO^T,
//            dV += (P f)^T dO, dK += dS^T Q.
// Local windows (half-width h = FmhaArgs::half, kernels/ops/attention.h): a block walks only the
// tiles from the one holding max(0, row0 - h) to the one holding row0 + 63 + h (clipped to the
// sequence; the window is symmetric, so the dK / dV kernel's query tiles are found the same
// way), and masks the pairs with |i - j| > h only in an edge tile (one not wholly inside every
// row's window). A row of an edge tile may have none of its keys there yet (its running max
// still -inf): the forward then shifts by 0 instead of the max, so its probabilities and
// rescale are 0, not NaN. Global attention (h = max_len) walks every tile, and its masked
// scores are the same -inf or the same products, so it keeps its bits.
// No atomics; every sum runs in a fixed order (tiles in order, fixed shuffle trees), so results
// are the same from run to run. P and dS are rounded to the 16-bit type before their products,
// as FlashAttention does.
//
// Dropout: the mask of (query i, key j) is word j % 4 of dropout_bits4(sample, head, i, j),
// exactly the fp32 kernel's and the CPU's (common/philox.h). One Philox call gives 4 keys of
// one query; the lanes that share a call's words exchange them by shuffles (row-major tiles:
// lane pairs t, t^1; key-major tiles: the 4 lanes of equal t and g / 4), so every word is
// computed once per tile.
//
// Lengths: any (up to the dropout key's 2^20 positions); rows past a sequence's end are loaded
// as zeros, masked, and never written. Tuned for <= 512 (BERT).
//
// Budget (fmha_kernel_budget; scripts/kernel_report.py prints the compiled registers, spills
// and blocks per SM for sm_80 and sm_90). A warp owns an m16 slab, so a thread keeps 32 fp32
// registers per 16 x 64 accumulator and 16 per 16 x 64 A fragment live across a tile: forward
// 84 (O, S, Q), dQ 132 (dQ, S, dP, Q, dO), dK / dV 160 (dK, dV, S^T, dP^T, K, V). Compiled
// (CUDA 13): forward 134, dQ 176, dK / dV 242 (sm_80) and 255 (sm_90) registers, no spills;
// that is 3, 2 and 2 blocks of 4 warps per SM. The dK / dV kernel sits at the 255 cap (its .x4
// B loads spilled, hence .x2 there), and capping the forward at 128 registers for a fourth
// block spills. 64-row tiles of 4 warps keep that; 128-row tiles would need 8 warps (the same
// registers per thread, half the blocks per SM) or 32 rows per warp (twice the accumulators:
// spills), and would pad BERT's short sequences to 128. Shared memory, double-buffered, is
// 36 KiB per block (dK / dV 37 KiB): within the 48 KiB of static shared memory, and 4 (sm_80,
// 164 KiB) or 6 (sm_90, 228 KiB) blocks per SM, so registers, not shared memory, bound the
// blocks per SM.
//
// Hopper (sm_90) runs these same kernels: cp.async copies and mma.sync products, no TMA and no
// wgmma (what those would change: docs/performance.md, GPU).
//
// Included by the two kernel files only. Its helpers have internal linkage, as in a .cu file:
// each of the two compiles its own copy (the CUDA sources are not linked as device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fmha.h"

namespace packbert::cuda {
namespace {

constexpr int kD = kFmhaHeadDim;    // 64
constexpr int kTile = kFmhaTile;    // rows of a tile (queries or keys)
constexpr int kWarps = kTile / 16;  // one m16 slab per warp
constexpr int kThreads = kWarps * 32;
constexpr int kStride = kD + 8;       // shared row stride in elements (see above)
constexpr int kDChunks = kD / 16;     // k16 chunks along d
constexpr int kDTiles = kD / 8;       // n8 tiles along d
constexpr int kRowTiles = kTile / 8;  // n8 tiles along a 64-row tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kTile == 64 && kD == 64, "the fragment bookkeeping assumes 64 x 64 tiles");
// Static shared memory per block (see Budget above): two buffers of two 16-bit tiles,
// and in the dK / dV kernel two buffers of the tile's lse and D.
constexpr int kTileBytes = kTile * kStride * 2;
constexpr int kSmemForward = 2 * 2 * kTileBytes;                  // K, V
constexpr int kSmemDq = 2 * 2 * kTileBytes;                       // K, V
constexpr int kSmemDkv = 2 * 2 * kTileBytes + 2 * 2 * kTile * 4;  // Q, dO; lse, D
static_assert(kSmemDkv <= 48 * 1024 && kSmemForward <= 48 * 1024,
              "static shared memory is limited to 48 KiB (more needs dynamic shared memory)");

// ---- the element type ----------------------------------------------------------------------
template <typename T>
struct Elem;

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the lower 16 bits
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
  }
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k16_bf16(c, a, b0, b1);
  }
};

template <>
struct Elem<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, 4);
    return r;
  }
  static __device__ __forceinline__ float to_float(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    mma_m16n8k16_f16(c, a, b0, b1);
  }
};

struct FmhaArgs {
  DeviceLayout l;
  const int32_t* seqs;   // the work list (fmha.h)
  const uint16_t* qkv;   // [rows, 3 hidden]
  const uint16_t* out;   // [rows, hidden] (backward)
  const uint16_t* dout;  // [rows, hidden] (backward)
  const float* lse;      // [rows, heads] (backward)
  float* delta;          // [rows, heads] (backward): D = dO . O, written by dQ, read by dK / dV
  int64_t hidden;
  int heads;
  int blocks_per_seq;  // ceil(work max_len / kTile)
  int half;            // the window's half-width (checks::attention_half_window)
  float scale;         // 1 / sqrt(d)
  DropoutStream ds;
};

// The first tile (a multiple of kTile) and the end of the keys that rows [row0, row0 + kTile)
// attend, or of the queries that attend them (the window is symmetric), in a sequence of len.
__device__ __forceinline__ int window_begin(int row0, int half) {
  const int lo = row0 > half ? row0 - half : 0;
  return lo - lo % kTile;
}
__device__ __forceinline__ int window_end(int row0, int half, int len) {
  const int64_t end = int64_t{row0} + kTile + half;
  return end < len ? static_cast<int>(end) : len;
}
// Whether some pair of the rows [row0, row0 + kTile) and the tile [t0, t0 + kTile) lies outside
// the window: the tile needs the window's mask.
__device__ __forceinline__ bool edge_tile(int row0, int t0, int half) {
  return t0 + (kTile - 1) - row0 > half || row0 + (kTile - 1) - t0 > half;
}
// Whether the pair (i, j) of one sequence lies within the window.
__device__ __forceinline__ bool in_window(int i, int j, int half) {
  return j - i <= half && i - j <= half;
}

// The (sequence, first row of the tile) of this block.
struct BlockWork {
  int seq, row0, len;
  int64_t start;
};

__device__ __forceinline__ BlockWork block_work(const FmhaArgs& a) {
  const int item = blockIdx.x / a.blocks_per_seq;
  BlockWork w;
  w.seq = a.seqs ? a.seqs[item] : item;
  w.row0 = (blockIdx.x - item * a.blocks_per_seq) * kTile;
  w.len = a.l.seq_len[w.seq];
  w.start = a.l.seq_start[w.seq];
  return w;
}

// Starts the copies of rows [first, first + kTile) of a [len, >= kD] global matrix (row stride
// ld elements) into a shared tile, 16 bytes per cp.async (device_seams.cuh); rows at or past len
// are zero-filled (nothing is read past the sequence). The caller commits the group.
__device__ __forceinline__ void load_tile_async(const uint16_t* base, int64_t ld, int first,
                                                int len, uint16_t* dst) {
  for (int idx = threadIdx.x; idx < kTile * (kD / 8); idx += kThreads) {
    const int r = idx / (kD / 8), c = (idx % (kD / 8)) * 8, i = first + r;
    const bool in = i < len;
    cp_async_16(dst + r * kStride + c, base + (in ? static_cast<int64_t>(i) * ld + c : 0),
                in ? 16 : 0);
  }
}

// B fragments from a shared tile by ldmatrix (device_seams.cuh), lane = the lane.
// Products whose k runs along the tile's columns (K in Q K^T and dQ's V in dO V^T; Q and dO in
// the dK / dV kernel's K Q^T, V dO^T): the n8 tile of rows n0 .. n0 + 7 and, N = 4 (.x4), the
// k16 chunks kc and kc + 1 (columns 16 kc .. 16 kc + 31): b[0], b[1] of chunk kc, b[2], b[3] of
// chunk kc + 1; N = 2 (.x2), chunk kc alone (the dK / dV kernel, whose 160 live fragment
// registers leave no room for the .x4's two more: it spilled).
template <int N>
__device__ __forceinline__ void ldsm_b_cols(const uint16_t* tile, int n0, int kc, int lane,
                                            uint32_t (&b)[N]) {
  ldmatrix_m8n8<N, false>(
      b, tile + (n0 + (lane & 7)) * kStride + kc * 16 + ((lane >> 3) & (N - 1)) * 8);
}
// Products whose k runs along the tile's rows (V in P V, K in dS K, dO and Q in dV, dK): the
// k16 chunk kc (rows 16 kc .. 16 kc + 15) and the n8 tiles of columns c0 and c0 + 8: b[0], b[1]
// of the first, b[2], b[3] of the second (.trans: no transposed copy of the tile is kept).
__device__ __forceinline__ void ldsm_b_rows(const uint16_t* tile, int kc, int c0, int lane,
                                            uint32_t (&b)[4]) {
  ldmatrix_m8n8<4, true>(b, tile + (kc * 16 + (lane & 15)) * kStride + c0 + (lane >> 4) * 8);
  if (PB_MUTANT(Mutant::fmha_b_halves))
    for (uint32_t& r : b) r = (r >> 16) | (r << 16);
}
// Two adjacent elements of row i of a global matrix (0 past the sequence).
__device__ __forceinline__ uint32_t gword(const uint16_t* base, int64_t ld, int i, int len,
                                          int col) {
  return i < len ? *reinterpret_cast<const uint32_t*>(base + static_cast<int64_t>(i) * ld + col)
                 : 0u;
}

// A fragments (all kDChunks chunks along d) of rows i0 = slab + g and i0 + 8 of a global matrix.
__device__ __forceinline__ void load_a_rows(const uint16_t* base, int64_t ld, int i0, int len,
                                            int t, uint32_t (&f)[kDChunks][4]) {
#pragma unroll
  for (int kc = 0; kc < kDChunks; ++kc) {
    f[kc][0] = gword(base, ld, i0, len, kc * 16 + 2 * t);
    f[kc][1] = gword(base, ld, i0 + 8, len, kc * 16 + 2 * t);
    f[kc][2] = gword(base, ld, i0, len, kc * 16 + 8 + 2 * t);
    f[kc][3] = gword(base, ld, i0 + 8, len, kc * 16 + 8 + 2 * t);
    if (PB_MUTANT(Mutant::fmha_a1_a2)) {
      const uint32_t a1 = f[kc][1];
      f[kc][1] = f[kc][2];
      f[kc][2] = a1;
    }
  }
}

// The A fragment of k16 chunk kc of a 16 x 64 score-shaped accumulator (C tiles 2kc, 2kc+1).
template <typename T>
__device__ __forceinline__ void c_to_a(const float (&c)[kRowTiles][4], int kc, uint32_t (&a)[4]) {
  a[0] = Elem<T>::pack(c[2 * kc][0], c[2 * kc][1]);
  a[1] = Elem<T>::pack(c[2 * kc][2], c[2 * kc][3]);
  a[2] = Elem<T>::pack(c[2 * kc + 1][0], c[2 * kc + 1][1]);
  a[3] = Elem<T>::pack(c[2 * kc + 1][2], c[2 * kc + 1][3]);
}

__device__ __forceinline__ uint32_t word_of(const Philox4x32& b, int i) {
  return i == 0 ? b.v[0] : i == 1 ? b.v[1] : i == 2 ? b.v[2] : b.v[3];
}

// Dropout factors of one C tile whose rows are queries qa (elements 0, 1) and qb (2, 3) and whose
// columns are keys kb + 2t, kb + 2t + 1 (kb a multiple of 8). Keys 2t, 2t+1 of lanes t and t^1
// share the Philox call of key group kb + 4 (t / 2): the even lane computes row qa's call, the
// odd lane row qb's, and each passes the partner the two words it needs. All lanes must call.
__device__ __forceinline__ void dropout_query_rows(const DropoutStream& ds, uint64_t sample,
                                                   int head, int qa, int qb, int kb, int t,
                                                   float (&f)[4]) {
  const bool odd = t & 1;
  const Philox4x32 w =
      dropout_bits4(ds, sample, static_cast<uint32_t>(head), static_cast<uint32_t>(odd ? qb : qa),
                    static_cast<uint32_t>(kb + 4 * (t >> 1)));
  const uint32_t r0 = __shfl_xor_sync(kFullMask, odd ? w.v[0] : w.v[2], 1);
  const uint32_t r1 = __shfl_xor_sync(kFullMask, odd ? w.v[1] : w.v[3], 1);
  f[0] = dropout_factor(ds, odd ? r0 : w.v[0]);  // (qa, key 2t)
  f[1] = dropout_factor(ds, odd ? r1 : w.v[1]);  // (qa, key 2t + 1)
  f[2] = dropout_factor(ds, odd ? w.v[2] : r0);  // (qb, key 2t)
  f[3] = dropout_factor(ds, odd ? w.v[3] : r1);  // (qb, key 2t + 1)
}

// Dropout factors of one C tile whose rows are keys kbase + g (elements 0, 1) and kbase + g + 8
// (2, 3) and whose columns are queries qc, qc + 1 (kbase a multiple of 16). The 4 lanes of equal
// t and g / 4 need 4 calls: (query qc + (c & 1), the key group of row g (c < 2) or g + 8), and
// call c is exactly element c of the tile. Lane w = g % 4 computes call w; the words are then
// transposed among the 4 lanes (round k: lane w reads call (w + k) % 4, whose lane sends word
// (c - k) % 4 = w), so lane w ends with word w of each call: its key is group + w. All lanes
// must call.
__device__ __forceinline__ void dropout_key_rows(const DropoutStream& ds, uint64_t sample, int head,
                                                 int kbase, int qc, int lane, float (&f)[4]) {
  const int g = lane >> 2, w = g & 3;
  const int group = kbase + (g & ~3) + ((w >> 1) ? 8 : 0);
  const Philox4x32 bits =
      dropout_bits4(ds, sample, static_cast<uint32_t>(head), static_cast<uint32_t>(qc + (w & 1)),
                    static_cast<uint32_t>(group));
  uint32_t got[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int c = (w + k) & 3;
    const uint32_t v = __shfl_sync(kFullMask, word_of(bits, (w - k) & 3), (lane & ~12) | (c << 2));
    got[0] = c == 0 ? v : got[0];
    got[1] = c == 1 ? v : got[1];
    got[2] = c == 2 ? v : got[2];
    got[3] = c == 3 ? v : got[3];
  }
#pragma unroll
  for (int e = 0; e < 4; ++e)
    f[e] = dropout_factor(ds, got[PB_MUTANT(Mutant::fmha_dkv_dropout_words) ? (e + 1) & 3 : e]);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// The arguments of a work list's launch; the backward sets out, dout, lse and delta.
inline FmhaArgs make_args(const DeviceLayout& l, const AttnWork& w, const void* qkv, int64_t hidden,
                          int heads, int half, const DropoutStream& ds) {
  FmhaArgs a;
  a.l = l;
  a.seqs = w.seqs;
  a.qkv = static_cast<const uint16_t*>(qkv);
  a.out = nullptr;
  a.dout = nullptr;
  a.lse = nullptr;
  a.delta = nullptr;
  a.hidden = hidden;
  a.heads = heads;
  a.blocks_per_seq = (w.max_len + kTile - 1) / kTile;
  a.half = half;
  a.scale = static_cast<float>(1.0 / sqrt(static_cast<double>(kD)));
  a.ds = ds;
  return a;
}

// Blocks: a tile of rows of each listed sequence (x), heads (y).
inline dim3 work_grid(const AttnWork& w, const FmhaArgs& a) {
  return dim3(static_cast<unsigned>(int64_t{w.count} * a.blocks_per_seq),
              static_cast<unsigned>(a.heads));
}

}  // namespace
}  // namespace packbert::cuda
