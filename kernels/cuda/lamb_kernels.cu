// LAMB (and AdamW, StableAdamW: LambArgs::rule) over a work list of chunks, in two passes
// (kernels/ops/lamb.h, lamb_update, lamb_apply):
// per-row sums of squares of the weights and of the update (partials per chunk, added per row in
// order) with the update itself and the skipped-step record; then the norms, the trust ratio and
// the update's application (and the low-precision weight copy).
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

// One thread per row: its chunks' partials in order, into column `column` of sums [T, 2]; with
// count_column >= 0, the row's element count into that column too (StableAdamW).
__global__ void lamb_row_sum_kernel(const LambTensorRange* tensors, int64_t num_tensors,
                                    const double* partial, double* sums, int column,
                                    int count_column) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= num_tensors) return;
  double s = 0.0;
  for (int64_t k = 0; k < tensors[t].chunks; ++k) s += partial[tensors[t].first_chunk + k];
  sums[2 * t + column] = s;
  if (count_column >= 0) sums[2 * t + count_column] = static_cast<double>(tensors[t].size);
}

// One thread per row: the norms from the sums (lamb_apply's norms_ws).
__global__ void lamb_norms_kernel(int64_t num_tensors, const double* sums, float* norms) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= num_tensors) return;
  norms[t] = static_cast<float>(sqrt(sums[2 * t]));
  norms[num_tensors + t] = static_cast<float>(sqrt(sums[2 * t + 1]));
}

__global__ void lamb_update_kernel(const LambChunk* chunks, const LambTensorRange* tensors,
                                   LambArgs a, const float* global_grad_norm, const float* w,
                                   float* g, float* m, float* v, double* partial) {
  __shared__ double scratch[32];
  const LambChunk ch = chunks[blockIdx.x];
  if (a.step_scalars) {  // LambConfig::step_scalars: as the step's memory holds them now
    a.lr = a.step_scalars[0];
    a.bias_correction1 = a.step_scalars[1];
    a.bias_correction2 = a.step_scalars[2];
    a.grad_scale = a.step_scalars[3];
  }
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
  const auto rule = static_cast<UpdateRule>(a.rule);
  double s = 0.0;
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
    if (rule == UpdateRule::lamb) {
      const float u = packbert::lamb_update(g[i], w[i], m[i], v[i], c, decay);
      g[i] = u;
      s += static_cast<double>(u) * u;
    } else {
      float term = 0.f;
      const float u = adam_update(g[i], m[i], v[i], c, term);
      g[i] = u;
      s +=
          rule == UpdateRule::stable_adamw ? static_cast<double>(term) : static_cast<double>(u) * u;
    }
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void lamb_apply_kernel(const LambChunk* chunks, const LambTensorRange* tensors,
                                  int32_t rule_id, float lr, const double* sums, float* w,
                                  const float* u, void* w_lowp, FloatFormat lowp_format,
                                  const float* global_grad_norm, float grad_scale,
                                  const float* step_scalars) {
  if (step_scalars) lr = step_scalars[0], grad_scale = step_scalars[3];
  if (!lamb_norm_is_finite(global_grad_norm[0], grad_scale)) return;  // skipped step
  const LambChunk ch = chunks[blockIdx.x];
  const LambTensorRange t = tensors[ch.tensor];
  const auto rule = static_cast<UpdateRule>(rule_id);
  float step = lr;
  if (rule == UpdateRule::lamb) {
    const auto wnorm = static_cast<float>(sqrt(sums[2 * ch.tensor]));
    const auto unorm = static_cast<float>(sqrt(sums[2 * ch.tensor + 1]));
    step = lamb_step_size(lr, wnorm, unorm, t.adapt != 0);
  } else if (rule == UpdateRule::stable_adamw) {
    step = stable_adamw_lr(lr, sums[2 * ch.tensor], sums[2 * ch.tensor + 1]);
  }
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x) {
    const float nw =
        rule == UpdateRule::lamb ? w[i] - step * u[i] : adamw_apply(w[i], u[i], step, t.decay);
    w[i] = nw;
    if (w_lowp) store_from_float(w_lowp, lowp_format, i, nw);
  }
}

// One thread: the skipped-step record of a LAMB step.
__global__ void lamb_record_kernel(const float* global_grad_norm, float grad_scale,
                                   const float* step_scalars, int32_t* record) {
  if (step_scalars) grad_scale = step_scalars[3];
  lamb_record_step(record, lamb_norm_is_finite(global_grad_norm[0], grad_scale));
}

__global__ void write_floats_kernel(float* dst, FloatArgs values, int n) {
  for (int i = 0; i < n; ++i) dst[i] = values.v[i];
}

}  // namespace

cudaError_t lamb_update(const LambChunk* chunks, int64_t num_chunks, const LambTensorRange* tensors,
                        int64_t num_tensors, const LambArgs& a, const float* global_grad_norm,
                        const float* params, float* grads, float* m, float* v, double* sums,
                        double* partial, int32_t* record, cudaStream_t s) {
  cudaError_t e;
  if (num_tensors > 0) {
    const unsigned tgrid = grid_for(num_tensors, 128);
    const auto cgrid = static_cast<unsigned>(num_chunks);
    const bool stable = a.rule == static_cast<int32_t>(UpdateRule::stable_adamw);
    // sum of w^2 per row (before the step); StableAdamW's sums are its RMS terms and counts.
    if (!stable) {
      if (num_chunks > 0) {
        PB_LAUNCH(cgrid, kThreads, 0, s, lamb_sumsq_kernel)(chunks, params, partial);
        if ((e = launched()) != cudaSuccess) return e;
      }
      PB_LAUNCH(tgrid, 128, 0, s, lamb_row_sum_kernel)(tensors, num_tensors, partial, sums, 0, -1);
      if ((e = launched()) != cudaSuccess) return e;
    }
    // u into the gradient buffer, m and v in place, sum of u^2 (or the RMS terms) per row.
    if (num_chunks > 0) {
      PB_LAUNCH(cgrid, kThreads, 0, s, lamb_update_kernel)(chunks, tensors, a, global_grad_norm,
                                                           params, grads, m, v, partial);
      if ((e = launched()) != cudaSuccess) return e;
    }
    PB_LAUNCH(tgrid, 128, 0, s, lamb_row_sum_kernel)(tensors, num_tensors, partial, sums,
                                                     stable ? 0 : 1, stable ? 1 : -1);
    if ((e = launched()) != cudaSuccess) return e;
  }
  if (record) {
    PB_LAUNCH(1, 1, 0, s, lamb_record_kernel)(global_grad_norm, a.grad_scale, a.step_scalars,
                                              record);
    if ((e = launched()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t lamb_apply(const LambChunk* chunks, int64_t num_chunks, const LambTensorRange* tensors,
                       int64_t num_tensors, int32_t rule, float lr, float grad_scale,
                       const float* step_scalars, const float* global_grad_norm, const double* sums,
                       float* params, const float* grads, void* params_lowp,
                       FloatFormat lowp_format, float* norms_ws, cudaStream_t s) {
  if (num_tensors == 0) return cudaSuccess;
  cudaError_t e;
  if (norms_ws) {
    PB_LAUNCH(grid_for(num_tensors, 128), 128, 0, s, lamb_norms_kernel)(num_tensors, sums,
                                                                        norms_ws);
    if ((e = launched()) != cudaSuccess) return e;
  }
  if (num_chunks > 0) {
    PB_LAUNCH(static_cast<unsigned>(num_chunks), kThreads, 0, s, lamb_apply_kernel)(
        chunks, tensors, rule, lr, sums, params, grads, params_lowp, lowp_format, global_grad_norm,
        grad_scale, step_scalars);
    if ((e = launched()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t write_floats(float* dst, const FloatArgs& values, int n, cudaStream_t s) {
  PB_LAUNCH(1, 1, 0, s, write_floats_kernel)(dst, values, n);
  return launched();
}

}  // namespace packbert::cuda
