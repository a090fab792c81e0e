// The reference backend: fp32, OpenBLAS for GEMMs, OpenMP loops for the rest. bf16 / f16
// tensors (mixed precision) are emulated: widened, run through the fp32 op, rounded back to
// nearest even (cpu_lowp.h), so the CPU also specifies what low-precision storage computes. It is the
// executable specification the CUDA backend is tested against, so clarity and determinism come
// before speed: every reduction runs in a fixed order that does not depend on the thread count
// (row-wise sums inside one row, column sums over rows in row order, long sums in fixed blocks).
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_lowp.h"

namespace packbert {

namespace cpu {
// Threads for OpenMP loops and OpenBLAS alike (multi-rank runs use 1 per rank).
void set_num_threads(int n);
int num_threads();
}  // namespace cpu

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }

  void* allocate_memory(size_t bytes) override;
  void free_memory(void* p) override;

  void zero(const Tensor& t) override;
  void copy(const Tensor& dst, const Tensor& src) override;

  void embedding_forward(const SeqLayout& layout, const Tensor& input_ids,
                         const Tensor& segment_ids, const EmbeddingParams& params,
                         const Dropout& dropout, const Tensor& out, const Tensor& ln_mean,
                         const Tensor& ln_rstd) override;
  void embedding_backward(const SeqLayout& layout, const Tensor& input_ids,
                          const Tensor& segment_ids, const EmbeddingParams& params,
                          const Dropout& dropout, const Tensor& ln_mean, const Tensor& ln_rstd,
                          const Tensor& dout, const EmbeddingParams& grads) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Epilogue epilogue,
                      const Tensor& out, const Tensor& pre) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                       const Tensor& dw, const Tensor& db,
                       const LinearBackwardOptions& options) override;

  void residual_layernorm_forward(const SeqLayout& layout, const Tensor& x, const Tensor& bias,
                                  const Tensor& residual, const LayerNormParams& ln,
                                  const Dropout& dropout, const Tensor& out, const Tensor& ln_in,
                                  const Tensor& ln_mean, const Tensor& ln_rstd) override;
  void residual_layernorm_backward(const SeqLayout& layout, const Tensor& dout,
                                   const Tensor& ln_in, const Tensor& ln_mean,
                                   const Tensor& ln_rstd, const LayerNormParams& ln,
                                   const Dropout& dropout, const Tensor& dx,
                                   const Tensor& dresidual, const Tensor& dbias,
                                   const LayerNormParams& dln) override;

  void attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                         const Dropout& dropout, const Tensor& out, const Tensor& lse) override;
  void attention_backward(const SeqLayout& layout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, int num_heads,
                          const Dropout& dropout, const Tensor& dqkv) override;

  void gather_rows(const Tensor& x, const Tensor& index, const Tensor& out) override;
  void gather_rows_backward(const Tensor& dout, const Tensor& index, const Tensor& dx) override;

  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const GradScale& grad_scale,
                             const Tensor& loss_sum, const Tensor& num_correct,
                             const Tensor& dlogits) override;
  void mlm_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                const GradScale& grad_scale, const Tensor& logits_ws, const Tensor& loss_sum,
                const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                const Tensor& db) override;
  void nsp_loss(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                const Tensor& labels, const GradScale& grad_scale, const Tensor& workspace,
                const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                const PoolerParams& grads) override;

  void l2_norm(const Tensor& x, const Tensor& out) override;
  void sum_squares(const Tensor& x, const Tensor& out) override;
  void norm_from_sum_squares(const Tensor& sum, const Tensor& out) override;
  void lamb_update(const Tensor& table, const LambConfig& config,
                   const Tensor& global_grad_norm, const Tensor& params, const Tensor& grads,
                   const Tensor& m, const Tensor& v, const Tensor& sums,
                   const Tensor& record = Tensor()) override;
  void lamb_apply(const Tensor& table, const LambConfig& config, const Tensor& global_grad_norm,
                  const Tensor& sums, const Tensor& params, const Tensor& grads,
                  const Tensor& params_lowp = Tensor(), const Tensor& norms_ws = Tensor()) override;
  void convert(const Tensor& dst, const Tensor& src) override;

  void fp8_cast(const Tensor& src, const Tensor& rows, const Tensor& scale, const Tensor& amax,
                const Tensor& out, const Tensor& out_t) override;
  void fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                const Tensor& out, const Fp8GemmOptions& options) override;
  void fp8_amax_share(const Tensor& amax, int rank, const Tensor& shared) override;
  void fp8_scale_update(const Tensor& shared, const Tensor& fp8_max, int margin,
                        const Tensor& history, const Tensor& scales, const Tensor& amax) override;

 private:
  // Grow-only scratch, the documented exception to "the caller provides every buffer": one
  // float buffer per OpenMP thread (attention score rows and dK/dV accumulators, sized by the
  // longest sequence) and one double buffer for fixed-order reductions. Warm after the first
  // step of the largest shape, so the step loop does not allocate.
  float* thread_scratch(int thread, size_t floats);
  void reserve_thread_scratch(size_t floats);
  double* reduction_scratch(size_t doubles);
  double sum_squares(const float* x, int64_t n);
  // The sequences of a layout by decreasing length (ties: by index), the attention ops' task
  // order; grow-only.
  const int32_t* longest_first(const SeqLayout& layout);
  // lamb_update / lamb_apply's grow-only tables: the first work item of each row, each row's
  // step size.
  int64_t* lamb_blocks(int64_t num_tensors);
  float* lamb_step_sizes(int64_t num_tensors);

  std::vector<std::vector<float>> thread_scratch_;
  std::vector<double> reduction_scratch_;
  std::vector<int32_t> seq_order_;
  std::vector<int64_t> lamb_blocks_;
  std::vector<float> lamb_step_sizes_;
  // fp8_gemm's de-scaled operands (and its fp32 outputs when out is 16-bit); grow-only.
  std::vector<float> fp8_scratch_;
  // Ops called with bf16 / f16 tensors run through this (cpu_lowp.h).
  cpu::LowpStaging lowp_;
};

}  // namespace packbert
