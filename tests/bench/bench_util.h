// Helpers of the model benchmarks. Synthetic pretraining samples: lengths drawn from the MLPerf
// Wikipedia length histogram (tests/data/wikipedia-seqlen-histogram-512.txt), random token ids,
// segment B after the middle, and 15% of the tokens masked (at most 20 at max_len 128, 76 at
// 512, as in MLPerf's data). Token values do not change a step's time; lengths do.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "data/packing/packing.h"
#include "data/shards/sample.h"

namespace packbert::bench {

// The histogram file in the repository (benchmarks get PACKBERT_REPO_DATA from CMake).
inline std::string default_histogram_path(const std::string& repo_data) {
  return repo_data + "/../tests/data/wikipedia-seqlen-histogram-512.txt";
}

inline int max_predictions_for(int max_len) { return max_len <= 128 ? 20 : 76; }

inline Sample make_sample(std::mt19937_64& rng, int64_t id, int len, int max_predictions,
                          int64_t vocab) {
  Sample s;
  s.id = id;
  std::uniform_int_distribution<int32_t> tok(999, static_cast<int32_t>(vocab - 1));
  const int len_a = std::max(1, len / 2);
  for (int i = 0; i < len; ++i) {
    s.input_ids.push_back(i == 0 ? 101 : tok(rng));
    s.segment_ids.push_back(i > len_a ? 1 : 0);
  }
  const int masked = std::min(max_predictions, std::max(1, (len * 15 + 50) / 100));
  std::vector<int32_t> pos;
  for (int i = 1; i < len; ++i) pos.push_back(i);
  std::shuffle(pos.begin(), pos.end(), rng);
  pos.resize(std::min<size_t>(pos.size(), static_cast<size_t>(masked)));
  std::sort(pos.begin(), pos.end());
  for (int32_t p : pos) {
    s.masked_lm_positions.push_back(p);
    s.masked_lm_ids.push_back(tok(rng));
  }
  s.next_sentence_label = static_cast<int8_t>(rng() & 1);
  return s;
}

// Samples with lengths drawn from the histogram (clipped to [2, max_len]) until the tokens
// reach `tokens` (tokens > 0) or there are `count` samples (count > 0).
// "a,b,,c" -> {"a", "b", "c"} (command-line lists).
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

inline std::vector<Sample> draw_samples(std::mt19937_64& rng, const LengthHistogram& h, int max_len,
                                        int64_t tokens, int64_t count, int64_t vocab) {
  std::discrete_distribution<int> length(h.counts.begin(), h.counts.end());
  std::vector<Sample> out;
  int64_t total = 0;
  const int max_predictions = max_predictions_for(max_len);
  while ((tokens > 0 && total < tokens) ||
         (count > 0 && static_cast<int64_t>(out.size()) < count)) {
    const int len = std::clamp(length(rng), 2, max_len);
    out.push_back(make_sample(rng, static_cast<int64_t>(out.size()), len, max_predictions, vocab));
    total += len;
  }
  return out;
}

}  // namespace packbert::bench
