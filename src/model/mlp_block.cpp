#include "model/mlp_block.h"

#include <algorithm>

#include "model/linears.h"

namespace packbert {

void MlpBlock::forward(int64_t l) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  const MlpSaved& s = a.layers[l].mlp;
  const AttentionSaved& att = a.layers[l].attention;
  dense_forward(l);
  // The residual: h1 (post-norm), or the stream after the attention (pre-norm).
  m_.backend.residual_layernorm_forward(
      a.layout, s.ln_in, w.ffn_out_b, m_.pre_norm() ? att.ln_in : att.h1, w.ffn_ln,
      m_.dropout(DropoutSite::ffn_output, l), a.hidden[l + 1], s.ln_in, s.ln_mean, s.ln_rstd);
}

void MlpBlock::backward(int64_t l, const Tensor& dy) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  LayerWeights& g = m_.grads.layers[l];
  const MlpSaved& s = a.layers[l].mlp;
  // dy -> d(FFN out) in dtmp, and dL/dh1's residual share into dy itself. Pre-norm: the share
  // goes into the stream's gradient (which the later layers' shares reach first, except after
  // the last layer), and dy then takes the MLP's gradient wrt its normed input h1.
  const bool pre = m_.pre_norm();
  m_.backend.residual_layernorm_backward(a.layout, dy, s.ln_in, s.ln_mean, s.ln_rstd, w.ffn_ln,
                                         m_.dropout(DropoutSite::ffn_output, l), a.scratch.dtmp,
                                         pre ? a.scratch.dstream : dy,
                                         pre && l + 1 < m_.config.layers, g.ffn_out_b, g.ffn_ln);
  dense_backward(l, a.scratch.dtmp, dy, !pre);
}

namespace {

// The activation of a gated MLP (BertConfig::mlp): GeGLU with hidden_act's GELU, or SwiGLU.
GluAct glu_act(const BertConfig& c) {
  if (c.mlp == MlpKind::swiglu) return GluAct::silu;
  return c.hidden_act == Gelu::tanh ? GluAct::gelu_tanh : GluAct::gelu;
}

}  // namespace

void MlpBlock::inner_forward(int64_t l, int64_t first, const Tensor& x, const Tensor& pre,
                             const Tensor& act) {
  const LayerWeights& w = m_.weights.layers[l];
  if (!m_.config.gated()) {
    m_.linears.forward(l, Fp8State::ffn_in, first, x, w.ffn_in_w, w.ffn_in_b,
                       bias_gelu_epilogue(m_.config.hidden_act), act, pre);
    return;
  }
  m_.linears.forward(l, Fp8State::ffn_in, first, x, w.ffn_in_w, w.ffn_in_b,
                     bias_epilogue(w.ffn_in_b), pre, Tensor());
  m_.backend.glu_forward(pre, glu_act(m_.config), act);
}

void MlpBlock::outer_backward(int64_t l, int64_t first, const Tensor& act, const Tensor& pre,
                              const Tensor& dout, const Tensor& dact, const Tensor& dpre) {
  const LayerWeights& w = m_.weights.layers[l];
  LayerWeights& g = m_.grads.layers[l];
  if (!m_.config.gated()) {
    LinearBackwardOptions through_gelu;  // Wo's dx is written as d(pre)
    through_gelu.gelu = m_.config.hidden_act;
    through_gelu.x_gelu_pre = pre;
    m_.linears.backward(l, Fp8State::ffn_out, first, act, w.ffn_out_w, dout, dpre, g.ffn_out_w,
                        Tensor(), through_gelu);
    return;
  }
  m_.linears.backward(l, Fp8State::ffn_out, first, act, w.ffn_out_w, dout, dact, g.ffn_out_w,
                      Tensor(), {});
  m_.backend.glu_backward(pre, dact, glu_act(m_.config), dpre);
}

void MlpBlock::dense_forward(int64_t l) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  const MlpSaved& s = a.layers[l].mlp;
  const Tensor& h1 = a.layers[l].attention.h1;
  const int64_t chunk = a.plan.mlp_chunk_rows;
  if (chunk == 0) {
    inner_forward(l, 0, h1, s.pre, s.act);
    m_.linears.forward(l, Fp8State::ffn_out, 0, s.act, w.ffn_out_w, Tensor(), Epilogue::none,
                       s.ln_in, Tensor());
    return;
  }
  for (int64_t first = 0; first < a.shape.rows; first += chunk) {
    const int64_t n = std::min(chunk, a.shape.rows - first);
    const Tensor pre = rows_of(a.mlp.pre, 0, n), act = rows_of(a.mlp.act, 0, n);
    inner_forward(l, first, rows_of(h1, first, n), pre, act);
    m_.linears.forward(l, Fp8State::ffn_out, first, act, w.ffn_out_w, Tensor(), Epilogue::none,
                       rows_of(s.ln_in, first, n), Tensor());
  }
}

void MlpBlock::dense_backward(int64_t l, const Tensor& dout, const Tensor& dh1, bool add) {
  StepActivations& a = m_.act;
  const LayerWeights& w = m_.weights.layers[l];
  LayerWeights& g = m_.grads.layers[l];
  const MlpSaved& s = a.layers[l].mlp;
  const Tensor& h1_all = a.layers[l].attention.h1;
  const int64_t rows = a.shape.rows, chunk = a.plan.mlp_chunk_rows;
  const int64_t wi = m_.config.mlp_in_width(), inter = m_.config.intermediate;
  LinearBackwardOptions accumulate;
  accumulate.dx_accumulate = add;  // post-norm: dL/dh1 = residual share + FFN share
  if (chunk == 0) {
    // dwide holds d(pre) [rows, I'] and, for a gated MLP, d(act) [rows, I] after it.
    const Tensor dpre = reshaped(a.scratch.dwide, {rows, wi});
    const Tensor dact =
        m_.config.gated() ? after(a.scratch.dwide, rows * wi, {rows, inter}) : Tensor();
    outer_backward(l, 0, s.act, s.pre, dout, dact, dpre);
    m_.linears.backward(l, Fp8State::ffn_in, 0, h1_all, w.ffn_in_w, dpre, dh1, g.ffn_in_w,
                        g.ffn_in_b, accumulate);
    return;
  }
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    const Tensor pre = rows_of(a.mlp.pre, 0, n), act = rows_of(a.mlp.act, 0, n);
    const Tensor dpre = rows_of(a.mlp.dpre, 0, n), h1 = rows_of(h1_all, first, n);
    const Tensor dact = m_.config.gated() ? rows_of(a.mlp.dact, 0, n) : Tensor();
    inner_forward(l, first, h1, pre, act);
    outer_backward(l, first, act, pre, rows_of(dout, first, n), dact, dpre);
    m_.linears.backward(l, Fp8State::ffn_in, first, h1, w.ffn_in_w, dpre, rows_of(dh1, first, n),
                        g.ffn_in_w, g.ffn_in_b, accumulate);
  }
}

int64_t MlpBlock::chunk_rows(const BatchShape& shape, const ActivationPlan& plan) {
  return plan.mlp_chunk_rows > 0 ? std::min(plan.mlp_chunk_rows, shape.rows) : 0;
}

void MlpBlock::carve(Carver& c, const BertConfig& config, const BatchShape& shape,
                     const ActivationPlan& plan, MlpSaved& s) {
  using K = ActivationKind;
  const int64_t rows = shape.rows;
  s.pre = s.act = Tensor();
  if (chunk_rows(shape, plan) == 0) {
    s.pre = c.take(K::mlp, plan.act, {rows, config.mlp_in_width()});
    s.act = c.take(K::mlp, plan.act, {rows, config.intermediate});
  }
  s.ln_in = c.take(K::layernorm, plan.act, {rows, config.hidden});
  s.ln_mean = c.take(K::layernorm, DType::f32, {rows});
  s.ln_rstd = c.take(K::layernorm, DType::f32, {rows});
}

void MlpBlock::carve_scratch(Carver& c, const BertConfig& config, const BatchShape& shape,
                             const ActivationPlan& plan, MlpScratch& t) {
  const int64_t chunk = chunk_rows(shape, plan);
  t = MlpScratch{};
  if (chunk == 0) return;
  t.pre = c.take(ActivationKind::mlp, plan.act, {chunk, config.mlp_in_width()});
  t.act = c.take(ActivationKind::mlp, plan.act, {chunk, config.intermediate});
}

}  // namespace packbert
