// BertConfig: the shape of a BERT model, its dropout rates and its architecture options, with
// the standard presets. The shape fields mirror Hugging Face's BertConfig (hidden_size -> hidden,
// ...) so a config.json of a checkpoint maps onto it one to one; the options' defaults are BERT's
// (docs/architectures.md says what each one does and which presets set them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"  // Gelu
#include "model/option_enums.h"

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
  float layer_norm_eps = 1e-12f;   // every norm's epsilon (ModernBERT: 1e-5)
  // The GELU of the MLP and the MLM transform: erf (Hugging Face "gelu") or the tanh
  // approximation (Hugging Face "gelu_new"; Google's BERT and NVIDIA's MLPerf BERT).
  Gelu hidden_act = Gelu::erf;

  // Architecture options; the defaults are BERT's.
  NormPlacement norm = NormPlacement::post;
  Positions position = Positions::learned;
  float rope_theta = 10000.f;        // RoPE base of global layers (ModernBERT: 160000)
  float local_rope_theta = 10000.f;  // RoPE base of local layers (ModernBERT: 10000)
  MlpKind mlp = MlpKind::gelu;
  bool bias = true;         // biases of the encoder's and the MLM transform's linear layers
  bool norm_bias = true;    // the norms' beta
  bool token_types = true;  // token-type (segment) embeddings
  // Local attention: a layer l with l % global_every != 0 attends, per query i, the keys j of
  // its own sequence with |i - j| <= local_window / 2 (Hugging Face ModernBERT's window).
  // local_window 0: every layer is global.
  int64_t local_window = 0;
  int64_t global_every = 1;
  bool nsp_head = true;  // the pooler and the NSP classifier exist

  int64_t head_dim() const { return hidden / heads; }
  bool gated() const { return mlp != MlpKind::gelu; }
  // The width of Wi's output: I, or 2I for a gated MLP.
  int64_t mlp_in_width() const { return gated() ? 2 * intermediate : intermediate; }
  bool is_global(int64_t layer) const { return local_window == 0 || layer % global_every == 0; }
  // The attention window of a layer (0: global) and its RoPE base.
  int64_t window_of(int64_t layer) const { return is_global(layer) ? 0 : local_window; }
  float rope_theta_of(int64_t layer) const {
    return is_global(layer) ? rope_theta : local_rope_theta;
  }
};

// BERT: "tiny" (2 layers, 128 hidden, 2 heads, 512 intermediate), "mini" (4, 256, 4, 1024),
// "base" (12, 768, 12, 3072), "large" (24, 1024, 16, 4096); vocabulary 30522 padded to 30528,
// 512 positions, dropout 0.1. ModernBERT (pre-norm, RoPE 160000 / 10000, GeGLU, no biases but
// the decoder's, no token types, window 128 with every third layer global, norm eps 1e-5, no
// dropout, no NSP head, vocabulary 50368, 8192 positions): "modernbert-tiny" (4, 128, 2, 192),
// "modernbert-base" (22, 768, 12, 1152), "modernbert-large" (28, 1024, 16, 2624). Another name
// is an Error listing these.
BertConfig bert_preset(const std::string& name);
const std::vector<std::string>& bert_preset_names();

// Throws Error naming the field and the rule it breaks (hidden % heads, positive sizes, dropout
// in [0, 1), vocab_size >= real_vocab_size, the ranges the dropout key and the backend allow).
void validate(const BertConfig& c);

// "L=12 H=768 A=12 I=3072 V=30528 (30522) P=512"
std::string describe(const BertConfig& c);

}  // namespace packbert
