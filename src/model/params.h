// The parameter table: every tensor of BertForPreTraining, by its Hugging Face name, as a slice
// of one flat fp32 buffer (DESIGN.md, Memory). Parameters, gradients, LAMB moments and master
// weights all use this table, so all-reduce buckets, the optimizer and checkpoints are offset
// arithmetic over it.
//
// Order: Hugging Face's state_dict order, except that each layer's query, key and value weights
// come first and then their three biases, so that the three weights form one [3H, H] matrix and
// the biases one [3H] vector for the fused QKV GEMM. The MLM decoder weight
// (cls.predictions.decoder.weight) is tied to bert.embeddings.word_embeddings.weight and is not
// a tensor of its own; the decoder bias is cls.predictions.bias (HF counts each once too).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"

namespace packbert {

struct ParamTensor {
  std::string name;            // Hugging Face name, e.g. bert.encoder.layer.3.output.dense.weight
  std::vector<int64_t> shape;  // PyTorch's shape: nn.Linear weights are [out, in]
  int64_t offset = 0;          // first element in the flat buffer
  int64_t size = 0;            // elements
  // Excluded from weight decay and from LAMB's trust ratio: every bias and every LayerNorm
  // weight, as MLPerf's reference (no_decay = bias, gamma, beta, LayerNorm).
  bool no_decay = false;
};

class ParamTable {
 public:
  explicit ParamTable(const BertConfig& config);  // validates config

  const BertConfig& config() const { return config_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  int64_t total() const { return total_; }                 // elements of the flat buffer
  const ParamTensor* find(const std::string& name) const;  // nullptr when unknown
  const ParamTensor& at(const std::string& name) const;    // Error when unknown
  // LAMB's view (backend.h LambTensor): one row per tensor, ascending offsets.
  std::vector<LambTensor> lamb_rows() const;

 private:
  void add(const std::string& name, std::vector<int64_t> shape, bool no_decay);

  BertConfig config_;
  std::vector<ParamTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0;
};

// Views of one encoder layer's tensors.
struct LayerWeights {
  Tensor qkv_w;             // [3H, H] attention.self.{query,key,value}.weight
  Tensor qkv_b;             // [3H]
  Tensor attn_out_w;        // [H, H] attention.output.dense.weight
  Tensor attn_out_b;        // [H]
  LayerNormParams attn_ln;  // attention.output.LayerNorm
  Tensor ffn_in_w;          // [I, H] intermediate.dense.weight
  Tensor ffn_in_b;          // [I]
  Tensor ffn_out_w;         // [H, I] output.dense.weight
  Tensor ffn_out_b;         // [H]
  LayerNormParams ffn_ln;   // output.LayerNorm
};

// Views of every tensor the model uses, into one flat f32 buffer: the parameters, or the
// gradients (the same table, so the same views).
struct BertWeights {
  EmbeddingParams embeddings;
  std::vector<LayerWeights> layers;
  PoolerParams pooler_nsp;  // bert.pooler.dense and cls.seq_relationship
  Tensor mlm_dense_w;       // [H, H] cls.predictions.transform.dense.weight
  Tensor mlm_dense_b;       // [H]
  LayerNormParams mlm_ln;   // cls.predictions.transform.LayerNorm
  Tensor mlm_bias;          // [V] cls.predictions.bias; the decoder weight is embeddings.word
};

// flat: f32 [table.total()] on any device (views only, nothing is read); or the bf16 / f16 copy
// of the weights that mixed precision's GEMMs read (BertOptions::precision), laid out the same.
BertWeights bind_weights(const ParamTable& table, const Tensor& flat);

// The same views for a sharded run's model (optim.sharded, bf16 / fp16): the tensors the ops read
// in fp32 (fp32_read_ranges(table, true)) from `compact`, f32 [fp32_read_elems(table)], those
// ranges laid end to end; every other view none (mixed_weights fills them from the 16-bit copy).
BertWeights bind_fp32_weights(const ParamTable& table, const Tensor& compact);
int64_t fp32_read_elems(const ParamTable& table);

// What mixed precision's ops read in fp32 (BertOptions::precision): the 1-D tensors (biases,
// LayerNorm parameters); every 2-D tensor (the weight matrices and the embedding tables) they
// read from the 16-bit copy (Bert checks that it binds exactly these). The ranges [begin, end)
// of the flat buffer those tensors fill, ascending and merged where adjacent; with mixed =
// false (fp32) every tensor's.
std::vector<std::pair<int64_t, int64_t>> fp32_read_ranges(const ParamTable& table, bool mixed);

// The weights mixed precision's ops read: master's (fp32 views) with every weight matrix and
// embedding table replaced by its view of lowp, the bf16 / f16 copy of the whole table. Error
// unless the tensors left in fp32 are exactly fp32_read_ranges(table, true)'s.
BertWeights mixed_weights(const ParamTable& table, const BertWeights& master, const Tensor& lowp);

// The table's tensors in the groups a backward finishes: index ranges [first, last) into
// table.tensors(), the heads first, then encoder layer L-1 down to 0, then the embeddings.
std::vector<std::pair<int, int>> backward_groups(const ParamTable& table);
// Those groups in forward order (embeddings, layers, heads), each the range [begin, end) of the
// flat buffer its tensors span.
std::vector<std::pair<int64_t, int64_t>> forward_ranges(
    const ParamTable& table, const std::vector<std::pair<int, int>>& backward_groups);

// The view of one table entry with its own shape.
Tensor tensor_view(const Tensor& flat, const ParamTensor& t);

struct InitOptions {
  uint64_t seed = 0;
  float std = 0.02f;  // Hugging Face's initializer_range
};

// BERT's initialisation into host memory of table.total() floats: weights (embeddings
// included) ~ normal(0, std), biases 0, LayerNorm weights 1. Each element is a pure function of
// (seed, tensor name, element index) -- a counter-based generator, not a stream -- so a
// tensor's values do not depend on the other tensors, the table order or the thread count.
void init_parameters(const ParamTable& table, const InitOptions& options, float* host);

}  // namespace packbert
