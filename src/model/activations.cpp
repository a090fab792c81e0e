#include "model/activations.h"

#include <algorithm>

#include "model/attention_block.h"
#include "model/embeddings.h"
#include "model/heads.h"
#include "model/mlp_block.h"

namespace packbert {

void carve_batch(Carver& c, const BatchShape& shape, StepActivations& a) {
  const DType i32 = DType::i32;
  const int64_t rows = shape.rows, m = shape.masked, s = shape.seqs;
  a.step = c.take(i32, {1});  // first: their places depend on no count
  a.grad_scales = c.take(DType::f32, {2});
  a.input_ids = c.take(i32, {rows});
  a.segment_ids = c.take(i32, {rows});
  a.token_seq = c.take(i32, {rows});
  a.token_pos = c.take(i32, {rows});
  a.seq_start = c.take(i32, {s});
  a.seq_len = c.take(i32, {s});
  a.sample_id = c.take(DType::i64, {s});
  a.nsp_labels = c.take(i32, {s});
  a.masked_rows = c.take(i32, {m});
  a.masked_labels = c.take(i32, {m});
  a.layout.rows = rows;
  a.layout.num_seqs = static_cast<int32_t>(s);
  a.layout.max_len = shape.max_len;
  a.layout.seq_start = a.seq_start;
  a.layout.seq_len = a.seq_len;
  a.layout.sample_id = a.sample_id;
  a.layout.token_seq = a.token_seq;
  a.layout.token_pos = a.token_pos;
}

size_t batch_bytes(const BatchShape& shape) {
  Carver measure(nullptr, Device::cpu);
  StepActivations scratch;
  carve_batch(measure, shape, scratch);
  return measure.used();
}

Dropout dropout_of(const StepActivations& a, const BertConfig& config, DropoutSite site,
                   uint32_t layer) {
  Dropout d;
  if (a.keys.on)
    d.p = site == DropoutSite::attention_probs ? config.attention_dropout : config.hidden_dropout;
  d.seed = a.keys.seed;
  d.step = a.keys.step;
  d.device_step = a.step;  // the same step, uploaded with the batch
  d.layer = layer;
  d.site = site;
  return d;
}

void carve_activations(Carver& c, const BertConfig& config, const BatchShape& shape,
                       const ActivationPlan& plan, StepActivations& a) {
  const int64_t rows = shape.rows, h = config.hidden;
  a.shape = shape;
  a.gradients = plan.gradients;
  a.plan = plan;
  Embeddings::carve(c, shape, a.embedding);
  auto carve_layer = [&] {
    LayerActivations la;
    AttentionBlock::carve(c, config, shape, plan, la.attention);
    MlpBlock::carve(c, config, shape, plan, la.mlp);
    return la;
  };
  auto hidden = [&] { return c.take(ActivationKind::hidden, plan.act, {rows, h}); };
  a.hidden.clear();
  a.layers.clear();
  a.hidden.push_back(hidden());
  if (!plan.gradients) {
    // Forward only (evaluation): nothing is kept for a backward, so one set of layer buffers
    // serves every layer and the layer inputs/outputs alternate between two buffers.
    const Tensor other = hidden();
    for (int64_t l = 0; l < config.layers; ++l)
      a.hidden.push_back(l % 2 == 0 ? other : a.hidden[0]);
    a.layers.assign(static_cast<size_t>(config.layers), carve_layer());
  } else {
    for (int64_t l = 0; l < config.layers; ++l) {
      if (!plan.layer_recompute) a.layers.push_back(carve_layer());
      a.hidden.push_back(hidden());
    }
    if (plan.layer_recompute) {
      a.layers.assign(static_cast<size_t>(config.layers), carve_layer());
      // Pre-norm: the stream after each layer (its MLP's sum) is the next layer's residual, so
      // it is kept per layer like the layer inputs; a recomputed layer rewrites the same values.
      if (config.norm == NormPlacement::pre)
        for (LayerActivations& la : a.layers) la.mlp.ln_in = hidden();
    }
  }
  MlpBlock::carve_scratch(c, config, shape, plan, a.mlp);
  // The encoder's backward buffers (rows only) before the heads' (masked tokens, sequences), so
  // that everything an encoder layer reads or writes sits at offsets fixed by the rows and the
  // plan: a layer's recorded graph (BertOptions::cuda_graphs) serves batches whose masked-token
  // counts differ.
  a.scratch = EncoderScratch{};
  if (plan.gradients) {
    using K = ActivationKind;
    const int64_t mlp_chunk = MlpBlock::chunk_rows(shape, plan);
    EncoderScratch& t = a.scratch;
    t.dhidden[0] = c.take(K::grad_scratch, plan.act, {rows, h});
    t.dhidden[1] = c.take(K::grad_scratch, plan.act, {rows, h});
    t.dtmp = c.take(K::grad_scratch, plan.act, {rows, h});
    t.dctx = c.take(K::grad_scratch, plan.act, {rows, h});
    const int64_t gated_act = config.gated() ? config.intermediate : 0;  // d(act) of a gated MLP
    if (mlp_chunk > 0) {
      t.dwide = c.take(K::grad_scratch, plan.act, {rows, 3 * h});
      a.mlp.dpre = c.take(K::mlp, plan.act, {mlp_chunk, config.mlp_in_width()});
      if (gated_act > 0) a.mlp.dact = c.take(K::mlp, plan.act, {mlp_chunk, gated_act});
    } else {
      t.dwide = c.take(K::grad_scratch, plan.act,
                       {rows, std::max(config.mlp_in_width() + gated_act, 3 * h)});
    }
    if (config.norm == NormPlacement::pre) t.dstream = c.take(K::grad_scratch, plan.act, {rows, h});
  }
  carve_heads(c, config, shape, plan, a.heads);
}

void upload_batch(Backend& be, const Batch& b, uint32_t step, const std::vector<float>& grad_scales,
                  StepActivations& a, bool ahead) {
  // Empty arrays (no masked token) have nothing to copy and no host pointer to copy from.
  std::vector<Backend::HostUpload> copies;
  auto put = [&](const Tensor& dst, const auto& src) {
    if (src.empty()) return;
    PB_CHECK(dst.numel() == static_cast<int64_t>(src.size()) &&
                 dst.bytes() == src.size() * sizeof(src[0]),
             "upload of {} elements into {}", src.size(), dst.str());
    copies.push_back({dst, src.data()});
  };
  put(a.input_ids, b.input_ids);
  put(a.segment_ids, b.segment_ids);
  put(a.token_seq, b.token_seq);
  put(a.token_pos, b.token_pos);
  put(a.seq_start, b.seq_start);
  put(a.seq_len, b.seq_len);
  put(a.sample_id, b.sample_id);
  put(a.nsp_labels, b.nsp_labels);
  put(a.masked_rows, b.masked_rows);
  put(a.masked_labels, b.masked_labels);
  const std::vector<uint32_t> step_word = {step};
  put(a.step, step_word);
  put(a.grad_scales, grad_scales);
  if (ahead) {
    be.prefetch(copies);
  } else {
    be.upload(copies);
  }
  // Kept on the host too, so that a device backend plans attention without a read-back.
  a.host_seq_len = b.seq_len;
  a.layout.host_seq_len = a.host_seq_len.empty() ? nullptr : a.host_seq_len.data();
}

}  // namespace packbert
