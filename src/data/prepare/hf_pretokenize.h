// The text side of Hugging Face byte-level tokenizers (tokenizers' ByteLevel pre-tokenizer):
// invalid UTF-8 replaced as Python's bytes.decode("utf-8", errors="replace") does, the split
// pattern run by PCRE2 (UTF and Unicode properties), and GPT-2's map of bytes to printable
// characters.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace packbert {

// `text` with each maximal invalid subpart (Unicode's "substitution of maximal subparts", what
// Python's errors="replace" does) replaced by U+FFFD; valid UTF-8 is returned unchanged.
std::string replace_invalid_utf8(std::string_view text);
// The same without a copy when `text` is valid: a view of `text`, else of `buffer`, which
// receives the replaced text.
std::string_view valid_utf8(std::string_view text, std::string& buffer);

// GPT-2's bytes_to_unicode: byte b as the UTF-8 of a printable character (33-126, 161-172 and
// 174-255 stand for themselves, the other 68 bytes for U+0100 onwards in order).
const std::array<std::string, 256>& byte_level_chars();

// A regex split (tokenizers' Split with behavior Isolated): the matches and the text between
// them, in order, none empty. Compiled once (PCRE2 JIT where available); split() may be called
// from several threads at once. Throws Error naming the pattern when it does not compile.
class RegexSplitter {
 public:
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  // `text` must be valid UTF-8 (replace_invalid_utf8).
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

// The ByteLevel pre-tokenizer's pattern (GPT-2's, with use_regex = true).
inline constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace packbert
