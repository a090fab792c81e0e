#include "data/prepare/instances.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/base/error.h"

namespace packbert {

uint64_t Rng::mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed, std::initializer_list<uint64_t> key) {
  // Each key part goes through the finaliser before it is combined, so nearby keys (doc 7 and
  // doc 8) give unrelated starting states.
  uint64_t h = mix(seed + 0x632BE59BD9B4E019ull);
  for (uint64_t k : key) h = mix(h ^ mix(k + 0x9E3779B97F4A7C15ull));
  state_ = h;
}

uint64_t Rng::below(uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased, one multiplication in the common case.
  uint64_t x = next();
  unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      x = next();
      m = static_cast<unsigned __int128>(x) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

void DocumentStore::add_sentence(const uint16_t* ids, size_t n) {
  PB_CHECK(n > 0, "empty sentence");
  PB_REQUIRE(sentence_begin.size() < 0xFFFFFFFFull,
             "more than 4 billion sentences in one input file; split the file");
  tokens.insert(tokens.end(), ids, ids + n);
  sentence_begin.push_back(tokens.size());
}

void DocumentStore::end_document() {
  if (num_sentences() > doc_begin.back()) doc_begin.push_back(num_sentences());
}

size_t DocumentStore::memory_bytes() const {
  return tokens.capacity() * sizeof(uint16_t) + sentence_begin.capacity() * sizeof(uint64_t) +
         doc_begin.capacity() * sizeof(uint32_t);
}

size_t plan_document(const DocumentStore& docs, uint32_t doc, const uint32_t* pool,
                     size_t pool_size, const InstanceConfig& cfg, Rng structure, Rng random_doc,
                     std::vector<InstancePlan>* out) {
  // Google: "We *usually* want to fill up the entire sequence since we are padding to
  // max_seq_length anyways", but with short_seq_prob a shorter target, drawn once per document.
  const int64_t max_num_tokens = cfg.max_seq_len - 3;
  int64_t target = max_num_tokens;
  if (structure.uniform() < cfg.short_seq_prob) target = structure.between(2, max_num_tokens);

  const uint32_t first = docs.doc_begin[doc];
  const uint32_t last = docs.doc_begin[doc + 1];  // one past the document's last sentence
  size_t count = 0;
  uint32_t chunk_begin = first;
  int64_t chunk_tokens = 0;
  for (uint32_t i = first; i < last; ++i) {
    chunk_tokens += static_cast<int64_t>(docs.sentence_length(i));
    if (i + 1 != last && chunk_tokens < target) continue;
    // The chunk is sentences [chunk_begin, i]; A is its first a_end - chunk_begin of them.
    const uint32_t chunk_size = i + 1 - chunk_begin;
    uint32_t a_end = chunk_begin + 1;
    if (chunk_size >= 2)
      a_end = chunk_begin + static_cast<uint32_t>(structure.between(1, chunk_size - 1));
    const bool random_next = chunk_size == 1 || structure.uniform() < 0.5;
    if (random_next) {
      if (out) {
        const int64_t len_a =
            static_cast<int64_t>(docs.sentence_begin[a_end] - docs.sentence_begin[chunk_begin]);
        const int64_t target_b = target - len_a;
        // Up to 10 tries for a document other than this one, as Google does (with a pool of
        // one document, B comes from the same document, still labelled random).
        uint32_t rd = doc;
        for (int tries = 0; tries < 10; ++tries) {
          rd = pool[random_doc.below(pool_size)];
          if (rd != doc) break;
        }
        const uint32_t r_first = docs.doc_begin[rd], r_last = docs.doc_begin[rd + 1];
        const uint32_t b_begin =
            r_first + static_cast<uint32_t>(random_doc.below(r_last - r_first));
        uint32_t b_end = b_begin;
        int64_t len_b = 0;
        while (b_end < r_last) {
          len_b += static_cast<int64_t>(docs.sentence_length(b_end++));
          if (len_b >= target_b) break;
        }
        out->push_back({chunk_begin, a_end, b_begin, b_end, 1});
      }
      // "We didn't actually use these segments so we 'put them back' so they don't go to
      // waste": the next chunk starts right after A.
      i = a_end - 1;
    } else if (out) {
      out->push_back({chunk_begin, a_end, a_end, i + 1, 0});
    }
    ++count;
    chunk_begin = i + 1;
    chunk_tokens = 0;
  }
  return count;
}

void materialize(const DocumentStore& docs, const InstancePlan& plan, const InstanceConfig& cfg,
                 Rng rng, Sample& out, MaskScratch& scratch) {
  // truncate_seq_pair: trim the longer of A and B (B on a tie), one token at a time from the
  // front or the back with probability 0.5 each, so truncation does not favour either end.
  const uint64_t max_num_tokens = static_cast<uint64_t>(cfg.max_seq_len - 3);
  uint64_t a0 = docs.sentence_begin[plan.a_begin], a1 = docs.sentence_begin[plan.a_end];
  uint64_t b0 = docs.sentence_begin[plan.b_begin], b1 = docs.sentence_begin[plan.b_end];
  while ((a1 - a0) + (b1 - b0) > max_num_tokens) {
    const bool trim_a = (a1 - a0) > (b1 - b0);
    uint64_t& front = trim_a ? a0 : b0;
    uint64_t& back = trim_a ? a1 : b1;
    if (rng.coin())
      ++front;
    else
      --back;
  }
  const int len_a = static_cast<int>(a1 - a0), len_b = static_cast<int>(b1 - b0);
  PB_CHECK(len_a >= 1 && len_b >= 1, "empty segment after truncation (A {}, B {})", len_a, len_b);

  // [CLS] A [SEP] B [SEP]; segment 0 up to the first [SEP], 1 after it.
  const int len = len_a + len_b + 3;
  out.id = -1;
  out.input_ids.resize(len);
  out.segment_ids.assign(len, 0);
  out.input_ids[0] = cfg.cls_id;
  std::copy(docs.tokens.begin() + a0, docs.tokens.begin() + a1, out.input_ids.begin() + 1);
  out.input_ids[len_a + 1] = cfg.sep_id;
  std::copy(docs.tokens.begin() + b0, docs.tokens.begin() + b1, out.input_ids.begin() + len_a + 2);
  out.input_ids[len - 1] = cfg.sep_id;
  std::fill(out.segment_ids.begin() + len_a + 2, out.segment_ids.end(), int8_t{1});
  out.next_sentence_label = static_cast<int8_t>(plan.random_next ? 1 : 0);

  // create_masked_lm_predictions. Candidates are all positions but [CLS] and the two [SEP]s;
  // with whole-word masking a "##" piece joins the group of the position just before it.
  auto& cand = scratch.candidates;
  auto& group_begin = scratch.group_begin;
  cand.clear();
  group_begin.clear();
  for (int i = 1; i < len - 1; ++i) {
    if (i == len_a + 1) continue;  // the middle [SEP]
    const bool joins = cfg.whole_word_masking && !cand.empty() && cand.back() == i - 1 &&
                       cfg.is_continuation[out.input_ids[i]];
    if (!joins) group_begin.push_back(static_cast<int32_t>(cand.size()));
    cand.push_back(i);
  }
  const int num_groups = static_cast<int>(group_begin.size());
  group_begin.push_back(static_cast<int32_t>(cand.size()));

  // Python's round() rounds half to even, as nearbyint does in the default rounding mode.
  const int num_to_predict = std::min(
      cfg.max_predictions, std::max(1, static_cast<int>(std::nearbyint(len * cfg.masked_lm_prob))));

  // Google shuffles all groups, then takes them in order, skipping a group that would exceed
  // num_to_predict. A Fisher-Yates shuffle done lazily (stopping once enough are chosen) gives
  // the same distribution without shuffling the tail that is never looked at.
  auto& order = scratch.group_order;
  order.resize(num_groups);
  for (int g = 0; g < num_groups; ++g) order[g] = g;
  auto& chosen = scratch.chosen;
  chosen.clear();
  for (int k = 0; k < num_groups && static_cast<int>(chosen.size()) < num_to_predict; ++k) {
    const int j = k + static_cast<int>(rng.below(static_cast<uint64_t>(num_groups - k)));
    std::swap(order[k], order[j]);
    const int g = order[k];
    const int size = group_begin[g + 1] - group_begin[g];
    if (static_cast<int>(chosen.size()) + size > num_to_predict) continue;
    for (int c = group_begin[g]; c < group_begin[g + 1]; ++c) chosen.push_back(cand[c]);
  }
  std::sort(chosen.begin(), chosen.end());

  out.masked_lm_positions.assign(chosen.begin(), chosen.end());
  out.masked_lm_ids.resize(chosen.size());
  for (size_t k = 0; k < chosen.size(); ++k) out.masked_lm_ids[k] = out.input_ids[chosen[k]];
  // The 80/10/10 draws happen in position order here (Google: in shuffled order); each
  // position's draw is independent, so the distribution is the same.
  for (size_t k = 0; k < chosen.size(); ++k) {
    int32_t& token = out.input_ids[chosen[k]];
    if (rng.uniform() < 0.8) {
      token = cfg.mask_id;
    } else if (rng.uniform() < 0.5) {
      // keep the original token
    } else {
      token = cfg.random_words[rng.below(cfg.random_words.size())];
    }
  }
}

}  // namespace packbert
