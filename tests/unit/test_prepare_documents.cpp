// `packbert prepare --samples documents`: every sample is [CLS] chunk [SEP] with one segment and
// no NSP label, and the chunks are exactly each document's tokens cut into consecutive runs of
// max_seq_len - 2 (the last the tail), once per dupe round; the output (with an eval set) does
// not depend on the threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "data/prepare/prepare.h"
#include "data/prepare/text_input.h"
#include "data/prepare/tokenizer.h"
#include "data/shards/shard.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

const std::string kVocab = std::string(PACKBERT_REPO_DATA) + "/vocab.txt";
const std::string kDemo = std::string(PACKBERT_REPO_DATA) + "/kjv-bible-docs.txt.gz";

// The first `docs` documents of the demo corpus in the lines format, and each document's
// tokens (what prepare's tokenizer gives its sentences, concatenated).
std::string demo_text(int docs, std::vector<std::vector<int32_t>>* tokens) {
  static const Vocab vocab = Vocab::load(kVocab);
  const BertTokenizer tok(vocab);
  TextReader reader(kDemo);
  std::string chunk, out;
  tokens->assign(1, {});
  while (static_cast<int>(tokens->size()) <= docs && reader.next_chunk(chunk, 1 << 16)) {
    for (size_t pos = 0; pos < chunk.size() && static_cast<int>(tokens->size()) <= docs;) {
      size_t nl = chunk.find('\n', pos);
      if (nl == std::string::npos) nl = chunk.size();
      const std::string line = chunk.substr(pos, nl - pos);
      pos = nl + 1;
      out += line + "\n";
      if (line.find_first_not_of(" \t\r\v\f") == std::string::npos) {
        if (!tokens->back().empty()) tokens->emplace_back();
        continue;
      }
      const std::vector<int32_t> ids = tok.encode(line);
      tokens->back().insert(tokens->back().end(), ids.begin(), ids.end());
    }
  }
  tokens->resize(static_cast<size_t>(docs));
  return out;
}

PrepareOptions options(const std::string& input, const std::string& out, int threads) {
  PrepareOptions o;
  o.inputs = {input};
  o.vocab = kVocab;
  o.output_dir = out;
  o.samples = PrepareSamples::documents;
  o.max_seq_len = 48;
  o.max_predictions_per_seq = 8;
  o.dupe_factor = 2;
  o.seed = test::test_seed();
  o.threads = threads;
  o.eval_samples = 30;
  return o;
}

SampleRules rules48() {
  SampleRules rules;
  rules.max_seq_len = 48;
  return rules;
}

std::vector<Sample> samples_of(const PrepareStats& st) {
  std::vector<std::string> shards = st.train_shards;
  shards.push_back(st.eval_shard);
  return test::read_shards(shards, rules48());
}

TEST(PrepareDocuments, SamplesAreEachDocumentsChunksOncePerRound) {
  test::TempDir dir;
  std::vector<std::vector<int32_t>> docs;
  const std::string path = dir.file("docs.txt");
  std::ofstream(path) << demo_text(40, &docs);
  PrepareOptions o = options(path, dir.file("out"), 2);
  o.eval_samples = 0;  // (an eval set takes a held-out document's first chunks only)
  const PrepareStats st = run_prepare(o);
  const std::vector<Sample> samples = test::read_shards(st.train_shards, rules48());

  // What the chunks must be: every document cut into runs of 46, once per dupe round (2),
  // counted as a multiset.
  std::map<std::vector<int32_t>, int> want_once;
  for (const auto& d : docs)
    for (size_t at = 0; at < d.size(); at += 46)
      ++want_once[std::vector<int32_t>(
          d.begin() + static_cast<std::ptrdiff_t>(at),
          d.begin() + static_cast<std::ptrdiff_t>(std::min(d.size(), at + 46)))];
  std::map<std::vector<int32_t>, int> got;
  int masked = 0;
  for (const Sample& s : samples) {
    ASSERT_GE(s.input_ids.size(), 3u);
    EXPECT_EQ(s.input_ids.front(), 101);
    EXPECT_EQ(s.input_ids.back(), 102);
    EXPECT_EQ(s.next_sentence_label, 0);
    EXPECT_TRUE(
        std::all_of(s.segment_ids.begin(), s.segment_ids.end(), [](int8_t x) { return x == 0; }));
    std::vector<int32_t> ids = s.input_ids;  // the tokens before masking
    for (size_t k = 0; k < s.masked_lm_positions.size(); ++k) {
      const int32_t p = s.masked_lm_positions[k];
      EXPECT_GT(p, 0);
      EXPECT_LT(p, static_cast<int32_t>(ids.size()) - 1);
      ids[static_cast<size_t>(p)] = s.masked_lm_ids[k];
    }
    masked += static_cast<int>(s.masked_lm_positions.size());
    ++got[std::vector<int32_t>(ids.begin() + 1, ids.end() - 1)];
  }
  EXPECT_GT(masked, 0);
  for (const auto& [chunk, n] : want_once) {
    const auto it = got.find(chunk);
    ASSERT_NE(it, got.end()) << "a chunk of " << chunk.size() << " tokens is missing";
    EXPECT_EQ(it->second, 2 * n);
  }
  EXPECT_EQ(got.size(), want_once.size()) << "samples that are no document's chunk";
}

TEST(PrepareDocuments, OutputDoesNotDependOnThreads) {
  test::TempDir dir;
  std::vector<std::vector<int32_t>> docs;
  const std::string path = dir.file("docs.txt");
  std::ofstream(path) << demo_text(40, &docs);
  const auto one = samples_of(run_prepare(options(path, dir.file("t1"), 1)));
  const auto four = samples_of(run_prepare(options(path, dir.file("t4"), 4)));
  ASSERT_EQ(one.size(), four.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(one[i] == four[i]) << "sample " << i;
}

}  // namespace
}  // namespace packbert
