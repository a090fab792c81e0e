// The LayerNorm family: embedding gather + sum + LayerNorm + dropout, and bias + dropout +
// residual + LayerNorm, forward and backward. One block per row for the per-token math; the
// parameter gradients are deterministic two-stage column sums (fixed row chunks in order, then
// the chunks in order), never atomics.
//
// Threads walk a row in groups of 4 consecutive columns: one Philox call (dropout_bits4) gives
// the mask words of exactly those 4 elements, as on the CPU.
#include "cuda/cuda_kernels.h"
#include "cuda/device_util.cuh"

namespace packbert::cuda {

// misc_kernels.cu
cudaError_t add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld,
                            double* partial, float* out, cudaStream_t s);

namespace {

constexpr int kRowThreads = 128;

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

// The embedding sum of row r, element c (the same expression as the CPU's EmbeddingRows::sum).
struct EmbeddingSum {
  EmbeddingPtrs p;
  const int32_t* positions;
  int64_t h;
  __device__ __forceinline__ float operator()(int64_t r, int64_t c) const {
    return (p.word[static_cast<int64_t>(p.input_ids[r]) * h + c] +
            p.position[static_cast<int64_t>(positions[r]) * h + c]) +
           p.token_type[static_cast<int64_t>(p.segment_ids[r]) * h + c];
  }
};

struct SavedInput {
  const float* x;
  int64_t h;
  __device__ __forceinline__ float operator()(int64_t r, int64_t c) const { return x[r * h + c]; }
};

__global__ void embedding_forward_kernel(DeviceLayout l, EmbeddingPtrs p, int64_t h,
                                         DropoutStream ds, float* out, float* mean, float* rstd) {
  __shared__ float scratch[96];
  const int64_t row = blockIdx.x;
  const EmbeddingSum sum{p, l.token_pos, h};
  float* y = out + row * h;
  const int64_t groups = (h + 3) / 4;
  Welford w;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x)
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const float v = sum(row, 4 * g + e);
      y[4 * g + e] = v;
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
      y[c] = ((y[c] - t.mean) * rs * p.gamma[c] + p.beta[c]) * group_factor(ds, key.drop, bits, e);
    }
  }
  if (threadIdx.x == 0) {
    mean[row] = t.mean;
    rstd[row] = rs;
  }
}

// dout <- dropout'(dout); padding rows <- 0.
__global__ void embedding_dropout_backward_kernel(DeviceLayout l, int64_t h, DropoutStream ds,
                                                  float* dout) {
  const int64_t row = blockIdx.x;
  float* d = dout + row * h;
  const bool padding = l.token_seq[row] < 0;
  const RowKey key = row_key(l, ds, row);
  const int64_t groups = (h + 3) / 4;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    Philox4x32 bits{};
    if (key.drop) bits = dropout_bits4(ds, key.sample, 0, key.pos, static_cast<uint32_t>(4 * g));
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      d[c] = padding ? 0.0f : d[c] * group_factor(ds, key.drop, bits, e);
    }
  }
}

// Stage 1 of the gamma / beta gradients: per chunk of rows (in order), per column.
template <typename Input>
__global__ void ln_param_partials_kernel(const float* dy, Input input, const float* mean,
                                         const float* rstd, const int32_t* token_seq,
                                         int64_t rows, int64_t h, double* pg, double* pb) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  const int64_t r0 = blockIdx.y * kColumnChunk;
  const int64_t r1 = r0 + kColumnChunk < rows ? r0 + kColumnChunk : rows;
  double sg = 0.0, sb = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    if (token_seq && token_seq[r] < 0) continue;
    const float d = dy[r * h + c];
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

// Scatter-add into the three tables, one thread per column walking the rows in order (the
// CPU's order). TODO(cuda step 2): sort rows by id once per batch and reduce segments in
// parallel; this kernel has only `h` threads.
__global__ void embedding_scatter_kernel(DeviceLayout l, EmbeddingPtrs p, int64_t h,
                                         const float* d, float* dword, float* dpos,
                                         float* dtype) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= h) return;
  for (int64_t r = 0; r < l.rows; ++r) {
    if (l.token_seq[r] < 0) continue;
    const float v = d[r * h + c];
    if (dword) dword[static_cast<int64_t>(p.input_ids[r]) * h + c] += v;
    if (dpos) dpos[static_cast<int64_t>(l.token_pos[r]) * h + c] += v;
    if (dtype) dtype[static_cast<int64_t>(p.segment_ids[r]) * h + c] += v;
  }
}

__global__ void residual_ln_forward_kernel(DeviceLayout l, const float* x, const float* bias,
                                           const float* residual, const float* gamma,
                                           const float* beta, DropoutStream ds, int64_t h,
                                           float* out, float* ln_in, float* mean, float* rstd) {
  __shared__ float scratch[96];
  const int64_t row = blockIdx.x, o = row * h;
  const RowKey key = row_key(l, ds, row);
  const int64_t groups = (h + 3) / 4;
  Welford w;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    Philox4x32 bits{};
    if (key.drop) bits = dropout_bits4(ds, key.sample, 0, key.pos, static_cast<uint32_t>(4 * g));
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      float v = x[o + c];
      if (bias) v += bias[c];
      v *= group_factor(ds, key.drop, bits, e);
      if (residual) v += residual[o + c];
      ln_in[o + c] = v;  // after reading x[o + c]: ln_in may alias x (same thread, same c)
      welford_push(w, v);
    }
  }
  const Welford t = block_welford(w, scratch);
  const float rs = layernorm_rstd(t, kDeviceLayerNormEps);
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x)
    for (int e = 0; e < 4 && 4 * g + e < h; ++e) {
      const int64_t c = 4 * g + e;
      out[o + c] = (ln_in[o + c] - t.mean) * rs * gamma[c] + beta[c];
    }
  if (threadIdx.x == 0) {
    mean[row] = t.mean;
    rstd[row] = rs;
  }
}

__global__ void residual_ln_backward_kernel(DeviceLayout l, const float* dout, const float* ln_in,
                                            const float* mean, const float* rstd,
                                            const float* gamma, DropoutStream ds, int64_t h,
                                            float* dx, float* dresidual) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x, o = row * h;
  const float mu = mean[row], rs = rstd[row];
  const int64_t groups = (h + 3) / 4;
  double sg = 0.0, sgx = 0.0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float g = dout[o + c] * gamma[c];
    sg += g;
    sgx += static_cast<double>(g) * ((ln_in[o + c] - mu) * rs);
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
      const float xhat = (ln_in[o + c] - mu) * rs;
      const float dh = layernorm_dx(dout[o + c] * gamma[c], xhat, mean_g, mean_gx, rs);
      if (dresidual) dresidual[o + c] = dh;  // may alias dout: this thread read dout[o + c]
      dx[o + c] = dh * group_factor(ds, key.drop, bits, e);
    }
  }
}

template <typename Input>
cudaError_t layernorm_param_grads(const float* dy, Input input, const float* mean,
                                  const float* rstd, const int32_t* token_seq, int64_t rows,
                                  int64_t h, float* dgamma, float* dbeta, double* partial,
                                  cudaStream_t s) {
  if (!dgamma && !dbeta) return cudaSuccess;
  if (rows == 0 || h == 0) return cudaSuccess;
  const int64_t chunks = (rows + kColumnChunk - 1) / kColumnChunk;
  double* pg = partial;
  double* pb = partial + chunks * h;
  const dim3 grid(static_cast<unsigned>((h + 127) / 128), static_cast<unsigned>(chunks));
  ln_param_partials_kernel<<<grid, 128, 0, s>>>(dy, input, mean, rstd, token_seq, rows, h, pg,
                                                 pb);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  ln_param_finish_kernel<<<grid.x, 128, 0, s>>>(pg, pb, chunks, h, dgamma, dbeta);
  return launched();
}

}  // namespace

cudaError_t embedding_forward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                              const DropoutStream& ds, float* out, float* mean, float* rstd,
                              cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  embedding_forward_kernel<<<static_cast<unsigned>(l.rows), kRowThreads, 0, s>>>(l, p, h, ds, out,
                                                                                  mean, rstd);
  return launched();
}

cudaError_t embedding_backward(const DeviceLayout& l, const EmbeddingPtrs& p, int64_t h,
                               const DropoutStream& ds, const float* mean, const float* rstd,
                               float* dout, float* dword, float* dpos, float* dtype,
                               float* dgamma, float* dbeta, double* partial, cudaStream_t s) {
  if (l.rows == 0) return cudaSuccess;
  const auto rows = static_cast<unsigned>(l.rows);
  embedding_dropout_backward_kernel<<<rows, kRowThreads, 0, s>>>(l, h, ds, dout);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  const EmbeddingSum sum{p, l.token_pos, h};
  e = layernorm_param_grads(dout, sum, mean, rstd, l.token_seq, l.rows, h, dgamma, dbeta, partial,
                            s);
  if (e != cudaSuccess) return e;
  embedding_ln_dx_kernel<<<rows, kRowThreads, 0, s>>>(l, sum, p.gamma, mean, rstd, h, dout);
  if ((e = launched()) != cudaSuccess) return e;
  if (!dword && !dpos && !dtype) return cudaSuccess;
  embedding_scatter_kernel<<<grid_for(h, 128), 128, 0, s>>>(l, p, h, dout, dword, dpos, dtype);
  return launched();
}

cudaError_t residual_layernorm_forward(const DeviceLayout& l, const float* x, const float* bias,
                                       const float* residual, const float* gamma,
                                       const float* beta, const DropoutStream& ds, int64_t rows,
                                       int64_t h, float* out, float* ln_in, float* mean,
                                       float* rstd, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  residual_ln_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
      l, x, bias, residual, gamma, beta, ds, h, out, ln_in, mean, rstd);
  return launched();
}

cudaError_t residual_layernorm_backward(const DeviceLayout& l, const float* dout,
                                        const float* ln_in, const float* mean, const float* rstd,
                                        const float* gamma, const DropoutStream& ds, int64_t rows,
                                        int64_t h, float* dx, float* dresidual, float* dbias,
                                        float* dgamma, float* dbeta, double* partial,
                                        cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  // Parameter gradients first: dresidual may overwrite dout.
  cudaError_t e = layernorm_param_grads(dout, SavedInput{ln_in, h}, mean, rstd, nullptr, rows, h,
                                        dgamma, dbeta, partial, s);
  if (e != cudaSuccess) return e;
  residual_ln_backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
      l, dout, ln_in, mean, rstd, gamma, ds, h, dx, dresidual);
  if ((e = launched()) != cudaSuccess) return e;
  if (dbias) return add_column_sums(dx, rows, h, h, partial, dbias, s);
  return cudaSuccess;
}

}  // namespace packbert::cuda
