// The BPE model of a Hugging Face tokenizer.json (tokenizers' models::bpe), for byte-level
// vocabularies: a word (a pre-token's characters) starts as its characters' ids and merges the
// adjacent pair of lowest merge rank, leftmost first, until no pair has a merge; with
// ignore_merges, a word that is itself in the vocabulary is its id. A character missing from
// the vocabulary is the unk token, or dropped without one (as tokenizers does).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace packbert {

class BpeModel {
 public:
  // model: tokenizer.json's "model" object of type BPE. Throws Error naming `source` and the
  // field for what it does not support (dropout, byte_fallback, a continuing_subword_prefix or
  // end_of_word_suffix) or cannot read (a merge of tokens not in the vocabulary).
  BpeModel(const nlohmann::json& model, const std::string& source);

  // Appends the ids of one word (its bytes: mapped to byte-level characters here).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  int32_t id(std::string_view token) const;  // -1 when absent
  int64_t vocab_size() const { return vocab_size_; }

 private:
  struct Merge {
    int32_t rank, id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }
  void encode_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::vector<int32_t>& symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t unk_ = -1;
  bool ignore_merges_ = false;
  int64_t vocab_size_ = 0;  // largest id + 1
  uint64_t serial_ = 0;     // this model among the process's (encode_word's cache)
};

}  // namespace packbert
