#include "data/prepare/corpus_tokenizer.h"

#include <openssl/evp.h>

#include <filesystem>
#include <optional>

#include "core/files.h"
#include "data/prepare/hf_tokenizer.h"
#include "data/prepare/tokenizer.h"
#include "kernels/base/error.h"

namespace packbert {

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  PB_REQUIRE(EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr) == 1,
             "SHA-256: libcrypto failed");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < n; ++i) {
    s.push_back(hex[digest[i] >> 4]);
    s.push_back(hex[digest[i] & 15]);
  }
  return s;
}

struct CorpusTokenizer::Impl {
  std::string path, kind;
  std::unique_ptr<Vocab> vocab;  // vocab.txt (BertTokenizer keeps a reference)
  std::optional<BertTokenizer> bert;
  std::optional<HfTokenizer> hf;
  ShardMeta meta;
  MaskVocab mask;

  void load_json(const std::string& bytes);
  void load_vocab(const std::string& bytes);
};

namespace {

bool looks_like_json(const std::string& bytes) {
  for (const char c : bytes) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    return c == '{';
  }
  return false;
}

// The id of the first of `names` the tokenizer has.
int32_t find_token(const HfTokenizer& t, const std::string& path,
                   std::initializer_list<const char*> names, const char* what) {
  for (const char* n : names)
    if (const int32_t id = t.token_id(n); id >= 0) return id;
  std::string list;
  for (const char* n : names) list += std::string(list.empty() ? "" : " or ") + n;
  PB_THROW("tokenizer {}: no {} token ({}): masking and padding need it", path, what, list);
}

}  // namespace

void CorpusTokenizer::Impl::load_json(const std::string& bytes) {
  Impl& m = *this;
  m.hf.emplace(HfTokenizer::parse(bytes, m.path));
  const HfTokenizer& t = *m.hf;
  m.kind = "tokenizer.json (" + t.model_type() + ")";
  PB_REQUIRE(t.prefix_ids().size() == 1 && t.suffix_ids().size() == 1,
             "tokenizer {}: its post-processor puts {} special token(s) before a text and {} "
             "after; samples need one before and one after ([CLS] A [SEP], <s> A </s>)",
             m.path, t.prefix_ids().size(), t.suffix_ids().size());
  const auto n = static_cast<size_t>(t.vocab_size());
  m.meta.vocab_size = t.vocab_size();
  m.meta.cls_id = t.prefix_ids()[0];
  m.meta.sep_id = t.suffix_ids()[0];
  m.meta.mask_id = find_token(t, m.path, {"[MASK]", "<mask>"}, "mask");
  m.meta.pad_id = find_token(t, m.path, {"[PAD]", "<pad>"}, "padding");
  m.mask.mask_id = m.meta.mask_id;
  m.mask.is_continuation.assign(n, 0);
  m.mask.is_special.assign(n, 0);
  if (const Vocab* v = t.wordpiece_vocab())
    for (int32_t id = 0; id < v->size(); ++id)
      m.mask.is_continuation[static_cast<size_t>(id)] = v->token(id).rfind("##", 0) == 0;
  std::vector<int32_t> special = t.special_ids();
  special.insert(special.end(), {m.meta.cls_id, m.meta.sep_id, m.meta.mask_id, m.meta.pad_id});
  for (int32_t id : special) m.mask.is_special[static_cast<size_t>(id)] = 1;
  for (size_t id = 0; id < n; ++id)
    if (!m.mask.is_special[id]) m.mask.random_words.push_back(static_cast<int32_t>(id));
}

void CorpusTokenizer::Impl::load_vocab(const std::string& bytes) {
  Impl& m = *this;
  m.vocab = std::make_unique<Vocab>(Vocab::parse(bytes, m.path));
  m.bert.emplace(*m.vocab);
  m.kind = "WordPiece vocab.txt";
  m.meta.vocab_size = m.vocab->size();
  m.meta.cls_id = m.vocab->cls_id();
  m.meta.sep_id = m.vocab->sep_id();
  m.meta.mask_id = m.vocab->mask_id();
  m.meta.pad_id = m.vocab->pad_id();
  m.mask = packbert::mask_vocab(*m.vocab);
}

CorpusTokenizer CorpusTokenizer::load(const std::string& path) {
  auto m = std::make_unique<Impl>();
  m->path = path;
  const std::string bytes = read_whole_file(path, "tokenizer");
  PB_REQUIRE(!bytes.empty(), "tokenizer {}: the file is empty", path);
  if (looks_like_json(bytes))
    m->load_json(bytes);
  else
    m->load_vocab(bytes);
  m->meta.recorded = true;
  m->meta.tokenizer = std::filesystem::path(path).filename().string();
  m->meta.tokenizer_sha256 = sha256_hex(bytes);
  return CorpusTokenizer(std::move(m));
}

CorpusTokenizer::CorpusTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CorpusTokenizer::CorpusTokenizer(CorpusTokenizer&&) noexcept = default;
CorpusTokenizer& CorpusTokenizer::operator=(CorpusTokenizer&&) noexcept = default;
CorpusTokenizer::~CorpusTokenizer() = default;

void CorpusTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  const std::vector<int32_t> ids =
      impl_->bert ? impl_->bert->encode(text) : impl_->hf->encode(text, false);
  out.insert(out.end(), ids.begin(), ids.end());
}

const ShardMeta& CorpusTokenizer::meta() const { return impl_->meta; }
const MaskVocab& CorpusTokenizer::mask_vocab() const { return impl_->mask; }
bool CorpusTokenizer::word_pieces() const {
  return impl_->bert.has_value() || impl_->hf->wordpiece_vocab() != nullptr;
}
const std::string& CorpusTokenizer::kind() const { return impl_->kind; }

SampleRules CorpusTokenizer::sample_rules(int max_seq_len) const {
  SampleRules r;
  r.vocab_size = impl_->meta.vocab_size;
  r.max_seq_len = max_seq_len;
  r.cls_id = impl_->meta.cls_id;
  r.sep_id = impl_->meta.sep_id;
  r.tokenizer = impl_->path;
  r.tokenizer_sha256 = impl_->meta.tokenizer_sha256;
  return r;
}

}  // namespace packbert
