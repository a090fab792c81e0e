// Runs a backend's fp32 ops on low-precision (bf16 / f16) tensors: the generic path of mixed
// precision, shared by the CPU backend (which emulates the storage precision with it, so the
// model's mixed-precision path is testable anywhere) and the CUDA backend (for the ops and the
// combinations without a native low-precision kernel).
//
// For one call: every low-precision input is widened (exactly) into fp32 scratch, the backend's
// fp32 op runs on the scratch, and every low-precision output is rounded back to nearest even.
// An output the op accumulates into (+=) or reads before writing is widened first and rounded
// after: read-convert-add-round, exactly what a native kernel with fp32 arithmetic and
// low-precision storage does. Arguments that alias (ln_in = x, dresidual = dout, dlogits =
// logits) share one scratch buffer, so in-place contracts keep holding. The tensors the contract
// keeps in fp32 (LayerNorm statistics, lse, loss sums, parameter gradients, biases and LayerNorm
// parameters, workspaces) are rejected when given in low precision: the adapter never rounds
// what must stay exact (each op's "lowp:" line in kernels/ops/ lists which tensors may be low
// precision; kernels/backend.h, Precision, what never is).
//
// The backend supplies the memory and the two conversions (Staging); the per-op functions
// below know which argument is read, written or both.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/base/error.h"
#include "kernels/base/tensor.h"

namespace packbert::lowp {

inline bool is_lowp(DType t) { return t == DType::bf16 || t == DType::f16; }
// Whether any of the (defined) tensors is bf16 / f16: the backends' dispatch test.
inline bool any(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && is_lowp(t->dtype)) return true;
  return false;
}

// What a backend gives the adapter.
class Staging {
 public:
  virtual ~Staging() = default;
  // fp32 scratch of n elements in `slot` (0 .. kMaxStaged - 1); slots never overlap; the memory
  // lives until the next request for the same slot (grow-only).
  virtual float* scratch(int slot, int64_t n) = 0;
  // dst f32 = src (bf16 / f16), exact; same element count.
  virtual void widen(const Tensor& dst, const Tensor& src) = 0;
  // dst (bf16 / f16) = src f32 rounded to nearest even; same element count.
  virtual void narrow(const Tensor& dst, const Tensor& src) = 0;
};

constexpr int kMaxStaged = 12;

// The staging of one op call.
class Call {
 public:
  Call(const char* op, Staging& staging) : op_(op), staging_(staging) {}

  // A tensor the op reads / writes whole / reads and writes (accumulates). Returns the view
  // the fp32 op gets: t itself when it is f32 or none, else its fp32 scratch.
  Tensor in(const char* name, const Tensor& t) { return stage(name, t, true, false); }
  Tensor out(const char* name, const Tensor& t) { return stage(name, t, false, true); }
  Tensor inout(const char* name, const Tensor& t) { return stage(name, t, true, true); }
  // A tensor the contract keeps in fp32 (or an integer tensor): passed through, never rounded.
  const Tensor& f32(const char* name, const Tensor& t) const {
    PB_REQUIRE(!t.defined() || !is_lowp(t.dtype),
               "{}: {} is {}, but it is always f32 (kernels/backend.h)", op_, name, t.str());
    return t;
  }
  const LayerNormParams& f32(const char* name, const LayerNormParams& p) const {
    f32(name, p.gamma);
    f32(name, p.beta);
    return p;
  }

  // Widens the inputs: call after staging every argument, before the fp32 op.
  void widen() {
    for (int i = 0; i < count_; ++i)
      if (entries_[i].read) staging_.widen(entries_[i].scratch, entries_[i].original);
  }
  // Rounds the outputs back: call after the fp32 op.
  void narrow() {
    for (int i = 0; i < count_; ++i)
      if (entries_[i].written) staging_.narrow(entries_[i].original, entries_[i].scratch);
  }

 private:
  struct Entry {
    Tensor original, scratch;
    bool read = false, written = false;
  };

  Tensor stage(const char* name, const Tensor& t, bool read, bool written) {
    if (!t.defined() || !is_lowp(t.dtype)) return t;
    const char* p = static_cast<const char*>(t.data);
    for (int i = 0; i < count_; ++i) {
      Entry& e = entries_[i];
      const char* q = static_cast<const char*>(e.original.data);
      if (q == p && e.original.dtype == t.dtype && e.original.numel() == t.numel()) {
        e.read = e.read || read;  // an alias: one scratch, the union of the roles
        e.written = e.written || written;
        Tensor v = e.scratch;
        reshape_like(v, t);
        return v;
      }
      PB_REQUIRE(p + t.bytes() <= q || q + e.original.bytes() <= p,
                 "{}: {} {} partly overlaps another low-precision argument", op_, name, t.str());
    }
    PB_CHECK(count_ < kMaxStaged, "{}: more than {} low-precision arguments", op_, kMaxStaged);
    Entry& e = entries_[count_];
    e.original = t;
    e.scratch = t;
    e.scratch.dtype = DType::f32;
    e.scratch.data = staging_.scratch(count_, t.numel());
    e.read = read;
    e.written = written;
    ++count_;
    return e.scratch;
  }
  static void reshape_like(Tensor& v, const Tensor& t) {
    v.ndim = t.ndim;
    for (int d = 0; d < Tensor::kMaxDims; ++d) v.shape[d] = t.shape[d];
  }

  const char* op_;
  Staging& staging_;
  std::array<Entry, kMaxStaged> entries_{};
  int count_ = 0;
};

// ---- the ops: stage, widen, run the fp32 op on `be`, narrow ----------------------------------
// `be` must route all-f32 calls to its fp32 implementation (its dispatch sends a call here only
// when some argument is bf16 / f16, and every argument passed on is f32).

inline void embedding_forward(Backend& be, Staging& st, const SeqLayout& layout,
                              const Tensor& input_ids, const Tensor& segment_ids,
                              const EmbeddingParams& p, const Dropout& dropout, const Tensor& out,
                              const Tensor& ln_mean, const Tensor& ln_rstd) {
  Call c("embedding_forward", st);
  EmbeddingParams q;
  q.word = c.in("word", p.word);
  q.position = c.in("position", p.position);
  q.token_type = c.in("token_type", p.token_type);
  q.ln_gamma = c.f32("ln_gamma", p.ln_gamma);
  q.ln_beta = c.f32("ln_beta", p.ln_beta);
  q.ln_eps = p.ln_eps;
  const Tensor o = c.out("out", out);
  c.widen();
  be.embedding_forward(layout, input_ids, segment_ids, q, dropout, o, c.f32("ln_mean", ln_mean),
                       c.f32("ln_rstd", ln_rstd));
  c.narrow();
}

inline void embedding_backward(Backend& be, Staging& st, const SeqLayout& layout,
                               const Tensor& input_ids, const Tensor& segment_ids,
                               const EmbeddingParams& p, const Dropout& dropout,
                               const Tensor& ln_mean, const Tensor& ln_rstd, const Tensor& dout,
                               const EmbeddingParams& grads) {
  Call c("embedding_backward", st);
  EmbeddingParams q;
  q.word = c.in("word", p.word);
  q.position = c.in("position", p.position);
  q.token_type = c.in("token_type", p.token_type);
  q.ln_gamma = c.f32("ln_gamma", p.ln_gamma);
  q.ln_beta = c.f32("ln_beta", p.ln_beta);
  q.ln_eps = p.ln_eps;
  // dout is the op's scratch (overwritten): its low-precision original is simply left alone.
  const Tensor d = c.in("dout", dout);
  c.f32("grads.word", grads.word);
  c.f32("grads.position", grads.position);
  c.f32("grads.token_type", grads.token_type);
  c.f32("grads.ln_gamma", grads.ln_gamma);
  c.f32("grads.ln_beta", grads.ln_beta);
  c.widen();
  be.embedding_backward(layout, input_ids, segment_ids, q, dropout, c.f32("ln_mean", ln_mean),
                        c.f32("ln_rstd", ln_rstd), d, grads);
  c.narrow();
}

inline void linear_forward(Backend& be, Staging& st, const Tensor& x, const Tensor& w,
                           const Tensor& bias, Epilogue epilogue, const Tensor& out,
                           const Tensor& pre) {
  Call c("linear_forward", st);
  const Tensor xs = c.in("x", x), ws = c.in("w", w);
  const Tensor os = c.out("out", out), ps = c.out("pre", pre);
  c.widen();
  be.linear_forward(xs, ws, c.f32("bias", bias), epilogue, os, ps);
  c.narrow();
}

inline void linear_backward(Backend& be, Staging& st, const Tensor& x, const Tensor& w,
                            const Tensor& dout, const Tensor& dx, const Tensor& dw,
                            const Tensor& db, const LinearBackwardOptions& opt) {
  Call c("linear_backward", st);
  LinearBackwardOptions o = opt;
  const Tensor xs = c.in("x", x), ws = c.in("w", w);
  // With out_gelu_pre, dout becomes the gradient wrt pre in place: read and written.
  const Tensor ds = opt.out_gelu_pre.defined() ? c.inout("dout", dout) : c.in("dout", dout);
  o.out_gelu_pre = c.in("options.out_gelu_pre", opt.out_gelu_pre);
  o.x_gelu_pre = c.in("options.x_gelu_pre", opt.x_gelu_pre);
  const Tensor dxs = opt.dx_accumulate ? c.inout("dx", dx) : c.out("dx", dx);
  c.widen();
  be.linear_backward(xs, ws, ds, dxs, c.f32("dw", dw), c.f32("db", db), o);
  c.narrow();
}

inline void residual_layernorm_forward(Backend& be, Staging& st, const SeqLayout& layout,
                                       const Tensor& x, const Tensor& bias, const Tensor& residual,
                                       const LayerNormParams& ln, const Dropout& dropout,
                                       const Tensor& out, const Tensor& ln_in,
                                       const Tensor& ln_mean, const Tensor& ln_rstd) {
  Call c("residual_layernorm_forward", st);
  const Tensor xs = c.in("x", x), rs = c.in("residual", residual);
  const Tensor os = c.out("out", out), ls = c.out("ln_in", ln_in);  // ln_in may alias x
  c.widen();
  be.residual_layernorm_forward(layout, xs, c.f32("bias", bias), rs, c.f32("ln", ln), dropout, os,
                                ls, c.f32("ln_mean", ln_mean), c.f32("ln_rstd", ln_rstd));
  c.narrow();
}

inline void residual_layernorm_backward(Backend& be, Staging& st, const SeqLayout& layout,
                                        const Tensor& dout, const Tensor& ln_in,
                                        const Tensor& ln_mean, const Tensor& ln_rstd,
                                        const LayerNormParams& ln, const Dropout& dropout,
                                        const Tensor& dx, const Tensor& dresidual,
                                        bool dresidual_in, const Tensor& dbias,
                                        const LayerNormParams& dln) {
  Call c("residual_layernorm_backward", st);
  const Tensor ds = c.in("dout", dout), ls = c.in("ln_in", ln_in);
  // dresidual may alias dout; with dresidual_in it is read too.
  const Tensor dxs = c.out("dx", dx);
  const Tensor drs = dresidual_in ? c.inout("dresidual", dresidual) : c.out("dresidual", dresidual);
  c.widen();
  be.residual_layernorm_backward(layout, ds, ls, c.f32("ln_mean", ln_mean),
                                 c.f32("ln_rstd", ln_rstd), c.f32("ln", ln), dropout, dxs, drs,
                                 dresidual_in, c.f32("dbias", dbias), c.f32("dln", dln));
  c.narrow();
}

inline void attention_forward(Backend& be, Staging& st, const SeqLayout& layout, const Tensor& qkv,
                              int num_heads, int64_t window, const Dropout& dropout,
                              const Tensor& out, const Tensor& lse) {
  Call c("attention_forward", st);
  const Tensor qs = c.in("qkv", qkv), os = c.out("out", out);
  c.widen();
  be.attention_forward(layout, qs, num_heads, window, dropout, os, c.f32("lse", lse));
  c.narrow();
}

inline void attention_backward(Backend& be, Staging& st, const SeqLayout& layout, const Tensor& qkv,
                               const Tensor& out, const Tensor& lse, const Tensor& dout,
                               int num_heads, int64_t window, const Dropout& dropout,
                               const Tensor& dqkv) {
  Call c("attention_backward", st);
  const Tensor qs = c.in("qkv", qkv), os = c.in("out", out), ds = c.in("dout", dout);
  const Tensor dq = c.out("dqkv", dqkv);
  c.widen();
  be.attention_backward(layout, qs, os, c.f32("lse", lse), ds, num_heads, window, dropout, dq);
  c.narrow();
}

inline void gather_rows(Backend& be, Staging& st, const Tensor& x, const Tensor& index,
                        const Tensor& out) {
  Call c("gather_rows", st);
  const Tensor xs = c.in("x", x), os = c.out("out", out);
  c.widen();
  be.gather_rows(xs, index, os);
  c.narrow();
}

inline void gather_rows_backward(Backend& be, Staging& st, const Tensor& dout, const Tensor& index,
                                 const Tensor& dx) {
  Call c("gather_rows_backward", st);
  const Tensor ds = c.in("dout", dout), dxs = c.out("dx", dx);
  c.widen();
  be.gather_rows_backward(ds, index, dxs);
  c.narrow();
}

inline void softmax_cross_entropy(Backend& be, Staging& st, const Tensor& logits,
                                  const Tensor& labels, const GradScale& grad_scale,
                                  const Tensor& loss_sum, const Tensor& num_correct,
                                  const Tensor& dlogits) {
  Call c("softmax_cross_entropy", st);
  const Tensor ls = c.in("logits", logits), ds = c.out("dlogits", dlogits);  // may alias
  c.widen();
  be.softmax_cross_entropy(ls, labels, grad_scale, c.f32("loss_sum", loss_sum), num_correct, ds);
  c.narrow();
}

inline void mlm_loss(Backend& be, Staging& st, const Tensor& x, const Tensor& w, const Tensor& b,
                     const Tensor& labels, const GradScale& grad_scale, const Tensor& logits_ws,
                     const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                     const Tensor& dw, const Tensor& db) {
  Call c("mlm_loss", st);
  const Tensor xs = c.in("x", x), ws = c.in("w", w), dxs = c.out("dx", dx);
  c.widen();
  be.mlm_loss(xs, ws, c.f32("b", b), labels, grad_scale, c.f32("logits_ws", logits_ws),
              c.f32("loss_sum", loss_sum), num_correct, dxs, c.f32("dw", dw), c.f32("db", db));
  c.narrow();
}

inline void nsp_loss(Backend& be, Staging& st, const SeqLayout& layout, const Tensor& x,
                     const PoolerParams& params, const Tensor& labels, const GradScale& grad_scale,
                     const Tensor& workspace, const Tensor& loss_sum, const Tensor& num_correct,
                     const Tensor& dx, const PoolerParams& grads) {
  Call c("nsp_loss", st);
  const Tensor xs = c.in("x", x);
  PoolerParams p;
  p.dense_w = c.in("params.dense_w", params.dense_w);
  p.dense_b = c.f32("params.dense_b", params.dense_b);
  p.cls_w = c.in("params.cls_w", params.cls_w);
  p.cls_b = c.f32("params.cls_b", params.cls_b);
  const Tensor dxs = c.inout("dx", dx);  // the [CLS] rows' gradient is added
  c.f32("grads.dense_w", grads.dense_w);
  c.f32("grads.dense_b", grads.dense_b);
  c.f32("grads.cls_w", grads.cls_w);
  c.f32("grads.cls_b", grads.cls_b);
  c.widen();
  be.nsp_loss(layout, xs, p, labels, grad_scale, c.f32("workspace", workspace),
              c.f32("loss_sum", loss_sum), num_correct, dxs, grads);
  c.narrow();
}

}  // namespace packbert::lowp
