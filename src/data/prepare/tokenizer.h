// BERT uncased tokenizer: basic tokenization, then greedy longest-match WordPiece.
// Gives the same ids as Hugging Face BertTokenizer(do_lower_case=True) with the same vocab.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace packbert {

class Vocab {
 public:
  // One token per line, id = line number (0-based). Throws naming the file on failure.
  static Vocab load(const std::string& path);
  static Vocab parse(const std::string& text, const std::string& path);  // the file's text
  // The tokens by id; `source` names them in errors (a missing special token).
  static Vocab from_tokens(std::vector<std::string> tokens, const std::string& source);
  int32_t id(std::string_view token) const;  // -1 when absent
  const std::string& token(int32_t id) const;
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  // Special tokens; load() requires all of them to be present.
  int32_t pad_id() const { return pad_; }
  int32_t unk_id() const { return unk_; }
  int32_t cls_id() const { return cls_; }
  int32_t sep_id() const { return sep_; }
  int32_t mask_id() const { return mask_; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;
};

class BertTokenizer {
 public:
  explicit BertTokenizer(const Vocab& vocab) : vocab_(vocab) {}
  // Basic tokenization: clean (drop NUL/U+FFFD/control chars, whitespace -> space),
  // CJK ideographs split out, lower-case + NFD accent stripping, punctuation split.
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  // WordPiece of one basic token: greedy longest match, "##" continuations,
  // words over 100 characters (code points) or with no full match -> [UNK].
  void wordpiece(std::string_view word, std::vector<int32_t>& out) const;
  // Both steps: text -> ids (no [CLS]/[SEP] added).
  std::vector<int32_t> encode(std::string_view text) const;
  // The same as token strings (for debugging and tests).
  std::vector<std::string> tokenize(std::string_view text) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  const Vocab& vocab_;
};

}  // namespace packbert
