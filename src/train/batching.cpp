#include "train/batching.h"

#include <algorithm>
#include <unordered_set>

#include "kernels/common/philox.h"
#include "kernels/base/error.h"

namespace packbert {

namespace {

void check_sample_shape(const Sample& s, size_t index, int max_seq_len) {
  const int len = s.length();
  PB_REQUIRE(len >= 1 && len <= max_seq_len,
             "batch: sample {} (id {}) has {} tokens, outside 1..{} (max_seq_len)", index, s.id,
             len, max_seq_len);
  PB_REQUIRE(s.segment_ids.size() == s.input_ids.size(),
             "batch: sample {} (id {}) has {} segment ids for {} tokens", index, s.id,
             s.segment_ids.size(), len);
  PB_REQUIRE(s.masked_lm_ids.size() == s.masked_lm_positions.size(),
             "batch: sample {} (id {}) has {} masked ids for {} masked positions", index, s.id,
             s.masked_lm_ids.size(), s.masked_lm_positions.size());
  for (size_t i = 0; i < s.masked_lm_positions.size(); ++i) {
    const int32_t p = s.masked_lm_positions[i];
    PB_REQUIRE(p >= 0 && p < len && (i == 0 || p > s.masked_lm_positions[i - 1]),
               "batch: sample {} (id {}): masked_lm_positions[{}] = {} is outside the sequence "
               "(length {}) or not ascending",
               index, s.id, i, p, len);
  }
  PB_REQUIRE(s.next_sentence_label == 0 || s.next_sentence_label == 1,
             "batch: sample {} (id {}) has next_sentence_label {}", index, s.id,
             static_cast<int>(s.next_sentence_label));
  PB_REQUIRE(s.id >= 0 && static_cast<uint64_t>(s.id) < kDropoutMaxSampleId,
             "batch: sample {} has id {}, outside the dropout key range [0, 2^44)", index, s.id);
}

// Where each sample's first token goes, in layout order, and the row count.
struct Placement {
  std::vector<size_t> order;   // sample indices in layout order
  std::vector<int64_t> start;  // row of each (in `order` order)
  int64_t rows = 0;
};

Placement place_packs(const std::vector<Sample>& samples,
                      const std::vector<std::vector<int32_t>>& packs, int max_seq_len) {
  Placement p;
  std::vector<char> seen(samples.size(), 0);
  for (size_t k = 0; k < packs.size(); ++k) {
    int64_t at = static_cast<int64_t>(k) * max_seq_len;
    const int64_t end = at + max_seq_len;
    PB_REQUIRE(!packs[k].empty(), "batch: pack {} is empty", k);
    for (int32_t i : packs[k]) {
      PB_REQUIRE(i >= 0 && static_cast<size_t>(i) < samples.size() && !seen[i],
                 "batch: pack {} names sample index {} (of {}) that is unknown or already packed",
                 k, i, samples.size());
      seen[i] = 1;
      p.order.push_back(static_cast<size_t>(i));
      p.start.push_back(at);
      at += samples[i].length();
    }
    PB_REQUIRE(at <= end, "batch: pack {} holds {} tokens, more than max_seq_len {}", k,
               at - (end - max_seq_len), max_seq_len);
  }
  PB_REQUIRE(p.order.size() == samples.size(), "batch: the packs hold {} of the {} samples",
             p.order.size(), samples.size());
  p.rows = static_cast<int64_t>(packs.size()) * max_seq_len;
  return p;
}

}  // namespace

Batch make_batch(const std::vector<Sample>& samples, BatchLayout layout, int max_seq_len,
                 const std::vector<std::vector<int32_t>>& packs) {
  PB_REQUIRE(max_seq_len >= 1, "batch: max_seq_len {} must be >= 1", max_seq_len);
  std::unordered_set<int64_t> ids;
  for (size_t i = 0; i < samples.size(); ++i) {
    check_sample_shape(samples[i], i, max_seq_len);
    // Equal ids would draw equal dropout masks: a data bug, never a legitimate batch.
    PB_REQUIRE(ids.insert(samples[i].id).second, "batch: sample id {} appears twice",
               samples[i].id);
  }

  Placement place;
  switch (layout) {
    case BatchLayout::unpadded:
      for (size_t i = 0; i < samples.size(); ++i) {
        place.order.push_back(i);
        place.start.push_back(place.rows);
        place.rows += samples[i].length();
      }
      break;
    case BatchLayout::padded:
      for (size_t i = 0; i < samples.size(); ++i) {
        place.order.push_back(i);
        place.start.push_back(static_cast<int64_t>(i) * max_seq_len);
      }
      place.rows = static_cast<int64_t>(samples.size()) * max_seq_len;
      break;
    case BatchLayout::packed:
      // Packing is the planner's: a packed batch lays out the loader's packs, never its own.
      PB_REQUIRE(!packs.empty() || samples.empty(),
                 "batch: the packed layout needs the packs of the loader / planner "
                 "(LoaderMicroBatch::packs), got {} samples and no packs",
                 samples.size());
      place = place_packs(samples, packs, max_seq_len);
      break;
  }
  PB_REQUIRE(place.rows <= INT32_MAX, "batch: {} rows do not fit i32 row indices", place.rows);

  Batch b;
  b.layout = layout;
  b.max_seq_len = max_seq_len;
  b.rows = place.rows;
  b.input_ids.assign(b.rows, 0);
  b.segment_ids.assign(b.rows, 0);
  b.token_seq.assign(b.rows, -1);
  b.token_pos.assign(b.rows, 0);
  for (size_t k = 0; k < place.order.size(); ++k) {
    const Sample& s = samples[place.order[k]];
    const auto start = static_cast<int32_t>(place.start[k]);
    const auto seq = static_cast<int32_t>(k);
    b.seq_start.push_back(start);
    b.seq_len.push_back(s.length());
    b.sample_id.push_back(s.id);
    b.nsp_labels.push_back(s.next_sentence_label);
    b.max_len = std::max(b.max_len, static_cast<int32_t>(s.length()));
    for (int32_t p = 0; p < s.length(); ++p) {
      b.input_ids[start + p] = s.input_ids[p];
      b.segment_ids[start + p] = s.segment_ids[p];
      b.token_seq[start + p] = seq;
      b.token_pos[start + p] = p;
    }
    for (size_t i = 0; i < s.masked_lm_positions.size(); ++i) {
      b.masked_rows.push_back(start + s.masked_lm_positions[i]);
      b.masked_labels.push_back(s.masked_lm_ids[i]);
    }
  }
  return b;
}

}  // namespace packbert
