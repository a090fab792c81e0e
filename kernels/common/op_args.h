// The argument part of the op contracts of kernels/backend.h, shared by every backend: dtypes,
// extents, which optional tensors go together, aliasing. A backend passes an OpArgs that knows
// its device (and any check of its own, such as the CUDA backend's pointer check), so both
// backends reject the same calls with the same messages. Contents (indices, layouts) are
// checked by common/op_checks.h.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <utility>

#include "kernels/backend.h"
#include "kernels/common/op_checks.h"
#include "kernels/base/error.h"
#include "kernels/base/tensor.h"

namespace packbert::checks {

class OpArgs {
 public:
  using Extra = std::function<void(const char* op, const char* name, const Tensor& t)>;
  OpArgs(const char* op, Device device, Extra extra = {})
      : op(op), device_(device), extra_(std::move(extra)) {}

  // A required tensor with this dtype and dims (kAnyDim = any) on the backend's device.
  void operator()(const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> dims) const {
    check_tensor(op, name, t, dtype, dims);
    check_device(op, name, t, device_);
    if (extra_) extra_(op, name, t);
  }
  // The same when t is defined; a "none" view passes.
  void optional(const char* name, const Tensor& t, DType dtype,
                std::initializer_list<int64_t> dims) const {
    if (t.defined()) (*this)(name, t, dtype, dims);
  }

  const char* op;

 private:
  Device device_;
  Extra extra_;
};

struct EmbeddingDims {
  int64_t rows = 0, vocab = 0, h = 0;
};
struct RowDims {
  int64_t rows = 0, h = 0;
};

inline EmbeddingDims embedding_forward_args(const OpArgs& a, const SeqLayout& layout,
                                            const Tensor& input_ids, const Tensor& segment_ids,
                                            const EmbeddingParams& p, const Tensor& out,
                                            const Tensor& ln_mean, const Tensor& ln_rstd) {
  const int64_t rows = layout.rows;
  a("word", p.word, DType::f32, {kAnyDim, kAnyDim});
  const int64_t vocab = p.word.dim(0), h = p.word.dim(1);
  a("position", p.position, DType::f32, {kAnyDim, h});
  a("token_type", p.token_type, DType::f32, {kAnyDim, h});
  a("ln_gamma", p.ln_gamma, DType::f32, {h});
  a("ln_beta", p.ln_beta, DType::f32, {h});
  a("input_ids", input_ids, DType::i32, {rows});
  a("segment_ids", segment_ids, DType::i32, {rows});
  a("out", out, DType::f32, {rows, h});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  return {rows, vocab, h};
}

inline RowDims embedding_backward_args(const OpArgs& a, const SeqLayout& layout,
                                             const Tensor& input_ids, const Tensor& segment_ids,
                                             const EmbeddingParams& p, const Tensor& ln_mean,
                                             const Tensor& ln_rstd, const Tensor& dout,
                                             const EmbeddingParams& grads) {
  const int64_t rows = layout.rows;
  a("word", p.word, DType::f32, {kAnyDim, kAnyDim});
  const int64_t h = p.word.dim(1);
  a("position", p.position, DType::f32, {kAnyDim, h});
  a("token_type", p.token_type, DType::f32, {kAnyDim, h});
  a("ln_gamma", p.ln_gamma, DType::f32, {h});
  a("input_ids", input_ids, DType::i32, {rows});
  a("segment_ids", segment_ids, DType::i32, {rows});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  a("dout", dout, DType::f32, {rows, h});
  a.optional("grads.word", grads.word, DType::f32, {p.word.dim(0), h});
  a.optional("grads.position", grads.position, DType::f32, {p.position.dim(0), h});
  a.optional("grads.token_type", grads.token_type, DType::f32, {p.token_type.dim(0), h});
  a.optional("grads.ln_gamma", grads.ln_gamma, DType::f32, {h});
  a.optional("grads.ln_beta", grads.ln_beta, DType::f32, {h});
  return {rows, h};
}

inline RowDims residual_layernorm_forward_args(const OpArgs& a, const Tensor& x,
                                               const Tensor& bias, const Tensor& residual,
                                               const LayerNormParams& ln, const Tensor& out,
                                               const Tensor& ln_in, const Tensor& ln_mean,
                                               const Tensor& ln_rstd) {
  a("x", x, DType::f32, {kAnyDim, kAnyDim});
  const int64_t rows = x.dim(0), h = x.dim(1);
  a.optional("bias", bias, DType::f32, {h});
  a.optional("residual", residual, DType::f32, {rows, h});
  a("ln.gamma", ln.gamma, DType::f32, {h});
  a("ln.beta", ln.beta, DType::f32, {h});
  a("out", out, DType::f32, {rows, h});
  a("ln_in", ln_in, DType::f32, {rows, h});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  PB_REQUIRE(out.data != ln_in.data && out.data != x.data, "{}: out may not alias x or ln_in",
             a.op);
  return {rows, h};
}

inline RowDims residual_layernorm_backward_args(const OpArgs& a, const Tensor& dout,
                                                const Tensor& ln_in, const Tensor& ln_mean,
                                                const Tensor& ln_rstd, const LayerNormParams& ln,
                                                const Tensor& dx, const Tensor& dresidual,
                                                const Tensor& dbias,
                                                const LayerNormParams& dln) {
  a("dout", dout, DType::f32, {kAnyDim, kAnyDim});
  const int64_t rows = dout.dim(0), h = dout.dim(1);
  a("ln_in", ln_in, DType::f32, {rows, h});
  a("ln_mean", ln_mean, DType::f32, {rows});
  a("ln_rstd", ln_rstd, DType::f32, {rows});
  a("ln.gamma", ln.gamma, DType::f32, {h});
  a("dx", dx, DType::f32, {rows, h});
  a.optional("dresidual", dresidual, DType::f32, {rows, h});
  a.optional("dbias", dbias, DType::f32, {h});
  a.optional("dln.gamma", dln.gamma, DType::f32, {h});
  a.optional("dln.beta", dln.beta, DType::f32, {h});
  PB_REQUIRE(dx.data != dout.data, "{}: dx may not alias dout (dresidual may)", a.op);
  return {rows, h};
}

// out [n, m] = x [n, k] w [m, k]^T (+ epilogue).
struct GemmDims {
  int64_t n = 0, k = 0, m = 0;
};

inline GemmDims linear_forward_args(const OpArgs& a, const Tensor& x, const Tensor& w,
                                    const Tensor& bias, Epilogue epilogue, const Tensor& out,
                                    const Tensor& pre) {
  a("x", x, DType::f32, {kAnyDim, kAnyDim});
  a("w", w, DType::f32, {kAnyDim, x.dim(1)});
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  a("out", out, DType::f32, {n, m});
  if (epilogue == Epilogue::none) {
    PB_REQUIRE(!bias.defined(), "{}: bias given with Epilogue::none", a.op);
  } else {
    a("bias", bias, DType::f32, {m});
  }
  if (has_gelu(epilogue)) {
    a("pre", pre, DType::f32, {n, m});
  } else {
    PB_REQUIRE(!pre.defined(), "{}: pre is only written by the GELU epilogues", a.op);
  }
  return {n, k, m};
}

inline GemmDims linear_backward_args(const OpArgs& a, const Tensor& x, const Tensor& w,
                                     const Tensor& dout, const Tensor& dx, const Tensor& dw,
                                     const Tensor& db, const LinearBackwardOptions& opt) {
  a("w", w, DType::f32, {kAnyDim, kAnyDim});
  const int64_t m = w.dim(0), k = w.dim(1);
  a("dout", dout, DType::f32, {kAnyDim, m});
  const int64_t n = dout.dim(0);
  PB_REQUIRE(x.defined() || !dw.defined(), "{}: dw needs the forward input x", a.op);
  a.optional("x", x, DType::f32, {n, k});
  a.optional("dx", dx, DType::f32, {n, k});
  a.optional("dw", dw, DType::f32, {m, k});
  a.optional("db", db, DType::f32, {m});
  a.optional("options.out_gelu_pre", opt.out_gelu_pre, DType::f32, {n, m});
  a.optional("options.x_gelu_pre", opt.x_gelu_pre, DType::f32, {n, k});
  PB_REQUIRE(!opt.x_gelu_pre.defined() || (dx.defined() && !opt.dx_accumulate),
             "{}: options.x_gelu_pre needs dx and excludes dx_accumulate", a.op);
  return {n, k, m};
}

// gather_rows (out = x[index]) and its backward (dx from dout): x / dx [rows, h], index i32 [m],
// out / dout [m, h]. `table` names x or dx, `rows_out` out or dout.
struct GatherDims {
  int64_t rows = 0, h = 0, m = 0;
};

inline GatherDims gather_rows_args(const OpArgs& a, const char* table_name, const Tensor& table,
                                   const Tensor& index, const char* rows_name,
                                   const Tensor& rows_out) {
  a(table_name, table, DType::f32, {kAnyDim, kAnyDim});
  const int64_t rows = table.dim(0), h = table.dim(1);
  a("index", index, DType::i32, {kAnyDim});
  const int64_t m = index.dim(0);
  a(rows_name, rows_out, DType::f32, {m, h});
  return {rows, h, m};
}

// logits [m, v], labels [m], loss_sum f32 [1], num_correct i32 [1], dlogits [m, v] optional.
struct SoftmaxDims {
  int64_t m = 0, v = 0;
};

inline SoftmaxDims softmax_cross_entropy_args(const OpArgs& a, const Tensor& logits,
                                              const Tensor& labels, const GradScale& grad_scale,
                                              const Tensor& loss_sum, const Tensor& num_correct,
                                              const Tensor& dlogits) {
  a.optional("grad_scale.device", grad_scale.device, DType::f32, {1});
  a("logits", logits, DType::f32, {kAnyDim, kAnyDim});
  const int64_t m = logits.dim(0), v = logits.dim(1);
  a("labels", labels, DType::i32, {m});
  a("loss_sum", loss_sum, DType::f32, {1});
  a("num_correct", num_correct, DType::i32, {1});
  a.optional("dlogits", dlogits, DType::f32, {m, v});
  PB_REQUIRE(v >= 1, "{}: {} classes", a.op, v);
  return {m, v};
}

// The MLM decoder and loss of one chunk as a composition of a backend's own ops (the contract of
// Backend::mlm_loss): logits = x w^T + b into logits_ws, softmax cross-entropy (its gradient in
// place when dx is given), then the decoder's backward.
// mlm_loss's shapes beyond the ops it is made of: x [m, h], w [v, h], logits_ws [m, v]; dw and
// db only with dx. (The ops check the rest: b, labels, loss_sum, num_correct, dx, dw, db.)
struct MlmDims {
  int64_t m = 0, h = 0, v = 0;
};

inline MlmDims mlm_loss_args(const OpArgs& a, const Tensor& x, const Tensor& w,
                             const Tensor& logits_ws, const Tensor& dx, const Tensor& dw,
                             const Tensor& db) {
  a("x", x, DType::f32, {kAnyDim, kAnyDim});
  a("w", w, DType::f32, {kAnyDim, x.dim(1)});
  const int64_t m = x.dim(0), v = w.dim(0);
  a("logits_ws", logits_ws, DType::f32, {m, v});
  PB_REQUIRE(dx.defined() || (!dw.defined() && !db.defined()),
             "{}: dw / db without dx (forward-only calls pass none for all three)", a.op);
  return {m, x.dim(1), v};
}

inline void mlm_loss_by_ops(Backend& be, const OpArgs& a, const Tensor& x, const Tensor& w,
                            const Tensor& b, const Tensor& labels, const GradScale& grad_scale,
                            const Tensor& logits_ws, const Tensor& loss_sum,
                            const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                            const Tensor& db) {
  mlm_loss_args(a, x, w, logits_ws, dx, dw, db);
  be.linear_forward(x, w, b, Epilogue::bias, logits_ws, Tensor());
  be.softmax_cross_entropy(logits_ws, labels, grad_scale, loss_sum, num_correct,
                           dx.defined() ? logits_ws : Tensor());
  if (dx.defined()) be.linear_backward(x, w, logits_ws, dx, dw, db, {});
}

// nsp_loss: x [rows, h] with rows = layout.rows; returns h and the sequence count.
struct NspDims {
  int64_t h = 0, s = 0;
};

inline NspDims nsp_loss_args(const OpArgs& a, const SeqLayout& layout, const Tensor& x,
                             const PoolerParams& params, const Tensor& labels,
                             const Tensor& workspace, const Tensor& dx,
                             const PoolerParams& grads) {
  a("x", x, DType::f32, {layout.rows, kAnyDim});
  const int64_t h = x.dim(1), s = layout.num_seqs;
  a("labels", labels, DType::i32, {s});
  a("params.dense_w", params.dense_w, DType::f32, {h, h});
  a("params.dense_b", params.dense_b, DType::f32, {h});
  a("params.cls_w", params.cls_w, DType::f32, {2, h});
  a("params.cls_b", params.cls_b, DType::f32, {2});
  a("workspace", workspace, DType::f32, {nsp_workspace_elems(s, h)});
  a.optional("dx", dx, DType::f32, {layout.rows, h});
  PB_REQUIRE(dx.defined() || (!grads.dense_w.defined() && !grads.dense_b.defined() &&
                              !grads.cls_w.defined() && !grads.cls_b.defined()),
             "{}: parameter gradients without dx", a.op);
  return {h, s};
}

// lamb_update / lamb_apply: table i64 [T, 3], the flat buffers [n], the sums f64 [T, 2]; the
// config's ranges (the table's contents are check_lamb_table's, where the table is on the host).
struct LambDims {
  int64_t num_tensors = 0, n = 0;
};

inline LambDims lamb_update_args(const OpArgs& a, const Tensor& table, const LambConfig& cfg,
                                 const Tensor& global_grad_norm, const Tensor& params,
                                 const Tensor& grads, const Tensor& m, const Tensor& v,
                                 const Tensor& sums, const Tensor& record = Tensor()) {
  // The table is host memory on every backend (backend.h, lamb_update).
  OpArgs(a.op, Device::cpu)("table", table, DType::i64, {kAnyDim, 3});
  const int64_t num_tensors = table.dim(0);
  a("params", params, DType::f32, {kAnyDim});
  const int64_t n = params.dim(0);
  a("grads", grads, DType::f32, {n});
  a("m", m, DType::f32, {n});
  a("v", v, DType::f32, {n});
  a("global_grad_norm", global_grad_norm, DType::f32, {1});
  a("sums", sums, DType::f64, {num_tensors, 2});
  a.optional("record", record, DType::i32, {3});
  check_lamb_config(a.op, cfg);
  a.optional("config.step_scalars", cfg.step_scalars, DType::f32, {4});
  return {num_tensors, n};
}

inline LambDims lamb_apply_args(const OpArgs& a, const Tensor& table, const LambConfig& cfg,
                                const Tensor& global_grad_norm, const Tensor& sums,
                                const Tensor& params, const Tensor& grads,
                                const Tensor& norms_ws) {
  OpArgs(a.op, Device::cpu)("table", table, DType::i64, {kAnyDim, 3});
  const int64_t num_tensors = table.dim(0);
  a("params", params, DType::f32, {kAnyDim});
  const int64_t n = params.dim(0);
  a("grads", grads, DType::f32, {n});
  a("global_grad_norm", global_grad_norm, DType::f32, {1});
  a("sums", sums, DType::f64, {num_tensors, 2});
  a.optional("norms_ws", norms_ws, DType::f32, {2 * num_tensors});
  check_lamb_config(a.op, cfg);
  a.optional("config.step_scalars", cfg.step_scalars, DType::f32, {4});
  return {num_tensors, n};
}

// fp8_cast: src [n, c] f32 / bf16 / f16; out [>= n, c] and / or out_t [c, >= n], one FP8 dtype;
// rows i32 [n], scale f32 [2], amax f32 [1].
struct Fp8CastDims {
  int64_t n = 0, c = 0, n_out = 0, n_t = 0;
};

inline Fp8CastDims fp8_cast_args(const OpArgs& a, const Tensor& src, const Tensor& rows,
                                 const Tensor& scale, const Tensor& amax, const Tensor& out,
                                 const Tensor& out_t) {
  PB_REQUIRE(src.defined() && (src.dtype == DType::f32 || src.dtype == DType::bf16 ||
                               src.dtype == DType::f16),
             "{}: src is {}, expected f32, bf16 or f16", a.op, src.str());
  a("src", src, src.dtype, {kAnyDim, kAnyDim});
  const int64_t n = src.dim(0), c = src.dim(1);
  PB_REQUIRE(out.defined() || out_t.defined() || amax.defined(),
             "{}: neither out, out_t nor amax given", a.op);
  const int64_t n_out = out.defined() ? out.dim(0) : n, n_t = out_t.defined() ? out_t.dim(1) : n;
  if (out.defined() || out_t.defined()) {
    const Tensor& first = out.defined() ? out : out_t;
    PB_REQUIRE(is_fp8(first.dtype), "{}: {} is {}, expected e4m3 or e5m2", a.op,
               out.defined() ? "out" : "out_t", first.str());
    a.optional("out", out, first.dtype, {kAnyDim, c});
    a.optional("out_t", out_t, first.dtype, {c, kAnyDim});
    PB_REQUIRE(n_out >= n && n_t >= n, "{}: {} rows of src, out has {} and out_t {} (>= {})",
               a.op, n, n_out, n_t, n);
    a("scale", scale, DType::f32, {2});
  } else {
    a.optional("scale", scale, DType::f32, {2});
  }
  a.optional("rows", rows, DType::i32, {n});
  a.optional("amax", amax, DType::f32, {1});
  return {n, c, n_out, n_t};
}

// fp8_gemm: out [n, m] = a [n, k] b [m, k]^T, a and b FP8 (not both e5m2), n, k, m % 16 == 0.
inline GemmDims fp8_gemm_args(const OpArgs& a, const Tensor& x, const Tensor& x_scale,
                              const Tensor& w, const Tensor& w_scale, const Tensor& out,
                              const Fp8GemmOptions& o) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"a", &x}, {"b", &w}})
    PB_REQUIRE(t->defined() && is_fp8(t->dtype), "{}: {} is {}, expected e4m3 or e5m2", a.op,
               name, t->str());
  PB_REQUIRE(!(x.dtype == DType::e5m2 && w.dtype == DType::e5m2),
             "{}: a and b are both e5m2 (FP8 GEMMs take e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3)",
             a.op);
  a("a", x, x.dtype, {kAnyDim, kAnyDim});
  const int64_t n = x.dim(0), k = x.dim(1);
  a("b", w, w.dtype, {kAnyDim, k});
  const int64_t m = w.dim(0);
  PB_REQUIRE(n % 16 == 0 && k % 16 == 0 && m % 16 == 0,
             "{}: n {}, k {}, m {}: each must be a multiple of 16 (FP8 GEMMs' tensor-core "
             "layout; the model pads its rows to 16)",
             a.op, n, k, m);
  a("a_scale", x_scale, DType::f32, {2});
  a("b_scale", w_scale, DType::f32, {2});
  PB_REQUIRE(out.defined() && (out.dtype == DType::f32 || out.dtype == DType::bf16 ||
                               out.dtype == DType::f16),
             "{}: out is {}, expected f32, bf16 or f16", a.op, out.str());
  a("out", out, out.dtype, {n, m});
  if (o.epilogue == Epilogue::none) {
    PB_REQUIRE(!o.bias.defined(), "{}: bias given with Epilogue::none", a.op);
  } else {
    a("bias", o.bias, DType::f32, {m});
  }
  if (has_gelu(o.epilogue)) {
    a("pre", o.pre, out.dtype, {n, m});
    PB_REQUIRE(o.pre.data != out.data, "{}: pre may not alias out", a.op);
  } else {
    PB_REQUIRE(!o.pre.defined(), "{}: pre is only written by the GELU epilogues", a.op);
  }
  a.optional("dgelu_pre", o.dgelu_pre, out.dtype, {n, m});
  PB_REQUIRE(!o.dgelu_pre.defined() || o.epilogue == Epilogue::none,
             "{}: dgelu_pre with a forward epilogue", a.op);
  PB_REQUIRE(!o.accumulate || (o.epilogue == Epilogue::none && !o.dgelu_pre.defined()),
             "{}: accumulate with an epilogue or dgelu_pre", a.op);
  return {n, k, m};
}

// fp8_amax_share / fp8_scale_update: n operands, ranks rows, history h.
struct Fp8ScaleDims {
  int64_t n = 0, ranks = 0, h = 0;
};

inline Fp8ScaleDims fp8_amax_share_args(const OpArgs& a, const Tensor& amax, int rank,
                                        const Tensor& shared) {
  a("amax", amax, DType::f32, {kAnyDim});
  const int64_t n = amax.dim(0);
  a("shared", shared, DType::f64, {kAnyDim, n});
  PB_REQUIRE(rank >= 0 && rank < shared.dim(0), "{}: rank {} of {}", a.op, rank, shared.dim(0));
  return {n, shared.dim(0), 0};
}

inline Fp8ScaleDims fp8_scale_update_args(const OpArgs& a, const Tensor& shared,
                                          const Tensor& fp8_max, int margin,
                                          const Tensor& history, const Tensor& scales,
                                          const Tensor& amax) {
  a("shared", shared, DType::f64, {kAnyDim, kAnyDim});
  const int64_t ranks = shared.dim(0), n = shared.dim(1);
  a("fp8_max", fp8_max, DType::f32, {n});
  a("history", history, DType::f32, {n, kAnyDim});
  a("scales", scales, DType::f32, {n, 2});
  a("amax", amax, DType::f32, {n});
  PB_REQUIRE(history.dim(1) >= 1, "{}: an empty history", a.op);
  PB_REQUIRE(margin >= 0 && margin <= 64, "{}: margin {} outside [0, 64]", a.op, margin);
  return {n, ranks, history.dim(1)};
}

}  // namespace packbert::checks
