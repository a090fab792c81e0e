// BertConfig: the shape of a BERT model and its dropout rates, with the four standard presets.
// The fields mirror Hugging Face's BertConfig (hidden_size -> hidden, ...) so a config.json of
// a checkpoint maps onto it one to one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"  // Gelu

namespace packbert {

// The vocabulary of bert-base/large-uncased (tokenizer and data).
constexpr int64_t kBertVocab = 30522;
// NVIDIA's and MLPerf's BERT pad the vocabulary to a multiple of 8 (30528) so the decoder GEMM
// (M x V x H) has tensor-core friendly extents; the extra rows are never a label or an input.
constexpr int64_t kVocabPadMultiple = 8;

// v rounded up to a multiple of `multiple` (>= 1).
int64_t pad_vocab(int64_t v, int64_t multiple = kVocabPadMultiple);

struct BertConfig {
  // Rows of the word embedding / decoder (padded). Token ids and MLM labels must stay below
  // real_vocab_size: the padding rows exist only to shape the GEMM.
  int64_t vocab_size = pad_vocab(kBertVocab);
  int64_t real_vocab_size = kBertVocab;
  int64_t hidden = 768;
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t intermediate = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  float hidden_dropout = 0.1f;     // embedding output, attention output, FFN output
  float attention_dropout = 0.1f;  // attention probabilities
  float layer_norm_eps = 1e-12f;   // fixed by the backend (kLayerNormEps); checked, not free
  // The GELU of the MLP and the MLM transform: erf (Hugging Face "gelu") or the tanh
  // approximation (Hugging Face "gelu_new"; Google's BERT and NVIDIA's MLPerf BERT).
  Gelu hidden_act = Gelu::erf;

  int64_t head_dim() const { return hidden / heads; }
};

// "tiny" (2 layers, 128 hidden, 2 heads, 512 intermediate), "mini" (4, 256, 4, 1024),
// "base" (12, 768, 12, 3072), "large" (24, 1024, 16, 4096); vocabulary 30522 padded to 30528,
// 512 positions, dropout 0.1. Another name is an Error listing these.
BertConfig bert_preset(const std::string& name);
const std::vector<std::string>& bert_preset_names();

// Throws Error naming the field and the rule it breaks (hidden % heads, positive sizes, dropout
// in [0, 1), vocab_size >= real_vocab_size, the ranges the dropout key and the backend allow).
void validate(const BertConfig& c);

// "L=12 H=768 A=12 I=3072 V=30528 (30522) P=512"
std::string describe(const BertConfig& c);

}  // namespace packbert
