// The forward of the tensor-core attention (fmha.h): one block per query tile of one
// (sequence, head), K / V tiles streamed through double-buffered shared memory with an online
// softmax. The fragment layouts, tiles, dropout words and the budget of registers and shared
// memory are in fmha_mma_common.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/fmha.h"
#include "kernels/cuda/fmha_mma_common.cuh"

namespace packbert::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kThreads)
    fmha_forward_kernel(FmhaArgs a, uint16_t* out, float* lse) {
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
  const DropoutStream dstream = dropout_now(a.ds);  // the step of this run
  const bool drop = dropout_enabled(dstream);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[bw.seq]) : 0;
  const int qa = bw.row0 + warp * 16 + g, qb = qa + 8;  // this thread's two query rows

  const int kbeg = window_begin(bw.row0, a.half), kend = window_end(bw.row0, a.half, len);
  load_tile_async(kbase, ld, kbeg, len, Ks[0]);  // the first K / V tile loads with Q
  load_tile_async(vbase, ld, kbeg, len, Vs[0]);
  cp_async_commit();
  uint32_t qf[kDChunks][4];
  load_a_rows(qbase, ld, qa, len, t, qf);
  const float c = a.scale * kLog2e;  // scores in log2 units
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int k0 = kbeg, buf = 0; k0 < kend; k0 += kTile, buf ^= 1) {
    cp_async_wait_group<0>();  // this thread's copies of tile k0, the only ones in flight
    // Every thread's copies of tile k0 are visible, and every thread is done with the previous
    // tile, whose buffer the next tile's copies overwrite.
    if (!PB_MUTANT(Mutant::fmha_barrier)) __syncthreads();
    if (k0 + kTile < kend) {  // the next tile loads while this one computes
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
    // Scale and mask (keys past the end, and in an edge tile keys outside the row's window:
    // -inf), then the running max of each row, and the shift: the max, or 0 for a row with no
    // key yet (max -inf), so that exp2(-inf - shift) = 0 masks.
    const bool edge = edge_tile(bw.row0, k0, a.half);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * t + (e & 1);
        const bool in = key < len && (!edge || in_window((e >> 1) ? qb : qa, key, a.half));
        s[n][e] = in ? s[n][e] * c : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float alpha[2], shift[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float mnew = fmaxf(m[i], quad_max(mx[i]));
      shift[i] = mnew == -INFINITY ? 0.f : mnew;
      alpha[i] = exp2f(m[i] - shift[i]);  // 0 while m = -inf (the first tile)
      m[i] = mnew;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[n][e] - shift[e >> 1]);
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
        dropout_query_rows(dstream, sample, head, qa, qb, k0 + n * 8, t, f);
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

template <typename T>
cudaError_t forward_t(const FmhaArgs& a, const AttnWork& w, void* out, float* lse, cudaStream_t s) {
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, fmha_forward_kernel<T>)(a, static_cast<uint16_t*>(out),
                                                                     lse);
  return launched();
}

}  // namespace

// All three kernels' budgets (fmha_mma_common.cuh, "Budget"), defined once, here.
std::vector<FmhaKernelBudget> fmha_kernel_budget() {
  // Live registers per thread: fp32 accumulators of 16 x 64 (32) per output or score tile, and
  // 16 for the A fragments of a 16 x 64 16-bit slab.
  return {{"forward", kThreads, kSmemForward, 32 + 32 + 16 + 4},      // O, S; Q; m, l
          {"dq", kThreads, kSmemDq, 32 + 32 + 32 + 16 + 16 + 4},      // dQ, S, dP; Q, dO; D, lse
          {"dkv", kThreads, kSmemDkv, 32 + 32 + 32 + 32 + 16 + 16}};  // dK, dV, S^T, dP^T; K, V
}

cudaError_t fmha_forward_work(FmhaType t, const DeviceLayout& l, const AttnWork& w, const void* qkv,
                              int64_t hidden, int heads, int half, const DropoutStream& ds,
                              void* out, float* lse, cudaStream_t s) {
  if (w.count == 0 || w.max_len <= 0) return cudaSuccess;
  const FmhaArgs a = make_args(l, w, qkv, hidden, heads, half, ds);
  return t == FmhaType::bf16 ? forward_t<__nv_bfloat16>(a, w, out, lse, s)
                             : forward_t<__half>(a, w, out, lse, s);
}

}  // namespace packbert::cuda
