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

}  // namespace

const std::vector<std::string>& bert_preset_names() {
  static const std::vector<std::string> names = {"tiny", "mini", "base", "large"};
  return names;
}

BertConfig bert_preset(const std::string& name) {
  if (name == "tiny") return preset(2, 128, 2, 512);
  if (name == "mini") return preset(4, 256, 4, 1024);
  if (name == "base") return preset(12, 768, 12, 3072);
  if (name == "large") return preset(24, 1024, 16, 4096);
  PB_THROW("unknown model preset '{}' (known: {})", name, fmt::join(bert_preset_names(), ", "));
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
  positive("type_vocab_size", c.type_vocab_size);
  PB_REQUIRE(c.real_vocab_size <= c.vocab_size,
             "model config: real_vocab_size {} exceeds vocab_size {} (the padded size)",
             c.real_vocab_size, c.vocab_size);
  // Token ids, masked rows and labels travel as i32.
  PB_REQUIRE(c.vocab_size <= INT32_MAX, "model config: vocab_size {} does not fit i32 ids",
             c.vocab_size);
  PB_REQUIRE(c.hidden % c.heads == 0,
             "model config: hidden {} is not a multiple of heads {} (head_dim = hidden / heads)",
             c.hidden, c.heads);
  PB_REQUIRE(c.type_vocab_size >= 2,
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
  PB_REQUIRE(c.layer_norm_eps == kLayerNormEps,
             "model config: layer_norm_eps {} is not supported: the backend's LayerNorm uses {}",
             c.layer_norm_eps, kLayerNormEps);
}

std::string describe(const BertConfig& c) {
  return fmt::format("L={} H={} A={} I={} V={} ({}) P={}{}", c.layers, c.hidden, c.heads,
                     c.intermediate, c.vocab_size, c.real_vocab_size, c.max_position_embeddings,
                     c.hidden_act == Gelu::tanh ? " gelu_tanh" : "");
}

}  // namespace packbert
