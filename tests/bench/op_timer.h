// A Backend that forwards every op to another backend and adds its wall time to one of a few
// kinds, for the benchmarks' step-time split (where a step's time goes: the GEMMs, attention,
// the fused LayerNorm / dropout / embedding kernels, the MLM decoder with its loss, the
// optimizer). It changes no result: every call goes through unchanged, in the same order.
//
// Timing an op needs its end: `sync` is called before and after each op (for the CUDA backend,
// cuda_synchronize, which waits for the stream; nothing for the CPU, whose ops return when
// done). The synchronisation costs each op its launch latency and removes the overlap between
// ops, so the split is of a serialised step and its total is a little above a free-running one:
// the benchmarks print both.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "kernels/backend.h"

namespace packbert::bench {

enum class OpKind { gemm, attention, fused, mlm, nsp, optimizer, memory, count };

inline const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::gemm: return "GEMM";
    case OpKind::attention: return "attention";
    case OpKind::fused: return "LN/dropout/embed";
    case OpKind::mlm: return "MLM decoder+loss";
    case OpKind::nsp: return "pooler+NSP";
    case OpKind::optimizer: return "LAMB+norm";
    case OpKind::memory: return "copy/zero/gather";
    case OpKind::count: break;
  }
  return "?";
}

class TimedBackend final : public Backend {
 public:
  using Seconds = std::array<double, static_cast<size_t>(OpKind::count)>;

  TimedBackend(Backend& inner, std::function<void()> sync)
      : inner_(inner), sync_(std::move(sync)) {
    reset();
  }

  // Disabled: every op goes straight through, with neither synchronisation nor timing.
  void set_enabled(bool on) { enabled_ = on; }

  void reset() {
    seconds_.fill(0.0);
    calls_.fill(0);
  }
  const Seconds& seconds() const { return seconds_; }
  double total() const {
    double t = 0;
    for (double s : seconds_) t += s;
    return t;
  }
  int64_t calls(OpKind k) const { return calls_[static_cast<size_t>(k)]; }

  const char* name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  void* allocate_memory(size_t bytes) override { return inner_.allocate_memory(bytes); }
  void free_memory(void* p) override { inner_.free_memory(p); }
  void synchronize() override { inner_.synchronize(); }
  void* native_stream() const override { return inner_.native_stream(); }

  void write_floats(const Tensor& dst, const float* values, int n) override {
    inner_.write_floats(dst, values, n);
  }
  void zero(const Tensor& t) override {
    timed(OpKind::memory, [&] { inner_.zero(t); });
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    timed(OpKind::memory, [&] { inner_.copy(dst, src); });
  }
  void convert(const Tensor& dst, const Tensor& src) override {
    timed(OpKind::memory, [&] { inner_.convert(dst, src); });
  }
  void fp8_cast(const Tensor& src, const Tensor& rows, const Tensor& scale, const Tensor& amax,
                const Tensor& out, const Tensor& out_t) override {
    timed(OpKind::memory, [&] { inner_.fp8_cast(src, rows, scale, amax, out, out_t); });
  }
  void fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                const Tensor& out, const Fp8GemmOptions& options) override {
    timed(OpKind::gemm, [&] { inner_.fp8_gemm(a, a_scale, b, b_scale, out, options); });
  }
  void fp8_amax_share(const Tensor& amax, int rank, const Tensor& shared) override {
    timed(OpKind::optimizer, [&] { inner_.fp8_amax_share(amax, rank, shared); });
  }
  void fp8_scale_update(const Tensor& shared, const Tensor& fp8_max, int margin,
                        const Tensor& history, const Tensor& scales, const Tensor& amax) override {
    timed(OpKind::optimizer,
          [&] { inner_.fp8_scale_update(shared, fp8_max, margin, history, scales, amax); });
  }
  void embedding_forward(const SeqLayout& layout, const Tensor& input_ids,
                         const Tensor& segment_ids, const EmbeddingParams& params,
                         const Dropout& dropout, const Tensor& out, const Tensor& ln_mean,
                         const Tensor& ln_rstd) override {
    timed(OpKind::fused, [&] {
      inner_.embedding_forward(layout, input_ids, segment_ids, params, dropout, out, ln_mean,
                               ln_rstd);
    });
  }
  void embedding_backward(const SeqLayout& layout, const Tensor& input_ids,
                          const Tensor& segment_ids, const EmbeddingParams& params,
                          const Dropout& dropout, const Tensor& ln_mean, const Tensor& ln_rstd,
                          const Tensor& dout, const EmbeddingParams& grads) override {
    timed(OpKind::fused, [&] {
      inner_.embedding_backward(layout, input_ids, segment_ids, params, dropout, ln_mean,
                                ln_rstd, dout, grads);
    });
  }
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Epilogue epilogue,
                      const Tensor& out, const Tensor& pre) override {
    timed(OpKind::gemm, [&] { inner_.linear_forward(x, w, bias, epilogue, out, pre); });
  }
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout, const Tensor& dx,
                       const Tensor& dw, const Tensor& db,
                       const LinearBackwardOptions& options) override {
    timed(OpKind::gemm, [&] { inner_.linear_backward(x, w, dout, dx, dw, db, options); });
  }
  void residual_layernorm_forward(const SeqLayout& layout, const Tensor& x, const Tensor& bias,
                                  const Tensor& residual, const LayerNormParams& ln,
                                  const Dropout& dropout, const Tensor& out, const Tensor& ln_in,
                                  const Tensor& ln_mean, const Tensor& ln_rstd) override {
    timed(OpKind::fused, [&] {
      inner_.residual_layernorm_forward(layout, x, bias, residual, ln, dropout, out, ln_in,
                                        ln_mean, ln_rstd);
    });
  }
  void residual_layernorm_backward(const SeqLayout& layout, const Tensor& dout,
                                   const Tensor& ln_in, const Tensor& ln_mean,
                                   const Tensor& ln_rstd, const LayerNormParams& ln,
                                   const Dropout& dropout, const Tensor& dx,
                                   const Tensor& dresidual, const Tensor& dbias,
                                   const LayerNormParams& dln) override {
    timed(OpKind::fused, [&] {
      inner_.residual_layernorm_backward(layout, dout, ln_in, ln_mean, ln_rstd, ln, dropout, dx,
                                         dresidual, dbias, dln);
    });
  }
  void attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                         const Dropout& dropout, const Tensor& out, const Tensor& lse) override {
    timed(OpKind::attention,
          [&] { inner_.attention_forward(layout, qkv, num_heads, dropout, out, lse); });
  }
  void attention_backward(const SeqLayout& layout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, int num_heads,
                          const Dropout& dropout, const Tensor& dqkv) override {
    timed(OpKind::attention, [&] {
      inner_.attention_backward(layout, qkv, out, lse, dout, num_heads, dropout, dqkv);
    });
  }
  void gather_rows(const Tensor& x, const Tensor& index, const Tensor& out) override {
    timed(OpKind::memory, [&] { inner_.gather_rows(x, index, out); });
  }
  void gather_rows_backward(const Tensor& dout, const Tensor& index, const Tensor& dx) override {
    timed(OpKind::memory, [&] { inner_.gather_rows_backward(dout, index, dx); });
  }
  void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const GradScale& grad_scale,
                             const Tensor& loss_sum, const Tensor& num_correct,
                             const Tensor& dlogits) override {
    timed(OpKind::mlm, [&] {
      inner_.softmax_cross_entropy(logits, labels, grad_scale, loss_sum, num_correct, dlogits);
    });
  }
  void mlm_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                const GradScale& grad_scale, const Tensor& logits_ws, const Tensor& loss_sum,
                const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                const Tensor& db) override {
    timed(OpKind::mlm, [&] {
      inner_.mlm_loss(x, w, b, labels, grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db);
    });
  }
  void nsp_loss(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                const Tensor& labels, const GradScale& grad_scale, const Tensor& workspace,
                const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                const PoolerParams& grads) override {
    timed(OpKind::nsp, [&] {
      inner_.nsp_loss(layout, x, params, labels, grad_scale, workspace, loss_sum, num_correct,
                      dx, grads);
    });
  }
  void l2_norm(const Tensor& x, const Tensor& out) override {
    timed(OpKind::optimizer, [&] { inner_.l2_norm(x, out); });
  }
  void sum_squares(const Tensor& x, const Tensor& out) override {
    timed(OpKind::optimizer, [&] { inner_.sum_squares(x, out); });
  }
  void norm_from_sum_squares(const Tensor& sum, const Tensor& out) override {
    timed(OpKind::optimizer, [&] { inner_.norm_from_sum_squares(sum, out); });
  }
  void lamb_update(const Tensor& table, const LambConfig& config,
                   const Tensor& global_grad_norm, const Tensor& params, const Tensor& grads,
                   const Tensor& m, const Tensor& v, const Tensor& sums,
                   const Tensor& record) override {
    timed(OpKind::optimizer, [&] {
      inner_.lamb_update(table, config, global_grad_norm, params, grads, m, v, sums, record);
    });
  }
  void lamb_apply(const Tensor& table, const LambConfig& config, const Tensor& global_grad_norm,
                  const Tensor& sums, const Tensor& params, const Tensor& grads,
                  const Tensor& params_lowp, const Tensor& norms_ws) override {
    timed(OpKind::optimizer, [&] {
      inner_.lamb_apply(table, config, global_grad_norm, sums, params, grads, params_lowp,
                        norms_ws);
    });
  }

 private:
  template <typename F>
  void timed(OpKind kind, F&& op) {
    if (!enabled_) {
      op();
      return;
    }
    if (sync_) sync_();
    const auto t0 = std::chrono::steady_clock::now();
    op();
    if (sync_) sync_();
    seconds_[static_cast<size_t>(kind)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls_[static_cast<size_t>(kind)];
  }

  Backend& inner_;
  std::function<void()> sync_;
  bool enabled_ = true;
  Seconds seconds_{};
  std::array<int64_t, static_cast<size_t>(OpKind::count)> calls_{};
};

}  // namespace packbert::bench
