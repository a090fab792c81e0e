// What shards record of their making (ShardMeta) and the tokenizer they record
// (CorpusTokenizer): the attributes round trip, ids past int16 go to int32 datasets, the
// trainer's expectations refuse a shard made otherwise with both sides named, and `prepare`
// with a byte-level BPE tokenizer.json writes document chunks of its ids, without masks where
// asked (the eval shard masked either way).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/masking/masking.h"
#include "data/prepare/corpus_tokenizer.h"
#include "data/prepare/hf_pretokenize.h"
#include "data/prepare/hf_tokenizer.h"
#include "data/prepare/prepare.h"
#include "data/prepare/tokenizer.h"
#include "data/shards/shard.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

using nlohmann::json;

const std::string kVocab = std::string(PACKBERT_REPO_DATA) + "/vocab.txt";

ShardMeta some_meta(int64_t vocab_size) {
  ShardMeta m;
  m.recorded = true;
  m.tokenizer = "tokenizer.json";
  m.tokenizer_sha256 = std::string(64, 'a');
  m.vocab_size = vocab_size;
  m.cls_id = 0;
  m.sep_id = 2;
  m.mask_id = 4;
  m.pad_id = 1;
  m.masks = "static";
  m.samples = "documents";
  return m;
}

// Random samples [CLS] x.. [SEP] with ids anywhere in [5, vocab) and a few masked positions.
std::vector<Sample> wide_samples(std::mt19937_64& rng, int n, int64_t vocab, int max_len) {
  std::vector<Sample> out;
  for (int k = 0; k < n; ++k) {
    Sample s;
    const int len = std::uniform_int_distribution<int>(3, max_len)(rng);
    std::uniform_int_distribution<int32_t> id(5, static_cast<int32_t>(vocab - 1));
    s.input_ids = {0};
    for (int i = 1; i + 1 < len; ++i) s.input_ids.push_back(id(rng));
    s.input_ids.push_back(2);
    s.segment_ids.assign(static_cast<size_t>(len), 0);
    for (int p = 1; p + 1 < len; p += 3) {
      s.masked_lm_positions.push_back(p);
      s.masked_lm_ids.push_back(id(rng));
    }
    out.push_back(s);
  }
  return out;
}

ShardMeta meta_of(const std::string& path, const SampleRules& rules) {
  return ShardReader(path, rules).info().meta;
}

TEST(ShardMeta, RoundTripsWithIdsPastInt16InBothFormats) {
  test::TempDir dir;
  std::mt19937_64 rng(test::test_seed());
  const std::vector<Sample> samples = wide_samples(rng, 300, 50368, 40);
  for (const ShardFormat format : {ShardFormat::fixed, ShardFormat::var_length}) {
    ShardWriteOptions w;
    w.format = format;
    w.max_seq_len = 40;
    w.max_predictions = 16;
    w.chunk_samples = 64;
    w.meta = some_meta(50368);
    const std::string path = dir.file(std::string("wide_") + to_string(format) + ".h5");
    write_shard(path, samples, w);
    SampleRules rules;
    rules.vocab_size = 0;  // the recorded size
    const std::vector<Sample> back = test::read_shards({path}, rules);
    EXPECT_TRUE(meta_of(path, rules) == w.meta);
    ASSERT_EQ(back.size(), samples.size());
    for (size_t i = 0; i < samples.size(); ++i) EXPECT_TRUE(back[i] == samples[i]) << i;

    // A vocabulary int16 holds keeps int16 datasets: an id past them is refused by name.
    w.meta = some_meta(32768);
    const std::string error =
        test::error_of([&] { write_shard(dir.file("narrow.h5"), samples, w); });
    EXPECT_NE(error.find("does not fit the int16 dataset"), std::string::npos) << error;
  }
}

TEST(ShardMeta, ExpectationsRefuseAShardMadeOtherwiseNamingBothSides) {
  const ShardMeta m = some_meta(8192);
  SampleRules r;
  EXPECT_EQ(check_shard_meta(m, r), "");
  r.tokenizer = "/data/other.json";
  r.tokenizer_sha256 = std::string(64, 'b');
  std::string e = check_shard_meta(m, r);
  for (const std::string& want : {m.tokenizer, m.tokenizer_sha256, r.tokenizer, r.tokenizer_sha256})
    EXPECT_NE(e.find(want), std::string::npos) << want << " in " << e;
  r = SampleRules();
  r.model_vocab_size = 30522;
  e = check_shard_meta(m, r);
  EXPECT_NE(e.find("8192 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("30522"), std::string::npos) << e;
  EXPECT_NE(e.find("model.vocab_size = 8192"), std::string::npos) << e;
  r.model_vocab_size = 8192;
  EXPECT_EQ(check_shard_meta(m, r), "");
  r.needs_pairs = true;
  EXPECT_NE(check_shard_meta(m, r).find("model.nsp_head = false"), std::string::npos);
  ShardMeta unmasked = some_meta(8192);
  unmasked.masks = "none";
  unmasked.samples = "pairs";
  r.needs_masks = true;
  EXPECT_NE(check_shard_meta(unmasked, r).find("data.masking = \"dynamic\""), std::string::npos);
  // Nothing recorded (MLPerf's, NVIDIA's shards): nothing to check.
  EXPECT_EQ(check_shard_meta(ShardMeta(), r), "");

  // The reader refuses on open, naming the shard.
  test::TempDir dir;
  std::mt19937_64 rng(test::test_seed());
  ShardWriteOptions w;
  w.format = ShardFormat::var_length;
  w.meta = unmasked;
  const std::string path = dir.file("unmasked.h5");
  write_shard(path, wide_samples(rng, 5, 8192, 20), w);
  SampleRules rules;
  rules.needs_masks = true;
  e = test::error_of([&] { ShardReader reader(path, rules); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("holds no masks"), std::string::npos) << e;
}

// FIPS 180-2's examples (Appendix B.1, B.2) and the empty message.
TEST(CorpusTokenizer, Sha256MatchesTheStandardsExamples) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(CorpusTokenizer, VocabTxtIsBertsTokenizer) {
  const CorpusTokenizer t = CorpusTokenizer::load(kVocab);
  const Vocab vocab = Vocab::load(kVocab);
  const BertTokenizer bert(vocab);
  const ShardMeta& m = t.meta();
  EXPECT_TRUE(m.recorded);
  EXPECT_EQ(m.tokenizer, "vocab.txt");
  EXPECT_EQ(m.tokenizer_sha256, sha256_hex(test::read_file(kVocab)));
  EXPECT_EQ(m.vocab_size, vocab.size());
  EXPECT_EQ(m.cls_id, vocab.cls_id());
  EXPECT_EQ(m.sep_id, vocab.sep_id());
  EXPECT_EQ(m.mask_id, vocab.mask_id());
  EXPECT_EQ(m.pad_id, vocab.pad_id());
  const MaskVocab want = mask_vocab(vocab);
  EXPECT_EQ(t.mask_vocab().is_special, want.is_special);
  EXPECT_EQ(t.mask_vocab().is_continuation, want.is_continuation);
  EXPECT_EQ(t.mask_vocab().random_words, want.random_words);
  EXPECT_TRUE(t.word_pieces());
  for (const char* text : {"In the beginning God created the heaven and the earth.",
                           "Caf\xc3\xa9 unbelievably [MASK] tokenization"}) {
    std::vector<int32_t> ids;
    t.encode(text, ids);
    EXPECT_EQ(ids, bert.encode(text)) << text;
  }
}

// A byte-level BPE tokenizer.json: RoBERTa's specials at 0..4, filler tokens, the 256 byte
// characters at `first_byte` .. first_byte + 255 (past int16 when first_byte > 32767), the
// merge "t h" -> "th" after them. `post` is its post_processor.
json bpe_tokenizer(int32_t first_byte, const json& post) {
  json added = json::array();
  const std::vector<std::string> specials = {"<s>", "<pad>", "</s>", "<unk>", "<mask>"};
  json vocab = json::object();
  for (int32_t i = 0; i < 5; ++i) {
    added.push_back({{"id", i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    vocab[specials[i]] = i;
  }
  for (int32_t i = 5; i < first_byte; ++i) vocab["filler" + std::to_string(i)] = i;
  const auto& chars = byte_level_chars();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = first_byte + b;
  vocab["th"] = first_byte + 256;
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", post},
      {"decoder", nullptr},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"t h"})}}}};
}

json roberta_post() {
  return {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 0}}};
}

std::string write_json(test::TempDir& dir, const std::string& name, const json& j) {
  const std::string path = dir.file(name);
  std::ofstream(path) << j.dump();
  return path;
}

TEST(CorpusTokenizer, TokenizerJsonGivesItsTemplateAndSpecials) {
  test::TempDir dir;
  const std::string path = write_json(dir, "bpe.json", bpe_tokenizer(300, roberta_post()));
  const CorpusTokenizer t = CorpusTokenizer::load(path);
  const ShardMeta& m = t.meta();
  EXPECT_EQ(m.vocab_size, 300 + 257);
  EXPECT_EQ(m.cls_id, 0);
  EXPECT_EQ(m.sep_id, 2);
  EXPECT_EQ(m.mask_id, 4);
  EXPECT_EQ(m.pad_id, 1);
  EXPECT_EQ(m.tokenizer_sha256, sha256_hex(test::read_file(path)));
  EXPECT_FALSE(t.word_pieces());
  const MaskVocab& mv = t.mask_vocab();
  for (int32_t id = 0; id < m.vocab_size; ++id) EXPECT_EQ(mv.is_special[id] != 0, id < 5) << id;
  EXPECT_EQ(mv.random_words.size(), static_cast<size_t>(m.vocab_size - 5));
  EXPECT_EQ(mv.random_words.front(), 5);
  std::vector<int32_t> ids;
  t.encode("the", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{300 + 256, 300 + 'e'}));  // "th" merged, then "e"

  // Templates of other than one token before and one after, and no mask token: errors.
  json two_after = {{"type", "TemplateProcessing"},
                    {"single",
                     {{{"SpecialToken", {{"id", "<s>"}}}},
                      {{"Sequence", {{"id", "A"}}}},
                      {{"SpecialToken", {{"id", "</s>"}}}},
                      {{"SpecialToken", {{"id", "</s>"}}}}}},
                    {"special_tokens",
                     {{"<s>", {{"id", "<s>"}, {"ids", {0}}, {"tokens", {"<s>"}}}},
                      {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}};
  std::string e = test::error_of(
      [&] { CorpusTokenizer::load(write_json(dir, "two.json", bpe_tokenizer(300, two_after))); });
  EXPECT_NE(e.find("1 special token(s) before a text and 2 after"), std::string::npos) << e;
  json no_mask = bpe_tokenizer(300, roberta_post());
  no_mask["added_tokens"].erase(4);
  no_mask["model"]["vocab"].erase("<mask>");
  const std::string no_mask_path = write_json(dir, "nomask.json", no_mask);
  e = test::error_of([&] { CorpusTokenizer::load(no_mask_path); });
  EXPECT_NE(e.find(no_mask_path), std::string::npos) << e;
  EXPECT_NE(e.find("no mask token"), std::string::npos) << e;
}

TEST(PrepareOwnTokenizer, DocumentChunksOfTheTokenizersIdsWithoutMasks) {
  test::TempDir dir;
  // Byte tokens at 40000+: every id of the text is past int16.
  const std::string tok_path = write_json(dir, "bpe.json", bpe_tokenizer(40000, roberta_post()));
  const HfTokenizer hf = HfTokenizer::load(tok_path);
  std::mt19937_64 rng(test::test_seed());
  std::vector<std::string> docs;
  std::string jsonl;
  for (int d = 0; d < 60; ++d) {
    std::string text;
    const int words = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int w = 0; w < words; ++w)
      text += (w ? " " : "") + std::string(w % 3 ? "the" : "Thy") + std::to_string(rng() % 97);
    docs.push_back(text);
    jsonl += json({{"text", text}}).dump() + "\n";
  }
  const std::string input = dir.file("corpus.jsonl");
  std::ofstream(input) << jsonl;
  PrepareOptions o;
  o.inputs = {input};
  o.vocab = tok_path;
  o.output_dir = dir.file("out");
  o.samples = PrepareSamples::documents;
  o.masks = PrepareMasks::none;
  o.dupe_factor = 1;
  o.max_seq_len = 32;
  o.max_predictions_per_seq = 8;
  o.eval_samples = 10;
  o.format = ShardFormat::var_length;
  o.seed = test::test_seed();
  o.threads = 2;
  const PrepareStats st = run_prepare(o);

  // Every training sample is <s> chunk </s> of a document's ids, unmasked; together they are
  // the chunks of the documents not held out.
  std::multiset<std::vector<int32_t>> chunks;
  for (const std::string& text : docs) {
    const std::vector<int32_t> ids = hf.encode(text, false);
    for (size_t at = 0; at < ids.size(); at += 30)
      chunks.insert(std::vector<int32_t>(
          ids.begin() + static_cast<std::ptrdiff_t>(at),
          ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), at + 30))));
  }
  SampleRules rules;
  rules.vocab_size = 0;
  size_t train = 0;
  for (const std::string& shard : st.train_shards) {
    const ShardMeta meta = meta_of(shard, rules);
    EXPECT_EQ(meta.masks, "none");
    EXPECT_EQ(meta.samples, "documents");
    EXPECT_EQ(meta.vocab_size, 40257);
    for (const Sample& s : test::read_shards({shard}, rules)) {
      EXPECT_EQ(s.input_ids.front(), 0);
      EXPECT_EQ(s.input_ids.back(), 2);
      EXPECT_EQ(s.num_masked(), 0);
      const std::vector<int32_t> chunk(s.input_ids.begin() + 1, s.input_ids.end() - 1);
      EXPECT_GE(*std::min_element(chunk.begin(), chunk.end()), 40000);
      const auto it = chunks.find(chunk);
      ASSERT_NE(it, chunks.end()) << "a sample that is no document's chunk";
      chunks.erase(it);
      ++train;
    }
  }
  EXPECT_GT(train, 0u);
  // The eval shard is masked: at most 8 positions, never <s> or </s>, each reading <mask>, a
  // non-special token or itself.
  const std::vector<Sample> eval = test::read_shards({st.eval_shard}, rules);
  EXPECT_EQ(meta_of(st.eval_shard, rules).masks, "static");
  ASSERT_EQ(eval.size(), 10u);
  int masked = 0;
  for (const Sample& s : eval) {
    masked += s.num_masked();
    for (int32_t p : s.masked_lm_positions) {
      EXPECT_TRUE(p > 0 && p + 1 < s.length());
      EXPECT_TRUE(s.input_ids[p] == 4 || s.input_ids[p] >= 5);
    }
  }
  EXPECT_GT(masked, 0);

  // The same samples with 1 and 3 threads (the BPE's word cache is per thread).
  auto all_samples = [&](int threads) {
    PrepareOptions t = o;
    t.threads = threads;
    t.output_dir = dir.file("threads" + std::to_string(threads));
    const PrepareStats ts = run_prepare(t);
    std::vector<std::string> shards = ts.train_shards;
    shards.insert(shards.begin(), ts.eval_shard);
    return test::read_shards(shards, rules);
  };
  const std::vector<Sample> one = all_samples(1);
  EXPECT_TRUE(one == all_samples(3));
  EXPECT_EQ(one.size(), train + eval.size());

  // Whole-word masking needs WordPiece; identical copies of documents are refused.
  o.output_dir = dir.file("out2");
  o.whole_word_masking = true;
  std::string e = test::error_of([&] { run_prepare(o); });
  EXPECT_NE(e.find("whole words are WordPiece's"), std::string::npos) << e;
  o.whole_word_masking = false;
  o.dupe_factor = 3;
  e = test::error_of([&] { run_prepare(o); });
  EXPECT_NE(e.find("--dupe-factor 3"), std::string::npos) << e;
}

}  // namespace
}  // namespace packbert
