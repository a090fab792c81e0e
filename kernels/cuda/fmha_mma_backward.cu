// The backward of the tensor-core attention (fmha.h): the dQ kernel (one block per query tile),
// then the dK / dV kernel (one block per key tile) on the same stream. The fragment layouts,
// tiles, dropout words and the budget of registers and shared memory are in
// fmha_mma_common.cuh.
//
// D is made by the dQ kernel, not by a pre-pass: each dQ block owns one query tile of one
// (sequence, head) and holds its dO rows in registers already, so every row's D is computed
// exactly once with no further read of dO and no extra launch; the dK / dV kernel runs after it
// on the same stream and reads D (64 floats per query tile) instead of recomputing it from O and
// dO for every key tile.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/fmha.h"
#include "kernels/cuda/fmha_mma_common.cuh"

namespace packbert::cuda {
namespace {

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
  const DropoutStream dstream = dropout_now(a.ds);  // the step of this run
  const bool drop = dropout_enabled(dstream);
  const uint64_t sample = drop ? static_cast<uint64_t>(a.l.sample_id[bw.seq]) : 0;
  const int qa = bw.row0 + warp * 16 + g, qb = qa + 8;

  const int kbeg = window_begin(bw.row0, a.half), kend = window_end(bw.row0, a.half, len);
  load_tile_async(kbase, ld, kbeg, len, Ks[0]);
  load_tile_async(vbase, ld, kbeg, len, Vs[0]);
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

  for (int k0 = kbeg, buf = 0; k0 < kend; k0 += kTile, buf ^= 1) {
    cp_async_wait_group<0>();
    __syncthreads();  // as in the forward
    if (k0 + kTile < kend) {
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
    const bool edge = edge_tile(bw.row0, k0, a.half);
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n) {
      float f[4] = {1.f, 1.f, 1.f, 1.f};
      if (drop) dropout_query_rows(dstream, sample, head, qa, qb, k0 + n * 8, t, f);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * t + (e & 1);
        const bool in = key < len && (!edge || in_window((e >> 1) ? qb : qa, key, a.half));
        const float p = in ? exp2f(s[n][e] * c - lse2[e >> 1]) : 0.f;
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
  const DropoutStream dstream = dropout_now(a.ds);  // the step of this run
  const bool drop = dropout_enabled(dstream);
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
  const int qbeg = window_begin(bw.row0, a.half), qend = window_end(bw.row0, a.half, len);
  load_tile_async(qbase, ld, qbeg, len, Qs[0]);
  load_tile_async(dobase, a.hidden, qbeg, len, dOs[0]);
  cp_async_commit();
  load_rows(qbeg, 0);
  uint32_t kf[kDChunks][4], vf[kDChunks][4];
  load_a_rows(kbase, ld, ka, len, t, kf);
  load_a_rows(vbase, ld, ka, len, t, vf);
  const float c = a.scale * kLog2e;
  float dk[kDTiles][4], dv[kDTiles][4];
#pragma unroll
  for (int n = 0; n < kDTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  for (int q0 = qbeg, buf = 0; q0 < qend; q0 += kTile, buf ^= 1) {
    cp_async_wait_group<0>();
    __syncthreads();  // as in the forward
    if (q0 + kTile < qend) {
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
    const bool edge = edge_tile(bw.row0, q0, a.half);
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n) {
      float f[4] = {1.f, 1.f, 1.f, 1.f};
      if (drop) dropout_key_rows(dstream, sample, head, kslab, q0 + n * 8 + 2 * t, lane, f);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qt = n * 8 + 2 * t + (e & 1);
        const bool in = q0 + qt < len && (!edge || in_window(q0 + qt, (e >> 1) ? kb : ka, a.half));
        const float p = in ? exp2f(st[n][e] * c - lse_t[qt]) : 0.f;
        st[n][e] = p * f[e];                               // (P f)^T
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

template <typename T>
cudaError_t backward_t(const FmhaArgs& a, const AttnWork& w, void* dqkv, cudaStream_t s) {
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, fmha_dq_kernel<T>)(a, static_cast<uint16_t*>(dqkv));
  const cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(work_grid(w, a), kThreads, 0, s, fmha_dkv_kernel<T>)(a, static_cast<uint16_t*>(dqkv));
  return launched();
}

}  // namespace

cudaError_t fmha_backward_work(FmhaType t, const DeviceLayout& l, const AttnWork& w,
                               const void* qkv, const void* out, const float* lse, const void* dout,
                               int64_t hidden, int heads, int half, const DropoutStream& ds,
                               float* delta, void* dqkv, cudaStream_t s) {
  if (w.count == 0 || w.max_len <= 0) return cudaSuccess;
  FmhaArgs a = make_args(l, w, qkv, hidden, heads, half, ds);
  a.out = static_cast<const uint16_t*>(out);
  a.dout = static_cast<const uint16_t*>(dout);
  a.lse = lse;
  a.delta = delta;
  return t == FmhaType::bf16 ? backward_t<__nv_bfloat16>(a, w, dqkv, s)
                             : backward_t<__half>(a, w, dqkv, s);
}

}  // namespace packbert::cuda
