// Masked-LM masking of one sample: which positions the model predicts and what it reads there.
// `packbert prepare` draws it once into the shards (static masking); the trainer's dynamic
// masking draws it again each time a sample is served, from a stream keyed by (seed, epoch, the
// sample's global index), so that the masks depend on nothing else.
//
// mask_positions is Google's create_masked_lm_predictions: candidates in whole-word groups (a
// "##" piece joins the piece before it), a count per sample min(max_predictions, max(1,
// round(p * tokens))) taken from the groups in random order, skipping a group that would pass
// it; or, with MaskCount::bernoulli, each group taken with probability p (Hugging Face's
// DataCollatorForLanguageModeling) up to max_predictions. Each chosen position then reads
// [MASK] (u < mask_share), itself (else u' < keep_of_rest) or a random word.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/masking/keyed_rng.h"
#include "data/shards/sample.h"

namespace packbert {

enum class MaskCount { fixed, bernoulli };

struct MaskRule {
  double probability = 0.15;
  int max_predictions = 20;
  MaskCount count = MaskCount::fixed;
  bool whole_word = false;
  double mask_share = 0.8;    // [MASK]
  double keep_of_rest = 0.5;  // of the others, kept; the rest a random word
};

// A rule from the shares of the three outcomes (mask + random <= 1; kept: the rest).
MaskRule mask_rule(double probability, int max_predictions, MaskCount count, bool whole_word,
                   double mask_share, double random_share);

// What masking needs of a vocabulary, per token id.
struct MaskVocab {
  int32_t mask_id = 103;
  std::vector<uint8_t> is_continuation;  // starts with "##"
  std::vector<uint8_t> is_special;       // never masked, never drawn as a random word
  std::vector<int32_t> random_words;     // every id that is not special
};

class Vocab;
// The vocabulary's: the special tokens are [PAD], [CLS], [SEP] and [MASK] (what `prepare` never
// draws as a random word either); [UNK] and the [unusedN] entries are ordinary tokens.
MaskVocab mask_vocab(const Vocab& vocab);

// Reusable buffers (no allocation per sample once warm, beyond the Sample's own).
struct MaskScratch {
  std::vector<int32_t> candidates;   // positions that may be masked, ascending
  std::vector<int32_t> group_begin;  // candidates[group_begin[g] .. group_begin[g+1]) = group g
  std::vector<int32_t> group_order;  // shuffled group indices
  std::vector<int32_t> chosen;       // chosen positions
};

// Masks s at scratch.candidates (ascending positions of s.input_ids, which hold the original
// tokens); `tokens` is what the fixed count scales (Google: the whole sample, specials
// included). Writes s.masked_lm_positions, s.masked_lm_ids and the masked s.input_ids.
void mask_positions(const MaskRule& rule, const MaskVocab& vocab, int tokens, Rng& rng, Sample& s,
                    MaskScratch& scratch);

// The shard's masks undone: the original ids back at the masked positions, no masked position
// left.
void unmask(Sample& s);

// Dynamic masking of one served sample: unmask, then mask_positions over every position whose
// id is not special, with the stream Rng(seed, {kRngDynamicMask, epoch, index}).
constexpr uint64_t kRngDynamicMask = 6;  // the key domains of data/prepare/instances.h, continued
void mask_dynamic(const MaskRule& rule, const MaskVocab& vocab, uint64_t seed, uint64_t epoch,
                  uint64_t index, Sample& s, MaskScratch& scratch);

}  // namespace packbert
