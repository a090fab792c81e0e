// bias + dropout + residual + LayerNorm (residual_layernorm_*), forward and backward, in fp32 and
// bf16 / f16 storage. The conventions shared with the embedding's LayerNorm, and the gamma / beta
// gradients: layernorm_common.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/layernorm_common.cuh"

namespace packbert::cuda {
namespace {

// The input of the gamma / beta gradients (layernorm_param_grads): the saved LayerNorm input.
template <typename T>
struct SavedInput {
  const T* x;
  int64_t h;
  __device__ __forceinline__ float operator()(int64_t r, int64_t c) const {
    return load(x, r * h + c);
  }
};

// T: the storage of x, residual, out and ln_in. The fp32 instantiation re-reads h from ln_in;
// the others keep the fp32 h in dynamic shared memory (h floats per block), since ln_in holds it
// rounded (and may alias x, so h cannot be formed again).
template <typename T>
__global__ void residual_ln_forward_kernel(DeviceLayout l, const T* x, const float* bias,
                                           const T* residual, const float* gamma, const float* beta,
                                           float eps, DropoutStream ds, int64_t h, T* out, T* ln_in,
                                           float* mean, float* rstd) {
  ds = dropout_now(ds);  // the step of this run
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
  const float rs = layernorm_rstd(t, eps);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x)
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;  // the same thread stored element c above
      float v;
      if constexpr (kIsF32<T>)
        v = ln_in[o + c];
      else
        v = staged[c];
      store(out, o + c, (v - t.mean) * rs * gamma[c] + (beta ? beta[c] : 0.f));
    }
  if (threadIdx.x == 0) {
    mean[row] = t.mean;
    rstd[row] = rs;
  }
}

// T: the storage of dout, ln_in, dx and dresidual. dx32 (optional): dx in fp32 as well, for
// dbias: the bias gradient sums the unrounded dx, as the CPU's emulation does. dresidual_in:
// dh adds what dresidual holds (the residual stream's gradient of a pre-norm model).
template <typename T>
__global__ void residual_ln_backward_kernel(DeviceLayout l, const T* dout, const T* ln_in,
                                            const float* mean, const float* rstd,
                                            const float* gamma, DropoutStream ds, int64_t h, T* dx,
                                            T* dresidual, bool dresidual_in, float* dx32) {
  ds = dropout_now(ds);  // the step of this run
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
      float dh = layernorm_dx(load(dout, o + c) * gamma[c], xhat, mean_g, mean_gx, rs);
      if (dresidual_in) dh += load(dresidual, o + c);  // read, then written by this thread
      if (dresidual) store(dresidual, o + c, dh);  // may alias dout: this thread read dout[o + c]
      const float v = dh * group_factor(ds, key.drop, bits, e);
      store(dx, o + c, v);
      if (dx32) dx32[o + c] = v;
    }
  }
}

// ---- typed launches ---------------------------------------------------------------------------
template <typename T>
cudaError_t residual_layernorm_forward_typed(const DeviceLayout& l, const void* x,
                                             const float* bias, const void* residual,
                                             const float* gamma, const float* beta, float eps,
                                             const DropoutStream& ds, int64_t rows, int64_t h,
                                             void* out, void* ln_in, float* mean, float* rstd,
                                             cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  const size_t shared = kIsF32<T> ? 0 : static_cast<size_t>(h) * sizeof(float);
  PB_LAUNCH(static_cast<unsigned>(rows), kRowThreads, shared, s, residual_ln_forward_kernel<T>)(
      l, static_cast<const T*>(x), bias, static_cast<const T*>(residual), gamma, beta, eps, ds, h,
      static_cast<T*>(out), static_cast<T*>(ln_in), mean, rstd);
  return launched();
}

template <typename T>
cudaError_t residual_layernorm_backward_typed(const DeviceLayout& l, const void* dout,
                                              const void* ln_in, const float* mean,
                                              const float* rstd, const float* gamma,
                                              const DropoutStream& ds, int64_t rows, int64_t h,
                                              void* dx, void* dresidual, bool dresidual_in,
                                              float* dx32, float* dbias, float* dgamma,
                                              float* dbeta, double* partial, cudaStream_t s) {
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
      static_cast<T*>(dresidual), dresidual_in, !kIsF32<T> && dbias ? dx32 : nullptr);
  if ((e = launched()) != cudaSuccess) return e;
  if (dbias) return add_column_sums(sums, rows, h, h, partial, dbias, s);
  return cudaSuccess;
}

}  // namespace

cudaError_t residual_layernorm_forward(const DeviceLayout& l, const float* x, const float* bias,
                                       const float* residual, const float* gamma, const float* beta,
                                       float eps, const DropoutStream& ds, int64_t rows, int64_t h,
                                       float* out, float* ln_in, float* mean, float* rstd,
                                       cudaStream_t s) {
  return residual_layernorm_forward_typed<float>(l, x, bias, residual, gamma, beta, eps, ds, rows,
                                                 h, out, ln_in, mean, rstd, s);
}

cudaError_t residual_layernorm_backward(const DeviceLayout& l, const float* dout,
                                        const float* ln_in, const float* mean, const float* rstd,
                                        const float* gamma, const DropoutStream& ds, int64_t rows,
                                        int64_t h, float* dx, float* dresidual, bool dresidual_in,
                                        float* dbias, float* dgamma, float* dbeta, double* partial,
                                        cudaStream_t s) {
  return residual_layernorm_backward_typed<float>(l, dout, ln_in, mean, rstd, gamma, ds, rows, h,
                                                  dx, dresidual, dresidual_in, nullptr, dbias,
                                                  dgamma, dbeta, partial, s);
}

cudaError_t residual_layernorm_forward_lowp(const DeviceLayout& l, FloatFormat f, const void* x,
                                            const float* bias, const void* residual,
                                            const float* gamma, const float* beta, float eps,
                                            const DropoutStream& ds, int64_t rows, int64_t h,
                                            void* out, void* ln_in, float* mean, float* rstd,
                                            cudaStream_t s) {
  if (f == FloatFormat::f32 || h > kLowpLayerNormMaxHidden) return cudaErrorInvalidValue;
  return f == FloatFormat::bf16
             ? residual_layernorm_forward_typed<__nv_bfloat16>(
                   l, x, bias, residual, gamma, beta, eps, ds, rows, h, out, ln_in, mean, rstd, s)
             : residual_layernorm_forward_typed<__half>(l, x, bias, residual, gamma, beta, eps, ds,
                                                        rows, h, out, ln_in, mean, rstd, s);
}

cudaError_t residual_layernorm_backward_lowp(const DeviceLayout& l, FloatFormat f, const void* dout,
                                             const void* ln_in, const float* mean,
                                             const float* rstd, const float* gamma,
                                             const DropoutStream& ds, int64_t rows, int64_t h,
                                             void* dx, void* dresidual, bool dresidual_in,
                                             float* dx32, float* dbias, float* dgamma, float* dbeta,
                                             double* partial, cudaStream_t s) {
  if (f == FloatFormat::f32 || (dbias && !dx32)) return cudaErrorInvalidValue;
  return f == FloatFormat::bf16 ? residual_layernorm_backward_typed<__nv_bfloat16>(
                                      l, dout, ln_in, mean, rstd, gamma, ds, rows, h, dx, dresidual,
                                      dresidual_in, dx32, dbias, dgamma, dbeta, partial, s)
                                : residual_layernorm_backward_typed<__half>(
                                      l, dout, ln_in, mean, rstd, gamma, ds, rows, h, dx, dresidual,
                                      dresidual_in, dx32, dbias, dgamma, dbeta, partial, s);
}

}  // namespace packbert::cuda
