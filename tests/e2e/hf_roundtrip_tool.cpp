// The C++ half of the Hugging Face round trips (label e2e; driven by hf_roundtrip.py and
// modernbert_hf.py):
//
//   hf_roundtrip_tool write ROOT WORK
//       A randomly initialised tiny model (bert_preset("tiny"), biases and LayerNorm weights
//       perturbed so that a swapped tensor shows) written with write_checkpoint(ROOT) (its
//       directory printed on stdout); a batch of random samples WORK/batch.json; our logits on
//       it (eval: no dropout) in WORK/ours_mlm.f32 and WORK/ours_nsp.f32.
//   hf_roundtrip_tool logits CKPT WORK PREFIX
//       The model of CKPT (config.json + model.safetensors, load_model_weights) on
//       WORK/batch.json: WORK/PREFIX_mlm.f32 and WORK/PREFIX_nsp.f32.
//   hf_roundtrip_tool compare A B
//       Exit 0 when A and B hold the same config and bitwise the same weights, else 1 (each
//       differing tensor is printed).
//   hf_roundtrip_tool write-model ROOT TOML
//       A checkpoint of the model of train config TOML ([model], e.g. a modernbert preset),
//       initialised as packbert initialises it (init_parameters; norm weights and biases
//       perturbed), written with write_checkpoint(ROOT); its directory printed on stdout. No
//       Bert is constructed, so it runs for options the model refuses.
//   hf_roundtrip_tool init CKPT TOML CONFIG_OUT
//       The weights of CKPT loaded as --init-checkpoint loads them into the model of train
//       config TOML (load_model_weights: config.json must match the [model] in shape and every
//       architecture option, every tensor present with its shape, checksums verified); prints
//       "tensor NAME D0xD1..." for each tensor of the table and writes CKPT's config.json as
//       packbert writes it (read_hf_config, write_hf_config) to CONFIG_OUT.
//
// Files: batch.json {"vocab_size": V, "samples": [{"input_ids", "segment_ids",
// "masked_positions", "nsp_label"}, ...]}; *_mlm.f32 raw little-endian f32 [masked tokens, V]
// in the batch's masked order (sample by sample, positions ascending); *_nsp.f32 [samples, 2].
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/train_config.h"
#include "config/train_config_model.h"
#include "kernels/base/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/params.h"
#include "test_util.h"
#include "train/batching.h"
#include "train/checkpoint.h"

namespace packbert {
namespace {

constexpr int kMaxSeqLen = 64;

void write_f32(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(float)));
  PB_REQUIRE(out.good(), "{}: write failed", path);
}

// Random samples [CLS] A [SEP] B [SEP] with ids in [3, vocab), 1..8 masked positions each.
std::vector<Sample> random_samples(std::mt19937_64& rng, int64_t vocab) {
  constexpr int32_t kCls = 1, kSep = 2;
  std::vector<Sample> out;
  for (int len : {9, 64, 23, 40, 5, 31}) {
    Sample s;
    s.id = static_cast<int64_t>(out.size()) * 1000 + 17;
    const int len_a = std::uniform_int_distribution<int>(2, len - 3)(rng);
    std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
    for (int i = 0; i < len; ++i) {
      s.input_ids.push_back(tok(rng));
      s.segment_ids.push_back(i > len_a ? 1 : 0);
    }
    s.input_ids[0] = kCls;
    s.input_ids[static_cast<size_t>(len_a)] = kSep;
    s.input_ids[static_cast<size_t>(len - 1)] = kSep;
    std::vector<int32_t> cand;
    for (int i = 1; i < len - 1; ++i)
      if (i != len_a) cand.push_back(i);
    std::shuffle(cand.begin(), cand.end(), rng);
    cand.resize(std::min<size_t>(cand.size(), std::uniform_int_distribution<size_t>(1, 8)(rng)));
    std::sort(cand.begin(), cand.end());
    for (int32_t p : cand) {
      s.masked_lm_positions.push_back(p);
      s.masked_lm_ids.push_back(tok(rng));
    }
    s.next_sentence_label = static_cast<int8_t>(rng() & 1);
    out.push_back(std::move(s));
  }
  return out;
}

void write_batch(const std::string& path, const std::vector<Sample>& samples, int64_t vocab) {
  nlohmann::json j;
  j["vocab_size"] = vocab;
  j["samples"] = nlohmann::json::array();
  for (const Sample& s : samples) {
    std::vector<int> seg(s.segment_ids.begin(), s.segment_ids.end());
    j["samples"].push_back({{"id", s.id},
                            {"input_ids", s.input_ids},
                            {"segment_ids", seg},
                            {"masked_positions", s.masked_lm_positions},
                            {"masked_labels", s.masked_lm_ids},
                            {"nsp_label", static_cast<int>(s.next_sentence_label)}});
  }
  std::ofstream(path) << j.dump() << "\n";
}

std::vector<Sample> read_batch(const std::string& path) {
  const auto j = nlohmann::json::parse(test::read_file(path));
  std::vector<Sample> out;
  for (const auto& js : j["samples"]) {
    Sample s;
    s.id = js["id"].get<int64_t>();
    s.input_ids = js["input_ids"].get<std::vector<int32_t>>();
    for (int v : js["segment_ids"].get<std::vector<int>>())
      s.segment_ids.push_back(static_cast<int8_t>(v));
    s.masked_lm_positions = js["masked_positions"].get<std::vector<int32_t>>();
    s.masked_lm_ids = js["masked_labels"].get<std::vector<int32_t>>();
    s.next_sentence_label = static_cast<int8_t>(js["nsp_label"].get<int>());
    out.push_back(std::move(s));
  }
  return out;
}

// Our eval logits of `samples`: MLM [masked, V] and NSP [samples, 2].
void logits(const BertConfig& config, std::vector<float>& params,
            const std::vector<Sample>& samples, std::vector<float>* mlm, std::vector<float>* nsp) {
  auto be = make_cpu_backend();
  const ParamTable table(config);
  Bert bert(config, *be, view(params.data(), {table.total()}), Tensor());
  const Batch b = make_batch(samples, BatchLayout::unpadded, kMaxSeqLen);
  const int64_t v = config.vocab_size;
  mlm->assign(static_cast<size_t>(b.num_masked() * v), 0.f);
  nsp->assign(static_cast<size_t>(b.num_seqs() * 2), 0.f);
  ForwardOptions eval;
  eval.dropout = false;
  eval.gradients = false;
  eval.mlm_logits = [&](int64_t first, const std::vector<float>& z, int64_t n) {
    std::copy(z.begin(), z.begin() + n * v, mlm->begin() + first * v);
  };
  eval.nsp_logits = [&](const std::vector<float>& z, int64_t s) {
    std::copy(z.begin(), z.begin() + 2 * s, nsp->begin());
  };
  bert.forward(b, b.num_masked(), b.num_seqs(), 0, 0, eval);
}

int cmd_write(const std::string& root, const std::string& work) {
  std::mt19937_64 rng(test::test_seed());
  const BertConfig config = bert_preset("tiny");
  const ParamTable table(config);
  std::vector<float> params(static_cast<size_t>(table.total())), m(params.size()), v(params.size());
  init_parameters(table, InitOptions{rng(), 0.02f}, params.data());
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (const ParamTensor& t : table.tensors()) {
    // Perturb biases and LayerNorm weights (init: 0 and 1), but keep the padded vocabulary
    // rows at the converter's values so the model is one a conversion could produce.
    if (!t.no_decay) continue;
    for (int64_t i = 0; i < t.size; ++i) params[static_cast<size_t>(t.offset + i)] += nd(rng);
  }
  const ParamTensor& bias = table.at("cls.predictions.bias");
  const ParamTensor& emb = table.at("bert.embeddings.word_embeddings.weight");
  for (int64_t i = config.real_vocab_size; i < config.vocab_size; ++i) {
    params[static_cast<size_t>(bias.offset + i)] = -10000.f;
    for (int64_t j = 0; j < config.hidden; ++j)
      params[static_cast<size_t>(emb.offset + i * config.hidden + j)] = 0.f;
  }
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = nd(rng);
    v[i] = nd(rng) * nd(rng);
  }
  CheckpointWrite w{&table, params.data(), m.data(), v.data(), 0, 0, "{\"hf_roundtrip\": true}"};
  const std::string dir = write_checkpoint(root, w, 1);
  const auto samples = random_samples(rng, config.real_vocab_size);
  write_batch(work + "/batch.json", samples, config.vocab_size);
  std::vector<float> mlm, nsp;
  logits(config, params, samples, &mlm, &nsp);
  write_f32(work + "/ours_mlm.f32", mlm);
  write_f32(work + "/ours_nsp.f32", nsp);
  std::cout << dir << "\n";
  return 0;
}

int cmd_logits(const std::string& ckpt, const std::string& work, const std::string& prefix) {
  const BertConfig config = read_hf_config(ckpt + "/config.json");
  const ParamTable table(config);
  std::vector<float> params(static_cast<size_t>(table.total()));
  load_model_weights(ckpt, table, params.data());
  std::vector<float> mlm, nsp;
  logits(config, params, read_batch(work + "/batch.json"), &mlm, &nsp);
  write_f32(work + "/" + prefix + "_mlm.f32", mlm);
  write_f32(work + "/" + prefix + "_nsp.f32", nsp);
  std::cout << describe(config) << "\n";
  return 0;
}

int cmd_compare(const std::string& a, const std::string& b) {
  const BertConfig ca = read_hf_config(a + "/config.json");
  const BertConfig cb = read_hf_config(b + "/config.json");
  if (describe(ca) != describe(cb)) {
    std::cout << "configs differ: " << describe(ca) << " vs " << describe(cb) << "\n";
    return 1;
  }
  const ParamTable table(ca);
  std::vector<float> pa(static_cast<size_t>(table.total())), pb(pa.size());
  load_model_weights(a, table, pa.data());
  load_model_weights(b, table, pb.data());
  int bad = 0;
  for (const ParamTensor& t : table.tensors()) {
    if (std::memcmp(pa.data() + t.offset, pb.data() + t.offset,
                    static_cast<size_t>(t.size) * sizeof(float)) != 0) {
      std::cout << "differs: " << t.name << "\n";
      ++bad;
    }
  }
  std::cout << (bad ? "weights differ" : "weights bitwise equal") << " (" << table.tensors().size()
            << " tensors, " << table.total() << " floats)\n";
  return bad ? 1 : 0;
}

int cmd_write_model(const std::string& root, const std::string& toml) {
  std::mt19937_64 rng(test::test_seed());
  const BertConfig config = model_config(load_train_config(toml));
  const ParamTable table(config);
  std::vector<float> params(static_cast<size_t>(table.total())), m(params.size()), v(params.size());
  init_parameters(table, InitOptions{rng(), 0.02f}, params.data());
  std::normal_distribution<float> nd(0.f, 0.05f);
  for (const ParamTensor& t : table.tensors()) {
    if (!t.no_decay) continue;  // norm weights (init 1) and biases (init 0): away from them
    for (int64_t i = 0; i < t.size; ++i) params[static_cast<size_t>(t.offset + i)] += nd(rng);
  }
  CheckpointWrite w{&table, params.data(), m.data(), v.data(), 0, 0, "{\"hf_roundtrip\": true}"};
  std::cout << write_checkpoint(root, w, 1) << "\n";
  return 0;
}

int cmd_init(const std::string& ckpt, const std::string& toml, const std::string& config_out) {
  const BertConfig config = model_config(load_train_config(toml));
  const ParamTable table(config);
  std::vector<float> params(static_cast<size_t>(table.total()));
  load_model_weights(ckpt, table, params.data());
  for (const ParamTensor& t : table.tensors()) {
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    std::cout << "tensor " << t.name << " " << shape << "\n";
  }
  write_hf_config(config_out, read_hf_config(ckpt + "/config.json"));
  std::cout << describe(config) << ": " << table.tensors().size() << " tensors, " << table.total()
            << " floats\n";
  return 0;
}

}  // namespace
}  // namespace packbert

int main(int argc, char** argv) {
  using namespace packbert;
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() == 3 && a[0] == "write") return cmd_write(a[1], a[2]);
    if (a.size() == 4 && a[0] == "logits") return cmd_logits(a[1], a[2], a[3]);
    if (a.size() == 3 && a[0] == "compare") return cmd_compare(a[1], a[2]);
    if (a.size() == 3 && a[0] == "write-model") return cmd_write_model(a[1], a[2]);
    if (a.size() == 4 && a[0] == "init") return cmd_init(a[1], a[2], a[3]);
    std::cerr << "usage: hf_roundtrip_tool write ROOT WORK | logits CKPT WORK PREFIX | "
                 "compare A B | write-model ROOT TOML | init CKPT TOML CONFIG_OUT\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hf_roundtrip_tool: error: " << e.what() << "\n";
    return 1;
  }
}
