#include "model/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/backend.h"
#include "kernels/common/philox.h"
#include "kernels/base/error.h"

namespace packbert {

int64_t pad_vocab(int64_t v, int64_t multiple) {
  PB_REQUIRE(multiple >= 1, "vocabulary pad multiple {} must be >= 1", multiple);
  return (v + multiple - 1) / multiple * multiple;
}

namespace {

BertConfig preset(int64_t layers, int64_t hidden, int64_t heads, int64_t intermediate) {
  BertConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.intermediate = intermediate;
  return c;
}

// ModernBERT's architecture (Warner et al. 2024; Hugging Face ModernBertConfig's defaults).
BertConfig modernbert(int64_t layers, int64_t hidden, int64_t heads, int64_t intermediate) {
  BertConfig c = preset(layers, hidden, heads, intermediate);
  c.vocab_size = c.real_vocab_size = 50368;
  c.max_position_embeddings = 8192;
  c.hidden_dropout = c.attention_dropout = 0.f;
  c.layer_norm_eps = 1e-5f;
  c.hidden_act = Gelu::erf;
  c.norm = NormPlacement::pre;
  c.position = Positions::rope;
  c.rope_theta = 160000.f;
  c.local_rope_theta = 10000.f;
  c.mlp = MlpKind::geglu;
  c.bias = c.norm_bias = c.token_types = false;
  c.local_window = 128;
  c.global_every = 3;
  c.nsp_head = false;
  return c;
}

}  // namespace

const std::vector<std::string>& bert_preset_names() {
  static const std::vector<std::string> names = {
      "tiny", "mini", "base", "large", "modernbert-tiny", "modernbert-base", "modernbert-large"};
  return names;
}

BertConfig bert_preset(const std::string& name) {
  if (name == "tiny") return preset(2, 128, 2, 512);
  if (name == "mini") return preset(4, 256, 4, 1024);
  if (name == "base") return preset(12, 768, 12, 3072);
  if (name == "large") return preset(24, 1024, 16, 4096);
  if (name == "modernbert-tiny") {
    // For tests and the demo: BERT's vocabulary (the bundled corpus is WordPiece), sequences to
    // 1024, a window of 64 so that local layers differ from global ones at 128 tokens.
    BertConfig c = modernbert(4, 128, 2, 192);
    c.vocab_size = pad_vocab(kBertVocab);
    c.real_vocab_size = kBertVocab;
    c.max_position_embeddings = 1024;
    c.local_window = 64;
    return c;
  }
  if (name == "modernbert-base") return modernbert(22, 768, 12, 1152);
  if (name == "modernbert-large") return modernbert(28, 1024, 16, 2624);
  PB_THROW("unknown model preset '{}' (known: {})", name, fmt::join(bert_preset_names(), ", "));
}

const char* norm_placement_name(NormPlacement n) {
  return n == NormPlacement::pre ? "pre" : "post";
}
const char* positions_name(Positions p) { return p == Positions::rope ? "rope" : "learned"; }
const char* mlp_kind_name(MlpKind m) {
  return m == MlpKind::geglu ? "geglu" : m == MlpKind::swiglu ? "swiglu" : "gelu";
}

void validate(const BertConfig& c) {
  auto positive = [](const char* field, int64_t v) {
    PB_REQUIRE(v >= 1, "model config: {} = {} must be >= 1", field, v);
  };
  positive("vocab_size", c.vocab_size);
  positive("real_vocab_size", c.real_vocab_size);
  positive("hidden", c.hidden);
  positive("layers", c.layers);
  positive("heads", c.heads);
  positive("intermediate", c.intermediate);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (c.token_types) positive("type_vocab_size", c.type_vocab_size);
  PB_REQUIRE(c.real_vocab_size <= c.vocab_size,
             "model config: real_vocab_size {} exceeds vocab_size {} (the padded size)",
             c.real_vocab_size, c.vocab_size);
  // Token ids, masked rows and labels travel as i32.
  PB_REQUIRE(c.vocab_size <= INT32_MAX, "model config: vocab_size {} does not fit i32 ids",
             c.vocab_size);
  PB_REQUIRE(c.hidden % c.heads == 0,
             "model config: hidden {} is not a multiple of heads {} (head_dim = hidden / heads)",
             c.hidden, c.heads);
  PB_REQUIRE(!c.token_types || c.type_vocab_size >= 2,
             "model config: type_vocab_size {} < 2 (BERT's segments A and B)", c.type_vocab_size);
  // The dropout key (kernels/common/philox.h) gives each field a fixed number of bits.
  PB_REQUIRE(c.layers <= kDropoutMaxLayer, "model config: layers {} > {} (dropout key range)",
             c.layers, kDropoutMaxLayer);
  PB_REQUIRE(c.heads <= kDropoutMaxHead, "model config: heads {} > {} (dropout key range)", c.heads,
             kDropoutMaxHead);
  PB_REQUIRE(c.hidden <= kDropoutMaxElement, "model config: hidden {} > {} (dropout key range)",
             c.hidden, kDropoutMaxElement);
  PB_REQUIRE(c.max_position_embeddings <= kDropoutMaxPosition,
             "model config: max_position_embeddings {} > {} (dropout key range)",
             c.max_position_embeddings, kDropoutMaxPosition);
  auto rate = [](const char* field, float p) {
    PB_REQUIRE(p >= 0.f && p < 1.f, "model config: {} = {} outside [0, 1)", field, p);
  };
  rate("hidden_dropout", c.hidden_dropout);
  rate("attention_dropout", c.attention_dropout);
  PB_REQUIRE(c.layer_norm_eps > 0.f && c.layer_norm_eps < 1.f,
             "model config: layer_norm_eps {} outside (0, 1)", c.layer_norm_eps);
  if (c.position == Positions::rope) {
    PB_REQUIRE(c.head_dim() % 2 == 0,
               "model config: rotary positions need an even head_dim (hidden / heads = {})",
               c.head_dim());
    PB_REQUIRE(c.rope_theta > 1.f && c.local_rope_theta > 1.f,
               "model config: rope_theta {} and local_rope_theta {} must be > 1", c.rope_theta,
               c.local_rope_theta);
  }
  PB_REQUIRE(c.local_window >= 0, "model config: local_window {} < 0", c.local_window);
  PB_REQUIRE(c.global_every >= 1, "model config: global_every {} < 1", c.global_every);
}

std::string describe(const BertConfig& c) {
  std::string s =
      fmt::format("L={} H={} A={} I={} V={} ({}) P={}{}", c.layers, c.hidden, c.heads,
                  c.intermediate, c.vocab_size, c.real_vocab_size, c.max_position_embeddings,
                  c.hidden_act == Gelu::tanh ? " gelu_tanh" : "");
  if (c.norm == NormPlacement::pre) s += " pre-norm";
  if (c.position == Positions::rope)
    s += fmt::format(" rope({}/{})", c.rope_theta, c.local_rope_theta);
  if (c.gated()) s += std::string(" ") + mlp_kind_name(c.mlp);
  if (!c.bias) s += " no-bias";
  if (!c.norm_bias) s += " no-norm-bias";
  if (!c.token_types) s += " no-token-types";
  if (c.local_window > 0) s += fmt::format(" window={}/{}", c.local_window, c.global_every);
  return s;
}

}  // namespace packbert
