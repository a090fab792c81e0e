#include "data/shards/sample.h"

#include <fmt/format.h>

namespace packbert {

std::string check_sample(const Sample& s, const SampleRules& r) {
  const int64_t len = s.length();
  if (len < 2) return fmt::format("input_ids: length {} is too short (need [CLS] ... [SEP])", len);
  if (r.max_seq_len > 0 && len > r.max_seq_len)
    return fmt::format("input_ids: length {} exceeds max_seq_len {}", len, r.max_seq_len);
  if (static_cast<int64_t>(s.segment_ids.size()) != len)
    return fmt::format("segment_ids: length {} differs from input_ids length {}",
                       s.segment_ids.size(), len);
  for (int64_t i = 0; i < len; ++i) {
    const int32_t t = s.input_ids[i];
    if (t < 0 || t >= r.vocab_size)
      return fmt::format("input_ids[{}] = {} is outside the vocabulary [0, {})", i, t,
                         r.vocab_size);
    if (s.segment_ids[i] != 0 && s.segment_ids[i] != 1)
      return fmt::format("segment_ids[{}] = {} is not 0 or 1", i, int(s.segment_ids[i]));
  }
  if (s.masked_lm_ids.size() != s.masked_lm_positions.size())
    return fmt::format("masked_lm_ids: {} entries but masked_lm_positions has {}",
                       s.masked_lm_ids.size(), s.masked_lm_positions.size());
  for (size_t j = 0; j < s.masked_lm_positions.size(); ++j) {
    const int32_t p = s.masked_lm_positions[j];
    if (p <= 0 || p >= len)
      return fmt::format("masked_lm_positions[{}] = {} is outside the sequence (1 .. {})", j, p,
                         len - 1);
    if (j > 0 && p <= s.masked_lm_positions[j - 1])
      return fmt::format("masked_lm_positions[{}] = {} is not above the previous position {}", j, p,
                         s.masked_lm_positions[j - 1]);
    if (s.input_ids[p] == r.cls_id || s.input_ids[p] == r.sep_id)
      return fmt::format("masked_lm_positions[{}] = {} points at a [CLS]/[SEP] token", j, p);
    const int32_t m = s.masked_lm_ids[j];
    if (m < 0 || m >= r.vocab_size)
      return fmt::format("masked_lm_ids[{}] = {} is outside the vocabulary [0, {})", j, m,
                         r.vocab_size);
  }
  if (s.next_sentence_label != 0 && s.next_sentence_label != 1)
    return fmt::format("next_sentence_labels = {} is not 0 or 1", int(s.next_sentence_label));
  return {};
}

}  // namespace packbert
