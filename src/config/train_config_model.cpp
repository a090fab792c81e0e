#include "config/train_config_model.h"

namespace packbert {

BertConfig model_config(const TrainConfig& c) {
  BertConfig b = bert_preset(c.model.preset);
  b.layers = c.model.layers;
  b.hidden = c.model.hidden;
  b.heads = c.model.heads;
  b.intermediate = c.model.intermediate;
  b.max_position_embeddings = c.model.max_position_embeddings;
  b.real_vocab_size = c.model.vocab_size;
  b.vocab_size = pad_vocab(c.model.vocab_size);
  b.hidden_dropout = static_cast<float>(c.model.hidden_dropout);
  b.attention_dropout = static_cast<float>(c.model.attention_dropout);
  b.hidden_act = c.model.hidden_act;
  b.norm = c.model.norm;
  b.position = c.model.position;
  b.rope_theta = static_cast<float>(c.model.rope_theta);
  b.local_rope_theta = static_cast<float>(c.model.local_rope_theta);
  b.mlp = c.model.mlp;
  b.bias = c.model.bias;
  b.norm_bias = c.model.norm_bias;
  b.token_types = c.model.token_types;
  b.local_window = c.model.local_window;
  b.global_every = c.model.global_every;
  b.nsp_head = c.model.nsp_head;
  b.layer_norm_eps = static_cast<float>(c.model.layer_norm_eps);
  return b;
}

BatchWarmup batch_warmup_config(const TrainConfig& c, int world_size) {
  BatchWarmup w;
  w.start = c.train.batch_warmup_start;
  w.steps = c.train.batch_warmup_steps;
  w.tokens = c.train.batch_warmup_tokens;
  w.multiple = c.train.batch_warmup_multiple > 0
                   ? c.train.batch_warmup_multiple
                   : int64_t{world_size} * c.train.gradient_accumulation_steps;
  return w;
}

LrScheduleConfig lr_schedule_config(const TrainConfig& c) {
  LrScheduleConfig s;
  s.base_lr = c.optim.lr;
  s.max_steps = c.train.max_steps;
  s.num_warmup_steps = c.optim.warmup_steps;
  s.warmup_proportion = c.optim.warmup_proportion;
  s.start_warmup_step = c.optim.start_warmup_step;
  s.poly_power = c.optim.poly_power;
  s.end_lr = c.optim.end_lr;
  s.kind = c.optim.schedule;
  s.decay_steps = c.optim.decay_steps;
  s.decay_fraction = c.optim.decay_fraction;
  s.decay_shape = c.optim.decay_shape;
  s.unit = c.optim.schedule_unit;
  if (s.unit == ScheduleUnit::tokens) {
    s.max_steps = c.optim.schedule_tokens;
    s.num_warmup_steps = c.optim.warmup_tokens;
    s.decay_steps = c.optim.decay_tokens;
  }
  return s;
}

}  // namespace packbert
