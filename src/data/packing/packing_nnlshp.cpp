// NNLSHP (paper, section 4.2): pick how often to use each exact-fill strategy by non-negative
// least squares, round, and pad what rounding got wrong.
//
//   1. Strategies: every multiset of <= K lengths that sums to exactly L (partitions of L into
//      at most K parts; 22,102 for L=512, K=3), in the reference's order (ascending, shortest
//      first), since the order decides which of several equally good solutions NNLS returns.
//   2. A[l][s] = how often length l occurs in strategy s. Solve min ||W (A x - h)|| for x >= 0,
//      where W weights lengths 1..8 by 0.09: the paper's way of saying that leaving a very short
//      sequence to a padded pack costs little.
//   3. Round x to the nearest integer (ties to even, like numpy.rint). The residual h - A x:
//      a positive entry at l is sequences left over; each gets the two-sequence strategy
//      {l, L - l} (or {L}), whose L - l slot will be padding. A negative entry is slots
//      without a sequence: padding. We drop those slots from the strategies (one slot of length
//      l from as many packs as there are missing sequences), so that what we return holds
//      exactly the histogram; the packs count and so the efficiency are the paper's.
#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/base/error.h"
#include "data/packing/nnls.h"
#include "data/packing/packing.h"
#include "data/packing/packing_internal.h"

namespace packbert {

int64_t nnlshp_strategy_count(int max_seq_len, int max_seqs_per_pack) {
  // Partitions of L into at most K parts = partitions of L into parts of size <= K.
  const int k = std::min(max_seqs_per_pack > 0 ? max_seqs_per_pack : max_seq_len, max_seq_len);
  constexpr int64_t kCap = int64_t{1} << 62;  // saturate: p(512) overflows int64
  std::vector<int64_t> ways(max_seq_len + 1, 0);
  ways[0] = 1;
  for (int part = 1; part <= k; ++part)
    for (int n = part; n <= max_seq_len; ++n) ways[n] = std::min(kCap, ways[n] + ways[n - part]);
  return ways[max_seq_len];
}

namespace {

// Enumerates non-decreasing part lists summing to L in the reference's recursive order.
void enumerate(int L, int start_sum, int min_part, int depth, std::vector<int>& prefix,
               const std::function<void(const std::vector<int>&)>& emit) {
  const int gap = L - start_sum;
  if (depth == 1) {
    if (gap >= min_part) {
      prefix.push_back(gap);
      emit(prefix);
      prefix.pop_back();
    }
    return;
  }
  for (int part = min_part; part <= gap; ++part) {
    prefix.push_back(part);
    if (part == gap)
      emit(prefix);
    else
      enumerate(L, start_sum + part, part, depth - 1, prefix, emit);
    prefix.pop_back();
  }
}

}  // namespace

PackingResult pack_nnlshp(const LengthHistogram& h, const PackingLimits& limits) {
  packing_detail::require_packable(h, limits);
  packing_detail::Stopwatch watch;
  const int L = limits.max_seq_len;
  const int k = std::min(limits.effective_k(), L);
  const int64_t n_strategies = nnlshp_strategy_count(L, k);
  PB_REQUIRE(n_strategies <= kNnlshpMaxStrategies,
             "nnlshp: L={} with K={} has {} exact-fill strategies (at most {} are solved); use a "
             "smaller K",
             L, limits.max_seqs_per_pack, n_strategies, kNnlshpMaxStrategies);
  PackingResult result{"nnlshp", limits, {}, 0};
  if (k == 1) {  // nothing to solve: every sequence is its own pack
    for (int l = 1; l <= h.max_len; ++l)
      if (h.counts[l] > 0) result.strategies.push_back({{l}, h.counts[l]});
    result.strategies = packing_detail::canonical(std::move(result.strategies));
    result.runtime_ms = watch.ms();
    return result;
  }

  // Row l - 1 holds length l. Weights as in the reference: 0.09 for lengths 1..8.
  std::vector<double> weight(L, 1.0);
  for (int l = 1; l <= std::min(8, L); ++l) weight[l - 1] = 0.09;
  std::vector<std::vector<int>> strategies;
  strategies.reserve(static_cast<size_t>(n_strategies));
  SparseColumns a;
  a.rows = L;
  std::vector<int64_t> pair_column(L + 1, -1);  // column of {l, L - l}, or of {L} for l = L
  std::vector<int> prefix;
  std::vector<std::pair<int, double>> entries;
  enumerate(L, 0, 1, k, prefix, [&](const std::vector<int>& parts) {
    entries.clear();
    for (int p : parts) {
      if (!entries.empty() && entries.back().first == p - 1)
        entries.back().second += weight[p - 1];
      else
        entries.emplace_back(p - 1, weight[p - 1]);
    }
    const int64_t col = static_cast<int64_t>(strategies.size());
    if (parts.size() == 1) pair_column[L] = col;
    if (parts.size() == 2) pair_column[parts[0]] = pair_column[parts[1]] = col;
    a.add_column(entries);
    strategies.push_back(parts);
  });
  PB_CHECK(static_cast<int64_t>(strategies.size()) == n_strategies, "enumerated {} != {}",
           strategies.size(), n_strategies);

  std::vector<double> b(L, 0.0);
  for (int l = 1; l <= std::min(L, h.max_len); ++l)
    b[l - 1] = weight[l - 1] * static_cast<double>(h.counts[l]);
  const NnlsResult solved = solve_nnls(a, b);
  PB_REQUIRE(solved.converged, "nnlshp: NNLS did not converge in {} iterations", solved.iterations);

  std::vector<int64_t> repeat(strategies.size());
  for (size_t s = 0; s < strategies.size(); ++s)
    repeat[s] = static_cast<int64_t>(std::nearbyint(solved.x[s]));
  std::vector<int64_t> residual(L + 1, 0);
  for (int l = 1; l <= h.max_len; ++l) residual[l] = h.counts[l];
  auto subtract = [&](size_t s, int64_t times) {
    for (int p : strategies[s]) residual[p] -= times;
  };
  for (size_t s = 0; s < strategies.size(); ++s)
    if (repeat[s] != 0) subtract(s, repeat[s]);
  // Left-over sequences: one {l, L - l} pack each (all at once, from the rounded residual).
  std::vector<int64_t> left_over(residual);
  for (int l = 1; l <= L; ++l) {
    if (left_over[l] <= 0) continue;
    const int64_t col = pair_column[l];
    PB_CHECK(col >= 0, "no pair strategy for length {}", l);
    repeat[col] += left_over[l];
    subtract(static_cast<size_t>(col), left_over[l]);
  }

  // Now residual <= 0 everywhere: -residual[l] slots of length l are padding. Drop them.
  std::vector<PackStrategy> packs;
  for (size_t s = 0; s < strategies.size(); ++s)
    if (repeat[s] > 0) packs.push_back({strategies[s], repeat[s]});
  for (int l = 1; l <= L; ++l) {
    PB_CHECK(residual[l] <= 0, "residual {} at length {} after the left-over step", residual[l], l);
    int64_t missing = -residual[l];
    // Appended strategies are visited too: a pack may have several slots of length l.
    for (size_t i = 0; i < packs.size() && missing > 0; ++i) {
      auto& lengths = packs[i].lengths;
      const auto it = std::find(lengths.begin(), lengths.end(), l);
      if (it == lengths.end() || packs[i].repeat == 0) continue;
      const int64_t take = std::min(packs[i].repeat, missing);
      std::vector<int> shorter(lengths.begin(), it);
      shorter.insert(shorter.end(), it + 1, lengths.end());
      packs[i].repeat -= take;
      missing -= take;
      packs.push_back({std::move(shorter), take});
    }
    PB_CHECK(missing == 0, "{} padding slots of length {} not found", missing, l);
  }
  result.strategies = packing_detail::canonical(std::move(packs));
  result.runtime_ms = watch.ms();
  return result;
}

}  // namespace packbert
