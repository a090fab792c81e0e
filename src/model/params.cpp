#include "model/params.h"

#include <algorithm>

#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "kernels/common/philox.h"
#include "kernels/base/error.h"
#include "model/param_names.h"

namespace packbert {

void ParamTable::add(const std::string& name, std::vector<int64_t> shape, ParamKind kind,
                     double init_scale) {
  if (name.empty()) return;
  ParamTensor t;
  t.name = name;
  t.size = 1;
  for (int64_t d : shape) t.size *= d;
  t.shape = std::move(shape);
  t.offset = total_;
  t.no_decay = kind != ParamKind::weight;
  t.kind = kind;
  t.init_scale = init_scale;
  PB_CHECK(index_.emplace(name, tensors_.size()).second, "duplicate parameter {}", name);
  tensors_.push_back(std::move(t));
  total_ += tensors_.back().size;
}

ParamTable::ParamTable(const BertConfig& config) : config_(config) {
  validate(config);
  const ModelNames n = model_names(config);
  const int64_t v = config.vocab_size, h = config.hidden, i = config.intermediate;
  // ModernBERT's output projections start at std / sqrt(2 L) (param_names.h, init_parameters).
  const double out_scale = config.norm == NormPlacement::pre
                               ? 1.0 / std::sqrt(2.0 * static_cast<double>(config.layers))
                               : 1.0;
  auto norm = [&](const NormNames& names) {
    add(names.weight, {h}, ParamKind::norm_weight);
    add(names.bias, {h}, ParamKind::norm_bias);
  };
  add(n.word, {v, h}, ParamKind::weight);
  add(n.position, {config.max_position_embeddings, h}, ParamKind::weight);
  add(n.token_type, {config.type_vocab_size, h}, ParamKind::weight);
  norm(n.embedding_ln);
  for (const LayerNames& l : n.layers) {
    layer_first_.push_back(static_cast<int>(tensors_.size()));
    // Weights first, then biases: [3H, H] and [3H] for the fused QKV GEMM.
    const int64_t rows = 3 * h / static_cast<int64_t>(l.qkv_w.size());
    for (const std::string& w : l.qkv_w) add(w, {rows, h}, ParamKind::weight);
    for (const std::string& b : l.qkv_b) add(b, {rows}, ParamKind::bias);
    add(l.attn_out_w, {h, h}, ParamKind::weight, out_scale);
    add(l.attn_out_b, {h}, ParamKind::bias);
    norm(l.attn_ln);
    add(l.ffn_in_w, {config.mlp_in_width(), h}, ParamKind::weight);
    add(l.ffn_in_b, {config.mlp_in_width()}, ParamKind::bias);
    add(l.ffn_out_w, {h, i}, ParamKind::weight, out_scale);
    add(l.ffn_out_b, {h}, ParamKind::bias);
    norm(l.ffn_ln);
  }
  heads_first_ = static_cast<int>(tensors_.size());
  add(n.pooler_w, {h, h}, ParamKind::weight);
  add(n.pooler_b, {h}, ParamKind::bias);
  add(n.mlm_dense_w, {h, h}, ParamKind::weight, out_scale);
  add(n.mlm_dense_b, {h}, ParamKind::bias);
  norm(n.mlm_ln);
  add(n.mlm_bias, {v}, ParamKind::bias);
  add(n.nsp_w, {2, h}, ParamKind::weight);
  add(n.nsp_b, {2}, ParamKind::bias);
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
  const BertConfig& c = table.config();
  const int64_t h = c.hidden;
  const ModelNames n = model_names(c);
  // A tensor's view, none when the options leave it out.
  auto get = [&](const std::string& name) {
    if (name.empty()) return Tensor();
    const ParamTensor& t = table.at(name);
    return at(t.offset, t.shape);
  };
  // Tensors laid end to end as one (BERT's query, key and value: one [3H, ...] tensor for the
  // fused QKV GEMM).
  auto joined = [&](const std::vector<std::string>& names, const std::vector<int64_t>& dims) {
    if (names.empty()) return Tensor();
    for (size_t k = 1; k < names.size(); ++k) {
      const ParamTensor& prev = table.at(names[k - 1]);
      PB_CHECK(table.at(names[k]).offset == prev.offset + prev.size, "{} and {} are not adjacent",
               names[k - 1], names[k]);
    }
    return at(table.at(names[0]).offset, dims);
  };
  auto ln = [&](const NormNames& names) {
    return LayerNormParams{get(names.weight), get(names.bias), c.layer_norm_eps};
  };
  BertWeights w;
  w.embeddings.word = get(n.word);
  w.embeddings.position = get(n.position);
  w.embeddings.token_type = get(n.token_type);
  const LayerNormParams eln = ln(n.embedding_ln);
  w.embeddings.ln_gamma = eln.gamma;
  w.embeddings.ln_beta = eln.beta;
  w.embeddings.ln_eps = eln.eps;
  for (const LayerNames& l : n.layers) {
    LayerWeights lw;
    lw.qkv_w = joined(l.qkv_w, {3 * h, h});
    lw.qkv_b = joined(l.qkv_b, {3 * h});
    lw.attn_out_w = get(l.attn_out_w);
    lw.attn_out_b = get(l.attn_out_b);
    lw.attn_ln = ln(l.attn_ln);
    lw.ffn_in_w = get(l.ffn_in_w);
    lw.ffn_in_b = get(l.ffn_in_b);
    lw.ffn_out_w = get(l.ffn_out_w);
    lw.ffn_out_b = get(l.ffn_out_b);
    lw.ffn_ln = ln(l.ffn_ln);
    w.layers.push_back(lw);
  }
  w.pooler_nsp.dense_w = get(n.pooler_w);
  w.pooler_nsp.dense_b = get(n.pooler_b);
  w.pooler_nsp.cls_w = get(n.nsp_w);
  w.pooler_nsp.cls_b = get(n.nsp_b);
  w.mlm_dense_w = get(n.mlm_dense_w);
  w.mlm_dense_b = get(n.mlm_dense_b);
  w.mlm_ln = ln(n.mlm_ln);
  w.mlm_bias = get(n.mlm_bias);
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

// Two uniforms of one Philox word pair -> one standard normal (Box-Muller), u1 in (0, 1] so
// log(u1) is finite, u2 in [0, 1); k picks cos (0) or sin (1).
double box_muller(uint32_t w1, uint32_t w2, int k) {
  const double u1 = (w1 + 1.0) / 4294967296.0;
  const double u2 = w2 / 4294967296.0;
  const double r = std::sqrt(-2.0 * std::log(u1));
  return k == 0 ? r * std::cos(2.0 * M_PI * u2) : r * std::sin(2.0 * M_PI * u2);
}

// BERT's normal(0, std): one Philox call gives 4 uniforms, i.e. 2 pairs, i.e. 4 normals.
void fill_normal(const ParamTensor& t, uint64_t tag, uint32_t key0, uint32_t key1, double std,
                 float* p) {
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < (t.size + 3) / 4; ++block) {
    const Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                          static_cast<uint32_t>(tag), static_cast<uint32_t>(tag >> 32)}};
    const Philox4x32 bits = philox4x32_10(ctr, key0, key1);
    double z[4];
    for (int k = 0; k < 2; ++k) {
      z[2 * k] = box_muller(bits.v[2 * k], bits.v[2 * k + 1], 0);
      z[2 * k + 1] = box_muller(bits.v[2 * k], bits.v[2 * k + 1], 1);
    }
    for (int64_t k = 0; k < 4 && 4 * block + k < t.size; ++k)
      p[4 * block + k] = static_cast<float>(std * z[k]);
  }
}

// ModernBERT's truncated normal(0, std) on [-2 std, 2 std], by rejection: element e draws
// normals from Philox(e, attempt, tag) until one falls inside (95% do at the first attempt).
void fill_truncated(const ParamTensor& t, uint64_t tag, uint32_t key0, uint32_t key1, double std,
                    float* p) {
  const auto tag0 = static_cast<uint32_t>(tag), tag1 = static_cast<uint32_t>(tag >> 32);
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < t.size; ++e) {
    double z = 0.0;
    for (uint32_t attempt = 0;; ++attempt) {
      // The element's 40 bits and the attempt in the counter's first two words.
      const Philox4x32 ctr{{static_cast<uint32_t>(e),
                            static_cast<uint32_t>(e >> 32) | (attempt << 12) | 0x80000000u, tag0,
                            tag1}};
      const Philox4x32 bits = philox4x32_10(ctr, key0, key1);
      z = box_muller(bits.v[0], bits.v[1], 0);
      if (std::fabs(z) <= 2.0) break;
      z = box_muller(bits.v[0], bits.v[1], 1);
      if (std::fabs(z) <= 2.0) break;
    }
    p[e] = static_cast<float>(std * z);
  }
}

}  // namespace

void init_parameters(const ParamTable& table, const InitOptions& options, float* host) {
  PB_REQUIRE(options.std > 0.f, "init: std {} must be > 0", options.std);
  const auto key0 = static_cast<uint32_t>(options.seed);
  const auto key1 = static_cast<uint32_t>(options.seed >> 32);
  const bool modern = table.config().norm == NormPlacement::pre;
  for (const ParamTensor& t : table.tensors()) {
    float* p = host + t.offset;
    if (t.kind != ParamKind::weight) {  // norm weights (gamma) 1; biases and norm biases 0
      const float value = t.kind == ParamKind::norm_weight ? 1.f : 0.f;
      for (int64_t e = 0; e < t.size; ++e) p[e] = value;
      continue;
    }
    const double std = options.std * t.init_scale;
    if (modern)
      fill_truncated(t, name_hash(t.name), key0, key1, std, p);
    else
      fill_normal(t, name_hash(t.name), key0, key1, std, p);
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
  for (const Tensor* t : low16)
    if (t->defined()) low_elems += t->numel();
  for (const auto& [a, b] : fp32_read_ranges(table, true)) fp32_elems += b - a;
  for (const ParamTensor& t : table.tensors()) all += t.size;
  PB_REQUIRE(low_elems + fp32_elems == all,
             "model: {} elements read in 16 bits and {} in fp32 of {} (fp32_read_ranges)",
             low_elems, fp32_elems, all);
  return w;
}

std::vector<std::pair<int, int>> backward_groups(const ParamTable& table) {
  // The table is embeddings | layer 0 | ... | layer L-1 | pooler and heads (ParamTable).
  const int64_t layers = table.config().layers;
  const int heads_first = table.heads_first();
  std::vector<std::pair<int, int>> groups;
  groups.emplace_back(heads_first, static_cast<int>(table.tensors().size()));
  for (int64_t l = layers - 1; l >= 0; --l)
    groups.emplace_back(table.layer_first(l),
                        l + 1 < layers ? table.layer_first(l + 1) : heads_first);
  groups.emplace_back(0, table.layer_first(0));
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
