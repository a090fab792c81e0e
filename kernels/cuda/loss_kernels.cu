// Softmax cross-entropy over rows of logits: one block per row for its loss, its argmax and the
// logits' gradient, then one block that adds the rows' results in row order.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_util.cuh"

namespace packbert::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; three passes over the row (argmax, sum of exp, gradient).
// A label of -1 leaves its row out: no loss, not correct, dlogits 0. The gradient's factor is
// *grad_scale_ptr when given (read when the kernel runs: a graph replays the step's), else
// grad_scale.
__global__ void softmax_xent_kernel(const float* logits, const int32_t* labels, int64_t v,
                                    float grad_scale, const float* grad_scale_ptr, float* dlogits,
                                    double* row_loss, double* row_correct) {
  __shared__ float best_val[kThreads];
  __shared__ int64_t best_idx[kThreads];
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * v;
  const int tid = threadIdx.x;
  const int32_t label = labels[row];
  if (label < 0) {  // the whole block takes this branch
    if (dlogits)
      for (int64_t c = tid; c < v; c += blockDim.x) dlogits[row * v + c] = 0.f;
    if (tid == 0) row_loss[row] = row_correct[row] = 0.0;
    return;
  }
  if (grad_scale_ptr) grad_scale = *grad_scale_ptr;
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

__global__ void nsp_slots_kernel(const int32_t* seq_start, const int32_t* seq_len,
                                 const int32_t* labels, int64_t s, int32_t* cls_row,
                                 int32_t* slot_label) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < s;
       i += int64_t{gridDim.x} * blockDim.x) {
    const bool empty = seq_len[i] == 0;
    cls_row[i] = empty ? -1 : seq_start[i];
    slot_label[i] = empty ? -1 : labels[i];
  }
}

}  // namespace

cudaError_t nsp_slots(const int32_t* seq_start, const int32_t* seq_len, const int32_t* labels,
                      int64_t s, int32_t* cls_row, int32_t* slot_label, cudaStream_t st) {
  if (s == 0) return cudaSuccess;
  PB_LAUNCH(grid_for(s, kThreads), kThreads, 0, st, nsp_slots_kernel)(seq_start, seq_len, labels, s,
                                                                      cls_row, slot_label);
  return launched();
}

cudaError_t softmax_cross_entropy(const float* logits, const int32_t* labels, int64_t m, int64_t v,
                                  float grad_scale, const float* grad_scale_ptr, float* dlogits,
                                  double* row_loss, double* row_correct, float* loss_sum,
                                  int32_t* num_correct, cudaStream_t s) {
  if (m == 0) return cudaSuccess;
  PB_LAUNCH(static_cast<unsigned>(m), kThreads, 0, s, softmax_xent_kernel)(
      logits, labels, v, grad_scale, grad_scale_ptr, dlogits, row_loss, row_correct);
  cudaError_t e = launched();
  if (e != cudaSuccess) return e;
  PB_LAUNCH(1, kThreads, 0, s, softmax_xent_finish_kernel)(row_loss, row_correct, m, loss_sum,
                                                           num_correct);
  return launched();
}

}  // namespace packbert::cuda
