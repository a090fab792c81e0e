// A Hugging Face tokenizer.json, encoded as the `tokenizers` library encodes it, for the models
// pretraining uses (docs/data_pipeline.md, "Your own tokenizer"):
//   - byte-level BPE (GPT-2, RoBERTa, ModernBERT/OLMo): normalizer null or NFC, pre-tokenizer
//     ByteLevel (its split pattern through PCRE2), model BPE;
//   - WordPiece with BERT's normalisation (normalizer BertNormalizer lower-casing, pre-tokenizer
//     BertPreTokenizer, model WordPiece with "##"): the BertTokenizer of tokenizer.h;
// the added tokens (matched in the text first, leftmost-longest, with their single_word, lstrip
// and rstrip) and the post-processor's single-sequence template (TemplateProcessing,
// RobertaProcessing, BertProcessing) for the special tokens around a text. Any other component
// or option is an Error naming the file, the component and the value: never a silent
// difference. Input bytes that are not UTF-8 are replaced first, as Python's
// bytes.decode("utf-8", errors="replace") does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace packbert {

class Vocab;

class HfTokenizer {
 public:
  static HfTokenizer load(const std::string& path);
  static HfTokenizer parse(const std::string& json, const std::string& path);  // the file's text
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // The ids of `text`; with `special`, between the post-processor's special tokens
  // (tokenizers' encode(text, add_special_tokens=special)). Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool special) const;

  const std::string& model_type() const;  // "BPE" or "WordPiece"
  int64_t vocab_size() const;             // largest id (vocabulary or added token) + 1
  // The template's special ids before and after a text (empty without a post-processor).
  const std::vector<int32_t>& prefix_ids() const;
  const std::vector<int32_t>& suffix_ids() const;
  int32_t token_id(std::string_view token) const;  // an added token's, else the model's; -1
  std::vector<int32_t> special_ids() const;        // the added tokens marked special
  const Vocab* wordpiece_vocab() const;            // WordPiece: its vocabulary; BPE: nullptr

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packbert
