#include "model/param_names.h"

#include <fmt/format.h>

namespace packbert {

namespace {

std::string if_(bool keep, const std::string& name) { return keep ? name : std::string(); }

NormNames norm(const BertConfig& c, const std::string& prefix) {
  return {prefix + ".weight", if_(c.norm_bias, prefix + ".bias")};
}

ModelNames bert_names(const BertConfig& c) {
  ModelNames n;
  n.word = "bert.embeddings.word_embeddings.weight";
  n.position = if_(c.position == Positions::learned, "bert.embeddings.position_embeddings.weight");
  n.token_type = if_(c.token_types, "bert.embeddings.token_type_embeddings.weight");
  n.embedding_ln = norm(c, "bert.embeddings.LayerNorm");
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("bert.encoder.layer.{}.", l);
    LayerNames ln;
    for (const char* qkv : {"query", "key", "value"}) {
      ln.qkv_w.push_back(p + "attention.self." + qkv + ".weight");
      if (c.bias) ln.qkv_b.push_back(p + "attention.self." + qkv + ".bias");
    }
    ln.attn_out_w = p + "attention.output.dense.weight";
    ln.attn_out_b = if_(c.bias, p + "attention.output.dense.bias");
    ln.attn_ln = norm(c, p + "attention.output.LayerNorm");
    ln.ffn_in_w = p + "intermediate.dense.weight";
    ln.ffn_in_b = if_(c.bias, p + "intermediate.dense.bias");
    ln.ffn_out_w = p + "output.dense.weight";
    ln.ffn_out_b = if_(c.bias, p + "output.dense.bias");
    ln.ffn_ln = norm(c, p + "output.LayerNorm");
    n.layers.push_back(ln);
  }
  n.mlm_dense_w = "cls.predictions.transform.dense.weight";
  n.mlm_dense_b = if_(c.bias, "cls.predictions.transform.dense.bias");
  n.mlm_ln = norm(c, "cls.predictions.transform.LayerNorm");
  n.mlm_bias = "cls.predictions.bias";
  n.pooler_w = if_(c.nsp_head, "bert.pooler.dense.weight");
  n.pooler_b = if_(c.nsp_head, "bert.pooler.dense.bias");
  n.nsp_w = if_(c.nsp_head, "cls.seq_relationship.weight");
  n.nsp_b = if_(c.nsp_head, "cls.seq_relationship.bias");
  return n;
}

// ModernBertForMaskedLM's names; the options ModernBERT does not have (learned positions, token
// types, the NSP head) take names of the same form.
ModelNames modernbert_names(const BertConfig& c) {
  ModelNames n;
  n.word = "model.embeddings.tok_embeddings.weight";
  n.position = if_(c.position == Positions::learned, "model.embeddings.position_embeddings.weight");
  n.token_type = if_(c.token_types, "model.embeddings.token_type_embeddings.weight");
  n.embedding_ln = norm(c, "model.embeddings.norm");
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerNames ln;
    ln.qkv_w.push_back(p + "attn.Wqkv.weight");
    if (c.bias) ln.qkv_b.push_back(p + "attn.Wqkv.bias");
    ln.attn_out_w = p + "attn.Wo.weight";
    ln.attn_out_b = if_(c.bias, p + "attn.Wo.bias");
    ln.attn_ln = norm(c, p + "mlp_norm");
    ln.ffn_in_w = p + "mlp.Wi.weight";
    ln.ffn_in_b = if_(c.bias, p + "mlp.Wi.bias");
    ln.ffn_out_w = p + "mlp.Wo.weight";
    ln.ffn_out_b = if_(c.bias, p + "mlp.Wo.bias");
    ln.ffn_ln = l + 1 < c.layers ? norm(c, fmt::format("model.layers.{}.attn_norm", l + 1))
                                 : norm(c, "model.final_norm");
    n.layers.push_back(ln);
  }
  n.mlm_dense_w = "head.dense.weight";
  n.mlm_dense_b = if_(c.bias, "head.dense.bias");
  n.mlm_ln = norm(c, "head.norm");
  n.mlm_bias = "decoder.bias";
  n.pooler_w = if_(c.nsp_head, "pooler.dense.weight");
  n.pooler_b = if_(c.nsp_head, "pooler.dense.bias");
  n.nsp_w = if_(c.nsp_head, "seq_relationship.weight");
  n.nsp_b = if_(c.nsp_head, "seq_relationship.bias");
  return n;
}

}  // namespace

ModelNames model_names(const BertConfig& config) {
  return config.norm == NormPlacement::pre ? modernbert_names(config) : bert_names(config);
}

}  // namespace packbert
