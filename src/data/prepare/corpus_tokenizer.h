// The tokenizer of a corpus, as `packbert prepare` and the trainer read it: a WordPiece vocab.txt
// (tokenizer.h) or a Hugging Face tokenizer.json (hf_tokenizer.h), told apart by the file's
// first non-blank byte ('{': JSON). Both give what samples need: a text's ids, the tokens around
// a sample ([CLS] A [SEP] or <s> A </s>: a tokenizer.json's post-processor template, which must
// put one special token before a text and one after), [MASK] and [PAD], the special tokens
// masking never touches, and the record shards keep of it (ShardMeta).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/masking/masking.h"
#include "data/shards/sample.h"
#include "data/shards/shard.h"

namespace packbert {

// SHA-256 of bytes, lower-case hex (libcrypto's).
std::string sha256_hex(std::string_view bytes);

class CorpusTokenizer {
 public:
  // Throws Error naming the file: unreadable, not a tokenizer, a tokenizer.json component it
  // does not support, no [MASK]/<mask> or [PAD]/<pad> token, a template of other than one token
  // before and one after a text.
  static CorpusTokenizer load(const std::string& path);
  CorpusTokenizer(CorpusTokenizer&&) noexcept;
  CorpusTokenizer& operator=(CorpusTokenizer&&) noexcept;
  ~CorpusTokenizer();

  // Appends the ids of text, without special tokens. Thread-safe.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

  // The shard record of this tokenizer: name, SHA-256 of the file, vocabulary size and special
  // ids (masks and samples left for the writer of the shards to fill in).
  const ShardMeta& meta() const;
  // Special: [PAD], [CLS], [SEP], [MASK] of a vocab.txt; of a tokenizer.json those and every
  // added token marked special. "##" continuations: WordPiece only.
  const MaskVocab& mask_vocab() const;
  // The ids below the vocabulary size, its [CLS]/[SEP], this tokenizer as the one expected.
  SampleRules sample_rules(int max_seq_len) const;
  bool word_pieces() const;         // WordPiece: whole-word masking is possible
  const std::string& kind() const;  // "WordPiece vocab.txt", "tokenizer.json (BPE)", ...

 private:
  struct Impl;
  explicit CorpusTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace packbert
