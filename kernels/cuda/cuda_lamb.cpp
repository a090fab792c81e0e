// CudaBackend's optimizer ops: the L2 norm and sums of squares, and LAMB's two passes
// (lamb_kernels.cu, reduce_kernels.cu).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/op_checks.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/lamb.h"

namespace packbert {

// ---- optimizer -------------------------------------------------------------------------------
void CudaBackend::l2_norm(const Tensor& x, const Tensor& out) {
  const trace::Range range("l2_norm");
  sum_of_squares("l2_norm", x, out);
}

void CudaBackend::sum_squares(const Tensor& x, const Tensor& out) {
  const trace::Range range("sum_squares");
  sum_of_squares("sum_squares", x, out);
}

void CudaBackend::norm_from_sum_squares(const Tensor& sum, const Tensor& out) {
  const char* op = "norm_from_sum_squares";
  expect(op, "sum", sum, DType::f64, {1});
  expect(op, "out", out, DType::f32, {1});
  begin(op);
  launched(op, op, cuda::root_of_sums(sum.ptr<double>(), 1, out.ptr<float>(), stream_));
  end(op);
}

// l2_norm (out f32: the root) and sum_squares (out f64: the sum) share one reduction.
void CudaBackend::sum_of_squares(const char* op, const Tensor& x, const Tensor& out) {
  const bool root = out.dtype != DType::f64;
  expect(op, "x", x, DType::f32, {kAnyDim});
  expect(op, "out", out, root ? DType::f32 : DType::f64, {1});
  const int64_t n = x.dim(0);
  PB_REQUIRE(cuda::l2_norm_partials(n) <= 0x7fffffff, "{}: {} elements exceed the grid", op, n);
  begin(op);
  double* partial = scratch_doubles(op, static_cast<size_t>(cuda::l2_norm_partials(n)));
  launched(op, op,
           cuda::sum_of_squares(n ? x.ptr<float>() : nullptr, n, partial,
                                root ? out.ptr<float>() : nullptr,
                                root ? nullptr : out.ptr<double>(), stream_));
  end(op);
}

const char* CudaBackend::lamb_work(const char* op, const LambTensor* entries, int64_t num_tensors,
                                   float weight_decay) {
  const bool same_work =
      lamb_work_ && weight_decay == lamb_weight_decay_ &&
      lamb_rows_.size() == static_cast<size_t>(num_tensors) &&
      std::equal(lamb_rows_.begin(), lamb_rows_.end(), entries,
                 [](const LambTensor& x, const LambTensor& y) {
                   return x.offset == y.offset && x.size == y.size && x.decay == y.decay;
                 });
  if (same_work) return static_cast<const char*>(lamb_work_);
  // A new table (the first step): the chunk list and the per-row ranges, uploaded once.
  std::vector<cuda::LambChunk> chunks;
  std::vector<cuda::LambTensorRange> ranges;
  for (int64_t t = 0; t < num_tensors; ++t) {
    const LambTensor& e = entries[t];
    cuda::LambTensorRange r;
    r.first_chunk = static_cast<int64_t>(chunks.size());
    for (int64_t b = e.offset; b < e.offset + e.size; b += cuda::kNormChunk)
      chunks.push_back({t, b, std::min(e.offset + e.size, b + cuda::kNormChunk)});
    r.chunks = static_cast<int64_t>(chunks.size()) - r.first_chunk;
    r.decay = e.decay == 1 ? weight_decay : 0.f;
    // apex applies the trust ratio only where weight decay is non-zero (use_nvlamb = false).
    r.adapt = e.decay == 1 && weight_decay != 0.f;
    r.size = e.size;
    ranges.push_back(r);
  }
  PB_REQUIRE(chunks.size() <= 0x7fffffff, "{}: {} chunks exceed the grid", op, chunks.size());
  const size_t chunk_bytes = chunks.size() * sizeof(cuda::LambChunk);
  const size_t range_at = (chunk_bytes + 255) / 256 * 256;
  const size_t bytes =
      range_at + std::max<size_t>(ranges.size(), 1) * sizeof(cuda::LambTensorRange);
  // The previous list may still be read by a launch in flight: wait before replacing it.
  PB_CUDA_OP(op, cuda::stream_synchronize(stream_));
  if (bytes > lamb_work_bytes_) {
    PB_CUDA_OP(op, cuda::device_free(lamb_work_));
    lamb_work_ = nullptr;
    lamb_work_bytes_ = 0;
    lamb_work_ = cuda_alloc_named(op, "work list", bytes, planned_note());
    lamb_work_bytes_ = bytes;
  }
  char* w = static_cast<char*>(lamb_work_);
  if (chunk_bytes)
    PB_CUDA_OP(op, cuda::memcpy_sync(w, chunks.data(), chunk_bytes, cudaMemcpyHostToDevice));
  if (!ranges.empty())
    PB_CUDA_OP(op, cuda::memcpy_sync(w + range_at, ranges.data(),
                                     ranges.size() * sizeof(cuda::LambTensorRange),
                                     cudaMemcpyHostToDevice));
  lamb_rows_.assign(entries, entries + num_tensors);
  lamb_weight_decay_ = weight_decay;
  lamb_range_at_ = range_at;
  lamb_num_chunks_ = static_cast<int64_t>(chunks.size());
  return w;
}

void CudaBackend::lamb_update(const Tensor& table, const LambConfig& cfg,
                              const Tensor& global_grad_norm, const Tensor& params,
                              const Tensor& grads, const Tensor& m, const Tensor& v,
                              const Tensor& sums, const Tensor& record) {
  const trace::Range range("lamb_update");
  const char* op = "lamb_update";
  const auto [num_tensors, n] =
      checks::lamb_update_args(checks::OpArgs(op, Device::cuda, pointer_check()), table, cfg,
                               global_grad_norm, params, grads, m, v, sums, record);
  begin(op);
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  const char* ws = lamb_work(op, entries, num_tensors, cfg.weight_decay);
  const int64_t num_chunks = lamb_num_chunks_;
  // As the CPU backend: the bias corrections in double, then rounded (lamb_step_scalars); the
  // kernels read them from step_scalars instead when it is given.
  const LambStepScalars sc = lamb_step_scalars(cfg);
  cuda::LambArgs a;
  a.rule = static_cast<int32_t>(cfg.rule);
  a.lr = sc.lr;
  a.beta1 = cfg.beta1;
  a.beta2 = cfg.beta2;
  a.beta3 = 1.0f - cfg.beta1;
  a.bias_correction1 = sc.bias_correction1;
  a.bias_correction2 = sc.bias_correction2;
  a.eps = cfg.eps;
  a.max_grad_norm = cfg.max_grad_norm;
  a.grad_scale = sc.grad_scale;
  a.step_scalars = cfg.step_scalars.defined() ? cfg.step_scalars.ptr<float>() : nullptr;
  double* partial = scratch_doubles(op, static_cast<size_t>(std::max<int64_t>(num_chunks, 1)));
  launched(op, op,
           cuda::lamb_update(reinterpret_cast<const cuda::LambChunk*>(ws), num_chunks,
                             reinterpret_cast<const cuda::LambTensorRange*>(ws + lamb_range_at_),
                             num_tensors, a, global_grad_norm.ptr<float>(),
                             n ? params.ptr<float>() : nullptr, n ? grads.ptr<float>() : nullptr,
                             n ? m.ptr<float>() : nullptr, n ? v.ptr<float>() : nullptr,
                             num_tensors ? sums.ptr<double>() : nullptr, partial,
                             record.defined() ? record.ptr<int32_t>() : nullptr, stream_));
  end(op);
}

void CudaBackend::lamb_apply(const Tensor& table, const LambConfig& cfg,
                             const Tensor& global_grad_norm, const Tensor& sums,
                             const Tensor& params, const Tensor& grads, const Tensor& params_lowp,
                             const Tensor& norms_ws) {
  const trace::Range range("lamb_apply");
  const char* op = "lamb_apply";
  const auto [num_tensors, n] =
      checks::lamb_apply_args(checks::OpArgs(op, Device::cuda, pointer_check()), table, cfg,
                              global_grad_norm, sums, params, grads, norms_ws);
  cuda::FloatFormat lowp_format = cuda::FloatFormat::f32;
  if (params_lowp.defined()) {
    PB_REQUIRE(lowp::is_lowp(params_lowp.dtype), "{}: params_lowp is {}, expected bf16 or f16", op,
               params_lowp.str());
    expect(op, "params_lowp", params_lowp, params_lowp.dtype, {n});
    lowp_format = float_format(op, "params_lowp", params_lowp);
  }
  begin(op);
  const auto* entries = static_cast<const LambTensor*>(table.data);
  checks::check_lamb_table(op, entries, num_tensors, n);
  if (num_tensors == 0) return end(op);
  const char* ws = lamb_work(op, entries, num_tensors, cfg.weight_decay);
  launched(op, op,
           cuda::lamb_apply(reinterpret_cast<const cuda::LambChunk*>(ws), lamb_num_chunks_,
                            reinterpret_cast<const cuda::LambTensorRange*>(ws + lamb_range_at_),
                            num_tensors, static_cast<int32_t>(cfg.rule), cfg.lr, cfg.grad_scale,
                            cfg.step_scalars.defined() ? cfg.step_scalars.ptr<float>() : nullptr,
                            global_grad_norm.ptr<float>(), sums.ptr<double>(),
                            n ? params.ptr<float>() : nullptr, n ? grads.ptr<float>() : nullptr,
                            n && params_lowp.defined() ? params_lowp.data : nullptr, lowp_format,
                            norms_ws.defined() ? norms_ws.ptr<float>() : nullptr, stream_));
  end(op);
}

}  // namespace packbert
