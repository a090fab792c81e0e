// LAMB over a work list of chunks: per-tensor norms of the weights and of the update (partials
// per chunk, added per tensor in order), the update itself, its application (and the
// low-precision weight copy), and the skipped-step record.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void lamb_sumsq_kernel(const LambChunk* chunks, const float* x, double* partial) {
  __shared__ double scratch[32];
  const LambChunk ch = chunks[blockIdx.x];
  double s = 0.0;
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One thread per tensor: its chunks' partials in order.
__global__ void lamb_tensor_norm_kernel(const LambTensorRange* tensors, int64_t num_tensors,
                                        const double* partial, float* norms) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= num_tensors) return;
  double s = 0.0;
  for (int64_t k = 0; k < tensors[t].chunks; ++k) s += partial[tensors[t].first_chunk + k];
  norms[t] = static_cast<float>(sqrt(s));
}

__global__ void lamb_update_kernel(const LambChunk* chunks, const LambTensorRange* tensors,
                                   LambArgs a, const float* global_grad_norm, const float* w,
                                   float* g, float* m, float* v, double* partial) {
  __shared__ double scratch[32];
  const LambChunk ch = chunks[blockIdx.x];
  // A non-finite norm: the step is skipped (every thread of the block returns alike).
  if (!lamb_norm_is_finite(global_grad_norm[0], a.grad_scale)) return;
  LambCoeffs c;
  c.beta1 = a.beta1;
  c.beta2 = a.beta2;
  c.beta3 = a.beta3;
  c.bias_correction1 = a.bias_correction1;
  c.bias_correction2 = a.bias_correction2;
  c.eps = a.eps;
  c.clip_divisor =
      lamb_clip_divisor(global_grad_norm[0] / a.grad_scale, a.max_grad_norm) * a.grad_scale;
  const float decay = tensors[ch.tensor].decay;
  double s = 0.0;
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
    const float u = lamb_update(g[i], w[i], m[i], v[i], c, decay);
    g[i] = u;
    s += static_cast<double>(u) * u;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void lamb_apply_kernel(const LambChunk* chunks, const LambTensorRange* tensors,
                                  float lr, int64_t num_tensors, const float* norms, float* w,
                                  const float* u, void* w_lowp, FloatFormat lowp_format,
                                  const float* global_grad_norm, float grad_scale) {
  if (!lamb_norm_is_finite(global_grad_norm[0], grad_scale)) return;  // skipped step
  const LambChunk ch = chunks[blockIdx.x];
  const LambTensorRange t = tensors[ch.tensor];
  const float step = lamb_step_size(lr, norms[ch.tensor], norms[num_tensors + ch.tensor],
                                    t.adapt != 0);
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
    const float nw = w[i] - step * u[i];
    w[i] = nw;
    if (w_lowp) store_from_float(w_lowp, lowp_format, i, nw);
  }
}

// One thread: the skipped-step record of a LAMB step.
__global__ void lamb_record_kernel(const float* global_grad_norm, float grad_scale,
                                   int32_t* record) {
  lamb_record_step(record, lamb_norm_is_finite(global_grad_norm[0], grad_scale));
}

}  // namespace

cudaError_t lamb_record(const float* global_grad_norm, float grad_scale, int32_t* record,
                        cudaStream_t s) {
  PB_LAUNCH(1, 1, 0, s, lamb_record_kernel)(global_grad_norm, grad_scale, record);
  return launched();
}

cudaError_t lamb_step(const LambChunk* chunks, int64_t num_chunks, const LambTensorRange* tensors,
                      int64_t num_tensors, const LambArgs& a, const float* global_grad_norm,
                      float* params, float* grads, float* m, float* v, float* norms_ws,
                      double* partial, void* params_lowp, FloatFormat lowp_format,
                      int32_t* record, cudaStream_t s) {
  if (num_tensors == 0) return cudaSuccess;
  const unsigned tgrid = grid_for(num_tensors, 128);
  const auto cgrid = static_cast<unsigned>(num_chunks);
  cudaError_t e;
  // ||w|| per tensor (before the step).
  if (num_chunks > 0) {
    PB_LAUNCH(cgrid, kThreads, 0, s, lamb_sumsq_kernel)(chunks, params, partial);
    if ((e = launched()) != cudaSuccess) return e;
  }
  PB_LAUNCH(tgrid, 128, 0, s, lamb_tensor_norm_kernel)(tensors, num_tensors, partial, norms_ws);
  if ((e = launched()) != cudaSuccess) return e;
  // u into the gradient buffer, m and v in place, ||u|| per tensor.
  if (num_chunks > 0) {
    PB_LAUNCH(cgrid, kThreads, 0, s, lamb_update_kernel)(
        chunks, tensors, a, global_grad_norm, params, grads, m, v, partial);
    if ((e = launched()) != cudaSuccess) return e;
  }
  PB_LAUNCH(tgrid, 128, 0, s, lamb_tensor_norm_kernel)(
      tensors, num_tensors, partial, norms_ws + num_tensors);
  if ((e = launched()) != cudaSuccess) return e;
  if (num_chunks > 0) {
    PB_LAUNCH(cgrid, kThreads, 0, s, lamb_apply_kernel)(
        chunks, tensors, a.lr, num_tensors, norms_ws, params, grads, params_lowp, lowp_format,
        global_grad_norm, a.grad_scale);
    if ((e = launched()) != cudaSuccess) return e;
  }
  if (record) {
    PB_LAUNCH(1, 1, 0, s, lamb_record_kernel)(global_grad_norm, a.grad_scale, record);
    if ((e = launched()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace packbert::cuda
