// data/prepare/hf_*: the parts of the tokenizer.json reader that `tokenizers` cannot check
// (tests/e2e/tokenizer_check.py compares the ids with it on a whole test text): the merge
// order on a vocabulary small enough to follow by hand, the Unicode standard's example of
// maximal subparts, and that every unsupported component is an error naming it.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/prepare/hf_bpe.h"
#include "data/prepare/hf_pretokenize.h"
#include "data/prepare/hf_tokenizer.h"
#include "kernels/base/error.h"
#include "test_util.h"

namespace packbert {
namespace {

using nlohmann::json;

json bpe_model(const json& merges) {
  return {{"type", "BPE"},
          {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}}},
          {"merges", merges}};
}

std::vector<int32_t> encode(const BpeModel& m, const std::string& word) {
  std::vector<int32_t> out;
  m.encode_word(word, out);
  return out;
}

// Merges by rank, lowest first, the leftmost of equal ranks: worked by hand.
TEST(HfBpe, MergesFollowRankThenPosition) {
  // (a, b) before (ab, c): "abc" -> ab c -> abc.
  EXPECT_EQ(encode(BpeModel(bpe_model(json::array({"a b", "ab c"})), "t"), "abc"),
            (std::vector<int32_t>{5}));
  // (b, c) ranks first: a bc, and no merge (a, bc) exists.
  EXPECT_EQ(
      encode(
          BpeModel(bpe_model(json::array({json::array({"b", "c"}), json::array({"a", "b"})})), "t"),
          "abc"),
      (std::vector<int32_t>{0, 4}));
  // "aaa" with (a, a): the leftmost pair merges, the last a stays.
  EXPECT_EQ(encode(BpeModel(bpe_model(json::array({"a a"})), "t"), "aaa"),
            (std::vector<int32_t>{6, 0}));
  // A character missing from the vocabulary is dropped without an unk token, and its
  // neighbours merge as if adjacent (tokenizers' merge_word leaves it out of the word).
  EXPECT_EQ(encode(BpeModel(bpe_model(json::array({"a b"})), "t"), "axb"),
            (std::vector<int32_t>{3}));
  EXPECT_EQ(encode(BpeModel(bpe_model(json::array({"b c"})), "t"), "axb"),
            (std::vector<int32_t>{0, 1}));
  // ignore_merges: a word in the vocabulary is its id even where the merges would not make it.
  json m = bpe_model(json::array({"b c"}));
  m["ignore_merges"] = true;
  EXPECT_EQ(encode(BpeModel(m, "t"), "abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(encode(BpeModel(bpe_model(json::array({"b c"})), "t"), "abc"),
            (std::vector<int32_t>{0, 4}));
}

// The Unicode standard's example (chapter 3, "U+FFFD Substitution of Maximal Subparts"):
// 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d.
TEST(HfPretokenize, InvalidUtf8BecomesOneReplacementPerMaximalSubpart) {
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8(in), "a" + r + r + r + "b" + r + "c" + r + r + "d");
  const std::string valid = "caf\xC3\xA9 \xF0\x9F\x98\x80";
  EXPECT_EQ(replace_invalid_utf8(valid), valid);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), r + r + r);  // a surrogate: 3 subparts
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"), r);              // cut short: one
}

TEST(HfPretokenize, ByteLevelCharsAreGpt2s) {
  const auto& c = byte_level_chars();
  EXPECT_EQ(c['a'], "a");
  EXPECT_EQ(c[' '], "\xC4\xA0");   // U+0120 'Ġ': the 33rd byte mapped, 0x20
  EXPECT_EQ(c['\n'], "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(c[0xAD], "\xC5\x83");  // U+0143: soft hyphen, the last of the 68
}

// A tokenizer.json with one part changed fails naming that part.
TEST(HfTokenizer, UnsupportedComponentsAreNamed) {
  test::TempDir dir;
  const json base = {{"added_tokens", json::array()},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                     {"post_processor", nullptr},
                     {"model", bpe_model(json::array({"a b"}))}};
  ASSERT_NO_THROW(([&] {
    std::ofstream(dir.file("ok.json")) << base.dump();
    HfTokenizer::load(dir.file("ok.json"));
  }()));
  struct Case {
    const char* name;
    json patch;  // a JSON merge patch of base
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"unigram", {{"model", {{"type", "Unigram"}}}}, "model Unigram"},
      {"lowercase", {{"normalizer", {{"type", "Lowercase"}}}}, "normalizer Lowercase"},
      {"metaspace", {{"pre_tokenizer", {{"type", "Metaspace"}}}}, "pre_tokenizer Metaspace"},
      {"dropout", {{"model", {{"dropout", 0.1}}}}, "dropout"},
      {"byte_fallback", {{"model", {{"byte_fallback", true}}}}, "byte_fallback"},
      {"prefix", {{"model", {{"continuing_subword_prefix", "##"}}}}, "continuing_subword_prefix"},
      {"merge", {{"model", {{"merges", json::array({"a z"})}}}}, "merge 0"},
      {"post", {{"post_processor", {{"type", "Custom"}}}}, "post_processor Custom"},
      {"normalized added",
       {{"normalizer", {{"type", "NFC"}}},
        {"added_tokens", {{{"id", 7}, {"content", "<m>"}, {"normalized", true}}}}},
       "normalized = true"},
      {"wordpiece cased",
       {{"normalizer", {{"type", "BertNormalizer"}, {"lowercase", false}}},
        {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
        {"model", {{"type", "WordPiece"}}}},
       "lowercase"},
      {"not json", nullptr, "not a tokenizer.json"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".json");
    json j = base;
    j.merge_patch(c.patch);
    std::ofstream(path) << (c.patch.is_null() ? std::string("{not json") : j.dump());
    try {
      HfTokenizer::load(path);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(c.needle), std::string::npos) << c.name << ": " << what;
      EXPECT_NE(what.find(path), std::string::npos) << c.name << ": " << what;
    }
  }
}

}  // namespace
}  // namespace packbert
