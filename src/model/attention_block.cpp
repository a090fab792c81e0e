#include "model/attention_block.h"

#include "model/linears.h"

namespace packbert {

void AttentionBlock::forward(int64_t l) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  AttentionSaved& s = a.layers[l].attention;
  const Tensor& x = a.hidden[l];
  const int heads = static_cast<int>(m_.config.heads);
  const int64_t window = 0;  // global attention
  m_.linears.forward(l, Fp8State::qkv, 0, x, w.qkv_w, w.qkv_b, Epilogue::bias, s.qkv, Tensor());
  m_.backend.attention_forward(a.layout, s.qkv, heads, window,
                               m_.dropout(DropoutSite::attention_probs, l), s.ctx, s.lse);
  // The output projection's bias is added by the LayerNorm op (before its dropout).
  m_.linears.forward(l, Fp8State::attn_out, 0, s.ctx, w.attn_out_w, Tensor(), Epilogue::none,
                     s.ln_in, Tensor());
  m_.backend.residual_layernorm_forward(a.layout, s.ln_in, w.attn_out_b, x, w.attn_ln,
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
  // dh1 -> d(attention out) in dtmp, the residual share into dx.
  m_.backend.residual_layernorm_backward(a.layout, dh1, s.ln_in, s.ln_mean, s.ln_rstd, w.attn_ln,
                                         m_.dropout(DropoutSite::attention_output, l), t.dtmp, dx,
                                         g.attn_out_b, g.attn_ln);
  m_.linears.backward(l, Fp8State::attn_out, 0, s.ctx, w.attn_out_w, t.dtmp, t.dctx, g.attn_out_w,
                      Tensor(), {});
  const int64_t window = 0;  // global attention, as the forward
  m_.backend.attention_backward(a.layout, s.qkv, s.ctx, s.lse, t.dctx,
                                static_cast<int>(m_.config.heads), window,
                                m_.dropout(DropoutSite::attention_probs, l), dqkv);
  LinearBackwardOptions accumulate;
  accumulate.dx_accumulate = true;  // dL/dx = residual share + projection share
  m_.linears.backward(l, Fp8State::qkv, 0, a.hidden[l], w.qkv_w, dqkv, dx, g.qkv_w, g.qkv_b,
                      accumulate);
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
