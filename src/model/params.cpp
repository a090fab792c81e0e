#include "model/params.h"

#include <algorithm>

#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "kernels/common/philox.h"
#include "kernels/base/error.h"

namespace packbert {

void ParamTable::add(const std::string& name, std::vector<int64_t> shape, bool no_decay) {
  ParamTensor t;
  t.name = name;
  t.size = 1;
  for (int64_t d : shape) t.size *= d;
  t.shape = std::move(shape);
  t.offset = total_;
  t.no_decay = no_decay;
  PB_CHECK(index_.emplace(name, tensors_.size()).second, "duplicate parameter {}", name);
  tensors_.push_back(std::move(t));
  total_ += tensors_.back().size;
}

ParamTable::ParamTable(const BertConfig& config) : config_(config) {
  validate(config);
  const int64_t v = config.vocab_size, h = config.hidden, i = config.intermediate;
  const bool decay = false, no_decay = true;
  auto layer_norm = [&](const std::string& prefix) {
    add(prefix + ".weight", {h}, no_decay);
    add(prefix + ".bias", {h}, no_decay);
  };
  add("bert.embeddings.word_embeddings.weight", {v, h}, decay);
  add("bert.embeddings.position_embeddings.weight", {config.max_position_embeddings, h}, decay);
  add("bert.embeddings.token_type_embeddings.weight", {config.type_vocab_size, h}, decay);
  layer_norm("bert.embeddings.LayerNorm");
  for (int64_t l = 0; l < config.layers; ++l) {
    const std::string p = fmt::format("bert.encoder.layer.{}.", l);
    // Weights first, then biases: [3H, H] and [3H] for the fused QKV GEMM.
    for (const char* qkv : {"query", "key", "value"})
      add(p + "attention.self." + qkv + ".weight", {h, h}, decay);
    for (const char* qkv : {"query", "key", "value"})
      add(p + "attention.self." + qkv + ".bias", {h}, no_decay);
    add(p + "attention.output.dense.weight", {h, h}, decay);
    add(p + "attention.output.dense.bias", {h}, no_decay);
    layer_norm(p + "attention.output.LayerNorm");
    add(p + "intermediate.dense.weight", {i, h}, decay);
    add(p + "intermediate.dense.bias", {i}, no_decay);
    add(p + "output.dense.weight", {h, i}, decay);
    add(p + "output.dense.bias", {h}, no_decay);
    layer_norm(p + "output.LayerNorm");
  }
  add("bert.pooler.dense.weight", {h, h}, decay);
  add("bert.pooler.dense.bias", {h}, no_decay);
  add("cls.predictions.transform.dense.weight", {h, h}, decay);
  add("cls.predictions.transform.dense.bias", {h}, no_decay);
  layer_norm("cls.predictions.transform.LayerNorm");
  add("cls.predictions.bias", {v}, no_decay);
  add("cls.seq_relationship.weight", {2, h}, decay);
  add("cls.seq_relationship.bias", {2}, no_decay);
}

const ParamTensor* ParamTable::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const ParamTensor& ParamTable::at(const std::string& name) const {
  const ParamTensor* t = find(name);
  PB_REQUIRE(t, "no parameter named '{}' in the BERT parameter table", name);
  return *t;
}

std::vector<LambTensor> ParamTable::lamb_rows() const {
  std::vector<LambTensor> rows;
  rows.reserve(tensors_.size());
  for (const ParamTensor& t : tensors_) rows.push_back({t.offset, t.size, t.no_decay ? 0 : 1});
  return rows;
}

namespace {
// The elements of `base` from element `first` on, as a tensor of `shape`.
Tensor shaped_view(const Tensor& base, int64_t first, const std::vector<int64_t>& shape) {
  PB_CHECK(shape.size() <= static_cast<size_t>(Tensor::kMaxDims), "too many dims");
  Tensor v = base;
  v.data = static_cast<char*>(base.data) + first * static_cast<int64_t>(dtype_size(base.dtype));
  v.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < Tensor::kMaxDims; ++d)
    v.shape[d] = d < v.ndim ? shape[static_cast<size_t>(d)] : 0;
  return v;
}
}  // namespace

Tensor tensor_view(const Tensor& flat, const ParamTensor& t) {
  PB_CHECK((flat.dtype == DType::f32 || flat.dtype == DType::bf16 || flat.dtype == DType::f16) &&
               t.offset + t.size <= flat.numel(),
           "parameter {} [{} + {}] outside the flat buffer {}", t.name, t.offset, t.size,
           flat.str());
  return shaped_view(flat, t.offset, t.shape);
}

namespace {

// The views of every tensor the model uses, each made by at(offset in the flat table, shape).
using ViewAt = std::function<Tensor(int64_t offset, const std::vector<int64_t>& shape)>;
BertWeights bind_with(const ParamTable& table, const ViewAt& at) {
  const int64_t h = table.config().hidden;
  auto get = [&](const std::string& name) {
    const ParamTensor& t = table.at(name);
    return at(t.offset, t.shape);
  };
  // Query, key and value laid end to end: one [3H, ...] tensor for the fused QKV GEMM.
  auto fused = [&](const std::string& prefix, const char* suffix,
                   const std::vector<int64_t>& dims) {
    const ParamTensor& q = table.at(prefix + "query" + suffix);
    const ParamTensor& k = table.at(prefix + "key" + suffix);
    const ParamTensor& v = table.at(prefix + "value" + suffix);
    PB_CHECK(k.offset == q.offset + q.size && v.offset == k.offset + k.size,
             "{}query/key/value{} are not adjacent", prefix, suffix);
    return at(q.offset, dims);
  };
  auto ln = [&](const std::string& prefix) {
    return LayerNormParams{get(prefix + ".weight"), get(prefix + ".bias")};
  };
  BertWeights w;
  w.embeddings.word = get("bert.embeddings.word_embeddings.weight");
  w.embeddings.position = get("bert.embeddings.position_embeddings.weight");
  w.embeddings.token_type = get("bert.embeddings.token_type_embeddings.weight");
  const LayerNormParams eln = ln("bert.embeddings.LayerNorm");
  w.embeddings.ln_gamma = eln.gamma;
  w.embeddings.ln_beta = eln.beta;
  for (int64_t l = 0; l < table.config().layers; ++l) {
    const std::string p = fmt::format("bert.encoder.layer.{}.", l);
    LayerWeights lw;
    lw.qkv_w = fused(p + "attention.self.", ".weight", {3 * h, h});
    lw.qkv_b = fused(p + "attention.self.", ".bias", {3 * h});
    lw.attn_out_w = get(p + "attention.output.dense.weight");
    lw.attn_out_b = get(p + "attention.output.dense.bias");
    lw.attn_ln = ln(p + "attention.output.LayerNorm");
    lw.ffn_in_w = get(p + "intermediate.dense.weight");
    lw.ffn_in_b = get(p + "intermediate.dense.bias");
    lw.ffn_out_w = get(p + "output.dense.weight");
    lw.ffn_out_b = get(p + "output.dense.bias");
    lw.ffn_ln = ln(p + "output.LayerNorm");
    w.layers.push_back(lw);
  }
  w.pooler_nsp.dense_w = get("bert.pooler.dense.weight");
  w.pooler_nsp.dense_b = get("bert.pooler.dense.bias");
  w.pooler_nsp.cls_w = get("cls.seq_relationship.weight");
  w.pooler_nsp.cls_b = get("cls.seq_relationship.bias");
  w.mlm_dense_w = get("cls.predictions.transform.dense.weight");
  w.mlm_dense_b = get("cls.predictions.transform.dense.bias");
  w.mlm_ln = ln("cls.predictions.transform.LayerNorm");
  w.mlm_bias = get("cls.predictions.bias");
  return w;
}

}  // namespace

BertWeights bind_weights(const ParamTable& table, const Tensor& flat) {
  PB_REQUIRE(
      flat.defined() &&
          (flat.dtype == DType::f32 || flat.dtype == DType::bf16 || flat.dtype == DType::f16) &&
          flat.numel() == table.total(),
      "bind_weights: flat buffer {} does not hold the {} floats of the parameter table", flat.str(),
      table.total());
  return bind_with(table, [&](int64_t offset, const std::vector<int64_t>& shape) {
    return shaped_view(flat, offset, shape);
  });
}

int64_t fp32_read_elems(const ParamTable& table) {
  int64_t n = 0;
  for (const auto& [a, b] : fp32_read_ranges(table, true)) n += b - a;
  return n;
}

BertWeights bind_fp32_weights(const ParamTable& table, const Tensor& compact) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = fp32_read_ranges(table, true);
  PB_REQUIRE(
      compact.defined() && compact.dtype == DType::f32 && compact.numel() == fp32_read_elems(table),
      "bind_fp32_weights: buffer {} does not hold the {} floats the ops read in fp32",
      compact.str(), fp32_read_elems(table));
  return bind_with(table, [&](int64_t offset, const std::vector<int64_t>& shape) {
    int64_t first = 0;  // the range's first element in the compact buffer
    for (const auto& [a, b] : ranges) {
      if (offset >= a && offset < b) return shaped_view(compact, first + offset - a, shape);
      first += b - a;
    }
    return Tensor();  // read in 16 bits (mixed_weights puts the copy's view here)
  });
}

namespace {

// FNV-1a: the tensor's name becomes part of the generator's counter.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void init_parameters(const ParamTable& table, const InitOptions& options, float* host) {
  PB_REQUIRE(options.std > 0.f, "init: std {} must be > 0", options.std);
  const auto key0 = static_cast<uint32_t>(options.seed);
  const auto key1 = static_cast<uint32_t>(options.seed >> 32);
  for (const ParamTensor& t : table.tensors()) {
    float* p = host + t.offset;
    const bool layer_norm = t.name.find("LayerNorm") != std::string::npos;
    if (layer_norm) {  // weight (gamma) 1, bias (beta) 0
      const float value = ends_with(t.name, ".weight") ? 1.f : 0.f;
      for (int64_t e = 0; e < t.size; ++e) p[e] = value;
      continue;
    }
    if (ends_with(t.name, "bias")) {  // every bias, cls.predictions.bias included
      for (int64_t e = 0; e < t.size; ++e) p[e] = 0.f;
      continue;
    }
    // Box-Muller on Philox words: one call gives 4 uniforms, i.e. 2 pairs, i.e. 4 normals.
    const uint64_t tag = name_hash(t.name);
#pragma omp parallel for schedule(static)
    for (int64_t block = 0; block < (t.size + 3) / 4; ++block) {
      const Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                            static_cast<uint32_t>(tag), static_cast<uint32_t>(tag >> 32)}};
      const Philox4x32 bits = philox4x32_10(ctr, key0, key1);
      double z[4];
      for (int k = 0; k < 2; ++k) {
        // u1 in (0, 1] so log(u1) is finite; u2 in [0, 1).
        const double u1 = (bits.v[2 * k] + 1.0) / 4294967296.0;
        const double u2 = bits.v[2 * k + 1] / 4294967296.0;
        const double r = std::sqrt(-2.0 * std::log(u1));
        z[2 * k] = r * std::cos(2.0 * M_PI * u2);
        z[2 * k + 1] = r * std::sin(2.0 * M_PI * u2);
      }
      for (int64_t k = 0; k < 4 && 4 * block + k < t.size; ++k)
        p[4 * block + k] = static_cast<float>(options.std * z[k]);
    }
  }
}

std::vector<std::pair<int64_t, int64_t>> fp32_read_ranges(const ParamTable& table, bool mixed) {
  std::vector<const ParamTensor*> rows;
  for (const ParamTensor& t : table.tensors())
    if (t.size > 0 && (!mixed || t.shape.size() != 2)) rows.push_back(&t);
  std::sort(rows.begin(), rows.end(),
            [](const ParamTensor* a, const ParamTensor* b) { return a->offset < b->offset; });
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const ParamTensor* t : rows) {
    if (!out.empty() && out.back().second == t->offset)
      out.back().second = t->offset + t->size;
    else
      out.emplace_back(t->offset, t->offset + t->size);
  }
  return out;
}

BertWeights mixed_weights(const ParamTable& table, const BertWeights& master, const Tensor& lowp) {
  BertWeights w = master;
  const BertWeights low = bind_weights(table, lowp);
  for (size_t l = 0; l < low.layers.size(); ++l) {
    LayerWeights& g = w.layers[l];
    g.qkv_w = low.layers[l].qkv_w;
    g.attn_out_w = low.layers[l].attn_out_w;
    g.ffn_in_w = low.layers[l].ffn_in_w;
    g.ffn_out_w = low.layers[l].ffn_out_w;
  }
  // The embedding tables: the lookup and the tied decoder (mlm_loss) read the 16-bit copy, as
  // the GEMMs do, so that a sharded optimizer gathers them in 16 bits (DistributedLamb).
  w.embeddings.word = low.embeddings.word;
  w.embeddings.position = low.embeddings.position;
  w.embeddings.token_type = low.embeddings.token_type;
  w.mlm_dense_w = low.mlm_dense_w;
  w.pooler_nsp.dense_w = low.pooler_nsp.dense_w;
  w.pooler_nsp.cls_w = low.pooler_nsp.cls_w;
  // What the ops read in fp32 must be exactly the tensors not replaced above, which a sharded
  // optimizer relies on to gather the rest in 16 bits.
  std::vector<const Tensor*> low16;
  for (const LayerWeights& g : w.layers)
    for (const Tensor* t : {&g.qkv_w, &g.attn_out_w, &g.ffn_in_w, &g.ffn_out_w}) low16.push_back(t);
  for (const Tensor* t : {&w.mlm_dense_w, &w.pooler_nsp.dense_w, &w.pooler_nsp.cls_w,
                          &w.embeddings.word, &w.embeddings.position, &w.embeddings.token_type})
    low16.push_back(t);
  int64_t low_elems = 0, fp32_elems = 0, all = 0;
  for (const Tensor* t : low16) low_elems += t->numel();
  for (const auto& [a, b] : fp32_read_ranges(table, true)) fp32_elems += b - a;
  for (const ParamTensor& t : table.tensors()) all += t.size;
  PB_REQUIRE(low_elems + fp32_elems == all,
             "model: {} elements read in 16 bits and {} in fp32 of {} (fp32_read_ranges)",
             low_elems, fp32_elems, all);
  return w;
}

std::vector<std::pair<int, int>> backward_groups(const ParamTable& table) {
  // The table is embeddings | layer 0 | ... | layer L-1 | pooler and heads (above).
  auto index = [&](const std::string& name) {
    return static_cast<int>(&table.at(name) - table.tensors().data());
  };
  auto layer_first = [&](int64_t l) {
    return index("bert.encoder.layer." + std::to_string(l) + ".attention.self.query.weight");
  };
  const int64_t layers = table.config().layers;
  const int heads_first = index("bert.pooler.dense.weight");
  std::vector<std::pair<int, int>> groups;
  groups.emplace_back(heads_first, static_cast<int>(table.tensors().size()));
  for (int64_t l = layers - 1; l >= 0; --l)
    groups.emplace_back(layer_first(l), l + 1 < layers ? layer_first(l + 1) : heads_first);
  groups.emplace_back(0, layer_first(0));
  return groups;
}

std::vector<std::pair<int64_t, int64_t>> forward_ranges(
    const ParamTable& table, const std::vector<std::pair<int, int>>& backward_groups) {
  const auto& rows = table.tensors();
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto g = backward_groups.rbegin(); g != backward_groups.rend(); ++g) {
    int64_t lo = table.total(), hi = 0;
    for (int i = g->first; i < g->second; ++i) {
      const ParamTensor& t = rows[static_cast<size_t>(i)];
      lo = std::min(lo, t.offset);
      hi = std::max(hi, t.offset + t.size);
    }
    out.emplace_back(lo, std::max(lo, hi));
  }
  return out;
}

}  // namespace packbert
