// `packbert prepare` over JSONL and over directories and globs (data/prepare/jsonl_input.h): a
// JSONL document becomes the same samples as the same document in the lines format; malformed
// lines are errors naming file:line, or counted and skipped; a directory or a glob is its files
// in name order.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/prepare/jsonl_input.h"
#include "data/prepare/prepare.h"
#include "data/prepare/text_input.h"
#include "data/prepare/tokenizer.h"
#include "data/shards/shard.h"
#include "kernels/base/error.h"
#include "test_util.h"

namespace packbert {
namespace {

namespace fs = std::filesystem;
using test::error_of;

const std::string kVocab = std::string(PACKBERT_REPO_DATA) + "/vocab.txt";
const std::string kDemo = std::string(PACKBERT_REPO_DATA) + "/kjv-bible-docs.txt.gz";

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

// The first `docs` documents of the demo corpus, each a list of its sentence lines.
std::vector<std::vector<std::string>> demo_documents(int docs) {
  TextReader reader(kDemo);
  std::vector<std::vector<std::string>> out(1);
  std::string chunk;
  while (static_cast<int>(out.size()) <= docs && reader.next_chunk(chunk, 1 << 16)) {
    for (size_t pos = 0; pos < chunk.size() && static_cast<int>(out.size()) <= docs;) {
      size_t nl = chunk.find('\n', pos);
      if (nl == std::string::npos) nl = chunk.size();
      const std::string line = chunk.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.find_first_not_of(" \t\r\v\f") == std::string::npos) {  // blank: a separator
        if (!out.back().empty()) out.emplace_back();
      } else {
        out.back().push_back(line);
      }
    }
  }
  out.resize(static_cast<size_t>(docs));
  return out;
}

std::string as_lines(const std::vector<std::vector<std::string>>& docs) {
  std::string s;
  for (const auto& d : docs) {
    for (const auto& line : d) s += line + "\n";
    s += "\n";
  }
  return s;
}

// One JSON object per document, its sentences joined by "\n" (as a paragraph break would be
// "\n\n": both stay inside the document).
std::string as_jsonl(const std::vector<std::vector<std::string>>& docs, const char* field) {
  std::string s;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string text;
    for (size_t k = 0; k < docs[i].size(); ++k)
      text += (k ? (k % 3 ? "\n" : "\n\n") : "") + docs[i][k];
    s += nlohmann::json{{"id", i}, {field, text}}.dump() + "\n";
  }
  return s;
}

PrepareOptions options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions o;
  o.inputs = inputs;
  o.vocab = kVocab;
  o.output_dir = out;
  o.max_seq_len = 64;
  o.max_predictions_per_seq = 10;
  o.dupe_factor = 2;
  o.seed = test::test_seed();
  o.threads = 2;
  o.eval_samples = 20;
  return o;
}

// Every sample of a run's shards, train then eval, as one comparable string each.
std::vector<std::string> samples_of(const PrepareStats& st) {
  SampleRules rules;
  rules.max_seq_len = 64;
  std::vector<std::string> out;
  std::vector<std::string> shards = st.train_shards;
  shards.push_back(st.eval_shard);
  for (const std::string& path : shards) {
    ShardReader reader(path, rules);
    Sample s;
    while (reader.next(s)) {
      std::string k;
      for (int32_t id : s.input_ids) k += std::to_string(id) + ",";
      for (int32_t p : s.masked_lm_positions) k += std::to_string(p) + ";";
      k += std::to_string(s.next_sentence_label);
      out.push_back(k);
    }
  }
  return out;
}

TEST(JsonlInput, DocumentsBecomeSentenceLinesThenABlankLine) {
  const std::string chunk =
      "{\"text\": \"a b\\n\\nc\"}\n{\"id\": 1, \"text\": \"d\"}\n   \n{\"text\": \"\"}\n";
  std::string out;
  EXPECT_EQ(jsonl_to_lines(chunk, "f.jsonl", 1, {}, out), 0);
  EXPECT_EQ(out, "a b\nc\n\nd\n\n");  // the empty text gives no document
}

TEST(JsonlInput, MalformedLinesNameFileAndLineOrAreCountedAndSkipped) {
  struct Case {
    std::string line, needle;
  };
  for (const Case& c : std::vector<Case>{{"{\"text\": \"x\"", "not valid JSON"},
                                         {"[1, 2]", "not a JSON object"},
                                         {"{\"body\": \"x\"}", "no \"text\" field"},
                                         {"{\"text\": 3}", "not a string"},
                                         {"{\"text\": \"\xff\"}", "not valid JSON"}}) {
    const std::string chunk = "{\"text\": \"ok\"}\n\n" + c.line + "\n{\"text\": \"after\"}\n";
    std::string out;
    const std::string e = error_of([&] { jsonl_to_lines(chunk, "f.jsonl", 10, {}, out); });
    EXPECT_NE(e.find("f.jsonl:12: "), std::string::npos) << e;
    EXPECT_NE(e.find(c.needle), std::string::npos) << e;
    out.clear();
    EXPECT_EQ(jsonl_to_lines(chunk, "f.jsonl", 10, {"text", true}, out), 1) << c.line;
    EXPECT_EQ(out, "ok\n\nafter\n\n");
  }
  std::string out;
  EXPECT_EQ(jsonl_to_lines("{\"body\": \"x\\ny\"}\n", "f.jsonl", 1, {"body", false}, out), 0);
  EXPECT_EQ(out, "x\ny\n\n");
}

// The same documents as lines, as JSONL and as gzipped JSONL give the same samples, bit for bit;
// a malformed line fails the run naming it, or with skip_bad_lines is skipped and counted.
TEST(PrepareJsonl, SameSamplesAsTheLinesFormat) {
  test::TempDir dir;
  const auto docs = demo_documents(60);
  write_text(dir.file("docs.txt"), as_lines(docs));
  write_text(dir.file("docs.jsonl"), as_jsonl(docs, "text"));
  ASSERT_EQ(
      test::run_command("gzip -n -c " + dir.file("docs.jsonl") + " > " + dir.file("docs.jsonl.gz")),
      0);
  const auto want = samples_of(run_prepare(options({dir.file("docs.txt")}, dir.file("lines"))));
  ASSERT_GT(want.size(), 100u);
  EXPECT_EQ(samples_of(run_prepare(options({dir.file("docs.jsonl")}, dir.file("jsonl")))), want);
  EXPECT_EQ(samples_of(run_prepare(options({dir.file("docs.jsonl.gz")}, dir.file("gz")))), want);
  // Another field, and the format given rather than told by the name.
  write_text(dir.file("body.data"), as_jsonl(docs, "body"));
  PrepareOptions o = options({dir.file("body.data")}, dir.file("body"));
  o.input_format = InputFormat::jsonl;
  o.text_field = "body";
  EXPECT_EQ(samples_of(run_prepare(o)), want);

  std::string bad = as_jsonl(docs, "text");
  const size_t third = bad.find('\n', bad.find('\n') + 1) + 1;
  bad.insert(third, "{\"text\": oops}\n");  // line 3
  write_text(dir.file("bad.jsonl"), bad);
  const std::string e =
      error_of([&] { run_prepare(options({dir.file("bad.jsonl")}, dir.file("bad"))); });
  EXPECT_NE(e.find(dir.file("bad.jsonl") + ":3: not valid JSON"), std::string::npos) << e;
  o = options({dir.file("bad.jsonl")}, dir.file("skipped"));
  o.skip_bad_lines = true;
  const PrepareStats st = run_prepare(o);
  EXPECT_EQ(st.bad_lines, 1);
  EXPECT_EQ(samples_of(st), want);
}

// A directory and a glob are their files in name order: the samples of listing them.
TEST(PrepareJsonl, DirectoriesAndGlobsAreTheirFilesInOrder) {
  test::TempDir dir;
  const auto docs = demo_documents(45);
  fs::create_directories(dir.file("in"));
  for (int k = 0; k < 3; ++k)
    write_text(dir.file("in/part-" + std::to_string(k) + ".txt"),
               as_lines({docs.begin() + 15 * k, docs.begin() + 15 * (k + 1)}));
  std::vector<std::string> listed;
  for (int k = 0; k < 3; ++k) listed.push_back(dir.file("in/part-" + std::to_string(k) + ".txt"));
  EXPECT_EQ(expand_inputs({dir.file("in")}), listed);
  EXPECT_EQ(expand_inputs({dir.file("in/part-*.txt")}), listed);
  const auto want = samples_of(run_prepare(options(listed, dir.file("listed"))));
  EXPECT_EQ(samples_of(run_prepare(options({dir.file("in")}, dir.file("dir")))), want);
  EXPECT_EQ(samples_of(run_prepare(options({dir.file("in/*.txt")}, dir.file("glob")))), want);
  fs::create_directories(dir.file("empty"));
  EXPECT_NE(error_of([&] { expand_inputs({dir.file("empty")}); }).find("holds no file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { expand_inputs({dir.file("in/*.jsonl")}); }).find("matches no file"),
            std::string::npos);
}

}  // namespace
}  // namespace packbert
