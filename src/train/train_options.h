// The one place that turns a train config (config/train_config.h) into the options of the code
// it drives: the model, the trainer (replica, LAMB, schedule, reducer, arena reserve), the
// loader and the sample rules. `packbert train` and `packbert eval` both take theirs from here,
// so the two cannot read a key differently. It lives in train, above config, because the
// trainer's options are train's; the model and the schedule, which the config's validation
// checks too, come from config/train_config_model.h (included here).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "config/train_config.h"
#include "config/train_config_model.h"  // model_config, lr_schedule_config
#include "data/loader/loader.h"
#include "data/prepare/corpus_tokenizer.h"
#include "data/shards/sample.h"
#include "model/config.h"
#include "optim/lamb.h"
#include "optim/lr_schedule.h"
#include "train/trainer.h"

namespace packbert {

// The model and the learning-rate schedule (model_config, lr_schedule_config) are the config's
// own, config/train_config_model.h: its validation checks them.

// check_finite and skip_nonfinite always on: the run counts the skipped steps against
// train.max_nonfinite_steps.
LambOptions lamb_options(const TrainConfig& c);
// global batch, micro-steps, seq/pack limits, seed, prefetch, shuffle, last_step; the sample
// rules' max_seq_len = train.max_seq_len, vocab_size = model_config(c).real_vocab_size.
LoaderOptions loader_options(const TrainConfig& c);
// One GPU's dense peak for train.precision, FLOP/s (MFU's denominator): log.peak_tflops when
// set, else the table of train/model_flops.h for CUDA device `cuda_device`; 0 on the CPU or for
// an unknown GPU (then no mfu is reported).
double device_peak(const TrainConfig& c, int cuda_device);
// data.vocab's tokenizer, read once for the two below; none when data.vocab is empty.
std::optional<CorpusTokenizer> data_tokenizer(const TrainConfig& c);
// data.masking = "dynamic": the rule and data.vocab's masking vocabulary (`tokenizer`, which the
// config requires then); none for "static".
std::shared_ptr<const LoaderOptions::Masking> dynamic_masking(const TrainConfig& c,
                                                              const CorpusTokenizer* tokenizer);

// Independent seeds for initialisation (salt 1) and dropout (salt 2) from train.seed
// (splitmix64 of a salt), so the streams never share a key. The data order uses train.seed.
uint64_t derive_seed(uint64_t seed, uint64_t salt);

// The micro-batch the trainer reserves its activation arena for (TrainerOptions::reserve): the
// planner's bound (data/packing/planner.h micro_batch_bound) in the config's layout, with
// masked tokens at most train.max_predictions_per_seq per sample. Under lpt / lpt-search the
// sample count is the count at max_seq_len, not a bound: a micro-batch of more, shorter samples
// may need a little more, and the arena then grows (ActivationReport::allocations counts).
BatchShape largest_micro_batch(const TrainConfig& c, int world);
// Whether that shape bounds every micro-batch (false under lpt / lpt-search: see above).
bool micro_batch_bound_strict(const TrainConfig& c, int world);

// Everything the Trainer takes, for a world of `world` ranks: model (`model`: the config's own,
// or a checkpoint's config.json for `packbert eval`), precision, MST, layout, seeds, schedule,
// LAMB, sharding, device (on CUDA, local rank r takes GPU r mod the count), gradient transport,
// and the arena reserve (largest_micro_batch, above).
TrainerOptions trainer_options(const TrainConfig& c, const BertConfig& model, int world);

// The sample rules of the data: the tokenizer's size and special ids (data.vocab's, `tokenizer`;
// Error when it has more tokens than the model's vocabulary), else the model's vocabulary size;
// and what shards that record their making must agree with (SampleRules).
SampleRules sample_rules(const TrainConfig& c, const BertConfig& model,
                         const CorpusTokenizer* tokenizer);

}  // namespace packbert
