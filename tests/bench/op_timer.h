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
#include <string_view>
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

// The kind an op's time goes to: `family`, its family's, but for the ops whose time belongs
// elsewhere (a gather is a copy, the NSP head has its own kind, FP8's cast is a copy and its GEMM
// a GEMM). A new op takes its family's kind without a line here.
constexpr OpKind op_kind(std::string_view op, OpKind family) {
  return op == "gather_rows" || op == "gather_rows_backward" || op == "fp8_cast" ? OpKind::memory
         : op == "nsp_loss"                                                      ? OpKind::nsp
         : op == "fp8_gemm"                                                      ? OpKind::gemm
                                                                                 : family;
}

class TimedBackend final : public Backend {
 public:
  using Seconds = std::array<double, static_cast<size_t>(OpKind::count)>;

  TimedBackend(Backend& inner, std::function<void()> sync) : inner_(inner), sync_(std::move(sync)) {
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
  // Every op (kernels/backend.h, PACKBERT_BACKEND_OPS), family by family, each timed to its
  // kind: its family's (the macro's) unless op_kind names another.
#define PACKBERT_TIMED_OP(family, name, params, args)                                              \
  void name params override {                                                                      \
    constexpr OpKind kKind = op_kind(#name, family);                                               \
    timed(kKind, [&] { inner_.name args; });                                                       \
  }
#define PACKBERT_TIMED_MEMORY(name, params, args)                                                  \
  PACKBERT_TIMED_OP(OpKind::memory, name, params, args)
#define PACKBERT_TIMED_FUSED(name, params, args)                                                   \
  PACKBERT_TIMED_OP(OpKind::fused, name, params, args)
#define PACKBERT_TIMED_GEMM(name, params, args) PACKBERT_TIMED_OP(OpKind::gemm, name, params, args)
#define PACKBERT_TIMED_ATTENTION(name, params, args)                                               \
  PACKBERT_TIMED_OP(OpKind::attention, name, params, args)
#define PACKBERT_TIMED_MLM(name, params, args) PACKBERT_TIMED_OP(OpKind::mlm, name, params, args)
#define PACKBERT_TIMED_OPTIMIZER(name, params, args)                                               \
  PACKBERT_TIMED_OP(OpKind::optimizer, name, params, args)
  PACKBERT_MEMORY_OPS(PACKBERT_TIMED_MEMORY)
  PACKBERT_EMBEDDING_OPS(PACKBERT_TIMED_FUSED)
  PACKBERT_LINEAR_OPS(PACKBERT_TIMED_GEMM)
  PACKBERT_LAYERNORM_OPS(PACKBERT_TIMED_FUSED)
  PACKBERT_ATTENTION_OPS(PACKBERT_TIMED_ATTENTION)
  PACKBERT_LOSS_OPS(PACKBERT_TIMED_MLM)
  PACKBERT_LAMB_OPS(PACKBERT_TIMED_OPTIMIZER)
  PACKBERT_CONVERT_OPS(PACKBERT_TIMED_MEMORY)
  PACKBERT_FP8_OPS(PACKBERT_TIMED_OPTIMIZER)
  PACKBERT_ROTARY_OPS(PACKBERT_TIMED_ATTENTION)
  PACKBERT_GLU_OPS(PACKBERT_TIMED_FUSED)
#undef PACKBERT_TIMED_OPTIMIZER
#undef PACKBERT_TIMED_MLM
#undef PACKBERT_TIMED_ATTENTION
#undef PACKBERT_TIMED_GEMM
#undef PACKBERT_TIMED_FUSED
#undef PACKBERT_TIMED_MEMORY
#undef PACKBERT_TIMED_OP

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
