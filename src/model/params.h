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

// What a tensor is, for its initialisation (init_parameters).
enum class ParamKind { weight, bias, norm_weight, norm_bias };

struct ParamTensor {
  std::string name;            // Hugging Face name, e.g. bert.encoder.layer.3.output.dense.weight
  std::vector<int64_t> shape;  // PyTorch's shape: nn.Linear weights are [out, in]
  int64_t offset = 0;          // first element in the flat buffer
  int64_t size = 0;            // elements
  // Excluded from weight decay and from LAMB's trust ratio: every bias and every LayerNorm
  // weight, as MLPerf's reference (no_decay = bias, gamma, beta, LayerNorm).
  bool no_decay = false;
  ParamKind kind = ParamKind::weight;
  // A weight's initial std in units of InitOptions::std: 1, or 1 / sqrt(2 L) for the output
  // projections of a ModernBERT-style (pre-norm) model.
  double init_scale = 1.0;
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
  // Indices into tensors(): the first tensor of encoder layer l, and the first of the heads.
  int layer_first(int64_t l) const { return layer_first_.at(static_cast<size_t>(l)); }
  int heads_first() const { return heads_first_; }

 private:
  // A tensor named `name` (nothing when the name is empty: the options leave it out).
  void add(const std::string& name, std::vector<int64_t> shape, ParamKind kind,
           double init_scale = 1.0);

  BertConfig config_;
  std::vector<ParamTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  int64_t total_ = 0;
  std::vector<int> layer_first_;
  int heads_first_ = 0;
};

// Views of one encoder layer's tensors (none where the architecture options leave a tensor out;
// model/param_names.h says which norm is which in a pre-norm model).
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

// The initialisation into host memory of table.total() floats: biases 0, norm weights 1, and
// weights (embeddings included) ~ normal(0, std) for BERT (post-norm models), or ModernBERT's
// truncated normal(0, std * init_scale) cut at 2 of its stds for pre-norm models (std for the
// embeddings, Wqkv and Wi, std / sqrt(2 L) for the attention's and the MLP's Wo and the head's
// dense). Each element is a pure function of (seed, tensor name, element index) -- a
// counter-based generator, not a stream -- so a tensor's values do not depend on the other
// tensors, the table order or the thread count.
void init_parameters(const ParamTable& table, const InitOptions& options, float* host);

}  // namespace packbert
