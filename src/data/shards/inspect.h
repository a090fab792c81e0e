// `packbert inspect`: validate shards and summarise them.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "data/shards/sample.h"
#include "data/shards/shard.h"

namespace packbert {

struct InspectReport {
  int64_t shards = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t masked_tokens = 0;
  int64_t next_random = 0;  // next_sentence_label == 1
  int min_len = 0, max_len = 0;
  double mean_len = 0, median_len = 0;
  int file_max_len = 0;                   // L of fixed shards, else the longest sample
  double padding_fraction = 0;            // 1 - tokens / (samples * file_max_len)
  std::vector<int64_t> length_histogram;  // [file_max_len + 1]
  std::vector<int64_t> masked_histogram;  // count of samples by number of masked tokens
  // How the shards were made (ShardMeta), each distinct record once with its shard count;
  // shards that record nothing (MLPerf's, NVIDIA's) count under recorded = false.
  std::vector<std::pair<ShardMeta, int64_t>> made_with;
  int64_t bad_samples = 0;                // skipped (only with skip_bad_samples)
  std::vector<std::string> bad_examples;  // the first few skipped samples' errors
};

// Reads every shard under path (file or directory) with full validation. A sample that breaks a
// rule is an error, unless skip_bad_samples: then it is counted, its error kept (the first few),
// and the summary covers the valid samples. Unreadable files are errors either way.
InspectReport inspect_shards(const std::string& path, const SampleRules& rules,
                             bool skip_bad_samples = false);
void print_inspect_report(const InspectReport& r, std::ostream& os);

}  // namespace packbert
