// `packbert prepare`: raw text -> pretraining shards, with the semantics of Google's
// create_pretraining_data.py (NSP pairs, short_seq_prob, truncation, 80/10/10 MLM masking).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"

namespace packbert {

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, optionally .gz; one sentence per line,
                                    // documents separated by blank lines
  std::string vocab;
  std::string output_dir;
  int max_seq_len = 128;
  int max_predictions_per_seq = 20;
  double masked_lm_prob = 0.15;
  int dupe_factor = 10;
  double short_seq_prob = 0.1;
  uint64_t seed = 12345;
  int num_shards = 1;
  int64_t eval_samples = 0;         // samples written to the eval shard
  ShardFormat format = ShardFormat::Fixed;
  bool whole_word_masking = false;
  int threads = 0;                  // 0: hardware concurrency; output does not depend on it
};

struct PrepareStats {
  int64_t input_bytes = 0;
  int64_t documents = 0;
  int64_t train_samples = 0;
  int64_t eval_samples = 0;
  int64_t masked_tokens = 0;
  double seconds = 0;
  std::vector<std::string> train_shards;
  std::string eval_shard;
};

PrepareStats run_prepare(const PrepareOptions& opts);

}  // namespace packbert
