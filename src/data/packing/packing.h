// Histogram sequence packing (Krell et al., "Efficient Sequence Packing without
// Cross-contamination", arXiv 2107.02027) and an exact-fit packer of this project.
//
// Every algorithm works on a length histogram (how many sequences of each length 1..L), not on
// the sequences themselves, so it runs in milliseconds on a 16M-sample dataset. It returns pack
// strategies: a multiset of sequence lengths (summing to <= L, at most K of them) and how many
// packs follow it. assign_packs() then turns strategies plus the real (id, length) list into
// concrete packs of sample ids.
//
//   spfhp      shortest-pack-first: lengths longest first, each into the open pack with the
//              most space left (worst fit)
//   lpfhp      longest-pack-first: best fit, several copies of a length per pack at once
//   nnlshp     non-negative least squares over all exact-fill strategies of <= K sequences
//   exact-fit  exact-fit decreasing on counts, repriced, then repair (packing_exact_fit.cpp)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace packbert {

// counts[l] = number of sequences of length l, for l = 1..max_len; counts[0] is always 0 so that
// a length indexes its own count.
struct LengthHistogram {
  int max_len = 0;
  std::vector<int64_t> counts;

  LengthHistogram() = default;
  explicit LengthHistogram(int max_len);

  int64_t num_sequences() const;
  int64_t num_tokens() const;
  // Longest length with a non-zero count (0 when empty).
  int longest() const;
  bool operator==(const LengthHistogram& o) const {
    return max_len == o.max_len && counts == o.counts;
  }
};

// Text format of tests/data/wikipedia-seqlen-histogram-512.txt: lines starting with '#' are
// comments; the i-th remaining line holds the count of length i (a non-negative integer).
// Trailing blank lines are ignored; anything else malformed is an Error naming file and line.
// max_len of the result is the number of count lines.
LengthHistogram load_histogram(const std::string& path);

// Histogram of max_len lengths; a length outside 1..max_len is an Error.
LengthHistogram histogram_from_lengths(const std::vector<int>& lengths, int max_len);

// The same counts with max_len changed; an Error when a sequence longer than new_max_len exists.
LengthHistogram resize_histogram(const LengthHistogram& h, int new_max_len);

// One way to fill a pack: its sequence lengths, longest first, and how many packs use it.
struct PackStrategy {
  std::vector<int> lengths;
  int64_t repeat = 0;
};

// Limits every algorithm respects. max_seqs_per_pack <= 0 means no limit.
struct PackingLimits {
  int max_seq_len = 512;
  int max_seqs_per_pack = 3;
  // The limit as a number: L when there is none (a pack cannot hold more than L sequences).
  int effective_k() const { return max_seqs_per_pack > 0 ? max_seqs_per_pack : max_seq_len; }
};

struct PackingResult {
  std::string algorithm;
  PackingLimits limits;
  std::vector<PackStrategy> strategies;
  double runtime_ms = 0;  // the algorithm itself, not building the report
};

PackingResult pack_spfhp(const LengthHistogram& h, const PackingLimits& limits);
PackingResult pack_lpfhp(const LengthHistogram& h, const PackingLimits& limits);
PackingResult pack_nnlshp(const LengthHistogram& h, const PackingLimits& limits);
PackingResult pack_exact_fit(const LengthHistogram& h, const PackingLimits& limits);

// Names accepted by pack_with(): spfhp, lpfhp, nnlshp, exact-fit.
const std::vector<std::string>& packing_algorithms();
// For a former name of an algorithm, why it is refused: "packing algorithm 'ours' was renamed
// 'exact-fit'"; "" for any other name. A former name is not an alias: pack_with() and the pack
// command reject it with this message.
std::string renamed_packing_algorithm(const std::string& name);
PackingResult pack_with(const std::string& algorithm, const LengthHistogram& h,
                        const PackingLimits& limits);

// Number of exact-fill strategies NNLSHP enumerates (partitions of L into <= K parts), and the
// most it accepts: beyond it the solve would take minutes and gigabytes (L=512: K=4 is 0.9M,
// K=5 is 24M).
int64_t nnlshp_strategy_count(int max_seq_len, int max_seqs_per_pack);
constexpr int64_t kNnlshpMaxStrategies = 2'000'000;

struct PackingMetrics {
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t packs = 0;
  int max_seqs_in_pack = 0;     // the largest strategy actually used
  double efficiency = 0;        // tokens / (packs * L)
  double speedup = 0;           // over padding every sequence to L: sequences / packs
  double padding_fraction = 0;  // 1 - efficiency: share of pack slots that are padding
  double runtime_ms = 0;
};
PackingMetrics packing_metrics(const PackingResult& r);

// Throws Error unless every strategy respects L and K, has a positive repeat, and the strategies
// times their repeats hold exactly the sequences of h (each sequence packed once).
void check_packing(const LengthHistogram& h, const PackingResult& r);

// A sample to pack: its id (any value, each id once) and its length in tokens.
struct SeqRef {
  int64_t id = 0;
  int length = 0;
};

// Concrete packs of sample ids from strategies: strategy order, within a strategy its repeats in
// order, within a pack longest first; samples of one length are used in input order. Throws
// Error when the strategies do not hold exactly the samples' lengths or break the limits.
std::vector<std::vector<int64_t>> assign_packs(const std::vector<PackStrategy>& strategies,
                                               const std::vector<SeqRef>& samples,
                                               const PackingLimits& limits);

// Online packing for the step planner: a few dozen samples of one rank and step to packs with
// pack_exact_fit(), each sample once. Deterministic for a given input.
std::vector<std::vector<int64_t>> pack_online(const std::vector<SeqRef>& samples,
                                              const PackingLimits& limits);

}  // namespace packbert
