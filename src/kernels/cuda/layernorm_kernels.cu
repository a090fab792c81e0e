// The LayerNorm family: embedding gather + sum + LayerNorm + dropout, and bias + dropout +
// residual + LayerNorm, forward and backward. One block per row for the per-token math; the
// parameter gradients are deterministic two-stage column sums (fixed row chunks in order, then
// the chunks in order), never atomics.
//
// Threads walk a row in groups of 4 consecutive columns: one Philox call (dropout_bits4) gives
// the mask words of exactly those 4 elements, as on the CPU.
//
// Mixed precision: the kernels are templates on the storage type of the tensors backend.h's
// "lowp:" lines name (float, __nv_bfloat16, __half). They load and widen, compute in fp32 exactly
// as the fp32 instantiation does, and round once where they store (to nearest even), so one pass
// gives what the CPU's emulation (widen, fp32 op, round) gives, up to fp32 summation order. Where
// the fp32 kernel re-reads a value it stored (the embedding sum in out, h in ln_in), the
// low-precision one recomputes it or keeps the fp32 value in shared memory instead: the
// statistics and the normalisation use the unrounded value, as the emulation does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {

// reduce_kernels.cu
cudaError_t add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld,
                            double* partial, float* out, cudaStream_t s);

namespace {

constexpr int kRowThreads = 128;

// Storage <-> fp32: widening is exact, narrowing rounds to nearest even.
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }

template <typename T>
constexpr bool kIsF32 = std::is_same_v<T, float>;

// The dropout multiplier of element c of a 4-group, 1 when the row is not dropped.
__device__ __forceinline__ float group_factor(const DropoutStream& ds, bool drop,
                                              const Philox4x32& bits, int e) {
  return drop ? dropout_factor(ds, bits.v[e]) : 1.0f;
}

// Whether a row takes dropout, and its key: sample id and position.
struct RowKey {
  bool drop = false;
  uint64_t sample = 0;
  uint32_t pos = 0;
};
__device__ __forceinline__ RowKey row_key(const DeviceLayout& l, const DropoutStream& ds,
                                          int64_t row) {
  RowKey k;
  if (!dropout_enabled(ds)) return k;
  const int32_t seq = l.token_seq[row];
  if (seq < 0) return k;
  k.drop = true;
  k.sample = static_cast<uint64_t>(l.sample_id[seq]);
  k.pos = static_cast<uint32_t>(l.token_pos[row]);
  return k;
}

// The embedding sum of row r, element c (the same expression as the CPU's EmbeddingRows::sum),
// from tables stored as Tab.
template <typename Tab>
struct EmbeddingSum {
  const Tab* word;
  const Tab* position;
  const Tab* token_type;
  const int32_t* input_ids;
  const int32_t* segment_ids;
  const int32_t* positions;
  int64_t h;
  __device__ __forceinline__ float operator()(int64_t r, int64_t c) const {
    return (load(word, static_cast<int64_t>(input_ids[r]) * h + c) +
            load(position, static_cast<int64_t>(positions[r]) * h + c)) +
           load(token_type, static_cast<int64_t>(segment_ids[r]) * h + c);
  }
};

template <typename Tab>
EmbeddingSum<Tab> embedding_sum(const DeviceLayout& l, const void* word, const void* position,
                                const void* token_type, const int32_t* input_ids,
                                const int32_t* segment_ids, int64_t h) {
  return EmbeddingSum<Tab>{static_cast<const Tab*>(word), static_cast<const Tab*>(position),
                           static_cast<const Tab*>(token_type), input_ids, segment_ids,
                           l.token_pos, h};
}

template <typename T>
struct SavedInput {
  const T* x;
  int64_t h;
  __device__ __forceinline__ float operator()(int64_t r, int64_t c) const {
    return load(x, r * h + c);
  }
};

// out (stored as Out) from tables stored as Tab. The fp32 instantiation keeps the sum in out
// between the two passes; a low-precision out would round it, so the others gather it again
// (the same expression, the same bits).
template <typename Tab, typename Out>
__global__ void embedding_forward_kernel(DeviceLayout l, EmbeddingSum<Tab> sum, const float* gamma,
                                         const float* beta, int64_t h, DropoutStream ds, Out* out,
                                         float* mean, float* rstd) {
  __shared__ float scratch[96];
  const int64_t row = blockIdx.x;
  Out* y = out + row * h;
  const int64_t groups = (h + 3) / 4;
  Welford w;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x)
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const float v = sum(row, 4 * g + e);
      if constexpr (kIsF32<Out>) y[4 * g + e] = v;
      welford_push(w, v);
    }
  const Welford t = block_welford(w, scratch);
  const float rs = layernorm_rstd(t, kDeviceLayerNormEps);
  const RowKey key = row_key(l, ds, row);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    Philox4x32 bits{};
    if (key.drop) bits = dropout_bits4(ds, key.sample, 0, key.pos, static_cast<uint32_t>(4 * g));
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      float v;
      if constexpr (kIsF32<Out>)
        v = y[c];
      else
        v = sum(row, c);
      store(y, c, ((v - t.mean) * rs * gamma[c] + beta[c]) * group_factor(ds, key.drop, bits, e));
    }
  }
  if (threadIdx.x == 0) {
    mean[row] = t.mean;
    rstd[row] = rs;
  }
}

// d <- dropout'(dout); padding rows <- 0. fp32: d is dout (in place); low precision: d is fp32
// scratch and dout is left alone.
template <typename D>
__global__ void embedding_dropout_backward_kernel(DeviceLayout l, int64_t h, DropoutStream ds,
                                                  const D* dout, float* d) {
  const int64_t row = blockIdx.x, o = row * h;
  const bool padding = l.token_seq[row] < 0;
  const RowKey key = row_key(l, ds, row);
  const int64_t groups = (h + 3) / 4;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    Philox4x32 bits{};
    if (key.drop) bits = dropout_bits4(ds, key.sample, 0, key.pos, static_cast<uint32_t>(4 * g));
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      d[o + c] = padding ? 0.0f : load(dout, o + c) * group_factor(ds, key.drop, bits, e);
    }
  }
}

// Stage 1 of the gamma / beta gradients: per chunk of rows (in order), per column.
template <typename D, typename Input>
__global__ void ln_param_partials_kernel(const D* dy, Input input, const float* mean,
                                         const float* rstd, const int32_t* token_seq,
                                         int64_t rows, int64_t h, double* pg, double* pb) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  const int64_t r0 = blockIdx.y * kColumnChunk;
  const int64_t r1 = r0 + kColumnChunk < rows ? r0 + kColumnChunk : rows;
  double sg = 0.0, sb = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    if (token_seq && token_seq[r] < 0) continue;
    const float d = load(dy, r * h + c);
    const float xhat = (input(r, c) - mean[r]) * rstd[r];
    sg += d * xhat;  // float product, double sum: as the CPU
    sb += d;
  }
  pg[blockIdx.y * h + c] = sg;
  pb[blockIdx.y * h + c] = sb;
}

__global__ void ln_param_finish_kernel(const double* pg, const double* pb, int64_t chunks,
                                       int64_t h, float* dgamma, float* dbeta) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  double sg = 0.0, sb = 0.0;
  for (int64_t k = 0; k < chunks; ++k) sg += pg[k * h + c], sb += pb[k * h + c];
  if (dgamma) dgamma[c] += static_cast<float>(sg);
  if (dbeta) dbeta[c] += static_cast<float>(sb);
}

// d <- LayerNorm backward of d (rows of sequences only; padding rows were zeroed).
template <typename Input>
__global__ void embedding_ln_dx_kernel(DeviceLayout l, Input input, const float* gamma,
                                       const float* mean, const float* rstd, int64_t h,
                                       float* dout) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  if (l.token_seq[row] < 0) return;  // uniform over the block
  float* d = dout + row * h;
  const float mu = mean[row], rs = rstd[row];
  double sg = 0.0, sgx = 0.0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = d[c] * gamma[c];
    sg += g;
    sgx += static_cast<double>(g) * ((input(row, c) - mu) * rs);
  }
  sg = block_sum(sg, scratch);
  sgx = block_sum(sgx, scratch);
  const auto mean_g = static_cast<float>(sg / h), mean_gx = static_cast<float>(sgx / h);
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float xhat = (input(row, c) - mu) * rs;
    d[c] = layernorm_dx(d[c] * gamma[c], xhat, mean_g, mean_gx, rs);
  }
}

// T: the storage of x, residual, out and ln_in. The fp32 instantiation re-reads h from ln_in;
// the others keep the fp32 h in dynamic shared memory (h floats per block), since ln_in holds it
// rounded (and may alias x, so h cannot be formed again).
template <typename T>
__global__ void residual_ln_forward_kernel(DeviceLayout l, const T* x, const float* bias,
                                           const T* residual, const float* gamma,
                                           const float* beta, DropoutStream ds, int64_t h,
                                           T* out, T* ln_in, float* mean, float* rstd) {
  __shared__ float scratch[96];
  PB_EXTERN_SHARED(float, staged);  // low precision only: the row's fp32 h
  const int64_t row = blockIdx.x, o = row * h;
  const RowKey key = row_key(l, ds, row);
  const int64_t groups = (h + 3) / 4;
  Welford w;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    Philox4x32 bits{};
    if (key.drop) bits = dropout_bits4(ds, key.sample, 0, key.pos, static_cast<uint32_t>(4 * g));
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      float v = load(x, o + c);
      if (bias) v += bias[c];
      v *= group_factor(ds, key.drop, bits, e);
      if (residual) v += load(residual, o + c);
      store(ln_in, o + c, v);  // after reading x[o + c]: ln_in may alias x (same thread, same c)
      if constexpr (!kIsF32<T>) staged[c] = v;
      welford_push(w, v);
    }
  }
  const Welford t = block_welford(w, scratch);
  const float rs = layernorm_rstd(t, kDeviceLayerNormEps);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x)
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;  // the same thread stored element c above
      float v;
      if constexpr (kIsF32<T>)
        v = ln_in[o + c];
      else
        v = staged[c];
      store(out, o + c, (v - t.mean) * rs * gamma[c] + beta[c]);
    }
  if (threadIdx.x == 0) {
    mean[row] = t.mean;
    rstd[row] = rs;
  }
}

// T: the storage of dout, ln_in, dx and dresidual. dx32 (optional): dx in fp32 as well, for
// dbias: the bias gradient sums the unrounded dx, as the CPU's emulation does.
template <typename T>
__global__ void residual_ln_backward_kernel(DeviceLayout l, const T* dout, const T* ln_in,
                                            const float* mean, const float* rstd,
                                            const float* gamma, DropoutStream ds, int64_t h,
                                            T* dx, T* dresidual, float* dx32) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x, o = row * h;
  const float mu = mean[row], rs = rstd[row];
  const int64_t groups = (h + 3) / 4;
  double sg = 0.0, sgx = 0.0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = load(dout, o + c) * gamma[c];
    sg += g;
    sgx += static_cast<double>(g) * ((load(ln_in, o + c) - mu) * rs);
  }
  sg = block_sum(sg, scratch);
  sgx = block_sum(sgx, scratch);  // barriers: every read of dout above is done before writes
  const auto mean_g = static_cast<float>(sg / h), mean_gx = static_cast<float>(sgx / h);
  const RowKey key = row_key(l, ds, row);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    Philox4x32 bits{};
    if (key.drop) bits = dropout_bits4(ds, key.sample, 0, key.pos, static_cast<uint32_t>(4 * g));
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      const float xhat = (load(ln_in, o + c) - mu) * rs;
      const float dh = layernorm_dx(load(dout, o + c) * gamma[c], xhat, mean_g, mean_gx, rs);
      if (dresidual) store(dresidual, o + c, dh);  // may alias dout: this thread read dout[o + c]
      const float v = dh * group_factor(ds, key.drop, bits, e);
      store(dx, o + c, v);
      if (dx32) dx32[o + c] = v;
    }
  }
}

template <typename D, typename Input>
cudaError_t layernorm_param_grads(const D* dy, Input input, const float* mean,
                                  const float* rstd, const int32_t* token_seq, int64_t rows,
                                  int64_t h, float* dgamma, float* dbeta, double* partial,
                                  cudaStream_t s) {
  if (!dgamma && !dbeta) return cudaSuccess;
  if (rows == 0 || h == 0) return cudaSuccess;
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  double* pg = partial;
  double* pb = partial + chunks * h;
  const dim3 grid(static_cast<unsigned>((h + 127) / 128), static_cast<unsigned>(chunks));
  PB_LAUNCH(grid, 128, 0, s, ln_param_partials_kernel)(
      dy, input, mean, rstd, token_seq, rows, h, pg, pb);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(grid.x, 128, 0, s, ln_param_finish_kernel)(pg, pb, chunks, h, dgamma, dbeta);
  return launched();
}

// ---- typed launches ---------------------------------------------------------------------------
template <typename Tab, typename Out>
cudaError_t embedding_forward_typed(const DeviceLayout& l, const EmbeddingSum<Tab>& sum,
                                    const float* gamma, const float* beta, int64_t h,
                                    const DropoutStream& ds, void* out, float* mean, float* rstd,
                                    cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  PB_LAUNCH(static_cast<unsigned>(l.rows), kRowThreads, 0, s, embedding_forward_kernel<Tab, Out>)(
      l, sum, gamma, beta, h, ds, static_cast<Out*>(out), mean, rstd);
  return launched();
}

// dout (stored as D) -> d (fp32; d == dout for fp32) -> the parameter gradients.
template <typename Tab, typename D>
cudaError_t embedding_backward_typed(const DeviceLayout& l, const EmbeddingSum<Tab>& sum,
                                     const float* gamma, int64_t h, const DropoutStream& ds,
                                     const float* mean, const float* rstd, const D* dout,
                                     float* d,
                                     float* dgamma, float* dbeta, double* partial,
                                     cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  const auto rows = static_cast<unsigned>(l.rows);
  PB_LAUNCH(rows, kRowThreads, 0, s, embedding_dropout_backward_kernel<D>)(l, h, ds, dout, d);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  e = layernorm_param_grads(static_cast<const float*>(d), sum, mean, rstd, l.token_seq, l.rows, h,
                            dgamma, dbeta, partial, s);
  if (e != cudaSuccess) return e;
  PB_LAUNCH(rows, kRowThreads, 0, s, embedding_ln_dx_kernel)(l, sum, gamma, mean, rstd, h, d);
  return launched();
}

template <typename T>
cudaError_t residual_layernorm_forward_typed(const DeviceLayout& l, const void* x,
                                             const float* bias, const void* residual,
                                             const float* gamma, const float* beta,
                                             const DropoutStream& ds, int64_t rows, int64_t h,
                                             void* out, void* ln_in, float* mean, float* rstd,
                                             cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  const size_t shared = kIsF32<T> ? 0 : static_cast<size_t>(h) * sizeof(float);
  PB_LAUNCH(static_cast<unsigned>(rows), kRowThreads, shared, s, residual_ln_forward_kernel<T>)(
      l, static_cast<const T*>(x), bias, static_cast<const T*>(residual), gamma, beta, ds, h,
      static_cast<T*>(out), static_cast<T*>(ln_in), mean, rstd);
  return launched();
}

template <typename T>
cudaError_t residual_layernorm_backward_typed(const DeviceLayout& l, const void* dout,
                                              const void* ln_in, const float* mean,
                                              const float* rstd, const float* gamma,
                                              const DropoutStream& ds, int64_t rows, int64_t h,
                                              void* dx, void* dresidual, float* dx32,
                                              float* dbias, float* dgamma, float* dbeta,
                                              double* partial, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  const auto* dy = static_cast<const T*>(dout);
  // Parameter gradients first: dresidual may overwrite dout.
  cudaError_t e = layernorm_param_grads(dy, SavedInput<T>{static_cast<const T*>(ln_in), h}, mean,
                                        rstd, nullptr, rows, h, dgamma, dbeta, partial, s);
  if (e != cudaSuccess) return e;
  // fp32: dbias sums dx itself; low precision: the fp32 copy dx32.
  float* sums = kIsF32<T> ? static_cast<float*>(dx) : dx32;
  PB_LAUNCH(static_cast<unsigned>(rows), kRowThreads, 0, s, residual_ln_backward_kernel<T>)(
      l, dy, static_cast<const T*>(ln_in), mean, rstd, gamma, ds, h, static_cast<T*>(dx),
      static_cast<T*>(dresidual), !kIsF32<T> && dbias ? dx32 : nullptr);
  if ((e = launched()) != cudaSuccess) return e;
  if (dbias) return add_column_sums(sums, rows, h, h, partial, dbias, s);
  return cudaSuccess;
}

template <typename Out>
cudaError_t embedding_forward_lowp_as(const DeviceLayout& l, const EmbeddingLowpPtrs& p,
                                      int64_t h, const DropoutStream& ds, void* out, float* mean,
                                      float* rstd, cudaStream_t s) {
  if (p.tables == FloatFormat::f32)
    return embedding_forward_typed<float, Out>(
        l, embedding_sum<float>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
        p.gamma, p.beta, h, ds, out, mean, rstd, s);
  return embedding_forward_typed<Out, Out>(
      l, embedding_sum<Out>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
      p.gamma, p.beta, h, ds, out, mean, rstd, s);
}

template <typename D>
cudaError_t embedding_backward_lowp_as(const DeviceLayout& l, const EmbeddingLowpPtrs& p,
                                       int64_t h, const DropoutStream& ds, const float* mean,
                                       const float* rstd, const void* dout, float* d,
                                       float* dgamma, float* dbeta, double* partial,
                                       cudaStream_t s) {
  const auto* dy = static_cast<const D*>(dout);
  if (p.tables == FloatFormat::f32)
    return embedding_backward_typed<float, D>(
        l, embedding_sum<float>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
        p.gamma, h, ds, mean, rstd, dy, d, dgamma, dbeta, partial, s);
  return embedding_backward_typed<D, D>(
      l, embedding_sum<D>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
      p.gamma, h, ds, mean, rstd, dy, d, dgamma, dbeta, partial, s);
}

// The tables are f32 or of the low-precision format itself (the host dispatch guarantees it).
bool tables_ok(FloatFormat tables, FloatFormat f) {
  return f != FloatFormat::f32 && (tables == FloatFormat::f32 || tables == f);
}

}  // namespace

cudaError_t embedding_forward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                              const DropoutStream& ds, float* out, float* mean, float* rstd,
                              cudaStream_t s) {
  return embedding_forward_typed<float, float>(
      l, embedding_sum<float>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
      p.gamma, p.beta, h, ds, out, mean, rstd, s);
}

cudaError_t embedding_backward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                               const DropoutStream& ds, const float* mean, const float* rstd,
                               float* dout, float* dgamma, float* dbeta, double* partial,
                               cudaStream_t s) {
  return embedding_backward_typed<float, float>(
      l, embedding_sum<float>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
      p.gamma, h, ds, mean, rstd, dout, dout, dgamma, dbeta, partial, s);
}

cudaError_t residual_layernorm_forward(const DeviceLayout& l, const float* x, const float* bias,
                                       const float* residual, const float* gamma,
                                       const float* beta, const DropoutStream& ds, int64_t rows,
                                       int64_t h, float* out, float* ln_in, float* mean,
                                       float* rstd, cudaStream_t s) {
  return residual_layernorm_forward_typed<float>(l, x, bias, residual, gamma, beta, ds, rows, h,
                                                 out, ln_in, mean, rstd, s);
}

cudaError_t residual_layernorm_backward(const DeviceLayout& l, const float* dout,
                                        const float* ln_in, const float* mean, const float* rstd,
                                        const float* gamma, const DropoutStream& ds, int64_t rows,
                                        int64_t h, float* dx, float* dresidual, float* dbias,
                                        float* dgamma, float* dbeta, double* partial,
                                        cudaStream_t s) {
  return residual_layernorm_backward_typed<float>(l, dout, ln_in, mean, rstd, gamma, ds, rows, h,
                                                  dx, dresidual, nullptr, dbias, dgamma, dbeta,
                                                  partial, s);
}

cudaError_t embedding_forward_lowp(const DeviceLayout& l, const EmbeddingLowpPtrs& p, int64_t h,
                                   const DropoutStream& ds, void* out, FloatFormat out_format,
                                   float* mean, float* rstd, cudaStream_t s) {
  if (!tables_ok(p.tables, out_format)) return cudaErrorInvalidValue;
  return out_format == FloatFormat::bf16
             ? embedding_forward_lowp_as<__nv_bfloat16>(l, p, h, ds, out, mean, rstd, s)
             : embedding_forward_lowp_as<__half>(l, p, h, ds, out, mean, rstd, s);
}

cudaError_t embedding_backward_lowp(const DeviceLayout& l, const EmbeddingLowpPtrs& p, int64_t h,
                                    const DropoutStream& ds, const float* mean, const float* rstd,
                                    const void* dout, FloatFormat dout_format, float* d,
                                    float* dgamma, float* dbeta, double* partial, cudaStream_t s) {
  if (!tables_ok(p.tables, dout_format)) return cudaErrorInvalidValue;
  return dout_format == FloatFormat::bf16
             ? embedding_backward_lowp_as<__nv_bfloat16>(l, p, h, ds, mean, rstd, dout, d, dgamma,
                                                         dbeta, partial, s)
             : embedding_backward_lowp_as<__half>(l, p, h, ds, mean, rstd, dout, d, dgamma, dbeta,
                                                  partial, s);
}

cudaError_t residual_layernorm_forward_lowp(const DeviceLayout& l, FloatFormat f, const void* x,
                                            const float* bias, const void* residual,
                                            const float* gamma, const float* beta,
                                            const DropoutStream& ds, int64_t rows, int64_t h,
                                            void* out, void* ln_in, float* mean, float* rstd,
                                            cudaStream_t s) {
  if (f == FloatFormat::f32 || h > kLowpLayerNormMaxHidden) return cudaErrorInvalidValue;
  return f == FloatFormat::bf16
             ? residual_layernorm_forward_typed<__nv_bfloat16>(l, x, bias, residual, gamma, beta,
                                                               ds, rows, h, out, ln_in, mean,
                                                               rstd, s)
             : residual_layernorm_forward_typed<__half>(l, x, bias, residual, gamma, beta, ds,
                                                        rows, h, out, ln_in, mean, rstd, s);
}

cudaError_t residual_layernorm_backward_lowp(const DeviceLayout& l, FloatFormat f,
                                             const void* dout, const void* ln_in,
                                             const float* mean, const float* rstd,
                                             const float* gamma, const DropoutStream& ds,
                                             int64_t rows, int64_t h, void* dx, void* dresidual,
                                             float* dx32, float* dbias, float* dgamma,
                                             float* dbeta, double* partial, cudaStream_t s) {
  if (f == FloatFormat::f32 || (dbias && !dx32)) return cudaErrorInvalidValue;
  return f == FloatFormat::bf16
             ? residual_layernorm_backward_typed<__nv_bfloat16>(l, dout, ln_in, mean, rstd, gamma,
                                                                ds, rows, h, dx, dresidual, dx32,
                                                                dbias, dgamma, dbeta, partial, s)
             : residual_layernorm_backward_typed<__half>(l, dout, ln_in, mean, rstd, gamma, ds,
                                                         rows, h, dx, dresidual, dx32, dbias,
                                                         dgamma, dbeta, partial, s);
}

}  // namespace packbert::cuda
