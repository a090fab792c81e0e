#include "data/prepare/hf_pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "kernels/base/error.h"

namespace packbert {

std::string replace_invalid_utf8(std::string_view text) {
  std::string buffer;
  const std::string_view v = valid_utf8(text, buffer);
  return std::string(v);
}

std::string_view valid_utf8(std::string_view text, std::string& buffer) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  std::string out;
  size_t copied = 0;  // text[copied, i) is valid and not yet in out
  size_t i = 0;
  while (i < n) {
    // ASCII runs eight bytes at a time.
    uint64_t word = 0;
    while (i + 8 <= n && (std::memcpy(&word, s + i, 8), (word & 0x8080808080808080ull) == 0))
      i += 8;
    if (i >= n) break;
    const unsigned b = s[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    // The lead byte's length and its second byte's range (Unicode table 3-7).
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    }
    // The bytes that still fit a well-formed sequence: the maximal subpart.
    size_t k = 1;
    if (len > 0) {
      for (; k < len && i + k < n; ++k) {
        const unsigned c = s[i + k];
        const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
        if (!ok) break;
      }
      if (k == len) {  // well-formed
        i += len;
        continue;
      }
    }
    if (copied == 0 && out.empty()) out.reserve(text.size() + 8);
    out.append(text.substr(copied, i - copied));
    out += "\xEF\xBF\xBD";
    i += k;
    copied = i;
  }
  if (copied == 0 && out.empty()) return text;
  out.append(text.substr(copied));
  buffer = std::move(out);
  return buffer;
}

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = printable ? b : next++;
      std::string u;
      if (cp < 0x80) {
        u.push_back(static_cast<char>(cp));
      } else {
        u.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        u.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[static_cast<size_t>(b)] = u;
    }
    return t;
  }();
  return table;
}

RegexSplitter::RegexSplitter(const std::string& pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    PB_THROW("regex '{}': does not compile at offset {}: {}", pattern, offset,
             reinterpret_cast<const char*>(message));
  }
  // JIT-compiled where PCRE2 has a JIT for this machine, else interpreted.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  auto* code = static_cast<pcre2_code*>(code_);
  // Match data of this call (pcre2_match writes it): one small allocation per text.
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  pcre2_match_data* md = data.get();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0, gap = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    PB_REQUIRE(rc > 0, "regex '{}': match failed with PCRE2 error {}", pattern_, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match: step one character on
      at = begin + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    if (begin > gap) pieces.push_back(text.substr(gap, begin - gap));
    pieces.push_back(text.substr(begin, end - begin));
    gap = at = end;
  }
  if (gap < text.size()) pieces.push_back(text.substr(gap));
}

}  // namespace packbert
