// `packbert inspect`: validate shards and summarise them.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "data/sample.h"

namespace packbert {

struct InspectReport {
  int64_t shards = 0;
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t masked_tokens = 0;
  int64_t next_random = 0;          // next_sentence_label == 1
  int min_len = 0, max_len = 0;
  double mean_len = 0, median_len = 0;
  int file_max_len = 0;             // L of fixed shards, else the longest sample
  double padding_fraction = 0;      // 1 - tokens / (samples * file_max_len)
  std::vector<int64_t> length_histogram;  // [file_max_len + 1]
  std::vector<int64_t> masked_histogram;  // count of samples by number of masked tokens
};

// Reads every shard under path (file or directory) with full validation.
InspectReport inspect_shards(const std::string& path, const SampleRules& rules);
void print_inspect_report(const InspectReport& r, std::ostream& os);

}  // namespace packbert
