#include "model/attention_block.h"

#include "model/linears.h"

namespace packbert {

bool AttentionBlock::rotary() const { return m_.config.position == Positions::rope; }

// What the attention's output is added to: the layer's input (post-norm), or the residual
// stream (pre-norm: the embeddings' output for layer 0, else the previous MLP's sum).
const Tensor& AttentionBlock::residual(int64_t l) const {
  const StepActivations& a = m_.act;
  if (!m_.pre_norm() || l == 0) return a.hidden[l];
  return a.layers[l - 1].mlp.ln_in;
}

void AttentionBlock::forward(int64_t l) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  AttentionSaved& s = a.layers[l].attention;
  const Tensor& x = a.hidden[l];
  const int heads = static_cast<int>(m_.config.heads);
  m_.linears.forward(l, Fp8State::qkv, 0, x, w.qkv_w, w.qkv_b, bias_epilogue(w.qkv_b), s.qkv,
                     Tensor());
  // Rotary positions turn q and k in place: qkv then holds what the attention (and its
  // backward) reads.
  if (rotary())
    m_.backend.rotary_embedding(a.layout, s.qkv, heads, m_.config.rope_theta_of(l), false);
  // A local layer's window (0: global); the backward passes the same one.
  m_.backend.attention_forward(a.layout, s.qkv, heads, m_.config.window_of(l),
                               m_.dropout(DropoutSite::attention_probs, l), s.ctx, s.lse);
  // The output projection's bias is added by the LayerNorm op (before its dropout).
  m_.linears.forward(l, Fp8State::attn_out, 0, s.ctx, w.attn_out_w, Tensor(), Epilogue::none,
                     s.ln_in, Tensor());
  m_.backend.residual_layernorm_forward(a.layout, s.ln_in, w.attn_out_b, residual(l), w.attn_ln,
                                        m_.dropout(DropoutSite::attention_output, l), s.h1, s.ln_in,
                                        s.ln_mean, s.ln_rstd);
}

void AttentionBlock::backward(int64_t l, const Tensor& dh1, const Tensor& dx) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  LayerWeights& g = m_.grads.layers[l];
  const AttentionSaved& s = a.layers[l].attention;
  const EncoderScratch& t = a.scratch;
  const Tensor dqkv = reshaped(t.dwide, {a.shape.rows, 3 * m_.config.hidden});
  // dh1 -> d(attention out) in dtmp, the residual share into dx (pre-norm: into the stream's
  // gradient, which adds it to what the later layers sent down the stream).
  const bool pre = m_.pre_norm();
  m_.backend.residual_layernorm_backward(a.layout, dh1, s.ln_in, s.ln_mean, s.ln_rstd, w.attn_ln,
                                         m_.dropout(DropoutSite::attention_output, l), t.dtmp,
                                         pre ? t.dstream : dx, pre, g.attn_out_b, g.attn_ln);
  m_.linears.backward(l, Fp8State::attn_out, 0, s.ctx, w.attn_out_w, t.dtmp, t.dctx, g.attn_out_w,
                      Tensor(), {});
  m_.backend.attention_backward(a.layout, s.qkv, s.ctx, s.lse, t.dctx,
                                static_cast<int>(m_.config.heads), m_.config.window_of(l),
                                m_.dropout(DropoutSite::attention_probs, l), dqkv);
  // The rotation's backward is its inverse, on d(q) and d(k) in place.
  if (rotary())
    m_.backend.rotary_embedding(a.layout, dqkv, static_cast<int>(m_.config.heads),
                                m_.config.rope_theta_of(l), true);
  // dL/dx = residual share + projection share. Pre-norm: the projection's share is the whole
  // gradient of the normed input hidden[l], except in layer 0, whose input is the stream itself.
  LinearBackwardOptions accumulate;
  accumulate.dx_accumulate = !pre || l == 0;
  m_.linears.backward(l, Fp8State::qkv, 0, a.hidden[l], w.qkv_w, dqkv,
                      pre && l == 0 ? t.dstream : dx, g.qkv_w, g.qkv_b, accumulate);
}

void AttentionBlock::carve(Carver& c, const BertConfig& config, const BatchShape& shape,
                           const ActivationPlan& plan, AttentionSaved& s) {
  using K = ActivationKind;
  const int64_t rows = shape.rows, h = config.hidden;
  s.qkv = c.take(K::attention, plan.act, {rows, 3 * h});
  s.ctx = c.take(K::attention, plan.act, {rows, h});
  s.lse = c.take(K::attention, DType::f32, {rows, config.heads});
  s.ln_in = c.take(K::layernorm, plan.act, {rows, h});
  s.ln_mean = c.take(K::layernorm, DType::f32, {rows});
  s.ln_rstd = c.take(K::layernorm, DType::f32, {rows});
  s.h1 = c.take(K::hidden, plan.act, {rows, h});
}

}  // namespace packbert
