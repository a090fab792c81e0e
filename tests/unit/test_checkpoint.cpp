// Checkpoints (src/train/checkpoint.h): bitwise round trips of the tiny model's parameters,
// LAMB moments and trainer state; keep_last pruning and replacement; latest_checkpoint and
// incomplete / temporary directories; config and tensor mismatches; damage of each file (a
// DamagedFileError naming file and tensor, apart from mismatches) and checkpoints without
// checksums; the directories --resume auto tries and sets aside; a full disk (RLIMIT_FSIZE)
// in the middle of a write leaving the previous checkpoint intact; an unwritable root; the
// trainer state's round trip and its errors.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "model/config.h"
#include "model/params.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/safetensors.h"

namespace packbert {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

// A tiny model's state: random parameters and moments (every element distinct from zero).
struct State {
  ParamTable table;
  std::vector<float> params, m, v;
  std::string trainer_state;

  explicit State(uint64_t seed, const BertConfig& c = bert_preset("tiny"))
      : table(c), params(static_cast<size_t>(table.total())), m(params.size()), v(params.size()) {
    init_parameters(table, InitOptions{seed, 0.02f}, params.data());
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1e-3f);
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = nd(rng);
      v[i] = std::abs(nd(rng)) * 1e-3f;
    }
    // Biases and LayerNorm weights away from 0/1 so that a swap shows.
    for (const ParamTensor& t : table.tensors())
      if (t.no_decay)
        for (int64_t i = 0; i < t.size; ++i) params[static_cast<size_t>(t.offset + i)] += nd(rng);
    trainer_state = nlohmann::json({{"seed", seed}, {"loader", {1, 2, 3}}, {"note", "é\n"}}).dump();
  }

  CheckpointWrite write(int64_t step, int64_t lamb_steps) const {
    return {&table, params.data(), m.data(), v.data(), step, lamb_steps, trainer_state};
  }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_reads_back(const std::string& dir, const State& s, int64_t step, int64_t lamb_steps) {
  const size_t n = s.params.size();
  std::vector<float> p(n), m(n), v(n);
  for (auto* b : {&p, &m, &v}) std::fill(b->begin(), b->end(), -1.f);
  const CheckpointRead r = read_checkpoint(dir, s.table, p.data(), m.data(), v.data());
  EXPECT_EQ(r.step, step);
  EXPECT_EQ(r.lamb_steps_done, lamb_steps);
  EXPECT_EQ(r.trainer_state_json, s.trainer_state);
  EXPECT_EQ(describe(r.config), describe(s.table.config()));
  EXPECT_TRUE(bitwise_equal(p, s.params)) << dir;
  EXPECT_TRUE(bitwise_equal(m, s.m)) << dir;
  EXPECT_TRUE(bitwise_equal(v, s.v)) << dir;
}

std::vector<std::string> entries(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, RoundTripIsBitwise) {
  const uint64_t seed = test::test_seed();
  State s(seed);
  TempDir root;
  const std::string dir = write_checkpoint(root.path(), s.write(1234, 1200), 3);
  EXPECT_EQ(dir, root.file("step_00001234"));
  EXPECT_EQ(entries(root.path()), std::vector<std::string>{"step_00001234"});
  for (const char* f :
       {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"})
    EXPECT_TRUE(fs::is_regular_file(dir + "/" + f)) << f;
  expect_reads_back(dir, s, 1234, 1200);
  EXPECT_EQ(latest_checkpoint(root.path()), dir);

  // m and v may be skipped; params alone via load_model_weights.
  std::vector<float> p(s.params.size());
  read_checkpoint(dir, s.table, p.data(), nullptr, nullptr);
  EXPECT_TRUE(bitwise_equal(p, s.params));
  std::fill(p.begin(), p.end(), 0.f);
  load_model_weights(dir, s.table, p.data());
  EXPECT_TRUE(bitwise_equal(p, s.params));

  // The files as Hugging Face expects them.
  SafetensorsFile model(dir + "/model.safetensors");
  EXPECT_EQ(model.metadata().at("format"), "pt");
  EXPECT_EQ(model.names().size(), s.table.tensors().size());
  EXPECT_FALSE(model.contains("cls.predictions.decoder.weight"));
  EXPECT_EQ(model.info("bert.embeddings.word_embeddings.weight").shape,
            (std::vector<int64_t>{30528, 128}));
  SafetensorsFile opt(dir + "/optimizer.safetensors");
  EXPECT_EQ(opt.metadata().at("steps_done"), "1200");
  EXPECT_TRUE(opt.contains("exp_avg.cls.predictions.bias"));
  EXPECT_TRUE(opt.contains("exp_avg_sq.bert.pooler.dense.weight"));
  const auto cfg = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  EXPECT_EQ(cfg["architectures"], nlohmann::json({"BertForPreTraining"}));
  EXPECT_EQ(cfg["model_type"], "bert");
  EXPECT_EQ(cfg["vocab_size"], 30528);
  EXPECT_EQ(cfg["packbert_real_vocab_size"], 30522);
  EXPECT_EQ(cfg["hidden_size"], 128);
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["num_attention_heads"], 2);
  EXPECT_EQ(cfg["intermediate_size"], 512);
  EXPECT_EQ(cfg["hidden_act"], "gelu");
  EXPECT_EQ(cfg["hidden_dropout_prob"], 0.1);
  EXPECT_EQ(cfg["layer_norm_eps"], 1e-12);
  EXPECT_EQ(cfg["position_embedding_type"], "absolute");
}

TEST(Checkpoint, HfConfigReadsGoogleStyleConfigs) {
  TempDir dir;
  // Google's bert_config.json of bert-large-uncased: no layer_norm_eps, no model_type.
  std::ofstream(dir.file("google.json"))
      << R"({"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
             "hidden_dropout_prob": 0.1, "hidden_size": 1024, "initializer_range": 0.02,
             "intermediate_size": 4096, "max_position_embeddings": 512,
             "num_attention_heads": 16, "num_hidden_layers": 24, "type_vocab_size": 2,
             "vocab_size": 30522})";
  const BertConfig c = read_hf_config(dir.file("google.json"));
  EXPECT_EQ(describe(c), "L=24 H=1024 A=16 I=4096 V=30522 (30522) P=512");
  EXPECT_EQ(c.layer_norm_eps, 1e-12f);
  // Ours round trips, dropout included.
  BertConfig mini = bert_preset("mini");
  mini.hidden_dropout = 0.15f;
  mini.attention_dropout = 0.f;
  mini.real_vocab_size = 30000;
  write_hf_config(dir.file("ours.json"), mini);
  const BertConfig back = read_hf_config(dir.file("ours.json"));
  EXPECT_EQ(describe(back), describe(mini));
  EXPECT_EQ(back.hidden_dropout, 0.15f);
  EXPECT_EQ(back.attention_dropout, 0.f);
  EXPECT_EQ(back.hidden_act, Gelu::erf);
  // The tanh GELU is written under Hugging Face's name for it, and both of its names read back.
  mini.hidden_act = Gelu::tanh;
  write_hf_config(dir.file("tanh.json"), mini);
  EXPECT_EQ(nlohmann::json::parse(test::read_file(dir.file("tanh.json")))["hidden_act"],
            "gelu_new");
  EXPECT_EQ(read_hf_config(dir.file("tanh.json")).hidden_act, Gelu::tanh);
  EXPECT_EQ(describe(read_hf_config(dir.file("tanh.json"))), describe(mini));
  std::ofstream(dir.file("pytorch_tanh.json"))
      << R"({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
             "intermediate_size": 8, "max_position_embeddings": 8, "type_vocab_size": 2,
             "hidden_act": "gelu_pytorch_tanh"})";
  EXPECT_EQ(read_hf_config(dir.file("pytorch_tanh.json")).hidden_act, Gelu::tanh);
  // Errors name the file and the field.
  std::ofstream(dir.file("act.json"))
      << R"({"vocab_size": 8, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
             "intermediate_size": 8, "max_position_embeddings": 8, "type_vocab_size": 2,
             "hidden_act": "relu"})";
  std::string msg = error_of([&] { read_hf_config(dir.file("act.json")); });
  EXPECT_NE(msg.find(dir.file("act.json")), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden_act"), std::string::npos) << msg;
  std::ofstream(dir.file("missing.json")) << R"({"vocab_size": 8})";
  msg = error_of([&] { read_hf_config(dir.file("missing.json")); });
  EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  std::ofstream(dir.file("heads.json"))
      << R"({"vocab_size": 8, "hidden_size": 6, "num_hidden_layers": 1, "num_attention_heads": 4,
             "intermediate_size": 8, "max_position_embeddings": 8, "type_vocab_size": 2})";
  msg = error_of([&] { read_hf_config(dir.file("heads.json")); });
  EXPECT_NE(msg.find(dir.file("heads.json")), std::string::npos) << msg;
  EXPECT_NE(msg.find("heads"), std::string::npos) << msg;
}

TEST(Checkpoint, KeepLastPrunesTheOldestAndReplaces) {
  const uint64_t seed = test::test_seed();
  State s(seed);
  TempDir root;
  for (int64_t step : {10, 20, 30, 40}) write_checkpoint(root.path(), s.write(step, step), 2);
  EXPECT_EQ(entries(root.path()), (std::vector<std::string>{"step_00000030", "step_00000040"}));
  // Writing an older step keeps it (the one just written always stays) and the newest other.
  write_checkpoint(root.path(), s.write(5, 5), 2);
  EXPECT_EQ(entries(root.path()), (std::vector<std::string>{"step_00000005", "step_00000040"}));
  EXPECT_EQ(latest_checkpoint(root.path()), root.file("step_00000040"));
  // Replacing an existing step: the new content, no leftovers.
  State other(seed + 1);
  write_checkpoint(root.path(), other.write(40, 41), 2);
  EXPECT_EQ(entries(root.path()), (std::vector<std::string>{"step_00000005", "step_00000040"}));
  expect_reads_back(root.file("step_00000040"), other, 40, 41);
  // keep_last = 1.
  write_checkpoint(root.path(), s.write(100000000, 7), 1);  // nine digits
  EXPECT_EQ(entries(root.path()), std::vector<std::string>{"step_100000000"});
  expect_reads_back(root.file("step_100000000"), s, 100000000, 7);
  EXPECT_THROW(write_checkpoint(root.path(), s.write(1, 1), 0), Error);
}

TEST(Checkpoint, LatestIgnoresTemporaryAndIncompleteDirectories) {
  State s(test::test_seed());
  TempDir root;
  EXPECT_EQ(latest_checkpoint(root.file("missing")), std::nullopt);
  EXPECT_EQ(latest_checkpoint(root.path()), std::nullopt);
  write_checkpoint(root.path(), s.write(7, 7), 5);
  const std::string good = root.file("step_00000007");
  // A crashed writer's temporary dir and an incomplete step dir, both newer.
  fs::copy(good, root.file(".step_00000009.tmp-12345"));
  fs::copy(good, root.file("step_00000008"));
  fs::remove(root.file("step_00000008/trainer_state.json"));
  fs::create_directory(root.file("step_00000010"));
  fs::copy(good, root.file("step_9"));         // too few digits
  fs::copy(good, root.file("step_0000000x"));  // not a number
  std::ofstream(root.file("step_00000011")) << "a file";
  EXPECT_EQ(latest_checkpoint(root.path()), good);
  // Pruning never removes what latest_checkpoint does not count.
  write_checkpoint(root.path(), s.write(12, 12), 1);
  EXPECT_EQ(latest_checkpoint(root.path()), root.file("step_00000012"));
  EXPECT_FALSE(fs::exists(good));
  EXPECT_TRUE(fs::exists(root.file(".step_00000009.tmp-12345")));
  EXPECT_TRUE(fs::exists(root.file("step_00000008")));
}

TEST(Checkpoint, MismatchesNameTheFieldOrTensor) {
  State s(test::test_seed());
  TempDir root;
  const std::string dir = write_checkpoint(root.path(), s.write(3, 3), 1);
  std::vector<float> p(s.params.size()), m(p.size()), v(p.size());

  // Another model shape.
  BertConfig wider = bert_preset("tiny");
  wider.intermediate = 256;
  ParamTable other(wider);
  std::vector<float> q(static_cast<size_t>(other.total()));
  std::string msg = error_of([&] { read_checkpoint(dir, other, q.data(), nullptr, nullptr); });
  EXPECT_NE(msg.find(dir + "/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("intermediate_size = 512"), std::string::npos) << msg;
  msg = error_of([&] { load_model_weights(dir, other, q.data()); });
  EXPECT_NE(msg.find("intermediate_size"), std::string::npos) << msg;
  // Dropout: resume must match; weights alone may load into another dropout rate.
  BertConfig drop = bert_preset("tiny");
  drop.hidden_dropout = 0.f;
  ParamTable dropped(drop);
  msg = error_of([&] { read_checkpoint(dir, dropped, p.data(), nullptr, nullptr); });
  EXPECT_NE(msg.find("hidden_dropout_prob"), std::string::npos) << msg;
  load_model_weights(dir, dropped, p.data());
  EXPECT_TRUE(bitwise_equal(p, s.params));

  // A tensor missing from model.safetensors / optimizer.safetensors, one with another shape.
  auto rewrite = [&](const std::string& file, const std::string& drop_name,
                     const std::string& reshape) {
    SafetensorsFile f(dir + "/" + file);
    std::vector<std::vector<char>> bufs;
    std::vector<StTensor> ts;
    for (const std::string& n : f.names()) {
      if (n == drop_name) continue;
      const StTensorInfo& info = f.info(n);
      bufs.emplace_back(static_cast<size_t>(info.numel()) * 4);
      f.read_raw(n, bufs.back().data());
      std::vector<int64_t> shape = info.shape;
      if (n == reshape) shape = {info.numel()};
      ts.push_back({n, info.dtype, shape, bufs.back().data()});
    }
    const auto md = f.metadata();
    f.close();
    write_safetensors(dir + "/" + file, ts, md);
  };
  const std::string model_file = dir + "/model.safetensors";
  rewrite("model.safetensors", "bert.encoder.layer.1.output.LayerNorm.bias", "");
  msg = error_of([&] { read_checkpoint(dir, s.table, p.data(), m.data(), v.data()); });
  EXPECT_NE(msg.find(model_file), std::string::npos) << msg;
  EXPECT_NE(msg.find("bert.encoder.layer.1.output.LayerNorm.bias"), std::string::npos) << msg;
  msg = error_of([&] { load_model_weights(dir, s.table, p.data()); });
  EXPECT_NE(msg.find("bert.encoder.layer.1.output.LayerNorm.bias"), std::string::npos) << msg;

  write_checkpoint(root.path(), s.write(3, 3), 1);
  rewrite("model.safetensors", "", "bert.pooler.dense.weight");
  msg = error_of([&] { read_checkpoint(dir, s.table, p.data(), m.data(), v.data()); });
  EXPECT_NE(msg.find("bert.pooler.dense.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16384]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128, 128]"), std::string::npos) << msg;

  write_checkpoint(root.path(), s.write(3, 3), 1);
  rewrite("optimizer.safetensors", "exp_avg_sq.cls.seq_relationship.bias", "");
  msg = error_of([&] { read_checkpoint(dir, s.table, p.data(), nullptr, nullptr); });
  EXPECT_NE(msg.find(dir + "/optimizer.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exp_avg_sq.cls.seq_relationship.bias"), std::string::npos) << msg;
  // ... which the weights alone do not need.
  load_model_weights(dir, s.table, p.data());
  EXPECT_TRUE(bitwise_equal(p, s.params));

  // A missing file.
  write_checkpoint(root.path(), s.write(3, 3), 1);
  fs::remove(dir + "/config.json");
  msg = error_of([&] { read_checkpoint(dir, s.table, p.data(), nullptr, nullptr); });
  EXPECT_NE(msg.find(dir + "/config.json"), std::string::npos) << msg;
}

void flip_bit(const std::string& path, uint64_t offset, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// The file offset of element `index` of tensor `name` in a safetensors file.
uint64_t element_offset(const std::string& path, const std::string& name, int64_t index) {
  SafetensorsFile f(path);
  return fs::file_size(path) - f.data_bytes() + f.info(name).begin +
         static_cast<uint64_t>(index) * 4;
}

TEST(Checkpoint, DamageIsNamedAndSetApartFromMismatch) {
  const uint64_t seed = test::test_seed();
  std::mt19937_64 rng(seed);
  State s(seed);
  TempDir root;
  const std::string good = write_checkpoint(root.path(), s.write(4, 4), 1);
  std::vector<float> p(s.params.size()), m(p.size()), v(p.size());
  const ParamTensor& w = s.table.tensors()[rng() % s.table.tensors().size()];
  const int64_t at = static_cast<int64_t>(rng() % static_cast<uint64_t>(w.size));
  const int bit = static_cast<int>(rng() % 8);
  struct Case {
    const char* what;
    std::function<void(const std::string&)> damage;
    std::string file, needle;
  };
  const std::vector<Case> cases = {
      {"weight bit",
       [&](const std::string& d) {
         flip_bit(d + "/model.safetensors", element_offset(d + "/model.safetensors", w.name, at),
                  bit);
       },
       "model.safetensors", "'" + w.name + "'"},
      {"moment bit",
       [&](const std::string& d) {
         const std::string f = d + "/optimizer.safetensors";
         flip_bit(f, element_offset(f, "exp_avg_sq." + w.name, at), bit);
       },
       "optimizer.safetensors", "'exp_avg_sq." + w.name + "'"},
      {"header bit", [&](const std::string& d) { flip_bit(d + "/model.safetensors", 40, bit); },
       "model.safetensors", "header"},
      {"config bit", [&](const std::string& d) { flip_bit(d + "/config.json", 30, bit); },
       "config.json", "checksum"},
      {"trainer state bit",
       [&](const std::string& d) { flip_bit(d + "/trainer_state.json", 3, bit); },
       "trainer_state.json", "checksum"},
      {"truncated",
       [&](const std::string& d) {
         const std::string f = d + "/optimizer.safetensors";
         fs::resize_file(f, fs::file_size(f) - 5);
       },
       "optimizer.safetensors", "truncated"},
      {"missing file", [&](const std::string& d) { fs::remove(d + "/trainer_state.json"); },
       "trainer_state.json", "missing"},
  };
  for (const Case& c : cases) {
    const std::string dir = root.file(std::string("damaged_") + std::to_string(&c - cases.data()));
    fs::copy(good, dir);
    c.damage(dir);
    std::string msg;
    try {
      read_checkpoint(dir, s.table, p.data(), m.data(), v.data());
    } catch (const DamagedFileError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find(dir + "/" + c.file), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << c.what << ": " << msg;
    const CheckpointCheck check = verify_checkpoint(dir);
    ASSERT_TRUE(check.damaged()) << c.what;
    EXPECT_NE(check.damage[0].find(c.needle), std::string::npos)
        << c.what << ": " << check.damage[0];
  }
  // The weights alone: a damaged weight or config.json is caught, the optimizer's is not read.
  for (size_t k : {size_t{0}, size_t{3}}) {
    const std::string dir = root.file("damaged_" + std::to_string(k));
    EXPECT_THROW(load_model_weights(dir, s.table, p.data()), DamagedFileError) << k;
  }
  load_model_weights(root.file("damaged_1"), s.table, p.data());
  EXPECT_TRUE(bitwise_equal(p, s.params));

  // A checkpoint that does not fit the model is an Error, not damage.
  BertConfig wider = bert_preset("tiny");
  wider.intermediate = 256;
  ParamTable other(wider);
  std::vector<float> q(static_cast<size_t>(other.total()));
  bool damage = false;
  try {
    read_checkpoint(good, other, q.data(), nullptr, nullptr);
  } catch (const DamagedFileError&) {
    damage = true;
  } catch (const Error&) {
  }
  EXPECT_FALSE(damage);
  const CheckpointCheck ok = verify_checkpoint(good);
  EXPECT_FALSE(ok.damaged()) << ok.damage[0];
  EXPECT_TRUE(ok.unverified.empty());
  EXPECT_EQ(ok.step, 4);
  EXPECT_EQ(ok.config, describe(s.table.config()));
  EXPECT_EQ(ok.files[0].tensors, static_cast<int64_t>(s.table.tensors().size()));
  EXPECT_EQ(ok.files[2].tensors, 2 * static_cast<int64_t>(s.table.tensors().size()));
}

TEST(Checkpoint, WithoutChecksumsLoadsUnverified) {
  State s(test::test_seed());
  TempDir root;
  CheckpointWrite w = s.write(5, 5);
  w.checksums = false;
  const std::string dir = write_checkpoint(root.path(), w, 1);
  EXPECT_EQ(test::read_file(dir + "/model.safetensors").find("checksum"), std::string::npos);
  expect_reads_back(dir, s, 5, 5);
  const CheckpointCheck c = verify_checkpoint(dir);
  EXPECT_FALSE(c.damaged());
  EXPECT_EQ(c.unverified,
            (std::vector<std::string>{"model.safetensors", "config.json", "optimizer.safetensors",
                                      "trainer_state.json"}));
}

TEST(Checkpoint, DirsNewestFirstAndSetAside) {
  State s(test::test_seed());
  TempDir root;
  EXPECT_TRUE(checkpoint_dirs_newest_first(root.file("none")).empty());
  for (int64_t step : {3, 6, 9}) write_checkpoint(root.path(), s.write(step, step), 5);
  fs::create_directory(root.file("step_00000012"));  // incomplete: damage, listed all the same
  fs::create_directory(root.file(".step_00000015.tmp-1"));
  EXPECT_EQ(checkpoint_dirs_newest_first(root.path()),
            (std::vector<std::string>{root.file("step_00000012"), root.file("step_00000009"),
                                      root.file("step_00000006"), root.file("step_00000003")}));
  EXPECT_EQ(set_checkpoint_aside(root.file("step_00000012")), root.file("step_00000012.corrupt"));
  EXPECT_EQ(set_checkpoint_aside(root.file("step_00000009")), root.file("step_00000009.corrupt"));
  write_checkpoint(root.path(), s.write(9, 9), 5);
  EXPECT_EQ(set_checkpoint_aside(root.file("step_00000009")), root.file("step_00000009.corrupt-2"));
  EXPECT_EQ(set_aside_checkpoints(root.path()),
            (std::vector<std::string>{"step_00000009.corrupt", "step_00000009.corrupt-2",
                                      "step_00000012.corrupt"}));
  EXPECT_EQ(latest_checkpoint(root.path()), root.file("step_00000006"));
  // Pruning leaves what was set aside to a person.
  write_checkpoint(root.path(), s.write(20, 20), 1);
  EXPECT_EQ(set_aside_checkpoints(root.path()).size(), 3u);
  EXPECT_EQ(checkpoint_dirs_newest_first(root.path()),
            std::vector<std::string>{root.file("step_00000020")});
}

// In a child with RLIMIT_FSIZE = 1 MB (SIGXFSZ ignored, so write() fails with EFBIG):
// write_checkpoint must throw. Returns the child's verdict; its message goes to *message.
int write_with_small_fsize(const State& s, const std::string& root, int64_t step,
                           std::string* message) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(fds[0]);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl {
      1 << 20, 1 << 20
    };
    setrlimit(RLIMIT_FSIZE, &rl);
    int code = 1;  // no error
    std::string msg;
    try {
      write_checkpoint(root, s.write(step, step), 3);
    } catch (const Error& e) {
      code = 0;
      msg = e.what();
    } catch (const std::exception& e) {
      code = 2;
      msg = e.what();
    }
    if (::write(fds[1], msg.data(), msg.size()) < 0) code = 3;
    ::close(fds[1]);
    _exit(code);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) message->append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(Checkpoint, DiskFullLeavesThePreviousCheckpointIntact) {
  const uint64_t seed = test::test_seed();
  State s(seed), next(seed + 7);
  TempDir root;
  const std::string prev = write_checkpoint(root.path(), s.write(100, 100), 3);
  // A new step, and a replacement of the existing one.
  for (int64_t step : {200, 100}) {
    std::string msg;
    const int verdict = write_with_small_fsize(next, root.path(), step, &msg);
    EXPECT_EQ(verdict, 0) << "child: " << msg;
    EXPECT_NE(msg.find(root.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(EFBIG)), std::string::npos) << msg;
    EXPECT_EQ(entries(root.path()), std::vector<std::string>{"step_00000100"});
    EXPECT_EQ(latest_checkpoint(root.path()), prev);
    expect_reads_back(prev, s, 100, 100);
  }
}

TEST(Checkpoint, UnwritableRootNamesIt) {
  State s(test::test_seed());
  TempDir dir;
  std::ofstream(dir.file("plain")) << "not a directory";
  const std::string root = dir.file("plain/checkpoints");
  const std::string msg = error_of([&] { write_checkpoint(root, s.write(1, 1), 1); });
  EXPECT_NE(msg.find(root), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::strerror(ENOTDIR)), std::string::npos) << msg;
  // A root that is itself a regular file.
  const std::string msg2 = error_of([&] { write_checkpoint(dir.file("plain"), s.write(1, 1), 1); });
  EXPECT_NE(msg2.find(dir.file("plain")), std::string::npos) << msg2;
  EXPECT_EQ(latest_checkpoint(dir.file("plain")), std::nullopt);
}

// Every field set, none at its default: a seed above 2^63, a loader hash of 64 bits.
TrainerState full_trainer_state() {
  TrainerState s;
  s.step = 1200;
  s.samples = 307200;
  s.tokens = 39321600;
  s.skipped_steps = 3;
  s.loader.epoch = 2;
  s.loader.epoch_cursor = 4096;
  s.loader.step = 1200;
  s.loader.seed = 0xfedcba9876543210ull;
  s.loader.shuffle_block_rows = 64;
  s.loader.shuffle_window_blocks = 16;
  s.loader.num_shards = 4;
  s.loader.num_samples = 150000;
  s.loader.shards_hash = 0x8000000000000001ull;
  s.loss_scale = LossScalerState{32768.f, 17};
  s.rng.train_seed = 0xfedcba9876543210ull;
  s.rng.init_seed = 11;
  s.rng.dropout_seed = 12;
  s.rng.data_seed = 13;
  s.world_size = 8;
  s.config = "[train]\nseed = 42\n";
  return s;
}

TEST(Checkpoint, TrainerStateRoundTripIsExact) {
  const TrainerState s = full_trainer_state();
  const std::string text = trainer_state_to_json(s);
  const TrainerState r = trainer_state_from_json(text, "dir/trainer_state.json");
  EXPECT_EQ(r.step, s.step);
  EXPECT_EQ(r.samples, s.samples);
  EXPECT_EQ(r.tokens, s.tokens);
  EXPECT_EQ(r.skipped_steps, s.skipped_steps);
  EXPECT_TRUE(r.loader == s.loader);
  ASSERT_TRUE(r.loss_scale.has_value());
  EXPECT_EQ(r.loss_scale->scale, 32768.f);
  EXPECT_EQ(r.loss_scale->clean_steps, 17);
  EXPECT_EQ(r.rng.train_seed, s.rng.train_seed);
  EXPECT_EQ(r.rng.init_seed, 11u);
  EXPECT_EQ(r.rng.dropout_seed, 12u);
  EXPECT_EQ(r.rng.data_seed, 13u);
  EXPECT_EQ(r.world_size, 8);
  EXPECT_EQ(r.config, s.config);
  // The file's bytes: indented by two, keys sorted, the same text again when written back.
  EXPECT_EQ(text.rfind("{\n  \"config\": ", 0), 0u) << text;
  EXPECT_EQ(trainer_state_to_json(r), text);

  // fp32 / bf16: no loss scale in the file, none read back.
  TrainerState q = s;
  q.loss_scale.reset();
  const std::string no_scale = trainer_state_to_json(q);
  EXPECT_EQ(no_scale.find("loss_scale"), std::string::npos) << no_scale;
  EXPECT_FALSE(trainer_state_from_json(no_scale, "x").loss_scale.has_value());
}

TEST(Checkpoint, TrainerStateRecordOnlyFieldsMayBeAbsent) {
  nlohmann::json j = nlohmann::json::parse(trainer_state_to_json(full_trainer_state()));
  for (const char* key : {"rng", "world_size", "config", "loss_scale"}) j.erase(key);
  const TrainerState r = trainer_state_from_json(j.dump(), "x");
  EXPECT_EQ(r.step, 1200);
  EXPECT_TRUE(r.loader == full_trainer_state().loader);
  EXPECT_FALSE(r.loss_scale.has_value());
  EXPECT_EQ(r.rng.train_seed, 0u);
  EXPECT_EQ(r.world_size, 0);
  EXPECT_EQ(r.config, "");
}

TEST(Checkpoint, TrainerStateErrorsNameTheFileAndField) {
  const std::string path = "ckpt/step_00001200/trainer_state.json";
  const nlohmann::json good = nlohmann::json::parse(trainer_state_to_json(full_trainer_state()));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* field;  // in the message
  };
  const std::vector<Case> cases = {
      {"missing step", [](nlohmann::json& j) { j.erase("step"); }, "'step' is missing"},
      {"samples a string", [](nlohmann::json& j) { j["samples"] = "307200"; }, "'samples'"},
      {"tokens fractional", [](nlohmann::json& j) { j["tokens"] = 1.5; }, "'tokens'"},
      {"missing skipped_steps", [](nlohmann::json& j) { j.erase("skipped_steps"); },
       "'skipped_steps' is missing"},
      {"missing loader", [](nlohmann::json& j) { j.erase("loader"); }, "'loader' is missing"},
      {"loader an array",
       [](nlohmann::json& j) {
         j["loader"] = {1, 2};
       },
       "'loader'"},
      {"loader without seed", [](nlohmann::json& j) { j["loader"].erase("seed"); }, "'loader'"},
      {"loss_scale a number", [](nlohmann::json& j) { j["loss_scale"] = 2; }, "'loss_scale'"},
      {"loss_scale without scale", [](nlohmann::json& j) { j["loss_scale"].erase("scale"); },
       "'loss_scale.scale' is missing"},
      {"clean_steps a string", [](nlohmann::json& j) { j["loss_scale"]["clean_steps"] = "1"; },
       "'loss_scale.clean_steps'"},
      {"negative seed", [](nlohmann::json& j) { j["rng"]["train_seed"] = -1; }, "'rng.train_seed'"},
      {"world_size a string", [](nlohmann::json& j) { j["world_size"] = "8"; }, "'world_size'"},
      {"config a number", [](nlohmann::json& j) { j["config"] = 1; }, "'config'"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.edit(j);
    const std::string msg = error_of([&] { trainer_state_from_json(j.dump(), path); });
    EXPECT_EQ(msg.rfind(path + ": field ", 0), 0u) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.what << ": " << msg;
  }
  for (const char* text : {"{\"step\": ", "[1, 2]", ""}) {
    const std::string msg = error_of([&] { trainer_state_from_json(text, path); });
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << text << ": " << msg;
  }
}

}  // namespace
}  // namespace packbert
