// The rules between keys of a TrainConfig, and the paths it names.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/common/philox.h"
#include "kernels/base/error.h"
#include "kernels/device.h"
#include "config/train_config.h"
#include "config/train_config_model.h"
#include "model/config.h"       // validate, bert_preset_names
#include "optim/lr_schedule.h"  // LrSchedule

namespace packbert {

namespace {

bool path_exists(const std::string& p) {
  std::error_code ec;
  return !p.empty() && std::filesystem::exists(p, ec);
}

}  // namespace

void validate_train_config(const TrainConfig& c, int world_size, ConfigPurpose purpose,
                           bool check_paths) {
  PB_REQUIRE(world_size >= 1, "world size {} must be >= 1", world_size);
  PB_REQUIRE(!check_paths || c.train.device != Device::cuda || cuda_built(),
             "train.device = \"cuda\", but this build has no CUDA backend (configure with "
             "-DPACKBERT_CUDA=ON)");
  PB_REQUIRE(c.train.fp8_history >= 1 && c.train.fp8_history <= 65536,
             "train.fp8_history ({}) must be in [1, 65536]", c.train.fp8_history);
  PB_REQUIRE(c.train.fp8_margin >= 0 && c.train.fp8_margin <= 64,
             "train.fp8_margin ({}) must be in [0, 64]", c.train.fp8_margin);
  PB_REQUIRE(c.train.cuda_graphs == CudaGraphs::off || c.train.device == Device::cuda,
             "train.cuda_graphs = \"{}\" records CUDA graphs: it needs train.device = \"cuda\"",
             cuda_graphs_name(c.train.cuda_graphs));
  const auto& m = c.model;
  PB_REQUIRE(m.layers >= 1, "model.layers ({}) must be >= 1", m.layers);
  PB_REQUIRE(m.vocab_size >= 1 && m.vocab_size <= (int64_t{1} << 30),
             "model.vocab_size ({}) must be in [1, 2^30]", m.vocab_size);
  PB_REQUIRE(m.hidden >= 1, "model.hidden ({}) must be >= 1", m.hidden);
  PB_REQUIRE(m.heads >= 1, "model.heads ({}) must be >= 1", m.heads);
  PB_REQUIRE(m.hidden % m.heads == 0, "model.hidden ({}) must be divisible by model.heads ({})",
             m.hidden, m.heads);
  PB_REQUIRE(m.intermediate >= 1, "model.intermediate ({}) must be >= 1", m.intermediate);
  PB_REQUIRE(m.max_position_embeddings >= 1, "model.max_position_embeddings ({}) must be >= 1",
             m.max_position_embeddings);
  PB_REQUIRE(m.hidden_dropout >= 0 && m.hidden_dropout < 1,
             "model.hidden_dropout ({}) must be in [0, 1)", m.hidden_dropout);
  PB_REQUIRE(m.attention_dropout >= 0 && m.attention_dropout < 1,
             "model.attention_dropout ({}) must be in [0, 1)", m.attention_dropout);
  PB_REQUIRE(m.mlm_chunk_rows >= 0, "model.mlm_chunk_rows ({}) must be >= 0 (0 = all at once)",
             m.mlm_chunk_rows);
  PB_REQUIRE(m.mst_chunks >= 0, "model.mst_chunks ({}) must be >= 1, or 0 for auto", m.mst_chunks);
  PB_REQUIRE(m.activation_budget_mb >= 0, "model.activation_budget_mb ({}) must be >= 0",
             m.activation_budget_mb);
  PB_REQUIRE(m.mst_chunks != 0 || m.activation_budget_mb > 0,
             "model.mst_chunks = 0 (auto) needs model.activation_budget_mb > 0");
  try {
    validate(model_config(c));
  } catch (const Error& e) {
    PB_THROW("[model]: {}", e.what());
  }

  const auto& t = c.train;
  PB_REQUIRE(t.max_steps >= 1, "train.max_steps ({}) must be >= 1", t.max_steps);
  PB_REQUIRE(t.max_steps < int64_t{kDropoutMaxStep},
             "train.max_steps ({}) must be < {} (the dropout key's step range)", t.max_steps,
             kDropoutMaxStep);
  PB_REQUIRE(t.global_batch_size >= 1, "train.global_batch_size ({}) must be >= 1",
             t.global_batch_size);
  PB_REQUIRE(t.gradient_accumulation_steps >= 1,
             "train.gradient_accumulation_steps ({}) must be >= 1", t.gradient_accumulation_steps);
  PB_REQUIRE(t.global_batch_size >= t.gradient_accumulation_steps,
             "train.global_batch_size ({}) must be >= train.gradient_accumulation_steps ({})",
             t.global_batch_size, t.gradient_accumulation_steps);
  if (purpose == ConfigPurpose::train)
    PB_REQUIRE(t.global_batch_size >= int64_t{world_size} * t.gradient_accumulation_steps,
               "train.global_batch_size ({}) must be >= world size ({}) x "
               "train.gradient_accumulation_steps ({}) = {}: every micro-step of every rank "
               "needs a sample",
               t.global_batch_size, world_size, t.gradient_accumulation_steps,
               int64_t{world_size} * t.gradient_accumulation_steps);
  {
    const BatchWarmup w = batch_warmup_config(c, world_size);
    PB_REQUIRE(t.batch_warmup_multiple >= 0, "train.batch_warmup_multiple ({}) must be >= 0",
               t.batch_warmup_multiple);
    check_batch_warmup(w, t.global_batch_size, "train.batch_warmup");
    const int64_t divides = int64_t{world_size} * t.gradient_accumulation_steps;
    if (w.on() && purpose == ConfigPurpose::train)
      PB_REQUIRE(w.multiple % divides == 0,
                 "train.batch_warmup_multiple ({}) must be a multiple of world size ({}) x "
                 "train.gradient_accumulation_steps ({}) = {}: the sizes every rank and "
                 "micro-step divide",
                 w.multiple, world_size, t.gradient_accumulation_steps, divides);
  }
  PB_REQUIRE(t.max_seq_len >= 2, "train.max_seq_len ({}) must be >= 2", t.max_seq_len);
  PB_REQUIRE(t.max_seq_len <= m.max_position_embeddings,
             "train.max_seq_len ({}) must be <= model.max_position_embeddings ({})", t.max_seq_len,
             m.max_position_embeddings);
  PB_REQUIRE(t.max_seqs_per_pack >= 0, "train.max_seqs_per_pack ({}) must be >= 0 (0 = no limit)",
             t.max_seqs_per_pack);
  PB_REQUIRE(t.max_predictions_per_seq >= 1 && t.max_predictions_per_seq <= t.max_seq_len,
             "train.max_predictions_per_seq ({}) must be in [1, train.max_seq_len ({})]",
             t.max_predictions_per_seq, t.max_seq_len);
  {
    const double li = t.loss_scale_init;
    PB_REQUIRE(li >= 1.0 && li <= 16777216.0 && std::exp2(std::round(std::log2(li))) == li,
               "train.loss_scale_init ({}) must be a power of two in [1, 16777216]", li);
    PB_REQUIRE(t.loss_scale_growth_interval >= 1,
               "train.loss_scale_growth_interval ({}) must be >= 1", t.loss_scale_growth_interval);
  }
  PB_REQUIRE(t.max_nonfinite_steps >= 0, "train.max_nonfinite_steps ({}) must be >= 0",
             t.max_nonfinite_steps);
  PB_REQUIRE(std::isfinite(t.collective_timeout_s) && t.collective_timeout_s >= 0,
             "train.collective_timeout_s ({}) must be finite and >= 0 (0 = off)",
             t.collective_timeout_s);

  const auto& o = c.optim;
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  PB_REQUIRE(finite_nonneg(o.lr), "optim.lr ({}) must be finite and >= 0", o.lr);
  PB_REQUIRE(finite_nonneg(o.end_lr), "optim.end_lr ({}) must be finite and >= 0", o.end_lr);
  // Each unit's lengths, and none of the other's.
  if (o.schedule_unit == ScheduleUnit::tokens) {
    PB_REQUIRE(o.schedule_tokens >= 1,
               "optim.schedule_tokens ({}) must be >= 1 with optim.schedule_unit = tokens",
               o.schedule_tokens);
    for (const auto& [name, value] :
         {std::pair<const char*, int64_t>{"warmup_steps", o.warmup_steps},
          {"decay_steps", o.decay_steps},
          {"start_warmup_step", o.start_warmup_step}})
      PB_REQUIRE(value == 0,
                 "optim.{} ({}) counts steps; with optim.schedule_unit = tokens give the "
                 "length in tokens (optim.warmup_tokens, optim.decay_tokens)",
                 name, value);
  } else {
    for (const auto& [name, value] :
         {std::pair<const char*, int64_t>{"schedule_tokens", o.schedule_tokens},
          {"warmup_tokens", o.warmup_tokens},
          {"decay_tokens", o.decay_tokens}})
      PB_REQUIRE(value == 0, "optim.{} ({}) needs optim.schedule_unit = tokens", name, value);
  }
  // The lengths of the unit in use (the other unit's are 0, checked above).
  const bool tokens = o.schedule_unit == ScheduleUnit::tokens;
  const int64_t warmup = tokens ? o.warmup_tokens : o.warmup_steps;
  const int64_t decay = tokens ? o.decay_tokens : o.decay_steps;
  const char* warmup_key = tokens ? "optim.warmup_tokens" : "optim.warmup_steps";
  const char* decay_key = tokens ? "optim.decay_tokens" : "optim.decay_steps";
  PB_REQUIRE(warmup >= 0, "{} ({}) must be >= 0", warmup_key, warmup);
  PB_REQUIRE(o.warmup_proportion >= 0 && o.warmup_proportion <= 1,
             "optim.warmup_proportion ({}) must be in [0, 1]", o.warmup_proportion);
  PB_REQUIRE(warmup == 0 || o.warmup_proportion == 0,
             "{} ({}) and optim.warmup_proportion ({}) are both set; give one", warmup_key, warmup,
             o.warmup_proportion);
  PB_REQUIRE(o.start_warmup_step == 0 || o.warmup_steps > 0,
             "optim.start_warmup_step ({}) needs optim.warmup_steps > 0", o.start_warmup_step);
  PB_REQUIRE(finite_nonneg(o.poly_power), "optim.poly_power ({}) must be finite and >= 0",
             o.poly_power);
  const char* schedule = lr_schedule_kind_name(o.schedule);
  PB_REQUIRE(o.schedule == LrScheduleKind::poly || o.poly_power == 1.0,
             "optim.poly_power ({}) applies to optim.schedule = \"poly\", not \"{}\"", o.poly_power,
             schedule);
  if (o.schedule == LrScheduleKind::wsd) {
    PB_REQUIRE(decay >= 0, "{} ({}) must be >= 0", decay_key, decay);
    PB_REQUIRE(o.decay_fraction >= 0 && o.decay_fraction <= 1,
               "optim.decay_fraction ({}) must be in [0, 1]", o.decay_fraction);
    PB_REQUIRE((decay > 0) != (o.decay_fraction > 0),
               "optim.schedule = \"wsd\" needs one of {} ({}) and optim.decay_fraction ({})",
               decay_key, decay, o.decay_fraction);
  } else {
    PB_REQUIRE(decay == 0 && o.decay_fraction == 0 && o.decay_shape == DecayShape::linear,
               "{}, optim.decay_fraction and optim.decay_shape apply to "
               "optim.schedule = \"wsd\", not \"{}\"",
               decay_key, schedule);
  }
  PB_REQUIRE(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1 ({}) must be in [0, 1)", o.beta1);
  PB_REQUIRE(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2 ({}) must be in [0, 1)", o.beta2);
  PB_REQUIRE(std::isfinite(o.epsilon) && o.epsilon > 0, "optim.epsilon ({}) must be > 0",
             o.epsilon);
  PB_REQUIRE(finite_nonneg(o.weight_decay), "optim.weight_decay ({}) must be finite and >= 0",
             o.weight_decay);
  PB_REQUIRE(finite_nonneg(o.max_grad_norm),
             "optim.max_grad_norm ({}) must be finite and >= 0 (0: no clipping)", o.max_grad_norm);
  PB_REQUIRE(!o.decouple_lr || o.name != UpdateRule::lamb,
             "optim.decouple_lr applies to optim.name = \"adamw\" or \"stable_adamw\", not "
             "\"lamb\"");
  PB_REQUIRE(!o.decouple_lr || o.lr > 0,
             "optim.decouple_lr divides the weight decay by optim.lr, which is {}", o.lr);
  try {
    LrSchedule schedule(lr_schedule_config(c));
  } catch (const Error& e) {
    PB_THROW("[optim] learning-rate schedule: {}{}", e.what(),
             o.schedule_unit == ScheduleUnit::tokens
                 ? " (counted in tokens: its max_steps is optim.schedule_tokens, warmup_steps "
                   "optim.warmup_tokens, decay_steps optim.decay_tokens)"
                 : "");
  }

  // The MLPerf log names MLPerf BERT's LAMB and its step-counted schedule (train/mllog.h):
  // another optimizer or a schedule in tokens would be logged under keys that misstate it.
  PB_REQUIRE(c.log.mllog_file.empty() || t.batch_warmup_start == 0,
             "log.mllog_file: the MLPerf BERT log has one global_batch_size; a batch warmup "
             "(train.batch_warmup_start = {}) changes it: leave log.mllog_file empty",
             t.batch_warmup_start);
  PB_REQUIRE(c.log.mllog_file.empty() ||
                 (o.name == UpdateRule::lamb && o.schedule_unit == ScheduleUnit::steps),
             "log.mllog_file: the MLPerf BERT log describes LAMB with a schedule in steps "
             "(opt_lamb_*, opt_learning_rate_warmup_steps); optim.name = \"{}\" with "
             "optim.schedule_unit = \"{}\" has no such keys: leave log.mllog_file empty",
             o.name == UpdateRule::lamb    ? "lamb"
             : o.name == UpdateRule::adamw ? "adamw"
                                           : "stable_adamw",
             schedule_unit_name(o.schedule_unit));
  PB_REQUIRE(std::isfinite(c.log.peak_tflops) && c.log.peak_tflops >= 0,
             "log.peak_tflops ({}) must be finite and >= 0 (0: the table of known GPUs)",
             c.log.peak_tflops);
  const auto& d = c.data;
  PB_REQUIRE(d.prefetch_steps >= 1, "data.prefetch_steps ({}) must be >= 1", d.prefetch_steps);
  if (d.masking == MaskingMode::dynamic) {
    PB_REQUIRE(!d.vocab.empty(),
               "data.masking = \"dynamic\" needs data.vocab (the special "
               "tokens and the words a masked token may become)");
    try {
      mask_rule(d.mlm_probability, static_cast<int>(c.train.max_predictions_per_seq), d.mask_count,
                d.whole_word_masking, d.mask_token_share, d.random_token_share);
    } catch (const Error& e) {
      PB_THROW(
          "[data] dynamic masking (data.mlm_probability, data.mask_token_share, "
          "data.random_token_share, train.max_predictions_per_seq): {}",
          e.what());
    }
  } else {
    const TrainConfig::Data defaults;
    PB_REQUIRE(d.mlm_probability == defaults.mlm_probability &&
                   d.mask_count == defaults.mask_count &&
                   d.whole_word_masking == defaults.whole_word_masking &&
                   d.mask_token_share == defaults.mask_token_share &&
                   d.random_token_share == defaults.random_token_share,
               "data.mlm_probability, data.mask_count, data.whole_word_masking, "
               "data.mask_token_share and data.random_token_share apply to data.masking = "
               "\"dynamic\"; with \"static\" the shards' masks are used");
  }
  PB_REQUIRE(d.shuffle_block_rows >= 1, "data.shuffle_block_rows ({}) must be >= 1",
             d.shuffle_block_rows);
  PB_REQUIRE(d.shuffle_window_blocks >= 1, "data.shuffle_window_blocks ({}) must be >= 1",
             d.shuffle_window_blocks);
  PB_REQUIRE(d.read_ahead_windows >= 0, "data.read_ahead_windows ({}) must be >= 0",
             d.read_ahead_windows);

  const auto& k = c.checkpoint;
  PB_REQUIRE(k.every_steps >= 0, "checkpoint.every_steps ({}) must be >= 0", k.every_steps);
  PB_REQUIRE(k.keep >= 1, "checkpoint.keep ({}) must be >= 1", k.keep);
  PB_REQUIRE(k.resume != "auto" || !k.dir.empty(),
             "checkpoint.resume = \"auto\" needs checkpoint.dir");
  PB_REQUIRE(k.every_steps == 0 || !k.dir.empty(),
             "checkpoint.every_steps ({}) needs checkpoint.dir", k.every_steps);
  PB_REQUIRE(!k.overwrite || !k.dir.empty(), "checkpoint.overwrite = true needs checkpoint.dir");
  PB_REQUIRE(!k.overwrite || k.resume.empty(),
             "checkpoint.overwrite = true deletes the checkpoints under checkpoint.dir, and "
             "checkpoint.resume = \"{}\" continues one: give one of the two",
             k.resume);

  const auto& e = c.eval;
  PB_REQUIRE(e.every_samples >= 0, "eval.every_samples ({}) must be >= 0", e.every_samples);
  PB_REQUIRE(e.max_samples >= 0, "eval.max_samples ({}) must be >= 0 (0 = all)", e.max_samples);
  PB_REQUIRE(e.batch_size >= 1, "eval.batch_size ({}) must be >= 1", e.batch_size);
  PB_REQUIRE(e.target_accuracy >= 0 && e.target_accuracy <= 1,
             "eval.target_accuracy ({}) must be in [0, 1] (0 = no target)", e.target_accuracy);

  const auto& l = c.log;
  PB_REQUIRE(l.every_steps >= 1, "log.every_steps ({}) must be >= 1", l.every_steps);
  PB_REQUIRE(std::find(bert_preset_names().begin(), bert_preset_names().end(), m.preset) !=
                 bert_preset_names().end(),
             "model.preset: unknown value '{}' (expected one of {})", m.preset,
             fmt::join(bert_preset_names(), " | "));

  if (!check_paths) return;
  auto need = [](const std::string& key, const std::string& p, const char* why) {
    PB_REQUIRE(!p.empty(), "{} is not set ({})", key, why);
    PB_REQUIRE(path_exists(p), "{} = \"{}\" does not exist ({})", key, p, why);
  };
  if (purpose == ConfigPurpose::train) {
    need("data.train_dir", d.train_dir, "training shards");
    need("data.vocab", d.vocab, "vocabulary");
    if (c.eval_enabled())
      need("data.eval_dir", d.eval_dir,
           "evaluation is on; switch it off with eval.at_end=false, eval.every_samples=0 and "
           "eval.target_accuracy=0");
    if (!k.init_checkpoint.empty())
      need("checkpoint.init_checkpoint", k.init_checkpoint, "initial weights");
    if (!k.resume.empty() && k.resume != "auto")
      need("checkpoint.resume", k.resume, "checkpoint to resume from");
  } else {
    need("data.eval_dir", d.eval_dir, "evaluation shards");
    if (!k.init_checkpoint.empty())
      need("checkpoint.init_checkpoint", k.init_checkpoint, "weights to evaluate");
    if (!k.resume.empty() && k.resume != "auto")
      need("checkpoint.resume", k.resume, "checkpoint to evaluate");
  }
}

}  // namespace packbert
