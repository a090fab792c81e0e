// TrainConfig from a TOML file and overrides, through the key table; the model preset is
// resolved here.
#include "config/train_config.h"

#include <string>
#include <vector>

#include <fmt/format.h>

#include "config/train_config_schema.h"
#include "model/config.h"  // bert_preset

namespace packbert {

bool TrainConfig::eval_enabled() const {
  return eval.every_samples > 0 || eval.at_end || eval.target_accuracy > 0;
}

namespace {

void apply_preset(TrainConfig& c) {
  BertConfig p = bert_preset(c.model.preset);
  c.model.layers = p.layers;
  c.model.hidden = p.hidden;
  c.model.heads = p.heads;
  c.model.intermediate = p.intermediate;
  c.model.max_position_embeddings = p.max_position_embeddings;
  c.model.vocab_size = p.real_vocab_size;
  // The preset's float rates as the decimal they were written as (0.1f -> 0.1, not
  // 0.10000000149), so a preset config equals one that spells the rates out.
  auto decimal = [](float f) { return std::stod(fmt::format("{}", f)); };
  c.model.hidden_dropout = decimal(p.hidden_dropout);
  c.model.attention_dropout = decimal(p.attention_dropout);
  c.model.norm = p.norm;
  c.model.position = p.position;
  c.model.rope_theta = decimal(p.rope_theta);
  c.model.local_rope_theta = decimal(p.local_rope_theta);
  c.model.mlp = p.mlp;
  c.model.bias = p.bias;
  c.model.norm_bias = p.norm_bias;
  c.model.token_types = p.token_types;
  c.model.local_window = p.local_window;
  c.model.global_every = p.global_every;
  c.model.nsp_head = p.nsp_head;
  c.model.layer_norm_eps = decimal(p.layer_norm_eps);
}

}  // namespace

TrainConfig load_train_config(const std::string& toml_path,
                              const std::vector<std::string>& overrides,
                              config::KeyLocations* where) {
  const config::Schema<TrainConfig>& schema = train_config_schema();
  const std::vector<config::Setting> settings = schema.read(toml_path, overrides);
  TrainConfig c;
  // The preset first (the last setting wins), so explicit model keys override its values
  // whatever their order.
  for (const config::Setting& s : settings)
    if (s.key == "model.preset") schema.apply(s, c);
  apply_preset(c);
  schema.apply(settings, c);
  if (where) *where = config::locations(settings);
  return c;
}

}  // namespace packbert
