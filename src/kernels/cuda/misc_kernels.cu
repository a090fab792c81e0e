// Elementwise epilogues, deterministic column sums, gathers, softmax cross-entropy, the L2 norm,
// LAMB, and the float-format conversions of mixed precision. Simple grid-stride or block-per-row kernels; every reduction in a fixed order.
#include "kernels/common/lowp_convert.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit of gridDim.y

// The GELU of the form chosen at compile time (common/math.h).
template <bool Tanh>
__device__ float gelu_of(float x) {
  return Tanh ? gelu_tanh(x) : gelu(x);
}
template <bool Tanh>
__device__ float gelu_grad_of(float x) {
  return Tanh ? gelu_tanh_grad(x) : gelu_grad(x);
}

template <bool Tanh>
__global__ void gelu_forward_kernel(const float* pre, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = gelu_of<Tanh>(pre[i]);
}

template <bool Tanh>
__global__ void gelu_backward_kernel(float* g, const float* pre, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    g[i] *= gelu_grad_of<Tanh>(pre[i]);
}

__global__ void add_bias_rows_kernel(float* c, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    c[i] += bias[i % cols];
}

__global__ void add_inplace_kernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] += src[i];
}

__global__ void tanh_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = tanhf(x[i]);
}

__global__ void tanh_backward_kernel(float* dp, const float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dp[i] *= 1.0f - p[i] * p[i];
}

// Stage 1: partial[chunk, c] = sum of its kColumnChunk rows, in row order (double).
__global__ void column_partials_kernel(const float* x, int64_t rows, int64_t cols, int64_t ld,
                                       double* partial) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * kColumnChunk;
  const int64_t r1 = r0 + kColumnChunk < rows ? r0 + kColumnChunk : rows;
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += x[r * ld + c];
  partial[blockIdx.y * cols + c] = acc;
}

// Stage 2: out[c] += the chunks' partials, in chunk order.
__global__ void column_finish_kernel(const double* partial, int64_t chunks, int64_t cols,
                                     float* out) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= cols) return;
  double acc = 0.0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + c];
  out[c] += static_cast<float>(acc);
}


// One block per row; three passes over the row (argmax, sum of exp, gradient).
__global__ void softmax_xent_kernel(const float* logits, const int32_t* labels, int64_t v,
                                    float grad_scale, float* dlogits, double* row_loss,
                                    double* row_correct) {
  __shared__ float best_val[kThreads];
  __shared__ int64_t best_idx[kThreads];
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * v;
  const int tid = threadIdx.x;
  float bv = -INFINITY;
  int64_t bi = v;  // "none yet"
  for (int64_t c = tid; c < v; c += blockDim.x)
    if (bi == v || z[c] > bv) bv = z[c], bi = c;  // first maximum of this thread's columns
  best_val[tid] = bv;
  best_idx[tid] = bi;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (tid < o) {
      const float ov = best_val[tid + o];
      const int64_t oi = best_idx[tid + o];
      // The larger value wins; equal values: the lower column (the first maximum).
      if (oi < v && (best_idx[tid] == v || ov > best_val[tid] ||
                     (ov == best_val[tid] && oi < best_idx[tid]))) {
        best_val[tid] = ov;
        best_idx[tid] = oi;
      }
    }
    __syncthreads();
  }
  const float mx = best_val[0];
  const int64_t argmax = best_idx[0];
  const int32_t label = labels[row];
  const float z_label = z[label];  // read before any thread overwrites (dlogits may alias)
  double sum = 0.0;
  for (int64_t c = tid; c < v; c += blockDim.x) sum += exp(static_cast<double>(z[c] - mx));
  sum = block_sum(sum, scratch);  // ends with a barrier: every read of z above is done
  const double lse = mx + log(sum);
  if (dlogits) {
    float* d = dlogits + row * v;
    for (int64_t c = tid; c < v; c += blockDim.x) {
      float g = static_cast<float>(exp(static_cast<double>(z[c]) - lse)) * grad_scale;
      if (c == label) g -= grad_scale;
      d[c] = g;
    }
  }
  if (tid == 0) {
    row_loss[row] = lse - z_label;
    row_correct[row] = argmax == label ? 1.0 : 0.0;
  }
}

// One block adds the row results in row order (per thread), then a fixed tree.
__global__ void softmax_xent_finish_kernel(const double* row_loss, const double* row_correct,
                                           int64_t m, float* loss_sum, int32_t* num_correct) {
  __shared__ double scratch[32];
  double l = 0.0, c = 0.0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) l += row_loss[i], c += row_correct[i];
  l = block_sum(l, scratch);
  c = block_sum(c, scratch);
  if (threadIdx.x == 0) {
    loss_sum[0] += static_cast<float>(l);
    num_correct[0] += static_cast<int32_t>(c);
  }
}

__global__ void sum_squares_chunks_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  const int64_t i0 = blockIdx.x * kNormChunk;
  const int64_t i1 = i0 + kNormChunk < n ? i0 + kNormChunk : n;
  double s = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// The partials' sum in order: its root rounded to f32 into root, or (root null) the sum itself.
__global__ void finish_sum_of_squares_kernel(const double* partial, int64_t k, float* root,
                                             double* sum) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x != 0) return;
  if (root) {
    root[0] = static_cast<float>(sqrt(s));
  } else {
    sum[0] = s;
  }
}

// ---- LAMB ----------------------------------------------------------------------------------
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

// The value of element i of a buffer in one of the float formats, and its store (rounded to
// nearest even by common/lowp_convert.h, the CPU's very functions).
__device__ __forceinline__ float load_as_float(const void* p, FloatFormat f, int64_t i) {
  if (f == FloatFormat::f32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return f == FloatFormat::bf16 ? lowp::bf16_to_float(h) : lowp::f16_to_float(h);
}
__device__ __forceinline__ void store_from_float(void* p, FloatFormat f, int64_t i, float v) {
  if (f == FloatFormat::f32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] =
        f == FloatFormat::bf16 ? lowp::float_to_bf16(v) : lowp::float_to_f16(v);
  }
}

// out[i, :] = x[index[i], :], elements of T (float, or the 16 bits of bf16 / f16: a copy).
template <typename T>
__global__ void gather_rows_kernel(const T* x, const int32_t* index, T* out, int64_t m,
                                   int64_t h) {
  const int64_t n = m * h;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / h, c = i - row * h;
    out[i] = x[static_cast<int64_t>(index[row]) * h + c];
  }
}

// The ordered scatter-add dx[index[i]] += dout[i] in three steps, so that the usual case --
// every target row hit once -- runs in parallel and repeated rows still add in order of i:
// first[r] = the smallest i with index[i] == r (atomicMin: the same whatever the timing);
// every element of a first contributor is added in parallel (each target element once); then,
// only if some row repeats (repeated != 0), one thread per column adds the later contributors
// walking i in order.
__global__ void scatter_first_kernel(const int32_t* index, uint32_t* first, int64_t m) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x)
    atomicMin(first + index[i], static_cast<uint32_t>(i));
}

__global__ void scatter_repeated_kernel(const int32_t* index, const uint32_t* first,
                                        uint32_t* repeated, int64_t m) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x)
    if (first[index[i]] != static_cast<uint32_t>(i))
      atomicExch(repeated, 1u);  // many threads may flag it: atomic, not a data race
}

__global__ void scatter_add_first_kernel(const void* dout, const int32_t* index,
                                         const uint32_t* first, void* dx, FloatFormat f,
                                         int64_t m, int64_t h) {
  const int64_t n = m * h;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e / h, c = e - i * h;
    const int64_t r = index[i];
    if (first[r] != static_cast<uint32_t>(i)) continue;
    store_from_float(dx, f, r * h + c, load_as_float(dx, f, r * h + c) + load_as_float(dout, f, e));
  }
}

__global__ void scatter_add_rest_kernel(const void* dout, const int32_t* index,
                                        const uint32_t* first, const uint32_t* repeated, void* dx,
                                        FloatFormat f, int64_t m, int64_t h) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h || *repeated == 0) return;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t r = index[i];
    if (first[r] == static_cast<uint32_t>(i)) continue;
    store_from_float(dx, f, r * h + c, load_as_float(dx, f, r * h + c) + load_as_float(dout, f, i * h + c));
  }
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

__global__ void convert_kernel(const void* src, FloatFormat sf, void* dst, FloatFormat df,
                               int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
  {
    const float x = load_as_float(src, sf, i);
    store_from_float(dst, df, i, scale == 1.f ? x : x * scale);  // NaN payloads kept at 1
  }
}

// The same per element over a rows x cols block of two row-major buffers with their own
// leading dimensions (blockIdx.y strides over the rows).
__global__ void convert_rows_kernel(const void* src, FloatFormat sf, int64_t src_ld, void* dst,
                                    FloatFormat df, int64_t dst_ld, int64_t rows, int64_t cols,
                                    float scale) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
         c += int64_t{gridDim.x} * blockDim.x) {
      const float x = load_as_float(src, sf, r * src_ld + c);
      store_from_float(dst, df, r * dst_ld + c, scale == 1.f ? x : x * scale);
    }
}

__global__ void add_rows_f32_kernel(const float* src, const int32_t* index, void* dx,
                                    FloatFormat f, int64_t m, int64_t h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * h;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / h, d = int64_t{index[r]} * h + (i - r * h);
    store_from_float(dx, f, d, load_as_float(dx, f, d) + src[i]);
  }
}

template <bool Tanh>
__global__ void gelu_forward_lowp_kernel(const void* pre, void* out, FloatFormat f, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store_from_float(out, f, i, gelu_of<Tanh>(load_as_float(pre, f, i)));
}

template <bool Tanh>
__global__ void gelu_backward_lowp_kernel(void* g, const void* pre, FloatFormat f, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    store_from_float(g, f, i,
                     load_as_float(g, f, i) * gelu_grad_of<Tanh>(load_as_float(pre, f, i)));
}

}  // namespace

cudaError_t convert(const void* src, FloatFormat src_format, void* dst, FloatFormat dst_format,
                    int64_t n, cudaStream_t s, float scale) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, convert_kernel)(
      src, src_format, dst, dst_format, n, scale);
  return launched();
}

cudaError_t convert_rows(const void* src, FloatFormat src_format, int64_t src_ld, void* dst,
                         FloatFormat dst_format, int64_t dst_ld, int64_t rows, int64_t cols,
                         cudaStream_t s, float scale) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(grid_for(cols, kThreads),
                  static_cast<unsigned>(rows < kMaxGridY ? rows : kMaxGridY));
  PB_LAUNCH(grid, kThreads, 0, s, convert_rows_kernel)(src, src_format, src_ld, dst, dst_format,
                                                       dst_ld, rows, cols, scale);
  return launched();
}

cudaError_t add_rows_f32(const float* src, const int32_t* index, void* dx, FloatFormat f,
                         int64_t m, int64_t h, cudaStream_t s) {
  if (m == 0 || h == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, add_rows_f32_kernel)(src, index, dx, f,
                                                                           m, h);
  return launched();
}

cudaError_t gelu_forward_lowp(const void* pre, void* out, FloatFormat f, int64_t n, bool tanh_form,
                              cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_lowp_kernel<true>)(
        pre, out, f, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_lowp_kernel<false>)(
        pre, out, f, n);
  return launched();
}

cudaError_t gelu_backward_inplace_lowp(void* g, const void* pre, FloatFormat f, int64_t n,
                                       bool tanh_form, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_lowp_kernel<true>)(g, pre, f, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_lowp_kernel<false>)(
        g, pre, f, n);
  return launched();
}

cudaError_t gelu_forward(const float* pre, float* out, int64_t n, bool tanh_form, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_kernel<true>)(pre, out, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_forward_kernel<false>)(pre, out, n);
  return launched();
}

cudaError_t gelu_backward_inplace(float* g, const float* pre, int64_t n, bool tanh_form,
                                  cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (tanh_form)
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_kernel<true>)(g, pre, n);
  else
    PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, gelu_backward_kernel<false>)(g, pre, n);
  return launched();
}

cudaError_t add_bias_rows(float* c, const float* bias, int64_t rows, int64_t cols,
                          cudaStream_t s) {
  if (rows * cols == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(rows * cols, kThreads), kThreads, 0, s, add_bias_rows_kernel)(
      c, bias, rows, cols);
  return launched();
}

cudaError_t add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld,
                            double* partial, float* out, cudaStream_t s) {
  if (cols == 0 || rows == 0) return cudaSuccess;
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(chunks));
  PB_LAUNCH(grid, kThreads, 0, s, column_partials_kernel)(x, rows, cols, ld, partial);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(grid.x, kThreads, 0, s, column_finish_kernel)(partial, chunks, cols, out);
  return launched();
}

cudaError_t add_inplace(float* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, add_inplace_kernel)(dst, src, n);
  return launched();
}

cudaError_t tanh_inplace(float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, tanh_kernel)(x, n);
  return launched();
}

cudaError_t tanh_backward_inplace(float* dp, const float* p, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(n, kThreads), kThreads, 0, s, tanh_backward_kernel)(dp, p, n);
  return launched();
}

cudaError_t gather_rows(const void* x, const int32_t* index, void* out, FloatFormat f, int64_t m,
                        int64_t h, cudaStream_t s) {
  if (m * h == 0) return cudaSuccess;
  if (f == FloatFormat::f32)
    PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, gather_rows_kernel)(
        static_cast<const float*>(x), index, static_cast<float*>(out), m, h);
  else
    PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, gather_rows_kernel)(
        static_cast<const uint16_t*>(x), index, static_cast<uint16_t*>(out), m, h);
  return launched();
}

cudaError_t scatter_add_rows_ordered(const void* dout, const int32_t* index, void* dx,
                                     FloatFormat f, int64_t m, int64_t h, int64_t rows,
                                     uint32_t* scratch, cudaStream_t s) {
  if (m * h == 0) return cudaSuccess;
  uint32_t* first = scratch;
  uint32_t* repeated = scratch + rows;
  cudaError_t e = cudaMemsetAsync(first, 0xff, static_cast<size_t>(rows) * sizeof(uint32_t), s);
  if (e == cudaSuccess) e = cudaMemsetAsync(repeated, 0, sizeof(uint32_t), s);
  if (e != cudaSuccess) return e;
  PB_LAUNCH(grid_for(m, kThreads), kThreads, 0, s, scatter_first_kernel)(index, first, m);
  PB_LAUNCH(grid_for(m, kThreads), kThreads, 0, s, scatter_repeated_kernel)(
      index, first, repeated, m);
  PB_LAUNCH(grid_for(m * h, kThreads), kThreads, 0, s, scatter_add_first_kernel)(
      dout, index, first, dx, f, m, h);
  PB_LAUNCH(grid_for(h, 128), 128, 0, s, scatter_add_rest_kernel)(
      dout, index, first, repeated, dx, f, m, h);
  return launched();
}

cudaError_t softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t m,
                                  int64_t v, float grad_scale, float* dlogits, double* row_loss,
                                  double* row_correct, float* loss_sum, int32_t* num_correct,
                                  cudaStream_t s) {
  if (m == 0) return cudaSuccess;
  PB_LAUNCH(static_cast<unsigned>(m), kThreads, 0, s, softmax_xent_kernel)(
      logits, labels, v, grad_scale, dlogits, row_loss, row_correct);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(1, kThreads, 0, s, softmax_xent_finish_kernel)(
      row_loss, row_correct, m, loss_sum, num_correct);
  return launched();
}

cudaError_t sum_of_squares(const float* x, int64_t n, double* partial, float* root, double* sum,
                           cudaStream_t s) {
  const int64_t k = l2_norm_partials(n);
  if (k > 0) {
    PB_LAUNCH(static_cast<unsigned>(k), kThreads, 0, s, sum_squares_chunks_kernel)(x, n, partial);
    cudaError_t e = launched();
    if (e != cudaSuccess) return e;
  }
  PB_LAUNCH(1, kThreads, 0, s, finish_sum_of_squares_kernel)(partial, k, root, sum);
  return launched();
}

cudaError_t root_of_sums(const double* sums, int64_t k, float* root, cudaStream_t s) {
  PB_LAUNCH(1, kThreads, 0, s, finish_sum_of_squares_kernel)(sums, k, root, nullptr);
  return launched();
}

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
