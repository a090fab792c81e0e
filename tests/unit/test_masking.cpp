// Masked-LM masking (data/masking/masking.h) and dynamic masking: the counts and shares against
// derived bounds over large draws, special tokens never masked or drawn, whole words together,
// the masks a pure function of (seed, epoch, index), unmask restoring the shard's tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "data/masking/masking.h"
#include "data/prepare/tokenizer.h"
#include "measure.h"
#include "test_util.h"

namespace packbert::test {
namespace {

const MaskVocab& vocab() {
  static const MaskVocab v =
      mask_vocab(Vocab::load(std::string(PACKBERT_REPO_DATA) + "/vocab.txt"));
  return v;
}

// [CLS] tokens [SEP] tokens [SEP] of random ordinary ids (continuations included), unmasked.
Sample plain_sample(std::mt19937_64& rng, int len, int64_t id) {
  const MaskVocab& v = vocab();
  Sample s;
  s.id = id;
  std::uniform_int_distribution<size_t> word(0, v.random_words.size() - 1);
  for (int i = 0; i < len; ++i) s.input_ids.push_back(v.random_words[word(rng)]);
  s.input_ids.front() = 101;
  s.input_ids[static_cast<size_t>(len / 2)] = 102;
  s.input_ids.back() = 102;
  s.segment_ids.assign(static_cast<size_t>(len), 0);
  return s;
}

// Six standard deviations of a binomial share: a correct draw passes with probability
// 1 - 2e-9 per check.
double six_sigma(double p, double n) { return 6.0 * std::sqrt(p * (1.0 - p) / n); }

struct Outcomes {
  double candidates = 0, chosen = 0, masked = 0, kept = 0, random = 0;
};

// Masks every sample of `samples` (copies) with `rule` at epoch 0 and counts what happened,
// checking each sample's invariants on the way.
Outcomes draw(const std::vector<Sample>& samples, const MaskRule& rule, uint64_t seed) {
  const MaskVocab& v = vocab();
  Outcomes o;
  MaskScratch scratch;
  for (const Sample& original : samples) {
    Sample s = original;
    mask_dynamic(rule, v, seed, 0, static_cast<uint64_t>(s.id), s, scratch);
    int candidates = 0;
    for (int32_t id : original.input_ids)
      candidates += v.is_special[static_cast<size_t>(id)] ? 0 : 1;
    o.candidates += candidates;
    o.chosen += s.num_masked();
    EXPECT_LE(s.num_masked(), rule.max_predictions);
    if (rule.count == MaskCount::fixed && !rule.whole_word) {
      const int want = std::min(
          rule.max_predictions,
          std::max(1, static_cast<int>(std::nearbyint(original.length() * rule.probability))));
      EXPECT_EQ(s.num_masked(), std::min(want, candidates)) << "sample " << s.id;
    }
    for (size_t k = 0; k < s.masked_lm_positions.size(); ++k) {
      const auto pos = static_cast<size_t>(s.masked_lm_positions[k]);
      const int32_t was = original.input_ids[pos], now = s.input_ids[pos];
      EXPECT_FALSE(v.is_special[static_cast<size_t>(was)]) << "special token masked at " << pos;
      EXPECT_EQ(s.masked_lm_ids[k], was);
      if (now == v.mask_id) {
        o.masked += 1;
      } else if (now == was) {
        o.kept += 1;
      } else {
        o.random += 1;
        EXPECT_FALSE(v.is_special[static_cast<size_t>(now)]) << "drew special id " << now;
      }
    }
    for (size_t i = 0; i < s.input_ids.size(); ++i) {  // nothing else changed
      const bool masked = std::binary_search(s.masked_lm_positions.begin(),
                                             s.masked_lm_positions.end(), static_cast<int32_t>(i));
      if (!masked) {
        EXPECT_EQ(s.input_ids[i], original.input_ids[i]);
      }
    }
  }
  return o;
}

std::vector<Sample> corpus(std::mt19937_64& rng, int n) {
  std::vector<Sample> out;
  std::uniform_int_distribution<int> len(8, 128);
  for (int i = 0; i < n; ++i) out.push_back(plain_sample(rng, len(rng), i));
  return out;
}

// The 80/10/10 split among the chosen positions: a random word equal to the original reads as
// kept, with probability 1 / |random_words| each, so the observed kept share is
// keep + random / W.
void expect_split(const Outcomes& o, const MaskRule& rule, const std::string& what) {
  const double w = static_cast<double>(vocab().random_words.size());
  const double random_share = (1 - rule.mask_share) * (1 - rule.keep_of_rest);
  const double keep_share = (1 - rule.mask_share) * rule.keep_of_rest + random_share / w;
  expect_bound(what + ": [MASK] share - mask_share",
               std::abs(o.masked / o.chosen - rule.mask_share),
               six_sigma(rule.mask_share, o.chosen));
  expect_bound(what + ": kept share - its expectation", std::abs(o.kept / o.chosen - keep_share),
               six_sigma(keep_share, o.chosen));
}

TEST(Masking, FixedCountAndSplitOverALargeDraw) {
  std::mt19937_64 rng(test_seed());
  const auto samples = corpus(rng, 4000);
  const MaskRule rule = mask_rule(0.15, 20, MaskCount::fixed, false, 0.8, 0.1);
  const Outcomes o = draw(samples, rule, rng());
  std::printf("fixed: %.0f chosen of %.0f candidates\n", o.chosen, o.candidates);
  expect_split(o, rule, "fixed 15%");
}

TEST(Masking, BernoulliShareOverALargeDraw) {
  std::mt19937_64 rng(test_seed());
  const auto samples = corpus(rng, 4000);
  // ModernBERT's 30%, the cap out of reach (at most 128 candidates).
  const MaskRule rule = mask_rule(0.3, 128, MaskCount::bernoulli, false, 0.8, 0.1);
  const Outcomes o = draw(samples, rule, rng());
  expect_bound("bernoulli 30%: chosen share - p", std::abs(o.chosen / o.candidates - 0.3),
               six_sigma(0.3, o.candidates));
  expect_split(o, rule, "bernoulli 30%");
}

TEST(Masking, WholeWordsAreMaskedTogether) {
  std::mt19937_64 rng(test_seed());
  const MaskVocab& v = vocab();
  std::vector<int32_t> heads, pieces;
  for (int32_t id : v.random_words)
    (v.is_continuation[static_cast<size_t>(id)] ? pieces : heads).push_back(id);
  MaskScratch scratch;
  for (MaskCount count : {MaskCount::fixed, MaskCount::bernoulli}) {
    const MaskRule rule = mask_rule(0.3, 40, count, true, 0.8, 0.1);
    for (int n = 0; n < 500; ++n) {
      Sample s = plain_sample(rng, 64, n);
      for (size_t i = 1; i + 1 < s.input_ids.size(); ++i)  // about a third are "##" pieces
        if (s.input_ids[i] != 102 && rng() % 3 == 0) s.input_ids[i] = pieces[rng() % pieces.size()];
      const Sample original = s;
      mask_dynamic(rule, v, 7, 0, static_cast<uint64_t>(n), s, scratch);
      std::vector<uint8_t> masked(s.input_ids.size(), 0);
      for (int32_t p : s.masked_lm_positions) masked[static_cast<size_t>(p)] = 1;
      for (size_t i = 1; i < s.input_ids.size(); ++i)
        if (v.is_continuation[static_cast<size_t>(original.input_ids[i])] &&
            !v.is_special[static_cast<size_t>(original.input_ids[i - 1])]) {
          EXPECT_EQ(masked[i], masked[i - 1]) << "a word split at " << i << " of sample " << n;
        }
    }
  }
}

TEST(Masking, AFunctionOfSeedEpochAndIndexOnly) {
  std::mt19937_64 rng(test_seed());
  const MaskRule rule = mask_rule(0.15, 20, MaskCount::fixed, false, 0.8, 0.1);
  const MaskVocab& v = vocab();
  MaskScratch scratch;
  int differ = 0;
  for (int n = 0; n < 200; ++n) {
    const Sample original = plain_sample(rng, 96, n);
    Sample a = original, b = original, c = original;
    mask_dynamic(rule, v, 11, 3, 40 + static_cast<uint64_t>(n), a, scratch);
    // Masked twice (as a shard's static masks, then the served draw): the same as once.
    mask_dynamic(rule, v, 99, 0, 1, b, scratch);
    mask_dynamic(rule, v, 11, 3, 40 + static_cast<uint64_t>(n), b, scratch);
    EXPECT_EQ(a, b);
    // Another epoch draws other positions (14 of 93: the same set has probability 1e-16).
    mask_dynamic(rule, v, 11, 4, 40 + static_cast<uint64_t>(n), c, scratch);
    differ += a.masked_lm_positions != c.masked_lm_positions;
    // unmask gives back the tokens.
    unmask(a);
    EXPECT_EQ(a.input_ids, original.input_ids);
    EXPECT_TRUE(a.masked_lm_positions.empty());
  }
  EXPECT_EQ(differ, 200);
}

TEST(Masking, RejectsBadRules) {
  EXPECT_THROW(mask_rule(0.0, 20, MaskCount::fixed, false, 0.8, 0.1), Error);
  EXPECT_THROW(mask_rule(1.5, 20, MaskCount::fixed, false, 0.8, 0.1), Error);
  EXPECT_THROW(mask_rule(0.15, 0, MaskCount::fixed, false, 0.8, 0.1), Error);
  EXPECT_THROW(mask_rule(0.15, 20, MaskCount::fixed, false, 0.8, 0.3), Error);
  const MaskRule r = mask_rule(0.15, 20, MaskCount::fixed, false, 1.0, 0.0);
  EXPECT_EQ(r.mask_share, 1.0);
}

}  // namespace
}  // namespace packbert::test
