// The embedding: the gather of the three tables' rows, their sum, LayerNorm and dropout in one
// kernel per row, and its backward up to the gradient wrt the embedding sum (dropout, LayerNorm,
// gamma and beta); the tables' gradients are embedding_scatter.cu's. fp32 and bf16 / f16
// storage; the conventions shared with the residual LayerNorm: layernorm_common.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/layernorm_common.cuh"

namespace packbert::cuda {
namespace {

// The embedding sum of row r, element c (the same expression as the CPU's EmbeddingRows::sum),
// from tables stored as Tab; a null position or token_type table adds 0.
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
    const float p = position ? load(position, static_cast<int64_t>(positions[r]) * h + c) : 0.f;
    const float t =
        token_type ? load(token_type, static_cast<int64_t>(segment_ids[r]) * h + c) : 0.f;
    return (load(word, static_cast<int64_t>(input_ids[r]) * h + c) + p) + t;
  }
};

template <typename Tab>
EmbeddingSum<Tab> embedding_sum(const DeviceLayout& l, const void* word, const void* position,
                                const void* token_type, const int32_t* input_ids,
                                const int32_t* segment_ids, int64_t h) {
  return EmbeddingSum<Tab>{static_cast<const Tab*>(word),
                           static_cast<const Tab*>(position),
                           static_cast<const Tab*>(token_type),
                           input_ids,
                           segment_ids,
                           l.token_pos,
                           h};
}

// out (stored as Out) from tables stored as Tab. The fp32 instantiation keeps the sum in out
// between the two passes; a low-precision out would round it, so the others gather it again
// (the same expression, the same bits).
template <typename Tab, typename Out>
__global__ void embedding_forward_kernel(DeviceLayout l, EmbeddingSum<Tab> sum, const float* gamma,
                                         const float* beta, float eps, int64_t h, DropoutStream ds,
                                         Out* out, float* mean, float* rstd) {
  ds = dropout_now(ds);  // the step of this run
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
  const float rs = layernorm_rstd(t, eps);
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
      const float b = beta ? beta[c] : 0.f;
      store(y, c, ((v - t.mean) * rs * gamma[c] + b) * group_factor(ds, key.drop, bits, e));
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
  ds = dropout_now(ds);  // the step of this run
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

// ---- typed launches ---------------------------------------------------------------------------
template <typename Tab, typename Out>
cudaError_t embedding_forward_typed(const DeviceLayout& l, const EmbeddingSum<Tab>& sum,
                                    const float* gamma, const float* beta, float eps, int64_t h,
                                    const DropoutStream& ds, void* out, float* mean, float* rstd,
                                    cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  PB_LAUNCH(static_cast<unsigned>(l.rows), kRowThreads, 0, s, embedding_forward_kernel<Tab, Out>)(
      l, sum, gamma, beta, eps, h, ds, static_cast<Out*>(out), mean, rstd);
  return launched();
}

// dout (stored as D) -> d (fp32; d == dout for fp32) -> the parameter gradients.
template <typename Tab, typename D>
cudaError_t embedding_backward_typed(const DeviceLayout& l, const EmbeddingSum<Tab>& sum,
                                     const float* gamma, int64_t h, const DropoutStream& ds,
                                     const float* mean, const float* rstd, const D* dout, float* d,
                                     float* dgamma, float* dbeta, double* partial, cudaStream_t s) {
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

template <typename Out>
cudaError_t embedding_forward_lowp_as(const DeviceLayout& l, const EmbeddingLowpPtrs& p, int64_t h,
                                      const DropoutStream& ds, void* out, float* mean, float* rstd,
                                      cudaStream_t s) {
  if (p.tables == FloatFormat::f32)
    return embedding_forward_typed<float, Out>(
        l, embedding_sum<float>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
        p.gamma, p.beta, p.eps, h, ds, out, mean, rstd, s);
  return embedding_forward_typed<Out, Out>(
      l, embedding_sum<Out>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
      p.gamma, p.beta, p.eps, h, ds, out, mean, rstd, s);
}

template <typename D>
cudaError_t embedding_backward_lowp_as(const DeviceLayout& l, const EmbeddingLowpPtrs& p, int64_t h,
                                       const DropoutStream& ds, const float* mean,
                                       const float* rstd, const void* dout, float* d, float* dgamma,
                                       float* dbeta, double* partial, cudaStream_t s) {
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
      p.gamma, p.beta, p.eps, h, ds, out, mean, rstd, s);
}

cudaError_t embedding_backward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                               const DropoutStream& ds, const float* mean, const float* rstd,
                               float* dout, float* dgamma, float* dbeta, double* partial,
                               cudaStream_t s) {
  return embedding_backward_typed<float, float>(
      l, embedding_sum<float>(l, p.word, p.position, p.token_type, p.input_ids, p.segment_ids, h),
      p.gamma, h, ds, mean, rstd, dout, dout, dgamma, dbeta, partial, s);
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

}  // namespace packbert::cuda
