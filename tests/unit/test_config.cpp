// The config system shared by every subcommand (src/config): the key tables of prepare, inspect
// and pack, reading lists and enums, the round trip through the writer, and the key tables of
// docs/configuration.md, which are generated from the code. Regenerate them with
//   PACKBERT_UPDATE_DOCS=1 build/tests/test_config --gtest_filter='ConfigDocs.*'
// (TrainConfig's own tests: test_train_config.cpp; the errors through the binary: tests/e2e.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "config/command_config.h"
#include "kernels/base/error.h"
#include "test_util.h"
#include "config/train_config.h"

namespace fs = std::filesystem;
using namespace packbert;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an Error";
  return "";
}

template <class Root>
Root load(const config::Schema<Root>& schema, const std::string& path,
          const std::vector<std::string>& overrides = {}) {
  Root r;
  schema.apply(schema.read(path, overrides), r);
  return r;
}

}  // namespace

TEST(CommandConfig, PrepareFileThenOverrides) {
  test::TempDir dir;
  const std::string path = dir.file("p.toml");
  std::ofstream(path) << "[prepare]\ninput = [\"a.txt\", \"b.txt.gz\"]\nmax_seq_len = 512\n"
                         "format = \"varlength\"\nwhole_word_masking = true\nseed = 7\n";
  const auto& schema = prepare_config_schema();
  const PrepareConfig c = load(schema, path, {"prepare.max_seq_len=256", "prepare.vocab=v.txt"});
  EXPECT_EQ(c.prepare.inputs, (std::vector<std::string>{"a.txt", "b.txt.gz"}));
  EXPECT_EQ(c.prepare.max_seq_len, 256);  // the command line wins
  EXPECT_EQ(c.prepare.vocab, "v.txt");
  EXPECT_EQ(c.prepare.format, ShardFormat::var_length);
  EXPECT_TRUE(c.prepare.whole_word_masking);
  EXPECT_EQ(c.prepare.seed, 7u);
  EXPECT_EQ(c.prepare.dupe_factor, PrepareOptions{}.dupe_factor);  // untouched: the default

  // A bare override of a list key is a list of one; TOML's list syntax works too.
  EXPECT_EQ(load(schema, "", {"prepare.input=x.txt"}).prepare.inputs,
            (std::vector<std::string>{"x.txt"}));
  EXPECT_EQ(load(schema, "", {"prepare.input=[\"x\", \"y\"]"}).prepare.inputs,
            (std::vector<std::string>{"x", "y"}));

  // The writer's text reads back equal.
  const std::string text = schema.to_toml(c);
  const std::string back_path = dir.file("back.toml");
  std::ofstream(back_path) << text;
  const PrepareConfig back = load(schema, back_path);
  EXPECT_TRUE(schema.equal(back, c)) << text;
  EXPECT_FALSE(schema.equal(back, PrepareConfig{}));
  EXPECT_EQ(schema.to_toml(back), text);
}

TEST(CommandConfig, ErrorsNameFileLineColumnAndKey) {
  test::TempDir dir;
  const std::string path = dir.file("e.toml");
  auto error_for = [&](const std::string& text) {
    std::ofstream(path) << text;
    return error_of([&] { load(prepare_config_schema(), path); });
  };
  std::string e = error_for("[prepare]\ninput = \"a.txt\"\n");
  EXPECT_NE(e.find(path + ":2:1: prepare.input: expected a list of strings"), std::string::npos)
      << e;
  e = error_for("[prepare]\nformat = \"vl\"\n");
  EXPECT_NE(e.find(path + ":2:1: prepare.format: unknown value 'vl'"), std::string::npos) << e;
  EXPECT_NE(e.find("fixed | varlength"), std::string::npos) << e;
  e = error_for("# comment\n[prepare]\n  dupe-factor = 2\n");
  EXPECT_NE(e.find(path + ":3:3: key 'dupe-factor' is kebab-case"), std::string::npos) << e;
  EXPECT_NE(e.find("prepare.dupe_factor"), std::string::npos) << e;
  e = error_for("log-level = \"info\"\n[prepare]\n");
  EXPECT_NE(e.find(path + ":1:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("--log-level"), std::string::npos) << e;
  e = error_for("[train]\nmax_steps = 3\n");
  EXPECT_NE(e.find("unknown section [train] for packbert prepare (known: [prepare])"),
            std::string::npos)
      << e;
  e = error_for("[prepare]\nthreads = 5000000000\n");
  EXPECT_NE(e.find(path + ":2:1: prepare.threads: 5000000000 is out of range"), std::string::npos)
      << e;
  e = error_of([] { load(pack_config_schema(), "", {"pack.algorithm=best"}); });
  EXPECT_NE(e.find("override 'pack.algorithm=best': pack.algorithm: unknown value 'best'"),
            std::string::npos)
      << e;
}

TEST(CommandConfig, ValidationNamesKeyAndOption) {
  PrepareConfig p;
  p.prepare.inputs = {PACKBERT_REPO_DATA "/vocab.txt"};
  p.prepare.vocab = PACKBERT_REPO_DATA "/vocab.txt";
  p.prepare.output_dir = "out";
  validate_prepare_config(p);
  p.prepare.max_seq_len = 4;
  EXPECT_NE(error_of([&] {
              validate_prepare_config(p);
            }).find("prepare.max_seq_len (--max-seq-len) = 4: must be in [8, 65536]"),
            std::string::npos);
  p.prepare.max_seq_len = 128;
  p.prepare.inputs = {"/nonexistent/text.txt"};
  EXPECT_NE(error_of([&] { validate_prepare_config(p); }).find("/nonexistent/text.txt"),
            std::string::npos);
  p.prepare.inputs.clear();
  EXPECT_NE(
      error_of([&] { validate_prepare_config(p); }).find("prepare.input is not set: give --input"),
      std::string::npos);

  InspectConfig i;
  EXPECT_NE(error_of([&] { validate_inspect_config(i); }).find("inspect.path is not set"),
            std::string::npos);
  i.inspect.path = "x";
  i.inspect.vocab_size = -1;
  EXPECT_NE(error_of([&] { validate_inspect_config(i); }).find("inspect.vocab_size"),
            std::string::npos);

  PackConfig k;
  EXPECT_NE(error_of([&] { validate_pack_config(k); }).find("pack.histogram"), std::string::npos);
  k.pack.histogram_file = PACKBERT_TEST_DATA "/wikipedia-seqlen-histogram-512.txt";
  validate_pack_config(k);
  k.pack.data_dir = "d";
  EXPECT_NE(error_of([&] { validate_pack_config(k); }).find("both set"), std::string::npos);
}

TEST(CommandConfig, OptionOfKey) {
  EXPECT_EQ(option_of_key("prepare.max_predictions_per_seq"), "--max-predictions-per-seq");
  EXPECT_EQ(option_of_key("pack.json"), "--json");
  EXPECT_EQ(option_of_key("inspect.path"), "PATH");
}

// Every shipped prepare config loads.
TEST(CommandConfig, ShippedPrepareConfigsLoad) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(PACKBERT_SOURCE_DIR) / "configs")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("prepare_", 0) != 0) continue;
    ++n;
    EXPECT_NO_THROW(load(prepare_config_schema(), entry.path().string())) << name;
  }
  EXPECT_GE(n, 2);
}

// docs/configuration.md holds each subcommand's key table, generated from the code, between
// <!-- config-keys:NAME:begin --> and <!-- config-keys:NAME:end -->. With
// PACKBERT_UPDATE_DOCS=1 the tables are regenerated first.
TEST(ConfigDocs, TablesAreTheKeyTables) {
  const fs::path doc = fs::path(PACKBERT_SOURCE_DIR) / "docs" / "configuration.md";
  std::string text = test::read_file(doc.string());
  const std::vector<std::pair<std::string, std::vector<config::KeyDoc>>> tables = {
      {"prepare", prepare_config_schema().docs()},
      {"inspect", inspect_config_schema().docs()},
      {"pack", pack_config_schema().docs()},
      {"train", train_config_keys()}};
  const char* update = std::getenv("PACKBERT_UPDATE_DOCS");
  for (const auto& [name, keys] : tables) {
    const std::string begin = "<!-- config-keys:" + name + ":begin -->";
    const std::string end = "<!-- config-keys:" + name + ":end -->";
    const size_t b = text.find(begin);
    const size_t e = text.find(end);
    ASSERT_NE(b, std::string::npos) << doc << ": " << begin;
    ASSERT_NE(e, std::string::npos) << doc << ": " << end;
    ASSERT_LT(b, e);
    const std::string want = "\n" + config::keys_markdown(keys);
    if (update && std::string(update) == "1")
      text = text.substr(0, b + begin.size()) + want + text.substr(e);
    else
      EXPECT_EQ(text.substr(b + begin.size(), e - b - begin.size()), want)
          << "docs/configuration.md's " << name << " table is not the code's; regenerate it "
          << "with PACKBERT_UPDATE_DOCS=1 test_config --gtest_filter='ConfigDocs.*'";
  }
  if (update && std::string(update) == "1") std::ofstream(doc) << text;
}
