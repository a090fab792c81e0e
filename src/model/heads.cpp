#include "model/heads.h"

#include <algorithm>

namespace packbert {

void MlmHead::forward(float scale, const HeadSums& sums, const MlmLogitsHook& hook) {
  StepActivations& a = m_.act;
  HeadsActivations& t = a.heads;
  const BertWeights& w = m_.weights;
  const bool grad = a.gradients;
  const Tensor& dy = a.scratch.dhidden[0];
  const int64_t m = a.shape.masked;
  if (m == 0) {
    if (grad) m_.backend.zero(dy);
    return;
  }
  m_.backend.gather_rows(a.hidden[m_.config.layers], a.masked_rows, t.mlm_x);
  m_.backend.linear_forward(t.mlm_x, w.mlm_dense_w, w.mlm_dense_b,
                            bias_gelu_epilogue(m_.config.hidden_act), t.mlm_act, t.mlm_pre);
  m_.backend.residual_layernorm_forward(SeqLayout{}, t.mlm_act, Tensor(), Tensor(), w.mlm_ln,
                                        Dropout{}, t.mlm_out, t.mlm_act, t.mlm_ln_mean,
                                        t.mlm_ln_rstd);
  const GradScale gs(scale, rows_of(a.grad_scales, 0, 1));
  const int64_t chunk = t.logits.dim(0);
  for (int64_t first = 0; first < m; first += chunk) {
    const int64_t n = std::min(chunk, m - first);
    m_.backend.mlm_loss(
        rows_of(t.mlm_out, first, n), w.embeddings.word, w.mlm_bias,
        rows_of(a.masked_labels, first, n), gs, rows_of(t.logits, 0, n), sums.loss_sum,
        sums.correct, grad ? rows_of(t.mlm_dout, first, n) : Tensor(),
        grad ? m_.grads.embeddings.word : Tensor(), grad ? m_.grads.mlm_bias : Tensor());
    if (hook) {
      std::vector<float> host(static_cast<size_t>(n * m_.config.vocab_size));
      m_.backend.copy(view(host.data(), {n, m_.config.vocab_size}), rows_of(t.logits, 0, n));
      hook(first, host, n);
    }
  }
  if (!grad) return;
  m_.backend.residual_layernorm_backward(SeqLayout{}, t.mlm_dout, t.mlm_act, t.mlm_ln_mean,
                                         t.mlm_ln_rstd, w.mlm_ln, Dropout{}, t.mlm_dact, Tensor(),
                                         false, Tensor(), m_.grads.mlm_ln);
  LinearBackwardOptions gelu;
  gelu.gelu = m_.config.hidden_act;
  gelu.out_gelu_pre = t.mlm_pre;  // mlm_dact becomes d(pre) in place
  m_.backend.linear_backward(t.mlm_x, w.mlm_dense_w, t.mlm_dact, t.mlm_dx, m_.grads.mlm_dense_w,
                             m_.grads.mlm_dense_b, gelu);
  m_.backend.gather_rows_backward(t.mlm_dx, a.masked_rows, dy);
}

void NspHead::forward(float scale, const HeadSums& sums, const NspLogitsHook& hook) {
  StepActivations& a = m_.act;
  const Tensor& ws = a.heads.nsp_ws;
  const bool grad = a.gradients;
  const int64_t seqs = a.nsp_layout.num_seqs, h = m_.config.hidden;
  m_.backend.nsp_loss(
      a.nsp_layout, a.hidden[m_.config.layers], m_.weights.pooler_nsp,
      rows_of(a.nsp_labels, 0, seqs), GradScale(scale, rows_of(a.grad_scales, 1, 1)),
      rows_of(ws, 0, nsp_workspace_elems(seqs, h)), sums.loss_sum, sums.correct,
      grad ? a.scratch.dhidden[0] : Tensor(), grad ? m_.grads.pooler_nsp : PoolerParams{});
  if (!hook) return;
  // nsp_loss leaves the logits in its workspace (kernels/ops/losses.h nsp_loss).
  std::vector<float> host(static_cast<size_t>(seqs * 2));
  const Tensor logits(ws.ptr<float>() + 4 * seqs * h, DType::f32, {seqs, 2}, ws.device);
  m_.backend.copy(view(host.data(), {seqs, 2}), logits);
  hook(host, seqs);
}

void carve_heads(Carver& c, const BertConfig& config, const BatchShape& shape,
                 const ActivationPlan& plan, HeadsActivations& t) {
  using K = ActivationKind;
  const int64_t m = shape.masked, h = config.hidden;
  const int64_t chunk = plan.mlm_chunk_rows > 0 ? std::min(plan.mlm_chunk_rows, m) : m;
  t = HeadsActivations{};
  t.mlm_x = c.take(K::heads, plan.act, {m, h});
  t.mlm_pre = c.take(K::heads, plan.act, {m, h});
  t.mlm_act = c.take(K::heads, plan.act, {m, h});
  t.mlm_ln_mean = c.take(K::heads, DType::f32, {m});
  t.mlm_ln_rstd = c.take(K::heads, DType::f32, {m});
  t.mlm_out = c.take(K::heads, plan.act, {m, h});
  t.logits = c.take(K::mlm_logits, DType::f32, {chunk, config.vocab_size});
  t.nsp_ws = c.take(K::heads, DType::f32, {nsp_workspace_elems(shape.seqs, h)});
  if (!plan.gradients) return;
  t.mlm_dout = c.take(K::heads, plan.act, {m, h});
  t.mlm_dact = c.take(K::heads, plan.act, {m, h});
  t.mlm_dx = c.take(K::heads, plan.act, {m, h});
}

}  // namespace packbert
