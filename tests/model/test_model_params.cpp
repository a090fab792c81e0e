// BertConfig presets and validation; the parameter table (Hugging Face names, exact cover of the
// flat buffer, parameter counts equal to HF BertForPreTraining's); initialisation statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "model_test_util.h"

namespace packbert::test {
namespace {

// Hugging Face BertForPreTraining's parameter count, in closed form (modeling_bert.py):
//   embeddings  V*H (word) + P*H (position) + T*H (token type) + 2H (LayerNorm)
//   per layer   4 (H*H + H) (query, key, value, attention output) + 2H (LayerNorm)
//               + (I*H + I) (intermediate) + (H*I + H) (output) + 2H (LayerNorm)
//   pooler      H*H + H
//   MLM head    H*H + H (transform) + 2H (LayerNorm) + V (cls.predictions.bias; the decoder
//               weight is tied to the word embeddings and its bias is this same vector, so HF
//               counts both once)
//   NSP head    2H + 2
int64_t hf_bert_for_pretraining_params(int64_t v, int64_t h, int64_t layers, int64_t inter,
                                       int64_t positions, int64_t types) {
  const int64_t embeddings = v * h + positions * h + types * h + 2 * h;
  const int64_t layer = 4 * (h * h + h) + 2 * h + (inter * h + inter) + (h * inter + h) + 2 * h;
  const int64_t pooler = h * h + h;
  const int64_t mlm = h * h + h + 2 * h + v;
  const int64_t nsp = 2 * h + 2;
  return embeddings + layers * layer + pooler + mlm + nsp;
}

int64_t hf_count(const BertConfig& c) {
  return hf_bert_for_pretraining_params(c.vocab_size, c.hidden, c.layers, c.intermediate,
                                        c.max_position_embeddings, c.type_vocab_size);
}

// Hugging Face ModernBertForMaskedLM's count for ModernBERT's options (modeling_modernbert.py,
// every bias off but the decoder's, norms without a bias):
//   embeddings  V*H (tok_embeddings) + H (norm)
//   per layer   H (attn_norm, an Identity in layer 0) + 3H*H (Wqkv) + H*H (Wo) + H (mlp_norm)
//               + 2I*H (Wi) + H*I (Wo)
//   final norm  H;  head  H*H (dense) + H (norm);  decoder  V (bias; the weight is tied)
int64_t hf_modernbert_for_masked_lm_params(int64_t v, int64_t h, int64_t layers, int64_t inter) {
  const int64_t layer = h + 3 * h * h + h * h + h + 2 * inter * h + h * inter;
  return v * h + h + layers * layer - h + h + h * h + h + v;
}

TEST(ModelParams, FormulaReproducesPublishedCounts) {
  // bert-base-uncased / bert-large-uncased BertForPreTraining (vocab 30522), as PyTorch's
  // sum(p.numel() for p in model.parameters()) reports them.
  EXPECT_EQ(hf_bert_for_pretraining_params(30522, 768, 12, 3072, 512, 2), 110106428);
  EXPECT_EQ(hf_bert_for_pretraining_params(30522, 1024, 24, 4096, 512, 2), 336226108);
}

TEST(ModelParams, CountsMatchHuggingFaceForEveryPreset) {
  for (const std::string& name : bert_preset_names()) {
    const BertConfig c = bert_preset(name);
    const bool modern = name.rfind("modernbert", 0) == 0;
    const bool bert_vocab = !modern || name == "modernbert-tiny";
    EXPECT_EQ(c.vocab_size, bert_vocab ? 30528 : 50368) << name;
    EXPECT_EQ(c.real_vocab_size, bert_vocab ? 30522 : 50368) << name;
    const ParamTable t(c);
    std::printf("%-6s %s: %lld parameters\n", name.c_str(), describe(c).c_str(),
                static_cast<long long>(t.total()));
    EXPECT_EQ(t.total(), modern ? hf_modernbert_for_masked_lm_params(c.vocab_size, c.hidden,
                                                                     c.layers, c.intermediate)
                                : hf_count(c))
        << name;
  }
  EXPECT_EQ(ParamTable(bert_preset("base")).total(), 110106428 + 6 * 768 + 6);
  EXPECT_EQ(ParamTable(bert_preset("large")).total(), 336226108 + 6 * 1024 + 6);
  // Other shapes: a longer position table, an unpadded vocabulary.
  BertConfig c = bert_preset("mini");
  c.max_position_embeddings = 1024;
  c.vocab_size = c.real_vocab_size = 1000;
  EXPECT_EQ(ParamTable(c).total(), hf_count(c));
}

TEST(ModelParams, TableCoversTheBufferExactly) {
  for (const char* preset : {"tiny", "large"}) {
    const BertConfig c = bert_preset(preset);
    const ParamTable t(c);
    int64_t at = 0;
    std::set<std::string> names;
    for (const ParamTensor& p : t.tensors()) {
      EXPECT_EQ(p.offset, at) << p.name << ": gap or overlap";
      int64_t n = 1;
      for (int64_t d : p.shape) n *= d;
      EXPECT_EQ(p.size, n) << p.name;
      EXPECT_GT(p.size, 0) << p.name;
      at += p.size;
      EXPECT_TRUE(names.insert(p.name).second) << p.name << " twice";
      EXPECT_EQ(&t.at(p.name), &p);
      const bool bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
      EXPECT_EQ(p.no_decay, bias || p.name.find("LayerNorm") != std::string::npos) << p.name;
    }
    EXPECT_EQ(at, t.total());
    // 5 embedding tensors, 16 per layer, pooler 2, MLM head 5, NSP 2.
    EXPECT_EQ(t.tensors().size(), static_cast<size_t>(5 + 16 * c.layers + 2 + 5 + 2));
    EXPECT_EQ(t.find("cls.predictions.decoder.weight"), nullptr) << "tied, not a tensor";
    EXPECT_THROW(t.at("bert.no.such.tensor"), Error);

    const int64_t h = c.hidden, i = c.intermediate, v = c.vocab_size;
    using Shape = std::vector<int64_t>;
    EXPECT_EQ(t.at("bert.embeddings.word_embeddings.weight").shape, (Shape{v, h}));
    EXPECT_EQ(t.at("bert.embeddings.position_embeddings.weight").shape, (Shape{512, h}));
    EXPECT_EQ(t.at("bert.embeddings.token_type_embeddings.weight").shape, (Shape{2, h}));
    EXPECT_EQ(t.at("bert.encoder.layer.1.attention.self.query.weight").shape, (Shape{h, h}));
    EXPECT_EQ(t.at("bert.encoder.layer.1.intermediate.dense.weight").shape, (Shape{i, h}));
    EXPECT_EQ(t.at("bert.encoder.layer.1.output.dense.weight").shape, (Shape{h, i}));
    EXPECT_EQ(t.at("cls.predictions.bias").shape, (Shape{v}));
    EXPECT_EQ(t.at("cls.seq_relationship.weight").shape, (Shape{2, h}));
    // Q, K, V weights end to end ([3H, H]) and their biases too ([3H]).
    for (int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "bert.encoder.layer." + std::to_string(l) + ".attention.self.";
      for (const char* kind : {".weight", ".bias"}) {
        const ParamTensor& q = t.at(p + "query" + kind);
        EXPECT_EQ(t.at(p + "key" + kind).offset, q.offset + q.size);
        EXPECT_EQ(t.at(p + "value" + kind).offset, q.offset + 2 * q.size);
      }
    }
    // LAMB's rows: the same cover, decay flags inverted.
    const auto rows = t.lamb_rows();
    ASSERT_EQ(rows.size(), t.tensors().size());
    for (size_t k = 0; k < rows.size(); ++k) {
      EXPECT_EQ(rows[k].offset, t.tensors()[k].offset);
      EXPECT_EQ(rows[k].size, t.tensors()[k].size);
      EXPECT_EQ(rows[k].decay, t.tensors()[k].no_decay ? 0 : 1);
    }
  }
}

TEST(ModelParams, BoundViewsPointIntoTheFlatBuffer) {
  const BertConfig c = bert_preset("tiny");
  const ParamTable t(c);
  std::vector<float> flat(static_cast<size_t>(t.total()));
  const BertWeights w = bind_weights(t, view(flat.data(), {t.total()}));
  auto at = [&](const std::string& n) { return flat.data() + t.at(n).offset; };
  EXPECT_EQ(w.embeddings.word.data, at("bert.embeddings.word_embeddings.weight"));
  EXPECT_EQ(w.layers[1].qkv_w.data, at("bert.encoder.layer.1.attention.self.query.weight"));
  EXPECT_EQ(w.layers[1].qkv_w.dim(0), 3 * c.hidden);
  EXPECT_EQ(w.layers[1].qkv_b.data, at("bert.encoder.layer.1.attention.self.query.bias"));
  EXPECT_EQ(w.layers[1].qkv_b.dim(0), 3 * c.hidden);
  EXPECT_EQ(w.layers[0].ffn_ln.gamma.data, at("bert.encoder.layer.0.output.LayerNorm.weight"));
  EXPECT_EQ(w.pooler_nsp.cls_w.data, at("cls.seq_relationship.weight"));
  EXPECT_EQ(w.mlm_bias.data, at("cls.predictions.bias"));
  std::vector<float> short_buffer(10);
  EXPECT_THROW(bind_weights(t, view(short_buffer.data(), {10})), Error);
}

TEST(ModelParams, InitialisationStatistics) {
  const BertConfig c = bert_preset("tiny");
  const ParamTable t(c);
  const uint64_t seed = test_seed();
  std::vector<float> a(static_cast<size_t>(t.total())), b(a.size()), other(a.size());
  init_parameters(t, InitOptions{seed, 0.02f}, a.data());
  init_parameters(t, InitOptions{seed, 0.02f}, b.data());
  init_parameters(t, InitOptions{seed + 1, 0.02f}, other.data());
  EXPECT_EQ(a, b) << "same seed, same parameters";
  EXPECT_NE(a, other);
  double z_mean = 0, z_sd = 0, z_within = 0;  // the worst over the tensors, in standard errors
  for (const ParamTensor& p : t.tensors()) {
    const float* x = a.data() + p.offset;
    const bool layer_norm = p.name.find("LayerNorm") != std::string::npos;
    const bool gamma = layer_norm && p.name.substr(p.name.size() - 6) == "weight";
    if (p.no_decay) {  // biases 0, LayerNorm weights 1
      for (int64_t k = 0; k < p.size; ++k) ASSERT_EQ(x[k], gamma ? 1.f : 0.f) << p.name;
      continue;
    }
    double sum = 0, sq = 0;
    int64_t within_1sd = 0;
    for (int64_t k = 0; k < p.size; ++k) {
      sum += x[k];
      sq += static_cast<double>(x[k]) * x[k];
      within_1sd += std::abs(x[k]) < 0.02f;
    }
    const double n = static_cast<double>(p.size), mean = sum / n, sd = std::sqrt(sq / n);
    // 6 standard errors: a false alarm once in ~10^9 tensors.
    const double zm = std::abs(mean) / (0.02 / std::sqrt(n));
    const double zs = std::abs(sd - 0.02) / (0.02 / std::sqrt(2 * n));
    const double zw = std::abs(within_1sd / n - 0.682689) / (0.466 / std::sqrt(n));
    EXPECT_LE(zm, 6) << p.name << ": mean";
    EXPECT_LE(zs, 6) << p.name << ": standard deviation";
    EXPECT_LE(zw, 6) << p.name << ": fraction within one standard deviation";
    z_mean = std::max(z_mean, zm), z_sd = std::max(z_sd, zs), z_within = std::max(z_within, zw);
  }
  print_bound("init mean, worst tensor (standard errors)", z_mean, 6);
  print_bound("init standard deviation, worst tensor (standard errors)", z_sd, 6);
  print_bound("init fraction within 1 sd, worst tensor (standard errors)", z_within, 6);
}

TEST(ModelConfig, PresetsValidateAndBadConfigsAreClearErrors) {
  for (const std::string& name : bert_preset_names()) EXPECT_NO_THROW(validate(bert_preset(name)));
  EXPECT_EQ(bert_preset("large").layers, 24);
  EXPECT_EQ(bert_preset("mini").heads, 4);
  EXPECT_EQ(pad_vocab(30522), 30528);
  EXPECT_EQ(pad_vocab(30528), 30528);
  auto message = [](const BertConfig& c) {
    try {
      validate(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BertConfig c = bert_preset("base");
  c.heads = 7;
  EXPECT_NE(message(c).find("not a multiple of heads"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.real_vocab_size = c.vocab_size + 1;
  EXPECT_NE(message(c).find("real_vocab_size"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.hidden_dropout = 1.f;
  EXPECT_NE(message(c).find("hidden_dropout"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.layer_norm_eps = 1e-5f;  // ModernBERT's: free
  EXPECT_NO_THROW(validate(c));
  c.layer_norm_eps = 0.f;
  EXPECT_NE(message(c).find("layer_norm_eps"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.position = Positions::rope;
  c.heads = 16;
  c.hidden = 16 * 33;  // head_dim 33: odd
  EXPECT_NE(message(c).find("even head_dim"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.global_every = 0;
  EXPECT_NE(message(c).find("global_every"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.local_window = -1;
  EXPECT_NE(message(c).find("local_window"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.layers = 0;
  EXPECT_NE(message(c).find("layers = 0"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.max_position_embeddings = (1 << 20) + 1;  // past the dropout key's 20 position bits
  EXPECT_NE(message(c).find("max_position_embeddings"), std::string::npos) << message(c);
  c = bert_preset("base");
  c.max_position_embeddings = 4096;  // longer than BERT's 512 is allowed
  EXPECT_NO_THROW(validate(c));
  try {
    bert_preset("huge");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny, mini, base, large"), std::string::npos);
  }
}

}  // namespace
}  // namespace packbert::test
