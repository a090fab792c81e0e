// BERT uncased tokenizer with the ids of Hugging Face's slow BertTokenizer(do_lower_case=True)
// of transformers 4.x (checked on every line of the demo corpus, every code point and 129 hard
// strings by tests/unit/test_tokenizer.cpp).
//
// HF's pipeline, and how this file reproduces it in one pass over the bytes:
//   1. PreTrainedTokenizer.tokenize lower-cases the text one character at a time (str.lower(),
//      full mapping: 'İ' -> "i̇"; one character at a time means no Greek final-sigma rule).
//   2. _clean_text: drop U+0000, U+FFFD and category C* except \t \n \r; whitespace -> ' '.
//   3. _tokenize_chinese_chars: CJK ideographs become separate tokens.
//   4. NFC, then str.split() on whitespace (which also splits on U+2028/U+2029).
//   5. Per token: lower() (a no-op after step 1), NFD, drop category Mn.
//   6. Split on punctuation (ASCII 33-47, 58-64, 91-96, 123-126 and category P*).
//   7. WordPiece: greedy longest match, "##" continuations, > 100 code points -> [UNK].
// NFD(NFC(x)) == NFD(x), so the NFC of step 4 needs no work here. Lower-casing and canonical
// decomposition are per code point; the only cross-character part of NFD is the canonical
// reordering of combining marks, done below on the (rare) marks that survive Mn stripping.
//
// Deliberate or known differences (see tests/reference/make_tokenizer_reference.py):
//   - Literal "[MASK]", "[SEP]", ... in the text are plain text (HF's default maps them to the
//     special ids; Google's original tokenization.py does not). Pretraining text must not be
//     able to inject control tokens.
//   - Invalid UTF-8: each invalid byte sequence decodes to U+FFFD, which step 2 drops, so the
//     result equals HF on bytes.decode("utf-8", errors="replace"). It never splits a word.
//   - Unicode data comes from utf8proc (Unicode 15.0); Python 3.11 uses Unicode 14.0, whose
//     unassigned code points (category Cn) are dropped by HF but kept here when 15.0 assigns them.
//   - transformers 5's BertTokenizerLegacy (the slow one, renamed) skips step 1, so str.lower()
//     of step 5 turns a word-final capital sigma into U+03C2; 4.x slow and HF's Rust tokenizer
//     give U+03C3, as here.
#include "data/prepare/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>

#include "core/files.h"
#include "kernels/base/error.h"

namespace packbert {

// ---- Vocab ------------------------------------------------------------------------------

Vocab Vocab::load(const std::string& path) { return parse(read_whole_file(path, "vocab"), path); }

Vocab Vocab::parse(const std::string& data, const std::string& path) {
  PB_REQUIRE(!data.empty(), "vocab {}: file is empty", path);

  std::vector<std::string> tokens;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t nl = data.find('\n', pos);
    if (nl == std::string::npos) nl = data.size();
    size_t end = nl;
    // Only the line terminator is stripped: tokens may legitimately contain spaces or tabs.
    if (end > pos && data[end - 1] == '\r') --end;
    tokens.emplace_back(data, pos, end - pos);
    pos = nl + 1;
  }
  return from_tokens(std::move(tokens), "vocab " + path);
}

Vocab Vocab::from_tokens(std::vector<std::string> tokens, const std::string& source) {
  Vocab v;
  v.tokens_ = std::move(tokens);
  v.ids_.reserve(v.tokens_.size());
  // HF's load_vocab assigns dict[token] = index in order, so a duplicate's last line wins.
  for (size_t i = 0; i < v.tokens_.size(); ++i) v.ids_[v.tokens_[i]] = static_cast<int32_t>(i);

  std::string missing;
  auto special = [&](const char* name) {
    auto it = v.ids_.find(name);
    if (it == v.ids_.end()) {
      missing += missing.empty() ? "" : " ";
      missing += name;
      return -1;
    }
    return it->second;
  };
  v.pad_ = special("[PAD]");
  v.unk_ = special("[UNK]");
  v.cls_ = special("[CLS]");
  v.sep_ = special("[SEP]");
  v.mask_ = special("[MASK]");
  PB_REQUIRE(missing.empty(), "{}: special token(s) missing: {}", source, missing);
  return v;
}

int32_t Vocab::id(std::string_view token) const {
  // unordered_map<std::string> has no heterogeneous lookup in C++17; a reused per-thread key
  // keeps the hot WordPiece loop free of allocations.
  thread_local std::string key;
  key.assign(token.data(), token.size());
  auto it = ids_.find(key);
  return it == ids_.end() ? -1 : it->second;
}

const std::string& Vocab::token(int32_t id) const {
  PB_REQUIRE(id >= 0 && id < size(), "token id {} outside the vocabulary (size {})", id, size());
  return tokens_[static_cast<size_t>(id)];
}

// ---- basic tokenization -----------------------------------------------------------------

namespace {

constexpr int kMaxWordChars = 100;  // HF WordpieceTokenizer.max_input_chars_per_word

enum class AsciiClass : uint8_t { plain, upper, space, drop, punct };

constexpr std::array<AsciiClass, 128> make_ascii_table() {
  std::array<AsciiClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    AsciiClass k = AsciiClass::plain;
    if (c < 32 || c == 127) k = AsciiClass::drop;  // category Cc
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') k = AsciiClass::space;
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
        (c >= 123 && c <= 126))
      k = AsciiClass::punct;
    if (c >= 'A' && c <= 'Z') k = AsciiClass::upper;
    t[static_cast<size_t>(c)] = k;
  }
  return t;
}
constexpr std::array<AsciiClass, 128> kAscii = make_ascii_table();

constexpr char32_t kInvalid = 0xFFFD;

// Decodes one code point at s[i], advancing i. Invalid or truncated sequences, overlong forms,
// surrogates and values above U+10FFFF yield U+FFFD and advance by one byte only, so a valid
// character right after garbage is never swallowed.
inline char32_t decode_utf8(const unsigned char* s, size_t n, size_t& i) {
  const unsigned b0 = s[i];
  auto cont = [&](size_t k, unsigned lo, unsigned hi) {
    return i + k < n && s[i + k] >= lo && s[i + k] <= hi;
  };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (cont(1, 0x80, 0xBF)) {
      char32_t c = ((b0 & 0x1F) << 6) | (s[i + 1] & 0x3F);
      i += 2;
      return c;
    }
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    const unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (cont(1, lo, hi) && cont(2, 0x80, 0xBF)) {
      char32_t c = ((b0 & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
      i += 3;
      return c;
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    const unsigned lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF)) {
      char32_t c = ((b0 & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) |
                   (s[i + 3] & 0x3F);
      i += 4;
      return c;
    }
  }
  ++i;
  return kInvalid;
}

inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// The CJK ranges of Google's original _is_chinese_char (not all of CJK: kana and hangul are
// written with spaces and are left to WordPiece).
inline bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

inline bool is_punct_category(int cat) {
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

inline bool is_control_category(int cat) {
  return cat == UTF8PROC_CATEGORY_CN || cat >= UTF8PROC_CATEGORY_CC;  // Cn, Cc, Cf, Cs, Co
}

// Walks the text once and hands each basic token to sink(std::string_view token, bool ascii).
// The token view is only valid during the call.
template <class Sink>
class BasicScanner {
 public:
  explicit BasicScanner(Sink& sink) : sink_(sink) {}

  void run(std::string_view text) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
      const unsigned char b = s[i];
      if (b < 0x80) {
        ++i;
        switch (kAscii[b]) {
          case AsciiClass::plain:
            if (!run_.empty()) flush_run();
            piece_.push_back(static_cast<char>(b));
            break;
          case AsciiClass::upper:
            if (!run_.empty()) flush_run();
            piece_.push_back(static_cast<char>(b + ('a' - 'A')));
            break;
          case AsciiClass::space: end_token(); break;
          case AsciiClass::punct:
            if (!run_.empty()) flush_run();
            emit_punct(b);
            break;
          case AsciiClass::drop:  // removed by _clean_text before anything else sees it
            break;
        }
        continue;
      }
      const char32_t c = decode_utf8(s, n, i);
      if (c == kInvalid) continue;  // _clean_text drops U+FFFD (and so invalid input)
      const int cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      // Whitespace: Zs for _clean_text; U+2028/U+2029 survive it but str.split() splits there.
      if (cat == UTF8PROC_CATEGORY_ZS || c == 0x2028 || c == 0x2029) {
        end_token();
      } else if (is_control_category(cat)) {
        // dropped by _clean_text
      } else if (is_cjk(c)) {
        end_token();
        lower_and_decompose(c);
        end_token();
      } else {
        lower_and_decompose(c);
      }
    }
    end_token();
  }

 private:
  // Step 1 + the NFD of step 5 for one input code point.
  void lower_and_decompose(char32_t c) {
    if (c == 0x130) {  // the one multi-character lower-case mapping: İ -> i + U+0307
      final_char('i');
      final_char(0x307);
      return;
    }
    const utf8proc_int32_t lower = utf8proc_tolower(static_cast<utf8proc_int32_t>(c));
    utf8proc_int32_t buf[32];
    int boundclass = 0;
    const utf8proc_ssize_t k =
        utf8proc_decompose_char(lower, buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (k <= 0 || k > 32) {  // cannot happen for canonical decompositions; keep the char
      final_char(static_cast<char32_t>(lower));
      return;
    }
    for (utf8proc_ssize_t j = 0; j < k; ++j) final_char(static_cast<char32_t>(buf[j]));
  }

  // One code point of the decomposed, lower-cased token: strip Mn, split punctuation.
  void final_char(char32_t c) {
    if (c < 0x80) {
      if (!run_.empty()) flush_run();
      if (kAscii[c] == AsciiClass::punct) {
        emit_punct(static_cast<unsigned char>(c));
      } else {
        piece_.push_back(static_cast<char>(c));
      }
      return;
    }
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
    // NFD sorts each run of non-starters (combining class > 0) by class. Mn marks are stripped
    // anyway, so only the few non-Mn non-starters (some Mc) are held back and sorted.
    if (p->combining_class == 0 && !run_.empty()) flush_run();
    if (p->category == UTF8PROC_CATEGORY_MN) return;
    if (p->combining_class != 0) {
      run_.push_back({c, p->combining_class});
      return;
    }
    if (is_punct_category(p->category)) {
      flush_piece();
      piece_ascii_ = false;
      append_utf8(piece_, c);
      flush_piece();
      return;
    }
    piece_ascii_ = false;
    append_utf8(piece_, c);
  }

  void flush_run() {
    std::stable_sort(run_.begin(), run_.end(),
                     [](const Mark& a, const Mark& b) { return a.ccc < b.ccc; });
    for (const Mark& m : run_) {
      piece_ascii_ = false;
      append_utf8(piece_, m.cp);
    }
    run_.clear();
  }

  void emit_punct(unsigned char b) {
    flush_piece();
    const char ch = static_cast<char>(b);
    sink_(std::string_view(&ch, 1), true);
  }

  void flush_piece() {
    if (!piece_.empty()) sink_(std::string_view(piece_), piece_ascii_);
    piece_.clear();
    piece_ascii_ = true;
  }

  void end_token() {
    if (!run_.empty()) flush_run();
    flush_piece();
  }

  struct Mark {
    char32_t cp;
    int ccc;
  };
  Sink& sink_;
  std::string piece_;        // the current punctuation-free piece, lower-cased, UTF-8
  bool piece_ascii_ = true;  // lets WordPiece skip code-point boundary checks
  std::vector<Mark> run_;    // held-back non-Mn combining marks awaiting canonical order
};

template <class Sink>
void scan(std::string_view text, Sink&& sink) {
  BasicScanner<std::remove_reference_t<Sink>> scanner(sink);
  scanner.run(text);
}

inline bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Greedy longest-match-first WordPiece on one basic token.
void wordpiece_ids(const Vocab& vocab, std::string_view word, bool ascii,
                   std::vector<int32_t>& out) {
  if (word.empty()) return;
  size_t chars = word.size();
  if (!ascii)
    chars = static_cast<size_t>(
        std::count_if(word.begin(), word.end(), [](char c) { return !is_continuation(c); }));
  if (chars > static_cast<size_t>(kMaxWordChars)) {
    out.push_back(vocab.unk_id());
    return;
  }
  // Whole word first: most words of running text are in the vocabulary.
  if (int32_t id = vocab.id(word); id >= 0) {
    out.push_back(id);
    return;
  }
  thread_local std::string key;
  const size_t mark = out.size();
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int32_t found = -1;
    while (end > start) {
      key.clear();
      if (start > 0) key.append("##");
      key.append(word.data() + start, end - start);
      found = vocab.id(key);
      if (found >= 0) break;
      // Candidates end on code-point boundaries, as HF slices a list of characters.
      --end;
      while (!ascii && end > start && is_continuation(word[end])) --end;
    }
    if (found < 0) {  // some piece matched nothing: the whole word is unknown
      out.resize(mark);
      out.push_back(vocab.unk_id());
      return;
    }
    out.push_back(found);
    start = end;
  }
}

}  // namespace

std::vector<std::string> BertTokenizer::basic_tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  scan(text, [&](std::string_view tok, bool) { tokens.emplace_back(tok); });
  return tokens;
}

void BertTokenizer::wordpiece(std::string_view word, std::vector<int32_t>& out) const {
  const bool ascii = std::all_of(word.begin(), word.end(), [](char c) { return (c & 0x80) == 0; });
  wordpiece_ids(vocab_, word, ascii, out);
}

std::vector<int32_t> BertTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 4);
  scan(text, [&](std::string_view tok, bool ascii) { wordpiece_ids(vocab_, tok, ascii, ids); });
  return ids;
}

std::vector<std::string> BertTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (int32_t id : encode(text)) out.push_back(vocab_.token(id));
  return out;
}

}  // namespace packbert
