#include "data/masking/masking.h"

#include <algorithm>
#include <cmath>

#include "data/prepare/tokenizer.h"
#include "kernels/base/error.h"

namespace packbert {

MaskRule mask_rule(double probability, int max_predictions, MaskCount count, bool whole_word,
                   double mask_share, double random_share) {
  PB_REQUIRE(std::isfinite(probability) && probability > 0 && probability <= 1,
             "masking: probability {} must be in (0, 1]", probability);
  PB_REQUIRE(max_predictions >= 1, "masking: max_predictions {} must be >= 1", max_predictions);
  PB_REQUIRE(mask_share >= 0 && random_share >= 0 && mask_share + random_share <= 1,
             "masking: the [MASK] share {} and the random share {} must be >= 0 and add to at "
             "most 1",
             mask_share, random_share);
  MaskRule r;
  r.probability = probability;
  r.max_predictions = max_predictions;
  r.count = count;
  r.whole_word = whole_word;
  r.mask_share = mask_share;
  const double rest = 1.0 - mask_share;
  r.keep_of_rest = rest > 0 ? (rest - random_share) / rest : 1.0;
  return r;
}

MaskVocab mask_vocab(const Vocab& vocab) {
  MaskVocab m;
  m.mask_id = vocab.mask_id();
  const auto n = static_cast<int32_t>(vocab.size());
  m.is_continuation.assign(static_cast<size_t>(n), 0);
  m.is_special.assign(static_cast<size_t>(n), 0);
  for (int32_t id : {vocab.pad_id(), vocab.cls_id(), vocab.sep_id(), vocab.mask_id()})
    m.is_special[static_cast<size_t>(id)] = 1;
  for (int32_t id = 0; id < n; ++id) {
    m.is_continuation[static_cast<size_t>(id)] = vocab.token(id).rfind("##", 0) == 0;
    if (!m.is_special[static_cast<size_t>(id)]) m.random_words.push_back(id);
  }
  return m;
}

void mask_positions(const MaskRule& rule, const MaskVocab& vocab, int tokens, Rng& rng, Sample& s,
                    MaskScratch& scratch) {
  const auto& cand = scratch.candidates;
  auto& group_begin = scratch.group_begin;
  group_begin.clear();
  for (size_t c = 0; c < cand.size(); ++c) {
    const int32_t i = cand[c];
    const bool joins = rule.whole_word && c > 0 && cand[c - 1] == i - 1 &&
                       vocab.is_continuation[static_cast<size_t>(s.input_ids[i])];
    if (!joins) group_begin.push_back(static_cast<int32_t>(c));
  }
  const int num_groups = static_cast<int>(group_begin.size());
  group_begin.push_back(static_cast<int32_t>(cand.size()));

  // Python's round() rounds half to even, as nearbyint does in the default rounding mode.
  const bool fixed = rule.count == MaskCount::fixed;
  const int num_to_predict =
      fixed ? std::min(rule.max_predictions,
                       std::max(1, static_cast<int>(std::nearbyint(tokens * rule.probability))))
            : rule.max_predictions;

  // Google shuffles all groups, then takes them in order, skipping a group that would exceed
  // num_to_predict. A Fisher-Yates shuffle done lazily (stopping once enough are chosen) gives
  // the same distribution without shuffling the tail that is never looked at.
  auto& order = scratch.group_order;
  order.resize(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) order[static_cast<size_t>(g)] = g;
  auto& chosen = scratch.chosen;
  chosen.clear();
  for (int k = 0; k < num_groups && static_cast<int>(chosen.size()) < num_to_predict; ++k) {
    const int j = k + static_cast<int>(rng.below(static_cast<uint64_t>(num_groups - k)));
    std::swap(order[static_cast<size_t>(k)], order[static_cast<size_t>(j)]);
    if (!fixed && !(rng.uniform() < rule.probability)) continue;
    const int g = order[static_cast<size_t>(k)];
    const int size = group_begin[static_cast<size_t>(g) + 1] - group_begin[static_cast<size_t>(g)];
    if (static_cast<int>(chosen.size()) + size > num_to_predict) continue;
    for (int c = group_begin[static_cast<size_t>(g)]; c < group_begin[static_cast<size_t>(g) + 1];
         ++c)
      chosen.push_back(cand[static_cast<size_t>(c)]);
  }
  std::sort(chosen.begin(), chosen.end());

  s.masked_lm_positions.assign(chosen.begin(), chosen.end());
  s.masked_lm_ids.resize(chosen.size());
  for (size_t k = 0; k < chosen.size(); ++k) s.masked_lm_ids[k] = s.input_ids[chosen[k]];
  // The 80/10/10 draws happen in position order here (Google: in shuffled order); each
  // position's draw is independent, so the distribution is the same.
  for (size_t k = 0; k < chosen.size(); ++k) {
    int32_t& token = s.input_ids[chosen[k]];
    if (rng.uniform() < rule.mask_share) {
      token = vocab.mask_id;
    } else if (rng.uniform() < rule.keep_of_rest) {
      // keep the original token
    } else {
      token = vocab.random_words[rng.below(vocab.random_words.size())];
    }
  }
}

void unmask(Sample& s) {
  for (size_t k = 0; k < s.masked_lm_positions.size(); ++k)
    s.input_ids[static_cast<size_t>(s.masked_lm_positions[k])] = s.masked_lm_ids[k];
  s.masked_lm_positions.clear();
  s.masked_lm_ids.clear();
}

void mask_dynamic(const MaskRule& rule, const MaskVocab& vocab, uint64_t seed, uint64_t epoch,
                  uint64_t index, Sample& s, MaskScratch& scratch) {
  unmask(s);
  auto& cand = scratch.candidates;
  cand.clear();
  for (size_t i = 0; i < s.input_ids.size(); ++i) {
    const auto id = static_cast<size_t>(s.input_ids[i]);
    PB_REQUIRE(id < vocab.is_special.size(),
               "masking: sample {} token {} has id {} outside the "
               "vocabulary of {}",
               s.id, i, id, vocab.is_special.size());
    if (!vocab.is_special[id]) cand.push_back(static_cast<int32_t>(i));
  }
  Rng rng(seed, {kRngDynamicMask, epoch, index});
  mask_positions(rule, vocab, static_cast<int>(s.input_ids.size()), rng, s, scratch);
}

}  // namespace packbert
