// Variable-length multi-head attention on tensor cores: bf16 or fp16 q/k/v/out/dout/dqkv, fp32
// accumulation and softmax statistics, head dim 64, FlashAttention-2 tiling.
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
//   forward  query tile; Q fragments in registers; loops over K/V tiles of 64 keys in shared
//            memory: S = Q K^T, online softmax (running max and sum per row, in log2 units;
//            the sum is kept per thread and reduced once at the end), O += (P * dropout) V;
//            out = O / l, lse = (m + log2 l) ln 2 in fp32 [rows, heads] (the fp32 kernel's order).
//   dQ       query tile; Q and dO fragments in registers, D = dO . O per row, also stored
//            f32 [rows, heads] for the dK / dV kernel; per K/V tile: S = Q K^T, dP = dO V^T,
//            P = exp(S - lse), dS = P (f dP - D); dQ += dS K.
//   dK, dV   key tile; K and V fragments in registers; per Q/dO tile (64 queries in shared
//            memory with their lse and D): S^T = K Q^T, dP^T = V dO^T, dV += (P f)^T dO,
//            dK += dS^T Q.
// D is made by the dQ kernel, not by a pre-pass: each dQ block owns one query tile of one
// (sequence, head) and holds its dO rows in registers already, so every row's D is computed
// exactly once with no further read of dO and no extra launch; the dK / dV kernel runs after it
// on the same stream and reads D (64 floats per query tile) instead of recomputing it from O and
// dO for every key tile.
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
// Hopper (sm_90): not used yet, for want of a GPU to prove them on. The K / V (Q / dO) tile
// copies would become TMA bulk tensor loads (cp.async.bulk.tensor, one thread, an mbarrier per
// buffer) in load_tile_async's place, and the per-warp mma.sync products warpgroup-wide
// wgmma.mma_async with B read from shared memory directly (the ldsm_b_* loads go away), which
// needs 64-row slabs per warpgroup and a swizzled tile layout instead of the padded stride.
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
constexpr int kStride = kD + 8;     // shared row stride in elements (see the header)
constexpr int kDChunks = kD / 16;   // k16 chunks along d
constexpr int kDTiles = kD / 8;     // n8 tiles along d
constexpr int kRowTiles = kTile / 8;  // n8 tiles along a 64-row tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kTile == 64 && kD == 64, "the fragment bookkeeping assumes 64 x 64 tiles");
// Static shared memory per block (see Budget in the header): two buffers of two 16-bit tiles,
// and in the dK / dV kernel two buffers of the tile's lse and D.
constexpr int kTileBytes = kTile * kStride * 2;
constexpr int kSmemForward = 2 * 2 * kTileBytes;  // K, V
constexpr int kSmemDq = 2 * 2 * kTileBytes;       // K, V
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
  int blocks_per_seq;    // ceil(work max_len / kTile)
  float scale;           // 1 / sqrt(d)
  DropoutStream ds;
};

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
  const Philox4x32 w = dropout_bits4(ds, sample, static_cast<uint32_t>(head),
                                     static_cast<uint32_t>(odd ? qb : qa),
                                     static_cast<uint32_t>(kb + 4 * (t >> 1)));
  const uint32_t r0 = __shfl_xor_sync(kFullMask, odd ? w.v[0] : w.v[2], 1);
  const uint32_t r1 = __shfl_xor_sync(kFullMask, odd ? w.v[1] : w.v[3], 1);
  f[0] = dropout_factor(ds, odd ? r0 : w.v[0]);   // (qa, key 2t)
  f[1] = dropout_factor(ds, odd ? r1 : w.v[1]);   // (qa, key 2t + 1)
  f[2] = dropout_factor(ds, odd ? w.v[2] : r0);   // (qb, key 2t)
  f[3] = dropout_factor(ds, odd ? w.v[3] : r1);   // (qb, key 2t + 1)
}

// Dropout factors of one C tile whose rows are keys kbase + g (elements 0, 1) and kbase + g + 8
// (2, 3) and whose columns are queries qc, qc + 1 (kbase a multiple of 16). The 4 lanes of equal
// t and g / 4 need 4 calls: (query qc + (c & 1), the key group of row g (c < 2) or g + 8), and
// call c is exactly element c of the tile. Lane w = g % 4 computes call w; the words are then
// transposed among the 4 lanes (round k: lane w reads call (w + k) % 4, whose lane sends word
// (c - k) % 4 = w), so lane w ends with word w of each call: its key is group + w. All lanes
// must call.
__device__ __forceinline__ void dropout_key_rows(const DropoutStream& ds, uint64_t sample,
                                                 int head, int kbase, int qc, int lane,
                                                 float (&f)[4]) {
  const int g = lane >> 2, w = g & 3;
  const int group = kbase + (g & ~3) + ((w >> 1) ? 8 : 0);
  const Philox4x32 bits = dropout_bits4(ds, sample, static_cast<uint32_t>(head),
                                        static_cast<uint32_t>(qc + (w & 1)),
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

// ---- forward ----------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads) fmha_forward_kernel(FmhaArgs a, uint16_t* out,
                                                                float* lse) {
  __shared__ __align__(16) uint16_t Ks[2][kTile * kStride];  // double-buffered K / V tiles
  __shared__ __align__(16) uint16_t Vs[2][kTile * kStride];
  const BlockWork bw = block_work(a);
  if (bw.row0 >= bw.len) return;  // the whole block
  const int len = bw.len, head = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t ld = 3 * a.hidden;
  const uint16_t* qbase = a.qkv + bw.start * ld + static_cast<int64_t>(head) * kD;
  const uint16_t* kbase = qbase + a.hidden;
  const uint16_t* vbase = qbase + 2 * a.hidden;
  const bool drop = dropout_enabled(a.ds);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[bw.seq]) : 0;
  const int qa = bw.row0 + warp * 16 + g, qb = qa + 8;  // this thread's two query rows

  load_tile_async(kbase, ld, 0, len, Ks[0]);  // the first K / V tile loads with Q
  load_tile_async(vbase, ld, 0, len, Vs[0]);
  cp_async_commit();
  uint32_t qf[kDChunks][4];
  load_a_rows(qbase, ld, qa, len, t, qf);
  const float c = a.scale * kLog2e;  // scores in log2 units
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kDTiles][4];
  #pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int k0 = 0, buf = 0; k0 < len; k0 += kTile, buf ^= 1) {
    cp_async_wait_group<0>();  // this thread's copies of tile k0, the only ones in flight
    // Every thread's copies of tile k0 are visible, and every thread is done with the previous
    // tile, whose buffer the next tile's copies overwrite.
    if (!PB_MUTANT(Mutant::fmha_barrier)) __syncthreads();
    if (k0 + kTile < len) {  // the next tile loads while this one computes
      load_tile_async(kbase, ld, k0 + kTile, len, Ks[buf ^ 1]);
      load_tile_async(vbase, ld, k0 + kTile, len, Vs[buf ^ 1]);
      cp_async_commit();
    }
    const uint16_t* K = Ks[buf];
    const uint16_t* V = Vs[buf];
    float s[kRowTiles][4];
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    #pragma unroll
    for (int kc = 0; kc < kDChunks; kc += 2)
      #pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        uint32_t b[4];
        ldsm_b_cols(K, n * 8, kc, lane, b);
        Elem<T>::mma(s[n], qf[kc], b[0], b[1]);
        Elem<T>::mma(s[n], qf[kc + 1], b[2], b[3]);
      }
    // Scale and mask (keys past the end: -inf), then the running max of each row. Key k0 is
    // always valid, so the new max is finite and exp2(-inf - max) = 0 masks.
    float mx[2] = {-INFINITY, -INFINITY};
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * t + (e & 1);
        s[n][e] = key < len ? s[n][e] * c : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float alpha[2];
    #pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float mnew = fmaxf(m[i], quad_max(mx[i]));
      alpha[i] = exp2f(m[i] - mnew);  // 0 on the first tile (m = -inf)
      m[i] = mnew;
    }
    float rs[2] = {0.f, 0.f};
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] - m[e >> 1]);
        s[n][e] = p;
        rs[e >> 1] += p;  // the softmax sum: before dropout, as the fp32 kernel and the CPU
      }
    #pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + rs[i];  // per-thread partial sums
    #pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    if (drop) {
      #pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        float f[4];
        dropout_query_rows(a.ds, sample, head, qa, qb, k0 + n * 8, t, f);
        #pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= f[e];
      }
    }
    // O += P V: P's C tiles are the A fragments; V's k (keys) runs along the tile's rows.
    #pragma unroll
    for (int kc = 0; kc < kRowTiles / 2; ++kc) {
      uint32_t pa[4];
      c_to_a<T>(s, kc, pa);
      #pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        uint32_t b[4];
        ldsm_b_rows(V, kc, n * 8, lane, b);
        Elem<T>::mma(o[n], pa, b[0], b[1]);
        Elem<T>::mma(o[n + 1], pa, b[2], b[3]);
      }
    }
  }
  #pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = quad_sum(l[i]);
  #pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int qi = i ? qb : qa;
    if (qi >= len) continue;
    const int64_t row = bw.start + qi;
    const float inv = 1.0f / l[i];
    uint16_t* orow = out + row * a.hidden + static_cast<int64_t>(head) * kD;
    #pragma unroll
    for (int n = 0; n < kDTiles; ++n)
      *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * t) =
          Elem<T>::pack(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    if (t == 0) lse[row * a.heads + head] = m[i] * kLn2 + logf(l[i]);
  }
}

// D of rows qa, qb: dO . O over the d columns of this thread's A fragments of dO, summed over
// the 4 lanes of the row (which together hold all 64 columns).
template <typename T>
__device__ __forceinline__ void rows_delta(const uint16_t* obase, int64_t ld, int qa, int len,
                                           int t, const uint32_t (&dof)[kDChunks][4],
                                           float (&d)[2]) {
  float part[2] = {0.f, 0.f};
  #pragma unroll
  for (int kc = 0; kc < kDChunks; ++kc)
    #pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = (r & 1) ? qa + 8 : qa;
      const int col = kc * 16 + ((r & 2) ? 8 : 0) + 2 * t;
      const uint32_t ow = gword(obase, ld, i, len, col);
      const uint32_t dw = dof[kc][r];
      part[r & 1] += Elem<T>::to_float(static_cast<uint16_t>(ow & 0xffffu)) *
                         Elem<T>::to_float(static_cast<uint16_t>(dw & 0xffffu)) +
                     Elem<T>::to_float(static_cast<uint16_t>(ow >> 16)) *
                         Elem<T>::to_float(static_cast<uint16_t>(dw >> 16));
    }
  d[0] = quad_sum(part[0]);
  d[1] = quad_sum(part[1]);
}

// ---- backward: dQ -----------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads) fmha_dq_kernel(FmhaArgs a, uint16_t* dqkv) {
  __shared__ __align__(16) uint16_t Ks[2][kTile * kStride];  // double-buffered K / V tiles
  __shared__ __align__(16) uint16_t Vs[2][kTile * kStride];
  const BlockWork bw = block_work(a);
  if (bw.row0 >= bw.len) return;
  const int len = bw.len, head = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t ld = 3 * a.hidden;
  const int64_t hoff = static_cast<int64_t>(head) * kD;
  const uint16_t* qbase = a.qkv + bw.start * ld + hoff;
  const uint16_t* kbase = qbase + a.hidden;
  const uint16_t* vbase = qbase + 2 * a.hidden;
  const uint16_t* obase = a.out + bw.start * a.hidden + hoff;
  const uint16_t* dobase = a.dout + bw.start * a.hidden + hoff;
  const bool drop = dropout_enabled(a.ds);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[bw.seq]) : 0;
  const int qa = bw.row0 + warp * 16 + g, qb = qa + 8;

  load_tile_async(kbase, ld, 0, len, Ks[0]);
  load_tile_async(vbase, ld, 0, len, Vs[0]);
  cp_async_commit();
  uint32_t qf[kDChunks][4], dof[kDChunks][4];
  load_a_rows(qbase, ld, qa, len, t, qf);
  load_a_rows(dobase, a.hidden, qa, len, t, dof);
  float delta[2];
  rows_delta<T>(obase, a.hidden, qa, len, t, dof, delta);
  float lse2[2];
  #pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int qi = i ? qb : qa;
    lse2[i] = qi < len ? a.lse[(bw.start + qi) * a.heads + head] * kLog2e : 0.f;
    if (qi < len && t == 0) a.delta[(bw.start + qi) * a.heads + head] = delta[i];
  }
  const float c = a.scale * kLog2e;
  float dq[kDTiles][4];
  #pragma unroll
  for (int n = 0; n < kDTiles; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  for (int k0 = 0, buf = 0; k0 < len; k0 += kTile, buf ^= 1) {
    cp_async_wait_group<0>();
    __syncthreads();  // as in the forward
    if (k0 + kTile < len) {
      load_tile_async(kbase, ld, k0 + kTile, len, Ks[buf ^ 1]);
      load_tile_async(vbase, ld, k0 + kTile, len, Vs[buf ^ 1]);
      cp_async_commit();
    }
    const uint16_t* K = Ks[buf];
    const uint16_t* V = Vs[buf];
    float s[kRowTiles][4], dp[kRowTiles][4];
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
      #pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
    #pragma unroll
    for (int kc = 0; kc < kDChunks; kc += 2)
      #pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        uint32_t b[4];
        ldsm_b_cols(K, n * 8, kc, lane, b);
        Elem<T>::mma(s[n], qf[kc], b[0], b[1]);
        Elem<T>::mma(s[n], qf[kc + 1], b[2], b[3]);
        ldsm_b_cols(V, n * 8, kc, lane, b);
        Elem<T>::mma(dp[n], dof[kc], b[0], b[1]);
        Elem<T>::mma(dp[n], dof[kc + 1], b[2], b[3]);
      }
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n) {
      float f[4] = {1.f, 1.f, 1.f, 1.f};
      if (drop) dropout_query_rows(a.ds, sample, head, qa, qb, k0 + n * 8, t, f);
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * t + (e & 1);
        const float p = key < len ? exp2f(s[n][e] * c - lse2[e >> 1]) : 0.f;
        s[n][e] = p * (f[e] * dp[n][e] - delta[e >> 1]);  // dS
      }
    }
    // dQ += dS K: K's k (keys) runs along the tile's rows.
    #pragma unroll
    for (int kc = 0; kc < kRowTiles / 2; ++kc) {
      uint32_t da[4];
      c_to_a<T>(s, kc, da);
      #pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        uint32_t b[4];
        ldsm_b_rows(K, kc, n * 8, lane, b);
        Elem<T>::mma(dq[n], da, b[0], b[1]);
        Elem<T>::mma(dq[n + 1], da, b[2], b[3]);
      }
    }
  }
  #pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int qi = i ? qb : qa;
    if (qi >= len) continue;
    uint16_t* drow = dqkv + (bw.start + qi) * ld + hoff;
    #pragma unroll
    for (int n = 0; n < kDTiles; ++n)
      *reinterpret_cast<uint32_t*>(drow + n * 8 + 2 * t) =
          Elem<T>::pack(dq[n][2 * i] * a.scale, dq[n][2 * i + 1] * a.scale);
  }
}

// ---- backward: dK, dV -------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads) fmha_dkv_kernel(FmhaArgs a, uint16_t* dqkv) {
  __shared__ __align__(16) uint16_t Qs[2][kTile * kStride];  // double-buffered Q / dO tiles
  __shared__ __align__(16) uint16_t dOs[2][kTile * kStride];
  __shared__ float lse_s[2][kTile];  // lse of the tile's queries, log2 units (0 past the end)
  __shared__ float delta_s[2][kTile];
  const BlockWork bw = block_work(a);
  if (bw.row0 >= bw.len) return;
  const int len = bw.len, head = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t ld = 3 * a.hidden;
  const int64_t hoff = static_cast<int64_t>(head) * kD;
  const uint16_t* qbase = a.qkv + bw.start * ld + hoff;
  const uint16_t* kbase = qbase + a.hidden;
  const uint16_t* vbase = qbase + 2 * a.hidden;
  const uint16_t* dobase = a.dout + bw.start * a.hidden + hoff;
  const bool drop = dropout_enabled(a.ds);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[bw.seq]) : 0;
  const int kslab = bw.row0 + warp * 16;  // this warp's 16 keys
  const int ka = kslab + g, kb = ka + 8;  // this thread's two key rows

  // lse and D of the query tile at q0 into buffer b (D from the dQ kernel, which ran before on
  // this stream); plain loads, visible after the barrier that precedes the tile's use.
  auto load_rows = [&](int q0, int b) {
    if (threadIdx.x < kTile) {
      const int qi = q0 + threadIdx.x;
      const int64_t at = (bw.start + qi) * a.heads + head;
      lse_s[b][threadIdx.x] = qi < len ? a.lse[at] * kLog2e : 0.f;
      delta_s[b][threadIdx.x] = qi < len ? a.delta[at] : 0.f;
    }
  };
  load_tile_async(qbase, ld, 0, len, Qs[0]);
  load_tile_async(dobase, a.hidden, 0, len, dOs[0]);
  cp_async_commit();
  load_rows(0, 0);
  uint32_t kf[kDChunks][4], vf[kDChunks][4];
  load_a_rows(kbase, ld, ka, len, t, kf);
  load_a_rows(vbase, ld, ka, len, t, vf);
  const float c = a.scale * kLog2e;
  float dk[kDTiles][4], dv[kDTiles][4];
  #pragma unroll
  for (int n = 0; n < kDTiles; ++n)
    #pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  for (int q0 = 0, buf = 0; q0 < len; q0 += kTile, buf ^= 1) {
    cp_async_wait_group<0>();
    __syncthreads();  // as in the forward
    if (q0 + kTile < len) {
      load_tile_async(qbase, ld, q0 + kTile, len, Qs[buf ^ 1]);
      load_tile_async(dobase, a.hidden, q0 + kTile, len, dOs[buf ^ 1]);
      cp_async_commit();
      load_rows(q0 + kTile, buf ^ 1);
    }
    const uint16_t* Q = Qs[buf];
    const uint16_t* dO = dOs[buf];
    const float* lse_t = lse_s[buf];
    const float* delta_t = delta_s[buf];
    float st[kRowTiles][4], dpt[kRowTiles][4];  // S^T and dP^T: rows keys, columns queries
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
      #pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
    #pragma unroll
    for (int kc = 0; kc < kDChunks; ++kc)
      #pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        uint32_t b[2];
        ldsm_b_cols(Q, n * 8, kc, lane, b);
        Elem<T>::mma(st[n], kf[kc], b[0], b[1]);
        ldsm_b_cols(dO, n * 8, kc, lane, b);
        Elem<T>::mma(dpt[n], vf[kc], b[0], b[1]);
      }
    #pragma unroll
    for (int n = 0; n < kRowTiles; ++n) {
      float f[4] = {1.f, 1.f, 1.f, 1.f};
      if (drop) dropout_key_rows(a.ds, sample, head, kslab, q0 + n * 8 + 2 * t, lane, f);
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qt = n * 8 + 2 * t + (e & 1);
        const float p = q0 + qt < len ? exp2f(st[n][e] * c - lse_t[qt]) : 0.f;
        st[n][e] = p * f[e];                                 // (P f)^T
        dpt[n][e] = p * (f[e] * dpt[n][e] - delta_t[qt]);  // dS^T
      }
    }
    // dV += (P f)^T dO, dK += dS^T Q: the queries (k) run along the tiles' rows.
    #pragma unroll
    for (int kc = 0; kc < kRowTiles / 2; ++kc) {
      uint32_t pa[4], da[4];
      c_to_a<T>(st, kc, pa);
      c_to_a<T>(dpt, kc, da);
      #pragma unroll
      for (int n = 0; n < kDTiles; n += 2) {
        uint32_t b[4];
        ldsm_b_rows(dO, kc, n * 8, lane, b);
        Elem<T>::mma(dv[n], pa, b[0], b[1]);
        Elem<T>::mma(dv[n + 1], pa, b[2], b[3]);
        ldsm_b_rows(Q, kc, n * 8, lane, b);
        Elem<T>::mma(dk[n], da, b[0], b[1]);
        Elem<T>::mma(dk[n + 1], da, b[2], b[3]);
      }
    }
  }
  #pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int ki = i ? kb : ka;
    if (ki >= len) continue;
    uint16_t* drow = dqkv + (bw.start + ki) * ld + hoff;
    #pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      *reinterpret_cast<uint32_t*>(drow + a.hidden + n * 8 + 2 * t) =
          Elem<T>::pack(dk[n][2 * i] * a.scale, dk[n][2 * i + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(drow + 2 * a.hidden + n * 8 + 2 * t) =
          Elem<T>::pack(dv[n][2 * i], dv[n][2 * i + 1]);
    }
  }
}

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

FmhaArgs make_args(const DeviceLayout& l, const AttnWork& w, const void* qkv, int64_t hidden,
                   int heads, const DropoutStream& ds) {
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
  a.scale = static_cast<float>(1.0 / sqrt(static_cast<double>(kD)));
  a.ds = ds;
  return a;
}

dim3 work_grid(const AttnWork& w, const FmhaArgs& a) {
  return dim3(static_cast<unsigned>(int64_t{w.count} * a.blocks_per_seq),
              static_cast<unsigned>(a.heads));
}

template <typename T>
cudaError_t forward_t(const FmhaArgs& a, const AttnWork& w, void* out, float* lse,
                      cudaStream_t s) {
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, fmha_forward_kernel<T>)(
      a, static_cast<uint16_t*>(out), lse);
  return launched();
}

template <typename T>
cudaError_t backward_t(const FmhaArgs& a, const AttnWork& w, void* dqkv, cudaStream_t s) {
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, fmha_dq_kernel<T>)(a, static_cast<uint16_t*>(dqkv));
  const cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, fmha_dkv_kernel<T>)(a, static_cast<uint16_t*>(dqkv));
  return launched();
}

}  // namespace

std::vector<FmhaKernelBudget> fmha_kernel_budget() {
  // Live registers per thread: fp32 accumulators of 16 x 64 (32) per output or score tile, and
  // 16 for the A fragments of a 16 x 64 16-bit slab.
  return {{"forward", kThreads, kSmemForward, 32 + 32 + 16 + 4},      // O, S; Q; m, l
          {"dq", kThreads, kSmemDq, 32 + 32 + 32 + 16 + 16 + 4},      // dQ, S, dP; Q, dO; D, lse
          {"dkv", kThreads, kSmemDkv, 32 + 32 + 32 + 32 + 16 + 16}};  // dK, dV, S^T, dP^T; K, V
}

cudaError_t fmha_zero_padding_rows(const DeviceLayout& l, void* x, int64_t width, int elem_bytes,
                                   cudaStream_t s) {
  if (l.rows == 0 || width == 0) return cudaSuccess;
  const unsigned grid = grid_for(l.rows * 32, 256);  // a warp per row
  if (elem_bytes == 2)
    PB_LAUNCH(grid, 256, 0, s, zero_padding_rows_kernel<uint16_t>)(
        l.token_seq, l.rows, width, static_cast<uint16_t*>(x));
  else if (elem_bytes == 4)
    PB_LAUNCH(grid, 256, 0, s, zero_padding_rows_kernel<uint32_t>)(
        l.token_seq, l.rows, width, static_cast<uint32_t*>(x));
  else
    return cudaErrorInvalidValue;
  return launched();
}

cudaError_t fmha_forward_work(FmhaType t, const DeviceLayout& l, const AttnWork& w,
                              const void* qkv, int64_t hidden, int heads,
                              const DropoutStream& ds, void* out, float* lse, cudaStream_t s) {
  if (w.count == 0 || w.max_len <= 0) return cudaSuccess;
  const FmhaArgs a = make_args(l, w, qkv, hidden, heads, ds);
  return t == FmhaType::bf16 ? forward_t<__nv_bfloat16>(a, w, out, lse, s)
                             : forward_t<__half>(a, w, out, lse, s);
}

cudaError_t fmha_backward_work(FmhaType t, const DeviceLayout& l, const AttnWork& w,
                               const void* qkv, const void* out, const float* lse,
                               const void* dout, int64_t hidden, int heads,
                               const DropoutStream& ds, float* delta, void* dqkv,
                               cudaStream_t s) {
  if (w.count == 0 || w.max_len <= 0) return cudaSuccess;
  FmhaArgs a = make_args(l, w, qkv, hidden, heads, ds);
  a.out = static_cast<const uint16_t*>(out);
  a.dout = static_cast<const uint16_t*>(dout);
  a.lse = lse;
  a.delta = delta;
  return t == FmhaType::bf16 ? backward_t<__nv_bfloat16>(a, w, dqkv, s)
                             : backward_t<__half>(a, w, dqkv, s);
}

}  // namespace packbert::cuda
