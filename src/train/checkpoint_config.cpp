// config.json: a model's BertConfig as Hugging Face's BertForPreTraining config, written, read
// (ours, or one saved by transformers or Google's BERT) and compared with the model a checkpoint
// is loaded into.
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_internal.h"

namespace packbert {

using namespace detail;

namespace {

// A float as JSON shows it: its shortest decimal form (0.1f -> 0.1, not 0.10000000149...).
double json_float(float f) { return std::stod(fmt::format("{}", f)); }

nlohmann::ordered_json architecture_json(const BertConfig& c) {
  nlohmann::ordered_json a;
  a["norm"] = norm_placement_name(c.norm);
  a["position"] = positions_name(c.position);
  a["rope_theta"] = json_float(c.rope_theta);
  a["local_rope_theta"] = json_float(c.local_rope_theta);
  a["mlp"] = mlp_kind_name(c.mlp);
  a["bias"] = c.bias;
  a["norm_bias"] = c.norm_bias;
  a["token_types"] = c.token_types;
  a["local_window"] = c.local_window;
  a["global_every"] = c.global_every;
  a["nsp_head"] = c.nsp_head;
  return a;
}

nlohmann::ordered_json hf_config_json(const BertConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"BertForPreTraining"};
  j["model_type"] = "bert";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["intermediate_size"] = c.intermediate;
  j["hidden_act"] = c.hidden_act == Gelu::tanh ? "gelu_new" : "gelu";
  j["hidden_dropout_prob"] = json_float(c.hidden_dropout);
  j["attention_probs_dropout_prob"] = json_float(c.attention_dropout);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["type_vocab_size"] = c.type_vocab_size;
  j["initializer_range"] = 0.02;
  j["layer_norm_eps"] = json_float(c.layer_norm_eps);
  j["pad_token_id"] = 0;
  j["position_embedding_type"] = "absolute";
  j["torch_dtype"] = "float32";
  j["packbert_real_vocab_size"] = c.real_vocab_size;
  // The architecture options, when any differs from BERT's (a BERT checkpoint's config.json
  // stays Hugging Face's BertConfig, byte for byte).
  if (architecture_json(c) != architecture_json(BertConfig{}))
    j["packbert_architecture"] = architecture_json(c);
  return j;
}

struct FieldDiff {
  std::string field;
  std::string ours;
  std::string theirs;
};

// Fields where a and b differ (the model's shape; dropout rates too when `dropout`).
std::vector<FieldDiff> config_diffs(const BertConfig& a, const BertConfig& b, bool dropout) {
  std::vector<FieldDiff> d;
  auto i64 = [&](const char* f, int64_t x, int64_t y) {
    if (x != y) d.push_back({f, std::to_string(x), std::to_string(y)});
  };
  auto f32 = [&](const char* f, float x, float y) {
    if (x != y) d.push_back({f, fmt::format("{}", x), fmt::format("{}", y)});
  };
  i64("vocab_size", a.vocab_size, b.vocab_size);
  i64("packbert_real_vocab_size", a.real_vocab_size, b.real_vocab_size);
  i64("hidden_size", a.hidden, b.hidden);
  i64("num_hidden_layers", a.layers, b.layers);
  i64("num_attention_heads", a.heads, b.heads);
  i64("intermediate_size", a.intermediate, b.intermediate);
  i64("max_position_embeddings", a.max_position_embeddings, b.max_position_embeddings);
  i64("type_vocab_size", a.type_vocab_size, b.type_vocab_size);
  f32("layer_norm_eps", a.layer_norm_eps, b.layer_norm_eps);
  const nlohmann::ordered_json arch_a = architecture_json(a), arch_b = architecture_json(b);
  for (const auto& [key, value] : arch_a.items())
    if (value != arch_b[key])
      d.push_back({"packbert_architecture." + key, value.dump(), arch_b[key].dump()});
  if (dropout) {
    f32("hidden_dropout_prob", a.hidden_dropout, b.hidden_dropout);
    f32("attention_probs_dropout_prob", a.attention_dropout, b.attention_dropout);
    // Resuming keeps the GELU; a weights-only start may change it (Google's TF checkpoints,
    // trained with the tanh form, say "gelu", which Hugging Face reads as erf).
    auto act = [](Gelu g) { return std::string(g == Gelu::tanh ? "gelu_new" : "gelu"); };
    if (a.hidden_act != b.hidden_act)
      d.push_back({"hidden_act", act(a.hidden_act), act(b.hidden_act)});
  }
  return d;
}

// The options of architecture_json into c (Error naming the field otherwise).
void read_architecture(const std::string& path, const nlohmann::json& a, BertConfig& c) {
  PB_REQUIRE(a.is_object(), "{}: packbert_architecture is not an object", path);
  auto field = [&](const char* key) -> const nlohmann::json& {
    PB_REQUIRE(a.contains(key), "{}: packbert_architecture.{} is missing", path, key);
    return a[key];
  };
  auto choice = [&](const char* key, auto value, std::initializer_list<decltype(value)> all,
                    auto name) {
    const nlohmann::json& v = field(key);
    for (auto option : all)
      if (v.is_string() && v.get<std::string>() == name(option)) return option;
    PB_THROW("{}: packbert_architecture.{} = {} is not an option", path, key, v.dump());
  };
  auto flag = [&](const char* key) {
    const nlohmann::json& v = field(key);
    PB_REQUIRE(v.is_boolean(), "{}: packbert_architecture.{} = {} is not a boolean", path, key,
               v.dump());
    return v.get<bool>();
  };
  auto number = [&](const char* key) {
    const nlohmann::json& v = field(key);
    PB_REQUIRE(v.is_number(), "{}: packbert_architecture.{} = {} is not a number", path, key,
               v.dump());
    return v.get<double>();
  };
  c.norm = choice("norm", c.norm, {NormPlacement::post, NormPlacement::pre}, norm_placement_name);
  c.position =
      choice("position", c.position, {Positions::learned, Positions::rope}, positions_name);
  c.rope_theta = static_cast<float>(number("rope_theta"));
  c.local_rope_theta = static_cast<float>(number("local_rope_theta"));
  c.mlp = choice("mlp", c.mlp, {MlpKind::gelu, MlpKind::geglu, MlpKind::swiglu}, mlp_kind_name);
  c.bias = flag("bias");
  c.norm_bias = flag("norm_bias");
  c.token_types = flag("token_types");
  c.local_window = static_cast<int64_t>(number("local_window"));
  c.global_every = static_cast<int64_t>(number("global_every"));
  c.nsp_head = flag("nsp_head");
}

}  // namespace

std::string detail::hf_config_text(const BertConfig& config) {
  return hf_config_json(config).dump(2) + "\n";
}

void detail::check_config(const std::string& path, const BertConfig& expected, const BertConfig& c,
                          bool dropout) {
  const auto diffs = config_diffs(expected, c, dropout);
  if (diffs.empty()) return;
  std::string msg;
  for (const FieldDiff& f : diffs)
    msg += fmt::format("{}{} = {} (the model has {})", msg.empty() ? "" : "; ", f.field, f.theirs,
                       f.ours);
  PB_THROW("{}: checkpoint config does not match the model: {}", path, msg);
}

void write_hf_config(const std::string& path, const BertConfig& config) {
  write_file_synced(path, hf_config_text(config));
}

BertConfig read_hf_config(const std::string& path) {
  return parse_hf_config(path, read_text(path));
}

BertConfig detail::parse_hf_config(const std::string& path, const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PB_THROW("{}: not valid JSON: {}", path, e.what());
  }
  PB_REQUIRE(j.is_object(), "{}: not a JSON object", path);
  auto int_field = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      PB_REQUIRE(!required, "{}: field '{}' is missing", path, key);
      return fallback;
    }
    PB_REQUIRE(j[key].is_number_integer(), "{}: field '{}' = {} is not an integer", path, key,
               j[key].dump());
    return j[key].get<int64_t>();
  };
  auto float_field = [&](const char* key, float fallback) -> float {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    PB_REQUIRE(j[key].is_number(), "{}: field '{}' = {} is not a number", path, key, j[key].dump());
    return static_cast<float>(j[key].get<double>());
  };
  auto string_field = [&](const char* key, const char* required_value) {
    if (!j.contains(key) || j[key].is_null()) return;
    PB_REQUIRE(j[key].is_string() && j[key].get<std::string>() == required_value,
               "{}: field '{}' = {} is not supported (only \"{}\")", path, key, j[key].dump(),
               required_value);
  };
  if (j.contains("model_type")) string_field("model_type", "bert");
  string_field("position_embedding_type", "absolute");

  BertConfig c;
  // Hugging Face's names of the two GELUs (gelu_new and gelu_pytorch_tanh compute the same
  // tanh approximation).
  if (j.contains("hidden_act") && !j["hidden_act"].is_null()) {
    const std::string act = j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : "";
    PB_REQUIRE(act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh",
               "{}: field 'hidden_act' = {} is not supported (only \"gelu\", \"gelu_new\" or "
               "\"gelu_pytorch_tanh\")",
               path, j["hidden_act"].dump());
    c.hidden_act = act == "gelu" ? Gelu::erf : Gelu::tanh;
  }
  c.vocab_size = int_field("vocab_size", true, 0);
  c.hidden = int_field("hidden_size", true, 0);
  c.layers = int_field("num_hidden_layers", true, 0);
  c.heads = int_field("num_attention_heads", true, 0);
  c.intermediate = int_field("intermediate_size", true, 0);
  c.max_position_embeddings = int_field("max_position_embeddings", true, 0);
  c.type_vocab_size = int_field("type_vocab_size", true, 0);
  c.real_vocab_size =
      int_field("packbert_real_vocab_size", false, std::min<int64_t>(c.vocab_size, kBertVocab));
  c.hidden_dropout = float_field("hidden_dropout_prob", 0.1f);
  c.attention_dropout = float_field("attention_probs_dropout_prob", 0.1f);
  c.layer_norm_eps = float_field("layer_norm_eps", 1e-12f);
  if (j.contains("packbert_architecture")) read_architecture(path, j["packbert_architecture"], c);
  try {
    validate(c);
  } catch (const Error& e) {
    PB_THROW("{}: {}", path, e.what());
  }
  return c;
}

}  // namespace packbert
