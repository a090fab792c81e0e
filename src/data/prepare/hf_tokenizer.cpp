#include "data/prepare/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "data/prepare/hf_bpe.h"
#include "data/prepare/hf_pretokenize.h"
#include "data/prepare/tokenizer.h"
#include "core/files.h"
#include "kernels/base/error.h"

namespace packbert {
namespace {

using nlohmann::json;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, special = false;
};

// Rust's char::is_whitespace: the White_Space property.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Rust's char::is_alphanumeric, as the letters and numbers of utf8proc's categories.
bool is_word_char(char32_t c) {
  if (c == '_') return true;
  const int cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

// The code point at text[i] (valid UTF-8), and its length.
char32_t decode_at(std::string_view text, size_t i, size_t* len) {
  utf8proc_int32_t c = 0;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(&text[i]),
                                              static_cast<utf8proc_ssize_t>(text.size() - i), &c);
  *len = n > 0 ? static_cast<size_t>(n) : 1;
  return static_cast<char32_t>(c);
}
// The start of the code point that ends at text[end - 1].
size_t char_start_before(std::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

std::string nfc(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  PB_REQUIRE(n >= 0, "NFC: {}", utf8proc_errmsg(n));
  std::string s(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return s;
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

}  // namespace

struct HfTokenizer::Impl {
  std::string path, model_type;
  std::vector<AddedToken> added;
  std::array<bool, 256> first_byte{};  // the first bytes of the added tokens
  std::string firsts;                  // the same, each once
  bool nfc = false;
  // BPE
  std::optional<BpeModel> bpe;
  std::optional<RegexSplitter> split;  // ByteLevel with use_regex
  bool add_prefix_space = false;
  // WordPiece
  std::optional<Vocab> vocab;
  std::optional<BertTokenizer> bert;
  std::vector<int32_t> prefix, suffix;
  int64_t vocab_size = 0;

  [[noreturn]] void fail(const std::string& what) const { PB_THROW("{}: {}", path, what); }

  void read_added(const json& j);
  void read_normalizer(const json& j);
  void read_pre_tokenizer(const json& j);
  void read_model(const json& j);
  void read_post_processor(const json& j);
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void split_added(std::string_view text, std::vector<int32_t>& out) const;
};

void HfTokenizer::Impl::read_added(const json& j) {
  if (j.is_null()) return;
  if (!j.is_array()) fail("added_tokens is not a list");
  for (const json& t : j) {
    AddedToken a;
    a.id = t.at("id").get<int32_t>();
    a.content = t.at("content").get<std::string>();
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.special = t.value("special", false);
    if (a.content.empty()) fail("added token " + std::to_string(a.id) + " is empty");
    added.push_back(a);
    if (!first_byte[static_cast<unsigned char>(a.content[0])]) firsts.push_back(a.content[0]);
    first_byte[static_cast<unsigned char>(a.content[0])] = true;
    vocab_size = std::max<int64_t>(vocab_size, int64_t{a.id} + 1);
  }
}

void HfTokenizer::Impl::read_normalizer(const json& j) {
  if (j.is_null() && model_type == "BPE") return;
  const std::string type = j.is_null() ? "null" : type_of(j);
  if (type == "NFC" && model_type == "BPE") {
    nfc = true;
  } else if (type == "BertNormalizer" && model_type == "WordPiece") {
    // What BertTokenizer does: clean, CJK split, lower-case with accents stripped.
    const bool strip = j.value("strip_accents", json()).is_null() || j["strip_accents"] == true;
    if (!j.value("clean_text", true) || !j.value("handle_chinese_chars", true) ||
        !j.value("lowercase", true) || !strip)
      fail(
          "normalizer BertNormalizer: only clean_text, handle_chinese_chars and lowercase "
          "true with strip_accents null or true (uncased BERT) are supported");
  } else {
    fail("normalizer " + type + " is not supported with model " + model_type +
         " (supported: null, NFC for BPE; BertNormalizer for WordPiece)");
  }
}

void HfTokenizer::Impl::read_pre_tokenizer(const json& j) {
  const std::string type = j.is_null() ? "null" : type_of(j);
  if (model_type == "BPE" && type == "ByteLevel") {
    add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) split.emplace(kByteLevelPattern);
  } else if (model_type == "WordPiece" && type == "BertPreTokenizer") {
  } else {
    fail("pre_tokenizer " + type + " is not supported with model " + model_type +
         " (supported: ByteLevel for BPE, BertPreTokenizer for WordPiece)");
  }
}

void HfTokenizer::Impl::read_model(const json& j) {
  if (model_type == "BPE") {
    bpe.emplace(j, path);
    vocab_size = std::max(vocab_size, bpe->vocab_size());
    return;
  }
  if (j.value("continuing_subword_prefix", std::string()) != "##" ||
      j.value("max_input_chars_per_word", int64_t{0}) != 100 ||
      j.value("unk_token", std::string()) != "[UNK]")
    fail(
        "model WordPiece: only continuing_subword_prefix \"##\", max_input_chars_per_word 100 "
        "and unk_token \"[UNK]\" (BERT's) are supported");
  const json& v = j.at("vocab");
  std::vector<std::string> tokens(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    const int64_t id = it->get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(tokens.size()) || !tokens[id].empty())
      fail("model WordPiece: the vocab's ids are not 0..n-1 once each (\"" + it.key() + "\")");
    tokens[static_cast<size_t>(id)] = it.key();
  }
  vocab.emplace(Vocab::from_tokens(std::move(tokens), path + " (model WordPiece)"));
  bert.emplace(*vocab);
  vocab_size = std::max(vocab_size, vocab->size());
}

void HfTokenizer::Impl::read_post_processor(const json& j) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) read_post_processor(p);
    return;
  }
  std::vector<int32_t> before, after;
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    before.push_back(j.at("cls").at(1).get<int32_t>());
    after.push_back(j.at("sep").at(1).get<int32_t>());
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const json& item : j.at("single")) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", std::string()) != "A")
          fail("post_processor TemplateProcessing: the single template's sequence is not A");
        seen_a = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& special = j.at("special_tokens").at(name);
      for (const json& id : special.at("ids"))
        (seen_a ? after : before).push_back(id.get<int32_t>());
    }
    if (!seen_a) fail("post_processor TemplateProcessing: the single template has no $A");
  } else {
    fail("post_processor " + type +
         " is not supported (supported: TemplateProcessing, RobertaProcessing, BertProcessing, "
         "ByteLevel, Sequence of them)");
  }
  prefix.insert(prefix.begin(), before.begin(), before.end());
  suffix.insert(suffix.end(), after.begin(), after.end());
}

// A text without added tokens: normalizer, pre-tokenizer, model.
void HfTokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (bert) {
    const std::vector<int32_t> ids = bert->encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  // A copy only where the text changes.
  std::string changed;
  std::string_view normalized = text;
  if (nfc) normalized = changed = packbert::nfc(text);
  if (add_prefix_space && normalized.front() != ' ') {
    changed = " " + std::string(normalized);
    normalized = changed;
  }
  thread_local std::vector<std::string_view> words;
  words.clear();
  if (split) {
    split->split(normalized, words);
  } else {
    words.push_back(normalized);
  }
  for (std::string_view w : words) bpe->encode_word(w, out);
}

// tokenizers' AddedVocabulary: the added tokens found leftmost-longest in the text (a
// single_word one only between non-word characters; lstrip / rstrip take the whitespace beside
// it), the text between them encoded.
void HfTokenizer::Impl::split_added(std::string_view text, std::vector<int32_t>& out) const {
  size_t done = 0, at = 0;
  while (at < text.size()) {
    // The leftmost position where a token starts, and the longest token there.
    const AddedToken* best = nullptr;
    size_t start = at;
    for (; start < text.size() && !best; ++start) {
      // The next byte that may start one (memchr for each first byte when they are few).
      if (firsts.size() <= 4) {
        size_t next = text.size();
        for (const char f : firsts) {
          const void* p = std::memchr(text.data() + start, f, next - start);
          if (p) next = static_cast<size_t>(static_cast<const char*>(p) - text.data());
        }
        if (next == text.size()) break;
        start = next;
      } else if (!first_byte[static_cast<unsigned char>(text[start])]) {
        continue;
      }
      for (const AddedToken& a : added)
        if (text.compare(start, a.content.size(), a.content) == 0 &&
            (!best || a.content.size() > best->content.size()))
          best = &a;
    }
    if (!best) break;
    --start;
    size_t stop = start + best->content.size();
    at = stop;
    if (best->single_word) {
      size_t len = 0;
      const bool left =
          start == 0 || !is_word_char(decode_at(text, char_start_before(text, start), &len));
      const bool right = stop == text.size() || !is_word_char(decode_at(text, stop, &len));
      if (!left || !right) continue;
    }
    if (best->lstrip) {
      while (start > done) {
        size_t len = 0;
        const size_t prev = char_start_before(text, start);
        if (!is_white_space(decode_at(text, prev, &len))) break;
        start = prev;
      }
    }
    if (best->rstrip) {
      while (stop < text.size()) {
        size_t len = 0;
        if (!is_white_space(decode_at(text, stop, &len))) break;
        stop += len;
      }
      at = stop;
    }
    encode_text(text.substr(done, start - done), out);
    out.push_back(best->id);
    done = stop;
  }
  encode_text(text.substr(done), out);
}

HfTokenizer HfTokenizer::load(const std::string& path) {
  return parse(read_whole_file(path, "tokenizer"), path);
}

HfTokenizer HfTokenizer::parse(const std::string& bytes, const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  json j;
  try {
    j = json::parse(bytes);
  } catch (const json::exception& e) {
    PB_THROW("{}: not a tokenizer.json: {}", path, e.what());
  }
  try {
    impl->model_type = type_of(j.at("model"));
    if (impl->model_type != "BPE" && impl->model_type != "WordPiece")
      impl->fail("model " + impl->model_type + " is not supported (supported: BPE, WordPiece)");
    impl->read_added(j.value("added_tokens", json()));
    impl->read_normalizer(j.value("normalizer", json()));
    impl->read_pre_tokenizer(j.value("pre_tokenizer", json()));
    impl->read_model(j.at("model"));
    impl->read_post_processor(j.value("post_processor", json()));
    // tokenizers matches an added token with normalized = true in the normalized text; here
    // every added token is matched in the text as given, the same only without a normalizer.
    const bool normalizes = impl->nfc || impl->model_type == "WordPiece";
    for (const json& t : j.value("added_tokens", json::array()))
      if (normalizes && t.value("normalized", false))
        impl->fail("added token \"" + t.value("content", std::string()) +
                   "\" has normalized = true with a normalizer: not supported (make it false)");
  } catch (const json::exception& e) {
    PB_THROW("{}: a field is missing or of the wrong type: {}", path, e.what());
  }
  return HfTokenizer(std::move(impl));
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool special) const {
  std::string buffer;
  const std::string_view valid = valid_utf8(text, buffer);
  std::vector<int32_t> ids;
  if (special) ids = impl_->prefix;
  impl_->split_added(valid, ids);
  if (special) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

const std::string& HfTokenizer::model_type() const { return impl_->model_type; }
int64_t HfTokenizer::vocab_size() const { return impl_->vocab_size; }
const std::vector<int32_t>& HfTokenizer::prefix_ids() const { return impl_->prefix; }
const std::vector<int32_t>& HfTokenizer::suffix_ids() const { return impl_->suffix; }

int32_t HfTokenizer::token_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  if (impl_->bpe) return impl_->bpe->id(token);
  return impl_->vocab->id(token);
}

std::vector<int32_t> HfTokenizer::special_ids() const {
  std::vector<int32_t> ids;
  for (const AddedToken& a : impl_->added)
    if (a.special) ids.push_back(a.id);
  return ids;
}

const Vocab* HfTokenizer::wordpiece_vocab() const {
  return impl_->vocab ? &*impl_->vocab : nullptr;
}

}  // namespace packbert
