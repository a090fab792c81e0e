#include "model/activations.h"

#include <algorithm>

namespace packbert {

void carve_batch(Carver& c, const BatchShape& shape, Bert::Activations& a) {
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
  Bert::Activations scratch;
  carve_batch(measure, shape, scratch);
  return measure.used();
}

void carve_activations(Carver& c, const BertConfig& config, const BatchShape& shape,
                       const ActivationPlan& plan, Bert::Activations& a) {
  using K = ActivationKind;
  const DType f32 = DType::f32;
  const DType act = plan.act;  // token-wise activations and their gradients
  const int64_t rows = shape.rows, m = shape.masked, s = shape.seqs;
  const int64_t h = config.hidden, inter = config.intermediate;
  const int64_t chunk = plan.mlm_chunk_rows > 0 ? std::min(plan.mlm_chunk_rows, m) : m;
  const int64_t mlp_chunk = plan.mlp_chunk_rows > 0 ? std::min(plan.mlp_chunk_rows, rows) : 0;
  const bool gradients = plan.gradients;
  a.shape = shape;
  a.gradients = gradients;
  a.plan = plan;

  a.emb_ln_mean = c.take(K::layernorm, f32, {rows});
  a.emb_ln_rstd = c.take(K::layernorm, f32, {rows});
  auto carve_layer = [&] {
    LayerActivations la;
    la.qkv = c.take(K::attention, act, {rows, 3 * h});
    la.ctx = c.take(K::attention, act, {rows, h});
    la.lse = c.take(K::attention, f32, {rows, config.heads});
    la.attn_ln_in = c.take(K::layernorm, act, {rows, h});
    la.attn_ln_mean = c.take(K::layernorm, f32, {rows});
    la.attn_ln_rstd = c.take(K::layernorm, f32, {rows});
    la.h1 = c.take(K::hidden, act, {rows, h});
    if (mlp_chunk == 0) {
      la.ffn_pre = c.take(K::mlp, act, {rows, inter});
      la.ffn_act = c.take(K::mlp, act, {rows, inter});
    }
    la.ffn_ln_in = c.take(K::layernorm, act, {rows, h});
    la.ffn_ln_mean = c.take(K::layernorm, f32, {rows});
    la.ffn_ln_rstd = c.take(K::layernorm, f32, {rows});
    return la;
  };
  a.hidden.clear();
  a.layers.clear();
  a.hidden.push_back(c.take(K::hidden, act, {rows, h}));
  if (!gradients) {
    // Forward only (evaluation): nothing is kept for a backward, so one set of layer buffers
    // serves every layer and the layer inputs/outputs alternate between two buffers.
    const Tensor other = c.take(K::hidden, act, {rows, h});
    for (int64_t l = 0; l < config.layers; ++l) a.hidden.push_back(l % 2 == 0 ? other : a.hidden[0]);
    a.layers.assign(static_cast<size_t>(config.layers), carve_layer());
  } else {
    for (int64_t l = 0; l < config.layers; ++l) {
      if (!plan.layer_recompute) a.layers.push_back(carve_layer());
      a.hidden.push_back(c.take(K::hidden, act, {rows, h}));
    }
    if (plan.layer_recompute) a.layers.assign(static_cast<size_t>(config.layers), carve_layer());
  }
  a.mlp_pre = a.mlp_act = Tensor();
  if (mlp_chunk > 0) {
    a.mlp_pre = c.take(K::mlp, act, {mlp_chunk, inter});
    a.mlp_act = c.take(K::mlp, act, {mlp_chunk, inter});
  }
  // The encoder's backward buffers (rows only) before the heads' (masked tokens, sequences), so
  // that everything an encoder layer reads or writes sits at offsets fixed by the rows and the
  // plan: a layer's recorded graph (BertOptions::cuda_graphs) serves batches whose masked-token
  // counts differ.
  a.dhidden[0] = a.dhidden[1] = a.dtmp = a.dctx = a.dwide = a.mlp_dpre = Tensor();
  if (gradients) {
    a.dhidden[0] = c.take(K::grad_scratch, act, {rows, h});
    a.dhidden[1] = c.take(K::grad_scratch, act, {rows, h});
    a.dtmp = c.take(K::grad_scratch, act, {rows, h});
    a.dctx = c.take(K::grad_scratch, act, {rows, h});
    if (mlp_chunk > 0) {
      a.dwide = c.take(K::grad_scratch, act, {rows, 3 * h});
      a.mlp_dpre = c.take(K::mlp, act, {mlp_chunk, inter});
    } else {
      a.dwide = c.take(K::grad_scratch, act, {rows, std::max(inter, 3 * h)});
    }
  }
  a.mlm_x = c.take(K::heads, act, {m, h});
  a.mlm_pre = c.take(K::heads, act, {m, h});
  a.mlm_act = c.take(K::heads, act, {m, h});
  a.mlm_ln_mean = c.take(K::heads, f32, {m});
  a.mlm_ln_rstd = c.take(K::heads, f32, {m});
  a.mlm_out = c.take(K::heads, act, {m, h});
  a.logits = c.take(K::mlm_logits, f32, {chunk, config.vocab_size});
  a.nsp_ws = c.take(K::heads, f32, {nsp_workspace_elems(s, h)});

  a.mlm_dout = a.mlm_dact = a.mlm_dx = Tensor();
  if (!gradients) return;
  a.mlm_dout = c.take(K::heads, act, {m, h});
  a.mlm_dact = c.take(K::heads, act, {m, h});
  a.mlm_dx = c.take(K::heads, act, {m, h});
}

void upload_batch(Backend& be, const Batch& b, uint32_t step,
                  const std::vector<float>& grad_scales, Bert::Activations& a, bool ahead) {
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
