#include "train/train_config.h"

namespace packbert {

bool TrainConfig::eval_enabled() const {
  return eval.every_samples > 0 || eval.at_end || eval.target_accuracy > 0;
}

BertConfig model_config(const TrainConfig& c) {
  BertConfig b = bert_preset(c.model.preset);
  b.layers = c.model.layers;
  b.hidden = c.model.hidden;
  b.heads = c.model.heads;
  b.intermediate = c.model.intermediate;
  b.max_position_embeddings = c.model.max_position_embeddings;
  b.hidden_dropout = static_cast<float>(c.model.hidden_dropout);
  b.attention_dropout = static_cast<float>(c.model.attention_dropout);
  b.hidden_act = c.model.hidden_act;
  return b;
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
  return s;
}

LambOptions lamb_options(const TrainConfig& c) {
  LambOptions o;
  o.beta1 = static_cast<float>(c.optim.beta1);
  o.beta2 = static_cast<float>(c.optim.beta2);
  o.eps = static_cast<float>(c.optim.epsilon);
  o.weight_decay = static_cast<float>(c.optim.weight_decay);
  o.max_grad_norm = static_cast<float>(c.optim.max_grad_norm);
  // A non-finite gradient skips the update, whatever train.max_nonfinite_steps says: the run
  // counts such steps and decides by that key (run_train.cpp, SkippedSteps), 0 included (the
  // first one is an error naming the step). A throw here instead would bypass the count and, on
  // the GPU, fire only on the steps that read the norm back.
  o.check_finite = true;
  o.skip_nonfinite = true;
  return o;
}

LoaderOptions loader_options(const TrainConfig& c) {
  LoaderOptions o;
  o.global_batch_size = c.train.global_batch_size;
  o.micro_steps = c.train.gradient_accumulation_steps;
  o.max_seq_len = c.train.max_seq_len;
  o.max_seqs_per_pack = c.train.max_seqs_per_pack;
  o.seed = c.train.seed;
  o.prefetch_steps = c.data.prefetch_steps;
  o.shuffle_block_rows = c.data.shuffle_block_rows;
  o.shuffle_window_blocks = c.data.shuffle_window_blocks;
  o.read_ahead_windows = c.data.read_ahead_windows;
  o.last_step = c.train.last_step;
  o.rules.max_seq_len = c.train.max_seq_len;
  o.rules.vocab_size = model_config(c).real_vocab_size;
  return o;
}

}  // namespace packbert
