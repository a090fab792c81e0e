// TrainConfig: TOML reading, overrides, validation messages, round trip, presets, the key
// table and the shipped configs/*.toml. docs/configuration.md's key tables:
// ConfigDocs.TablesAreTheKeyTables (tests/unit/test_config.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <unistd.h>

#include "kernels/base/error.h"
#include "config/train_config.h"
#include "train/train_options.h"

namespace fs = std::filesystem;
using namespace packbert;

namespace packbert {
// gtest prints a config as its TOML.
void PrintTo(const TrainConfig& c, std::ostream* os) { *os << "\n" << train_config_to_toml(c); }
}  // namespace packbert

namespace {

fs::path source_dir() {
#ifdef PACKBERT_SOURCE_DIR
  return fs::path(PACKBERT_SOURCE_DIR);
#else
  return fs::path(__FILE__).parent_path().parent_path().parent_path();  // tests/unit/ -> root
#endif
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("packbert_cfg_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    fs::path p = path_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

 private:
  fs::path path_;
  static inline int counter_ = 0;
};

// The message of the Error fn throws ("" and a test failure when it throws nothing).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an Error";
  return "";
}

}  // namespace

TEST(TrainConfig, Defaults) {
  const TrainConfig c = load_train_config("", {});
  EXPECT_EQ(c, TrainConfig{});
  EXPECT_EQ(c.model.preset, "base");
  EXPECT_EQ(c.model.layers, 12);
  EXPECT_EQ(c.model.hidden, 768);
  EXPECT_EQ(c.train.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train.layout, BatchLayout::unpadded);
  EXPECT_EQ(c.train.last_step, LastStepPolicy::partial);
  EXPECT_EQ(c.train.max_nonfinite_steps, 5);
  EXPECT_EQ(c.train.collective_timeout_s, 1800.0);
  EXPECT_EQ(c.model.mst_chunks, 1);  // MST off
  EXPECT_EQ(c.model.activation_budget_mb, 0);
  EXPECT_EQ(c.model.recompute, Recompute::none);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.eval.max_samples, 10000);
  EXPECT_TRUE(c.eval.at_end);
  EXPECT_EQ(c.log.submission_division, SubmissionDivision::closed);
  EXPECT_EQ(c.log.submission_status, SubmissionStatus::onprem);
  EXPECT_TRUE(c.eval_enabled());
  // The defaults pass every rule that does not look at the disk.
  validate_train_config(c, 1, ConfigPurpose::train, /*check_paths=*/false);
  // Optimizer defaults are LambOptions' (one source of truth for the meaning).
  const LambOptions lamb;
  EXPECT_FLOAT_EQ(static_cast<float>(c.optim.beta1), lamb.beta1);
  EXPECT_FLOAT_EQ(static_cast<float>(c.optim.beta2), lamb.beta2);
  EXPECT_FLOAT_EQ(static_cast<float>(c.optim.epsilon), lamb.eps);
  EXPECT_FLOAT_EQ(static_cast<float>(c.optim.weight_decay), lamb.weight_decay);
  EXPECT_FLOAT_EQ(static_cast<float>(c.optim.max_grad_norm), lamb.max_grad_norm);
}

TEST(TrainConfig, FileThenOverridesAndPresetResolution) {
  TempDir tmp;
  const std::string path = tmp.write("a.toml", R"(# a comment
[model]
preset = "tiny"   # 2 layers, 128 hidden
hidden = 256

[train]
max_steps = 1_000
layout = 'packed'
dropout = false
seed = 7

[optim]
lr = 1        # an integer is fine for a float key
epsilon = 1e-8
start_warmup_step = -5
warmup_steps = 10

[data]
train_dir = "a \"quoted\" dir # not a comment"
)");
  const TrainConfig c = load_train_config(
      path, {"--train.max_steps=200", "model.preset=mini", "data.vocab=some/vocab.txt",
             "data.eval_dir=\"q\"", "log.every_steps=3"});
  EXPECT_EQ(c.model.preset, "mini");
  EXPECT_EQ(c.model.layers, 4);    // mini's (the override changed the preset)
  EXPECT_EQ(c.model.hidden, 256);  // explicit key beats the preset
  EXPECT_EQ(c.model.heads, 4);
  EXPECT_EQ(c.model.intermediate, 1024);
  EXPECT_EQ(c.train.max_steps, 200);  // the command line wins
  EXPECT_EQ(c.train.layout, BatchLayout::packed);
  EXPECT_FALSE(c.train.dropout);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.optim.lr, 1.0);
  EXPECT_EQ(c.optim.epsilon, 1e-8);
  EXPECT_EQ(c.optim.start_warmup_step, -5);
  EXPECT_EQ(c.data.train_dir, "a \"quoted\" dir # not a comment");
  EXPECT_EQ(c.data.vocab, "some/vocab.txt");
  EXPECT_EQ(c.data.eval_dir, "q");
  EXPECT_EQ(c.log.every_steps, 3);

  const BertConfig b = model_config(c);
  EXPECT_EQ(b.layers, 4);
  EXPECT_EQ(b.hidden, 256);
  EXPECT_EQ(b.vocab_size, BertConfig{}.vocab_size);
}

TEST(TrainConfig, PresetsResolve) {
  for (const std::string& name : bert_preset_names()) {
    const TrainConfig c = load_train_config("", {"model.preset=" + name});
    const BertConfig want = bert_preset(name);
    const BertConfig got = model_config(c);
    EXPECT_EQ(got.layers, want.layers) << name;
    EXPECT_EQ(got.hidden, want.hidden) << name;
    EXPECT_EQ(got.heads, want.heads) << name;
    EXPECT_EQ(got.intermediate, want.intermediate) << name;
    EXPECT_EQ(got.max_position_embeddings, want.max_position_embeddings) << name;
    EXPECT_EQ(got.hidden_dropout, want.hidden_dropout) << name;
    EXPECT_EQ(got.attention_dropout, want.attention_dropout) << name;
    EXPECT_EQ(got.vocab_size, want.vocab_size) << name;
    EXPECT_EQ(c.model.layers, want.layers) << name;  // the config shows resolved values
  }
  EXPECT_EQ(load_train_config("", {"model.preset=large"}).model.hidden, 1024);
}

TEST(TrainConfig, ParseErrorsNameFileLineAndKey) {
  TempDir tmp;
  auto load_text = [&](const std::string& text) {
    const std::string p = tmp.write("e.toml", text);
    return error_of([&] { load_train_config(p, {}); });
  };
  const std::string file = (tmp.path() / "e.toml").string();

  // Every error names FILE:LINE:COLUMN and the key.
  std::string e = load_text("[train]\nmax_stepz = 3\n");
  EXPECT_NE(e.find(file + ":2:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("max_stepz"), std::string::npos) << e;
  EXPECT_NE(e.find("[train]"), std::string::npos) << e;
  EXPECT_NE(e.find("max_steps"), std::string::npos) << e;  // lists the known keys

  e = load_text("# c\n[trian]\nmax_steps = 3\n");
  EXPECT_NE(e.find(file + ":2:"), std::string::npos) << e;
  EXPECT_NE(e.find("[trian]"), std::string::npos) << e;

  e = load_text("[train]\n\n  max_steps = 1.5\n");
  EXPECT_NE(e.find(file + ":3:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("train.max_steps"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;

  // Syntax errors (toml++'s) name the key of their line.
  e = load_text("[train]\nmax_steps = 12abc\n");
  EXPECT_NE(e.find(file + ":2:"), std::string::npos) << e;
  EXPECT_NE(e.find("train.max_steps"), std::string::npos) << e;

  e = load_text("[train]\ndropout = yes\n");
  EXPECT_NE(e.find(file + ":2:"), std::string::npos) << e;
  EXPECT_NE(e.find("train.dropout"), std::string::npos) << e;

  e = load_text("[train]\ndropout = 1\n");
  EXPECT_NE(e.find("train.dropout"), std::string::npos) << e;
  EXPECT_NE(e.find("boolean"), std::string::npos) << e;

  e = load_text("[train]\nlayout = \"paded\"\n");
  EXPECT_NE(e.find(file + ":2:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("train.layout"), std::string::npos) << e;
  EXPECT_NE(e.find("paded"), std::string::npos) << e;
  EXPECT_NE(e.find("unpadded | packed | padded"), std::string::npos) << e;

  e = load_text("[model]\npreset = \"huge\"\n");
  EXPECT_NE(e.find("model.preset"), std::string::npos) << e;
  EXPECT_NE(e.find("huge"), std::string::npos) << e;

  e = load_text("[data]\nvocab = data/vocab.txt\n");  // unquoted string
  EXPECT_NE(e.find(file + ":2:"), std::string::npos) << e;
  EXPECT_NE(e.find("data.vocab"), std::string::npos) << e;

  e = load_text("[data]\nvocab = \"unterminated\n");
  EXPECT_NE(e.find("data.vocab"), std::string::npos) << e;

  e = load_text("[train]\nmax_steps = 3 4\n");
  EXPECT_NE(e.find("train.max_steps"), std::string::npos) << e;

  e = load_text("[train]\nmax_steps = 3\nmax_steps = 4\n");
  EXPECT_NE(e.find(file + ":3:"), std::string::npos) << e;
  EXPECT_NE(e.find("max_steps"), std::string::npos) << e;

  e = load_text("max_steps = 3\n");
  EXPECT_NE(e.find(file + ":1:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("outside any section"), std::string::npos) << e;

  e = load_text("[train\n");
  EXPECT_NE(e.find(file + ":1:"), std::string::npos) << e;

  e = load_text("[train]\njust words\n");
  EXPECT_NE(e.find(file + ":2:"), std::string::npos) << e;

  // The old spellings say the new one.
  e = load_text("[train]\nmax-steps = 3\n");
  EXPECT_NE(e.find(file + ":2:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("snake_case: train.max_steps"), std::string::npos) << e;

  e = load_text("[prepare]\nmax_seq_len = 3\n");  // a section of another subcommand
  EXPECT_NE(e.find("unknown section [prepare] for packbert train"), std::string::npos) << e;

  // An integer out of a field's range names the range.
  e = load_text("[train]\nmax_seq_len = 3000000000\n");
  EXPECT_NE(e.find(file + ":2:1: train.max_seq_len: 3000000000 is out of range"), std::string::npos)
      << e;
}

TEST(TrainConfig, OverrideErrorsNameTheOverrideAndKey) {
  std::string e = error_of([] { load_train_config("", {"train.max_steps=abc"}); });
  EXPECT_NE(e.find("override 'train.max_steps=abc'"), std::string::npos) << e;
  EXPECT_NE(e.find("train.max_steps"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"--train.nope=1"}); });
  EXPECT_NE(e.find("nope"), std::string::npos) << e;
  EXPECT_NE(e.find("[train]"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"bogus.key=1"}); });
  EXPECT_NE(e.find("[bogus]"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"max_steps=1"}); });
  EXPECT_NE(e.find("section.key=VALUE"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"train.max-steps=1"}); });
  EXPECT_NE(e.find("snake_case: train.max_steps"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"train.dropout=maybe"}); });
  EXPECT_NE(e.find("train.dropout"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"train.layout=sideways"}); });
  EXPECT_NE(e.find("train.layout"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"train.device=tpu"}); });
  EXPECT_NE(e.find("train.device"), std::string::npos) << e;
  EXPECT_NE(e.find("cpu | cuda"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"train.gradient_accumulation_steps=3000000000"}); });
  EXPECT_NE(e.find("train.gradient_accumulation_steps"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;

  e = error_of([] { load_train_config("", {"train.seed=-1"}); });
  EXPECT_NE(e.find("train.seed"), std::string::npos) << e;

  e = error_of([] { load_train_config("/nonexistent/dir/x.toml", {}); });
  EXPECT_NE(e.find("/nonexistent/dir/x.toml"), std::string::npos) << e;
}

TEST(TrainConfig, ValidationNamesTheKey) {
  auto check = [](const std::vector<std::string>& overrides, int world, const std::string& want) {
    const TrainConfig c = load_train_config("", overrides);
    std::string e = error_of([&] { validate_train_config(c, world, ConfigPurpose::train, false); });
    EXPECT_NE(e.find(want), std::string::npos) << "got: " << e << "\nwant: " << want;
  };
  check({"model.hidden=100", "model.heads=3"}, 1,
        "model.hidden (100) must be divisible by model.heads (3)");
  check({"model.layers=0"}, 1, "model.layers (0)");
  check({"model.hidden_dropout=1.0"}, 1, "model.hidden_dropout");
  check({"model.attention_dropout=-0.1"}, 1, "model.attention_dropout");
  check({"train.global_batch_size=8", "train.gradient_accumulation_steps=4"}, 4,
        "train.global_batch_size (8) must be >= world size (4) x "
        "train.gradient_accumulation_steps (4)");
  check({"train.global_batch_size=2", "train.gradient_accumulation_steps=4"}, 1,
        "train.global_batch_size (2) must be >= train.gradient_accumulation_steps (4)");
  check({"train.gradient_accumulation_steps=0"}, 1, "train.gradient_accumulation_steps (0)");
  check({"train.max_seq_len=1024"}, 1,
        "train.max_seq_len (1024) must be <= model.max_position_embeddings (512)");
  check({"train.max_steps=0"}, 1, "train.max_steps");
  check({"train.collective_timeout_s=-1"}, 1,
        "train.collective_timeout_s (-1) must be finite and >= 0 (0 = off)");
  check({"train.collective_timeout_s=inf"}, 1, "train.collective_timeout_s");
  check({"optim.lr=-1"}, 1, "optim.lr");
  check({"optim.lr=nan"}, 1, "optim.lr");
  check({"optim.warmup_steps=10", "optim.warmup_proportion=0.1"}, 1, "optim.warmup_proportion");
  check({"optim.start_warmup_step=-3"}, 1, "optim.start_warmup_step");
  check({"optim.beta2=1"}, 1, "optim.beta2");
  check({"optim.epsilon=0"}, 1, "optim.epsilon");
  check({"optim.schedule=wsd"}, 1, "optim.decay_steps");
  check({"optim.decay_fraction=0.2"}, 1, "optim.decay_fraction");
  check({"optim.decouple_lr=true"}, 1, "optim.decouple_lr applies to optim.name = \"adamw\"");
  check({"optim.name=stable_adamw", "optim.decouple_lr=true", "optim.lr=0"}, 1,
        "optim.decouple_lr divides the weight decay by optim.lr");
  check({"optim.max_grad_norm=-1"}, 1, "optim.max_grad_norm (-1) must be finite and >= 0");
  check({"optim.schedule_unit=tokens"}, 1, "optim.schedule_tokens (0) must be >= 1");
  check({"optim.name=adamw", "log.mllog_file=run.log"}, 1,
        "log.mllog_file: the MLPerf BERT log describes LAMB");
  check({"optim.schedule_unit=tokens", "optim.schedule_tokens=1000", "optim.warmup_steps=0",
         "log.mllog_file=run.log"},
        1, "optim.schedule_unit = \"tokens\" has no such keys");
  check({"data.mlm_probability=0.3"}, 1, "data.mlm_probability");
  check({"data.masking=dynamic", "data.vocab="}, 1, "data.vocab");
  check({"data.masking=dynamic", "data.vocab=v.txt", "data.mask_token_share=0.95"}, 1,
        "data.mask_token_share");
  check({"eval.target_accuracy=1.5"}, 1, "eval.target_accuracy");
  check({"eval.batch_size=0"}, 1, "eval.batch_size");
  check({"eval.max_samples=-1"}, 1, "eval.max_samples");
  check({"checkpoint.keep=0"}, 1, "checkpoint.keep");
  check({"checkpoint.resume=auto"}, 1, "checkpoint.resume");
  check({"data.prefetch_steps=0"}, 1, "data.prefetch_steps");
  check({"log.every_steps=0"}, 1, "log.every_steps");
  check({"model.mst_chunks=-1"}, 1, "model.mst_chunks (-1) must be >= 1, or 0 for auto");
  check({"model.mst_chunks=0"}, 1,
        "model.mst_chunks = 0 (auto) needs model.activation_budget_mb > 0");
  check({"model.activation_budget_mb=-5"}, 1, "model.activation_budget_mb (-5)");
  check({"model.max_position_embeddings=1048577", "train.max_seq_len=128"}, 1,
        "max_position_embeddings 1048577 > 1048576 (dropout key range)");
  check({"train.max_steps=16777216"}, 1,
        "train.max_steps (16777216) must be < 16777216 (the dropout key's step range)");
  check({"train.cuda_graphs=segmented"}, 1,
        "train.cuda_graphs = \"segmented\" records CUDA graphs: it needs train.device = "
        "\"cuda\"");

  // The same batch is fine on fewer ranks, and for evaluation.
  const TrainConfig c =
      load_train_config("", {"train.global_batch_size=8", "train.gradient_accumulation_steps=4"});
  validate_train_config(c, 2, ConfigPurpose::train, false);
  validate_train_config(c, 4, ConfigPurpose::eval, false);
}

TEST(TrainConfig, MstRecomputeAndLongSequences) {
  const TrainConfig c = load_train_config(
      "", {"model.preset=large", "model.max_position_embeddings=16384", "train.max_seq_len=16384",
           "train.max_predictions_per_seq=2500", "model.mst_chunks=0",
           "model.activation_budget_mb=20000", "model.recompute=layer"});
  EXPECT_EQ(c.model.mst_chunks, 0);
  EXPECT_EQ(c.model.activation_budget_mb, 20000);
  EXPECT_EQ(c.model.recompute, Recompute::layer);
  EXPECT_EQ(model_config(c).max_position_embeddings, 16384);
  validate_train_config(c, 1, ConfigPurpose::train, false);
  for (const Recompute r : {Recompute::none, Recompute::mlp, Recompute::layer}) {
    const std::string name = config_name(r);
    EXPECT_EQ(load_train_config("", {"model.recompute=" + name}).model.recompute, r) << name;
    EXPECT_EQ(load_train_config("", {"model.recompute=\"" + name + "\""}).model.recompute, r);
  }
  const std::string e = error_of([] { load_train_config("", {"model.recompute=all"}); });
  EXPECT_NE(e.find("model.recompute"), std::string::npos) << e;
  EXPECT_NE(e.find("none | mlp | layer"), std::string::npos) << e;
}

TEST(TrainConfig, HiddenActChoosesTheGelu) {
  EXPECT_EQ(model_config(load_train_config("", {})).hidden_act, Gelu::erf);
  const TrainConfig t = load_train_config("", {"model.hidden_act=gelu_tanh"});
  EXPECT_EQ(t.model.hidden_act, Gelu::tanh);
  EXPECT_EQ(model_config(t).hidden_act, Gelu::tanh);
  EXPECT_FALSE(t == load_train_config("", {}));  // resuming under the other GELU is refused
  const std::string e = error_of([] { load_train_config("", {"model.hidden_act=relu"}); });
  EXPECT_NE(e.find("model.hidden_act"), std::string::npos) << e;
  EXPECT_NE(e.find("gelu | gelu_tanh"), std::string::npos) << e;
}

TEST(TrainConfig, ValidationChecksPaths) {
  TempDir tmp;
  fs::create_directories(tmp.path() / "shards");
  fs::create_directories(tmp.path() / "eval");
  const std::string vocab = tmp.write("vocab.txt", "[PAD]\n");
  const std::string shards = (tmp.path() / "shards").string();
  const std::string eval = (tmp.path() / "eval").string();
  const std::string missing = (tmp.path() / "missing").string();

  auto err = [](const TrainConfig& c, ConfigPurpose p) {
    try {
      validate_train_config(c, 1, p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TrainConfig c = load_train_config(
      "", {"data.train_dir=" + shards, "data.vocab=" + vocab, "data.eval_dir=" + eval});
  EXPECT_EQ(err(c, ConfigPurpose::train), "");
  EXPECT_EQ(err(c, ConfigPurpose::eval), "");

  c.data.train_dir = missing;
  std::string e = err(c, ConfigPurpose::train);
  EXPECT_NE(e.find("data.train_dir"), std::string::npos) << e;
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_EQ(err(c, ConfigPurpose::eval), "");  // eval needs no training shards

  c.data.train_dir = "";
  e = err(c, ConfigPurpose::train);
  EXPECT_NE(e.find("data.train_dir is not set"), std::string::npos) << e;
  c.data.train_dir = shards;

  c.data.vocab = missing;
  EXPECT_NE(err(c, ConfigPurpose::train).find("data.vocab"), std::string::npos);
  c.data.vocab = vocab;

  // Evaluation on (at_end by default) needs eval_dir; switched off it does not.
  c.data.eval_dir = missing;
  EXPECT_NE(err(c, ConfigPurpose::train).find("data.eval_dir"), std::string::npos);
  EXPECT_NE(err(c, ConfigPurpose::eval).find("data.eval_dir"), std::string::npos);
  c.eval.at_end = false;
  EXPECT_EQ(err(c, ConfigPurpose::train), "");
  c.eval.every_samples = 1000;
  EXPECT_NE(err(c, ConfigPurpose::train).find("data.eval_dir"), std::string::npos);
  c.eval.every_samples = 0;
  c.eval.target_accuracy = 0.5;
  EXPECT_NE(err(c, ConfigPurpose::train).find("data.eval_dir"), std::string::npos);
  c.eval.target_accuracy = 0;

  c.checkpoint.init_checkpoint = missing;
  EXPECT_NE(err(c, ConfigPurpose::train).find("checkpoint.init_checkpoint"), std::string::npos);
  c.checkpoint.init_checkpoint = "";
  c.checkpoint.resume = missing;
  EXPECT_NE(err(c, ConfigPurpose::train).find("checkpoint.resume"), std::string::npos);
  c.checkpoint.resume = "auto";
  c.checkpoint.dir = missing;  // auto: a directory that does not exist yet is fine
  EXPECT_EQ(err(c, ConfigPurpose::train), "");
}

TEST(TrainConfig, TomlRoundTrip) {
  TempDir tmp;
  const TrainConfig c = load_train_config("", {"model.preset=tiny",
                                               "model.hidden=192",
                                               "model.heads=3",
                                               "model.hidden_dropout=0.05",
                                               "model.mlm_chunk_rows=4096",
                                               "model.mst_chunks=4",
                                               "model.recompute=mlp",
                                               "model.activation_budget_mb=2048",
                                               "train.max_steps=7038",
                                               "train.global_batch_size=65536",
                                               "train.gradient_accumulation_steps=64",
                                               "train.seed=12345",
                                               "train.layout=padded",
                                               "train.max_seq_len=128",
                                               "train.max_seqs_per_pack=0",
                                               "train.max_predictions_per_seq=20",
                                               "train.last_step=drop",
                                               "train.dropout=false",
                                               "train.max_nonfinite_steps=0",
                                               "train.collective_timeout_s=90.5",
                                               "optim.lr=6e-3",
                                               "optim.end_lr=1e-7",
                                               "optim.warmup_proportion=0.2843",
                                               "optim.poly_power=0.5",
                                               "optim.beta1=0.85",
                                               "optim.beta2=0.98",
                                               "optim.epsilon=1e-11",
                                               "optim.weight_decay=0.1",
                                               "optim.max_grad_norm=0",
                                               "data.train_dir=/x/with \"quotes\" and \\back",
                                               "data.eval_dir=eval dir",
                                               "data.vocab=v.txt",
                                               "data.prefetch_steps=4",
                                               "data.shuffle_block_rows=128",
                                               "data.shuffle_window_blocks=3",
                                               "data.read_ahead_windows=0",
                                               "checkpoint.dir=ck",
                                               "checkpoint.every_steps=100",
                                               "checkpoint.keep=1",
                                               "checkpoint.resume=auto",
                                               "checkpoint.init_checkpoint=init.st",
                                               "eval.every_samples=150000",
                                               "eval.max_samples=0",
                                               "eval.batch_size=7",
                                               "eval.target_accuracy=0.72",
                                               "eval.at_end=false",
                                               "log.every_steps=1",
                                               "log.metrics_file=m.jsonl",
                                               "log.mllog_file=ml.log",
                                               "log.end_file=end.json",
                                               "log.submission_org=Org",
                                               "log.submission_platform=2xH200",
                                               "log.submission_division=open",
                                               "log.submission_status=research"});
  ASSERT_NE(c, TrainConfig{});
  const std::string text = train_config_to_toml(c);
  const std::string p = tmp.write("rt.toml", text);
  const TrainConfig back = load_train_config(p, {});
  EXPECT_EQ(back, c) << text;
  EXPECT_EQ(train_config_to_toml(back), text);
  // Every key is written.
  for (const config::KeyDoc& k : train_config_keys()) {
    const std::string leaf = k.name.substr(k.name.find('.') + 1);
    EXPECT_NE(text.find("\n" + leaf + " = "), std::string::npos) << k.name;
  }
  // The defaults round-trip too (floats such as 3.5e-4 and 0.999 exactly).
  const std::string p2 = tmp.write("rt2.toml", train_config_to_toml(TrainConfig{}));
  EXPECT_EQ(load_train_config(p2, {}), TrainConfig{});
}

TEST(TrainConfig, DerivedOptions) {
  const TrainConfig c = load_train_config(
      "", {"train.global_batch_size=64", "train.gradient_accumulation_steps=2",
           "train.max_seq_len=128", "optim.lr=2e-3", "optim.warmup_steps=5", "train.max_steps=50",
           "optim.weight_decay=0.02", "train.last_step=drop", "data.prefetch_steps=3"});
  const LrScheduleConfig s = lr_schedule_config(c);
  EXPECT_EQ(s.base_lr, 2e-3);
  EXPECT_EQ(s.max_steps, 50);
  EXPECT_EQ(s.num_warmup_steps, 5);
  const LambOptions l = lamb_options(c);
  EXPECT_FLOAT_EQ(l.weight_decay, 0.02f);
  EXPECT_TRUE(l.check_finite);
  // The optimizer skips a non-finite update at any train.max_nonfinite_steps: the run counts the
  // skipped steps against it (e2e: TrainCli.NonFiniteStepsCountAgainstMaxNonfiniteSteps).
  EXPECT_TRUE(l.skip_nonfinite);
  EXPECT_TRUE(lamb_options(load_train_config("", {"train.max_nonfinite_steps=0"})).skip_nonfinite);
  const LoaderOptions o = loader_options(c);
  EXPECT_EQ(o.global_batch_size, 64);
  EXPECT_EQ(o.micro_steps, 2);
  EXPECT_EQ(o.max_seq_len, 128);
  EXPECT_EQ(o.rules.max_seq_len, 128);
  EXPECT_EQ(o.prefetch_steps, 3);
  EXPECT_EQ(o.last_step, LastStepPolicy::drop);
  EXPECT_EQ(o.seed, c.train.seed);
  // The model's options: precision and CUDA graphs pass through.
  const TrainConfig g = load_train_config(
      "", {"train.device=cuda", "train.cuda_graphs=segmented", "train.precision=bf16"});
  const TrainerOptions t = trainer_options(g, bert_preset("tiny"), 1);
  EXPECT_EQ(t.bert.cuda_graphs, CudaGraphs::segmented);
  EXPECT_EQ(t.bert.precision, Precision::bf16);
  EXPECT_EQ(trainer_options(c, bert_preset("tiny"), 1).bert.cuda_graphs, CudaGraphs::off);
}

TEST(TrainConfig, KeyRegistry) {
  const auto& keys = train_config_keys();
  EXPECT_GE(keys.size(), 50u);
  for (const config::KeyDoc& k : keys) {
    EXPECT_FALSE(k.doc.empty()) << k.name;
    EXPECT_FALSE(k.type.empty()) << k.name;
  }
  const std::string md = config::keys_markdown(keys);
  for (const config::KeyDoc& k : keys) EXPECT_NE(md.find("`" + k.name + "`"), std::string::npos);
}

// Equality is every key's: changing any one key (to a value its type allows) makes the configs
// differ, so no field is left out of the comparison, and the writer shows each change.
TEST(TrainConfig, EqualityAndWriterCoverEveryKey) {
  const TrainConfig base = load_train_config("", {});
  for (const config::KeyDoc& k : train_config_keys()) {
    std::string value;
    if (k.type == "int")
      value = "7";
    else if (k.type == "float")
      value = "0.25";
    else if (k.type == "bool")  // a preset's default is true in the base preset
      value = k.default_value == "`false`" ? "true" : "false";
    else if (k.type == "string")
      value = "x";
    else {  // enum(a|b|..): a name other than the default (a preset's: the last, which the
            // base preset's BERT options never are)
      std::stringstream names(k.type.substr(5, k.type.size() - 6));
      const bool preset = k.default_value.rfind("`", 0) != 0;
      for (std::string name; std::getline(names, name, '|');) {
        value = name;
        if (!preset && "`\"" + value + "\"`" != k.default_value) break;
      }
    }
    const TrainConfig changed = load_train_config("", {k.name + "=" + value});
    EXPECT_NE(changed, base) << k.name << "=" << value;
    EXPECT_NE(train_config_to_toml(changed), train_config_to_toml(base)) << k.name;
  }
}

// Every shipped config loads and passes the rules that need no files.
TEST(TrainConfigFiles, ShippedConfigsLoadAndValidate) {
  const fs::path dir = source_dir() / "configs";
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const fs::path p = entry.path();
    if (p.extension() != ".toml") continue;
    if (p.filename().string().rfind("prepare_", 0) == 0) continue;  // `packbert prepare` configs
    SCOPED_TRACE(p.string());
    ++n;
    TrainConfig c;
    ASSERT_NO_THROW(c = load_train_config(p.string(), {})) << p;
    try {
      validate_train_config(c, 1, ConfigPurpose::train, /*check_paths=*/false);
    } catch (const Error& e) {
      ADD_FAILURE() << p << ": " << e.what();
    }
  }
  EXPECT_GE(n, 4);
}
