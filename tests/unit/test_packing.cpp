// Histogram packing: the paper's numbers on the Wikipedia histogram, exact-fit's, the
// invariants (every sequence packed once, L and K respected) on the Wikipedia and on random
// histograms, the NNLS solver against brute force and the KKT conditions, concrete and online
// packs, bad histogram files and the `packbert pack` report.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "data/packing/nnls.h"
#include "data/packing/pack_report.h"
#include "data/packing/packing.h"
#include "measure.h"
#include "test_util.h"

namespace packbert {
namespace {

const std::string kWikipedia =
    std::string(PACKBERT_TEST_DATA) + "/wikipedia-seqlen-histogram-512.txt";

const LengthHistogram& wikipedia() {
  static const LengthHistogram h = load_histogram(kWikipedia);
  return h;
}

// NNLSHP takes ~0.5 s on the Wikipedia histogram: solve it once for all tests.
const PackingResult& wikipedia_nnlshp_k3() {
  static const PackingResult r = pack_nnlshp(wikipedia(), {512, 3});
  return r;
}

// Everything a packing must satisfy, with the lower bounds no packing can beat.
void expect_valid(const LengthHistogram& h, const PackingResult& r, const std::string& what) {
  SCOPED_TRACE(what + " " + r.algorithm + " K=" + std::to_string(r.limits.max_seqs_per_pack));
  EXPECT_NO_THROW(check_packing(h, r));
  const PackingMetrics m = packing_metrics(r);
  const int64_t n = h.num_sequences(), t = h.num_tokens();
  const int L = r.limits.max_seq_len, k = r.limits.effective_k();
  EXPECT_EQ(m.sequences, n);
  EXPECT_EQ(m.tokens, t);
  EXPECT_LE(m.packs, n);
  EXPECT_GE(m.packs, (t + L - 1) / L);
  EXPECT_GE(m.packs, (n + k - 1) / k);
  EXPECT_LE(m.max_seqs_in_pack, k);
  EXPECT_GT(m.efficiency, 0);
  EXPECT_LE(m.efficiency, 1.0);
  EXPECT_NEAR(m.padding_fraction, 1.0 - m.efficiency, 1e-12);
  EXPECT_NEAR(m.speedup, m.packs ? double(n) / m.packs : 1.0, 1e-12);
  for (const auto& s : r.strategies) {
    EXPECT_TRUE(std::is_sorted(s.lengths.begin(), s.lengths.end(), std::greater<>()));
  }
}

// ---- the Wikipedia histogram: the paper's numbers ---------------------------------------------

TEST(PackingWikipedia, HistogramLoads) {
  const LengthHistogram& h = wikipedia();
  EXPECT_EQ(h.max_len, 512);
  EXPECT_EQ(h.num_sequences(), 16279552);  // as stated in the reference's histograms.py
  EXPECT_EQ(h.counts[512], 3815044);
  EXPECT_EQ(h.counts[4], 0);
  EXPECT_EQ(h.counts[5], 1821);
}

// The reference README runs SPFHP and LPFHP with max_sequences_per_pack = 12 and prints
// efficiency 99.6040 / 99.8129 % and speed-up 1.99340 / 1.99758. We reproduce them exactly.
TEST(PackingWikipedia, SpfhpAndLpfhpReproduceThePaperWithK12) {
  const PackingResult spfhp = pack_spfhp(wikipedia(), {512, 12});
  const PackingResult lpfhp = pack_lpfhp(wikipedia(), {512, 12});
  expect_valid(wikipedia(), spfhp, "wikipedia");
  expect_valid(wikipedia(), lpfhp, "wikipedia");
  const PackingMetrics s = packing_metrics(spfhp), l = packing_metrics(lpfhp);
  EXPECT_NEAR(100 * s.efficiency, 99.604, 0.01);
  EXPECT_NEAR(100 * l.efficiency, 99.813, 0.01);
  EXPECT_NEAR(s.speedup, 1.99340, 5e-5);
  EXPECT_NEAR(l.speedup, 1.99758, 5e-5);
  EXPECT_EQ(s.max_seqs_in_pack, 12);
}

// The reference README prints NNLSHP's efficiency as 0.9975 (4 digits) and its speed-up as
// 1.99625; the exact value behind them is 99.746%, which is what we get: 99.75% is the paper's
// rounding, so the bound here is 99.74% plus the speed-up to 5 digits.
TEST(PackingWikipedia, NnlshpReproducesThePaperWithK3) {
  const PackingResult& r = wikipedia_nnlshp_k3();
  expect_valid(wikipedia(), r, "wikipedia");
  const PackingMetrics m = packing_metrics(r);
  EXPECT_GE(100 * m.efficiency, 99.74);
  EXPECT_NEAR(m.speedup, 1.99625, 5e-5);
  EXPECT_EQ(m.max_seqs_in_pack, 3);
}

TEST(PackingWikipedia, ExactFitBeatsNnlshpWithK3AndReaches999WithoutLimit) {
  const PackingResult k3 = pack_exact_fit(wikipedia(), {512, 3});
  const PackingResult unlimited = pack_exact_fit(wikipedia(), {512, 0});
  expect_valid(wikipedia(), k3, "wikipedia");
  expect_valid(wikipedia(), unlimited, "wikipedia");
  const PackingMetrics m3 = packing_metrics(k3), mu = packing_metrics(unlimited);
  EXPECT_GE(100 * m3.efficiency, 99.75);
  EXPECT_LE(m3.packs, packing_metrics(wikipedia_nnlshp_k3()).packs);
  EXPECT_GE(100 * mu.efficiency, 99.9);
  // Also better than the paper's best greedy at its own K.
  EXPECT_LT(packing_metrics(pack_exact_fit(wikipedia(), {512, 12})).packs,
            packing_metrics(pack_lpfhp(wikipedia(), {512, 12})).packs);
}

TEST(PackingWikipedia, EveryAlgorithmKeepsTheInvariantsForManyK) {
  for (int k : {1, 2, 3, 4, 7, 12, 0}) {
    for (const std::string& name : packing_algorithms()) {
      if (name == "nnlshp" && k != 1 && k != 2) continue;  // K=3 has its own test; K>=4 is slow
      expect_valid(wikipedia(), pack_with(name, wikipedia(), {512, k}), "wikipedia");
    }
  }
}

// The table for the closing note (not an assertion: timings are reported, never tested).
TEST(PackingWikipedia, PrintTable) {
  std::printf("\n%-8s %5s %12s %14s %12s\n", "algorithm", "K", "packs", "efficiency %",
              "runtime ms");
  auto row = [](const PackingResult& r) {
    const PackingMetrics m = packing_metrics(r);
    std::printf("%-8s %5s %12lld %14.4f %12.2f\n", r.algorithm.c_str(),
                r.limits.max_seqs_per_pack > 0 ? std::to_string(r.limits.max_seqs_per_pack).c_str()
                                               : "none",
                static_cast<long long>(m.packs), 100 * m.efficiency, m.runtime_ms);
  };
  row(pack_spfhp(wikipedia(), {512, 12}));
  row(pack_lpfhp(wikipedia(), {512, 12}));
  row(wikipedia_nnlshp_k3());
  row(pack_exact_fit(wikipedia(), {512, 3}));
  row(pack_exact_fit(wikipedia(), {512, 12}));
  row(pack_exact_fit(wikipedia(), {512, 0}));
}

// ---- random histograms --------------------------------------------------------------------

LengthHistogram random_histogram(std::mt19937_64& rng, int L) {
  LengthHistogram h(L);
  const int shape = std::uniform_int_distribution<int>(0, 4)(rng);
  std::uniform_int_distribution<int> len(1, L);
  switch (shape) {
    case 0:  // uniform counts over all lengths
      for (int l = 1; l <= L; ++l) h.counts[l] = std::uniform_int_distribution<int>(0, 1000)(rng);
      break;
    case 1: {  // few distinct lengths with large counts
      const int distinct = std::uniform_int_distribution<int>(1, 6)(rng);
      for (int i = 0; i < distinct; ++i)
        h.counts[len(rng)] += std::uniform_int_distribution<int64_t>(1, 1000000)(rng);
      break;
    }
    case 2: {  // a handful of sequences (the online case)
      const int n = std::uniform_int_distribution<int>(1, 40)(rng);
      for (int i = 0; i < n; ++i) ++h.counts[len(rng)];
      break;
    }
    case 3: {  // BERT-like: a spike at L plus a skewed body
      std::gamma_distribution<double> g(2.0, L / 6.0);
      for (int i = 0; i < 20000; ++i) ++h.counts[std::clamp(int(g(rng)) + 1, 1, L)];
      h.counts[L] += 5000;
      break;
    }
    default:  // only long sequences (nothing fits together)
      for (int l = L / 2 + 1; l <= L; ++l)
        h.counts[l] = std::uniform_int_distribution<int>(0, 50)(rng);
  }
  if (h.num_sequences() == 0) h.counts[len(rng)] = 1;
  return h;
}

TEST(PackingRandom, EveryAlgorithmKeepsTheInvariants) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 60; ++trial) {
    const int L = std::uniform_int_distribution<int>(1, 3)(rng) == 1
                      ? std::uniform_int_distribution<int>(1, 16)(rng)
                      : std::uniform_int_distribution<int>(17, 600)(rng);
    const int k = std::uniform_int_distribution<int>(0, 8)(rng);  // 0: no limit
    const LengthHistogram h = random_histogram(rng, L);
    const std::string what = "trial " + std::to_string(trial) + " L=" + std::to_string(L);
    for (const std::string& name : packing_algorithms()) {
      if (name == "nnlshp" && nnlshp_strategy_count(L, k) > kNnlshpMaxStrategies) {
        EXPECT_THROW(pack_nnlshp(h, {L, k}), Error);
        continue;
      }
      if (name == "nnlshp" && nnlshp_strategy_count(L, k) > 30000) continue;  // slow, allowed
      expect_valid(h, pack_with(name, h, {L, k}), what);
    }
  }
}

TEST(PackingRandom, ExactFitBeatsLpfhpOnBertLikeHistograms) {
  // Skewed lengths plus a spike at L, like every BERT pretraining set: what exact-fit is for.
  std::mt19937_64 rng(test::test_seed() + 1);
  for (int trial = 0; trial < 10; ++trial) {
    LengthHistogram h(512);
    std::gamma_distribution<double> g(std::uniform_real_distribution<double>(1.0, 4.0)(rng), 50.0);
    for (int i = 0; i < 200000; ++i) ++h.counts[std::clamp(int(g(rng)) + 5, 5, 512)];
    h.counts[512] += 50000;
    for (int k : {3, 0}) {
      const PackingMetrics exact = packing_metrics(pack_exact_fit(h, {512, k}));
      const PackingMetrics lp = packing_metrics(pack_lpfhp(h, {512, k}));
      EXPECT_LE(exact.packs, lp.packs) << "trial " << trial << " K=" << k;
    }
  }
}

TEST(Packing, KOfOneIsOnePackPerSequence) {
  const LengthHistogram h = histogram_from_lengths({3, 3, 5, 8}, 8);
  for (const std::string& name : packing_algorithms()) {
    const PackingResult r = pack_with(name, h, {8, 1});
    expect_valid(h, r, "k1");
    EXPECT_EQ(packing_metrics(r).packs, 4);
  }
}

TEST(Packing, RejectsSequencesLongerThanL) {
  const LengthHistogram h = histogram_from_lengths({3, 9}, 9);
  for (const std::string& name : packing_algorithms())
    EXPECT_THROW(pack_with(name, h, {8, 3}), Error);
  EXPECT_THROW(pack_with("first-fit", h, {9, 3}), Error);
  EXPECT_THROW(histogram_from_lengths({0}, 8), Error);
  EXPECT_THROW(histogram_from_lengths({9}, 8), Error);
  EXPECT_THROW(resize_histogram(h, 8), Error);
  EXPECT_EQ(resize_histogram(h, 20).counts[9], 1);
}

// "ours", the former name of exact-fit, is not an alias: pack_with() and the pack command refuse
// it and say the new name.
TEST(Packing, FormerNameIsAnErrorThatSaysTheNewName) {
  const std::string said = "packing algorithm 'ours' was renamed 'exact-fit'";
  EXPECT_EQ(renamed_packing_algorithm("ours"), said);
  for (const std::string& name : packing_algorithms())
    EXPECT_EQ(renamed_packing_algorithm(name), "") << name;
  const LengthHistogram h = histogram_from_lengths({3, 3, 5}, 8);
  try {
    pack_with("ours", h, {8, 3});
    ADD_FAILURE() << "pack_with(\"ours\") did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), said);
  }
  PackCommandOptions o;
  o.histogram_file = kWikipedia;
  o.algorithm = "ours";
  std::ostringstream out;
  try {
    run_pack_command(o, out);
    ADD_FAILURE() << "pack --algorithm ours did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "pack: " + said);
  }
}

TEST(Packing, CheckPackingCatchesBrokenResults) {
  const LengthHistogram h = histogram_from_lengths({2, 3, 4}, 8);
  PackingResult r{"test", {8, 2}, {{{4, 3}, 1}, {{2}, 1}}, 0};
  EXPECT_NO_THROW(check_packing(h, r));
  PackingResult lost = r;
  lost.strategies.pop_back();
  EXPECT_THROW(check_packing(h, lost), Error);
  PackingResult twice = r;
  twice.strategies[1].repeat = 2;
  EXPECT_THROW(check_packing(h, twice), Error);
  PackingResult too_many = {"test", {8, 2}, {{{4, 3, 1}, 1}}, 0};
  EXPECT_THROW(check_packing(histogram_from_lengths({4, 3, 1}, 8), too_many), Error);
  PackingResult too_long = {"test", {6, 3}, {{{4, 3}, 1}}, 0};
  EXPECT_THROW(check_packing(histogram_from_lengths({4, 3}, 6), too_long), Error);
}

TEST(Packing, StrategyCountMatchesTheEnumeration) {
  EXPECT_EQ(nnlshp_strategy_count(512, 3), 22102);  // round((512 + 3)^2 / 12)
  EXPECT_EQ(nnlshp_strategy_count(8, 2), 5);        // 8, 7+1, 6+2, 5+3, 4+4
  EXPECT_EQ(nnlshp_strategy_count(10, 0), 42);      // p(10)
  EXPECT_GT(nnlshp_strategy_count(512, 5), kNnlshpMaxStrategies);
}

// ---- NNLS ---------------------------------------------------------------------------------

// Solves the normal equations of A_S by Gaussian elimination; false when A_S is singular to
// working precision (a pivot below 1e-13 of the largest diagonal). A nearly singular support
// still gives a candidate: the caller judges every candidate by its actual residual, and no
// x >= 0 has a residual below the optimum, so a poor candidate can only be ignored, never win.
bool least_squares(const std::vector<double>& a, int m, const std::vector<int>& cols,
                   const std::vector<double>& b, std::vector<double>& x) {
  const int p = static_cast<int>(cols.size());
  std::vector<double> g(size_t(p) * (p + 1), 0.0);
  double diag = 0;
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < p; ++j)
      for (int r = 0; r < m; ++r) g[i * (p + 1) + j] += a[cols[i] * m + r] * a[cols[j] * m + r];
    for (int r = 0; r < m; ++r) g[i * (p + 1) + p] += a[cols[i] * m + r] * b[r];
    diag = std::max(diag, g[i * (p + 1) + i]);
  }
  for (int c = 0; c < p; ++c) {
    int piv = c;
    for (int r = c + 1; r < p; ++r)
      if (std::abs(g[r * (p + 1) + c]) > std::abs(g[piv * (p + 1) + c])) piv = r;
    if (!(std::abs(g[piv * (p + 1) + c]) > 1e-13 * diag)) return false;
    for (int j = 0; j <= p; ++j) std::swap(g[c * (p + 1) + j], g[piv * (p + 1) + j]);
    for (int r = 0; r < p; ++r) {
      if (r == c) continue;
      const double f = g[r * (p + 1) + c] / g[c * (p + 1) + c];
      for (int j = c; j <= p; ++j) g[r * (p + 1) + j] -= f * g[c * (p + 1) + j];
    }
  }
  x.assign(p, 0.0);
  for (int i = 0; i < p; ++i) x[i] = g[i * (p + 1) + p] / g[i * (p + 1) + i];
  return true;
}

double residual_norm(const std::vector<double>& a, int m, int n, const std::vector<double>& x,
                     const std::vector<double>& b) {
  double s = 0;
  for (int r = 0; r < m; ++r) {
    double v = -b[r];
    for (int j = 0; j < n; ++j) v += a[j * m + r] * x[j];
    s += v * v;
  }
  return std::sqrt(s);
}

// KKT for min ||Ax - b||^2 / 2, x >= 0: x >= 0, w = A^T (b - Ax) <= 0, w_j = 0 where x_j > 0.
// Returns the worst violation in units of tol.
double expect_kkt(const std::vector<double>& a, int m, int n, const std::vector<double>& x,
                  const std::vector<double>& b, double tol) {
  double worst = 0;
  std::vector<double> r(b);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) r[i] -= a[j * m + i] * x[j];
  for (int j = 0; j < n; ++j) {
    double w = 0;
    for (int i = 0; i < m; ++i) w += a[j * m + i] * r[i];
    EXPECT_GE(x[j], 0) << "column " << j;
    EXPECT_LE(w, tol) << "column " << j;
    worst = std::max(worst, w / tol);
    if (x[j] > 0) {
      EXPECT_NEAR(w, 0, tol) << "column " << j << " x=" << x[j];
      worst = std::max(worst, std::abs(w) / tol);
    }
  }
  return worst;
}

TEST(Nnls, MatchesBruteForceOnSmallProblems) {
  std::mt19937_64 rng(test::test_seed() + 2);
  double worst_residual = 0, worst_consistency = 0, worst_kkt = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int m = std::uniform_int_distribution<int>(1, 7)(rng);
    const int n = std::uniform_int_distribution<int>(1, 7)(rng);
    const bool packing_like = trial % 2 == 1;  // small non-negative integers, often dependent
    std::vector<double> a(size_t(m) * n), b(m);
    std::uniform_real_distribution<double> u(-1, 1);
    std::uniform_int_distribution<int> small(0, 3);
    for (double& v : a) v = packing_like ? small(rng) : u(rng);
    for (double& v : b) v = packing_like ? small(rng) * 10.0 + u(rng) : u(rng) * 5;
    const NnlsResult res = solve_nnls(SparseColumns::from_dense(a, m, n), b);
    ASSERT_TRUE(res.converged) << "trial " << trial;
    // Brute force: the optimum has a support whose columns are independent and whose
    // unconstrained least-squares solution is positive; try them all.
    double best = residual_norm(a, m, n, std::vector<double>(n, 0.0), b);
    for (int mask = 1; mask < (1 << n); ++mask) {
      std::vector<int> cols;
      for (int j = 0; j < n; ++j)
        if (mask >> j & 1) cols.push_back(j);
      std::vector<double> xs;
      if (!least_squares(a, m, cols, b, xs)) continue;
      if (*std::min_element(xs.begin(), xs.end()) < 0) continue;
      std::vector<double> x(n, 0.0);
      for (size_t i = 0; i < cols.size(); ++i) x[cols[i]] = xs[i];
      best = std::min(best, residual_norm(a, m, n, x, b));
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + " m=" + std::to_string(m) +
                 " n=" + std::to_string(n));
    // The solver is at least as good as every support's solution. It may be better: the brute
    // force's normal equations can lose the optimum of an ill-conditioned support (4 seeds in
    // 1000 found 1e-11 where the brute force had up to 2.1), which the KKT check certifies.
    EXPECT_LE(res.residual_norm, best + 1e-8 * (1 + best));
    EXPECT_NEAR(residual_norm(a, m, n, res.x, b), res.residual_norm, 1e-9 * (1 + best));
    worst_residual = std::max(worst_residual, (res.residual_norm - best) / (1 + best));
    worst_consistency =
        std::max(worst_consistency,
                 std::abs(residual_norm(a, m, n, res.x, b) - res.residual_norm) / (1 + best));
    worst_kkt = std::max(worst_kkt, expect_kkt(a, m, n, res.x, b, 1e-8 * (1 + best) * 10));
  }
  test::print_measure("300 small problems: (residual - brute force's) / (1 + best)", worst_residual,
                      1e-8);
  test::print_measure("300 small problems: |recomputed - reported residual| / (1 + best)",
                      worst_consistency, 1e-9);
  test::print_measure("300 small problems: KKT violation / (1e-7 (1 + best))", worst_kkt, 1.0);
}

TEST(Nnls, KktOnLargerSparseProblems) {
  std::mt19937_64 rng(test::test_seed() + 3);
  double worst_kkt = 0;
  for (int trial = 0; trial < 5; ++trial) {
    const int m = std::uniform_int_distribution<int>(20, 60)(rng);
    const int n = std::uniform_int_distribution<int>(m / 2, 6 * m)(rng);
    std::vector<double> a(size_t(m) * n, 0.0), b(m);
    for (int j = 0; j < n; ++j)
      for (int e = 0; e < 3; ++e)
        a[j * m + std::uniform_int_distribution<int>(0, m - 1)(rng)] += 1.0;
    for (double& v : b) v = std::uniform_real_distribution<double>(0, 1000)(rng);
    const NnlsResult res = solve_nnls(SparseColumns::from_dense(a, m, n), b);
    ASSERT_TRUE(res.converged);
    worst_kkt = std::max(worst_kkt, expect_kkt(a, m, n, res.x, b, 1e-7 * 1000));
  }
  test::print_measure("5 sparse problems: KKT violation / 1e-4", worst_kkt, 1.0);
}

TEST(Nnls, ExactNonNegativeSolutionIsFound) {
  // b = A x* with x* >= 0 and A of full column rank: the residual is 0 and x = x*.
  const int m = 6, n = 4;
  const std::vector<double> a = {1, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 2,
                                 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0};
  const std::vector<double> want = {2, 0, 3.5, 1};
  std::vector<double> b(m, 0.0);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) b[i] += a[j * m + i] * want[j];
  const NnlsResult res = solve_nnls(SparseColumns::from_dense(a, m, n), b);
  EXPECT_LT(res.residual_norm, 1e-10);
  for (int j = 0; j < n; ++j) EXPECT_NEAR(res.x[j], want[j], 1e-10);
  EXPECT_THROW(solve_nnls(SparseColumns::from_dense(a, m, n), std::vector<double>(5, 1.0)), Error);
}

// ---- concrete and online packs --------------------------------------------------------------

void expect_packs(const std::vector<std::vector<int64_t>>& packs,
                  const std::vector<SeqRef>& samples, const PackingLimits& limits) {
  std::map<int64_t, int> length;
  for (const SeqRef& s : samples) length[s.id] = s.length;
  std::set<int64_t> seen;
  for (const auto& p : packs) {
    EXPECT_FALSE(p.empty());
    EXPECT_LE(static_cast<int>(p.size()), limits.effective_k());
    int tokens = 0;
    for (int64_t id : p) {
      ASSERT_TRUE(length.count(id)) << "unknown id " << id;
      EXPECT_TRUE(seen.insert(id).second) << "id " << id << " packed twice";
      tokens += length[id];
    }
    EXPECT_LE(tokens, limits.max_seq_len);
  }
  EXPECT_EQ(seen.size(), samples.size());
}

std::vector<SeqRef> random_samples(std::mt19937_64& rng, int n, int L) {
  std::vector<SeqRef> s(n);
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), int64_t{1000});
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int i = 0; i < n; ++i) s[i] = {ids[i], std::uniform_int_distribution<int>(1, L)(rng)};
  return s;
}

TEST(PackAssign, EverySampleOnceWithinLimits) {
  std::mt19937_64 rng(test::test_seed() + 4);
  for (int trial = 0; trial < 20; ++trial) {
    const int L = std::uniform_int_distribution<int>(4, 512)(rng);
    const int k = std::uniform_int_distribution<int>(0, 5)(rng);
    const auto samples = random_samples(rng, std::uniform_int_distribution<int>(1, 3000)(rng), L);
    std::vector<int> lengths;
    for (const auto& s : samples) lengths.push_back(s.length);
    const LengthHistogram h = histogram_from_lengths(lengths, L);
    for (const char* name : {"spfhp", "lpfhp", "exact-fit"}) {
      const PackingResult r = pack_with(name, h, {L, k});
      const auto packs = assign_packs(r.strategies, samples, {L, k});
      expect_packs(packs, samples, {L, k});
      EXPECT_EQ(static_cast<int64_t>(packs.size()), packing_metrics(r).packs);
    }
  }
}

TEST(PackAssign, RejectsStrategiesThatDoNotMatchTheSamples) {
  const std::vector<SeqRef> samples = {{1, 5}, {2, 3}, {3, 3}};
  const PackingLimits lim{8, 2};
  EXPECT_NO_THROW(assign_packs({{{5, 3}, 1}, {{3}, 1}}, samples, lim));
  EXPECT_THROW(assign_packs({{{5, 3}, 1}}, samples, lim), Error);               // one left out
  EXPECT_THROW(assign_packs({{{5, 3}, 2}}, samples, lim), Error);               // 5 used twice
  EXPECT_THROW(assign_packs({{{5, 3}, 1}, {{3}, 1}}, samples, {7, 2}), Error);  // over L
  EXPECT_THROW(assign_packs({{{3, 3}, 1}, {{5}, 1}}, samples, {8, 1}), Error);  // over K
  EXPECT_THROW(assign_packs({}, {{1, 9}}, lim), Error);
}

TEST(PackOnline, AFewDozenSamplesPerStep) {
  std::mt19937_64 rng(test::test_seed() + 5);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = std::uniform_int_distribution<int>(1, 3)(rng) == 1 ? 128 : 512;
    const int k = std::uniform_int_distribution<int>(0, 4)(rng);
    const auto samples = random_samples(rng, std::uniform_int_distribution<int>(0, 64)(rng), L);
    const auto packs = pack_online(samples, {L, k});
    expect_packs(packs, samples, {L, k});
    EXPECT_EQ(packs, pack_online(samples, {L, k}));  // deterministic
  }
  EXPECT_TRUE(pack_online({}, {512, 3}).empty());
  EXPECT_THROW(pack_online({{7, 513}}, {512, 3}), Error);
  // Two that fill a pack exactly and one that fits nowhere else.
  const auto packs = pack_online({{1, 300}, {2, 212}, {3, 400}}, {512, 3});
  ASSERT_EQ(packs.size(), 2u);
  EXPECT_EQ(packs[0], (std::vector<int64_t>{3}));
  EXPECT_EQ(packs[1], (std::vector<int64_t>{1, 2}));
}

// ---- histogram files ----------------------------------------------------------------------

void expect_load_error(const std::string& content, const std::string& expected_part) {
  test::TempDir dir;
  const std::string path = dir.file("hist.txt");
  std::ofstream(path) << content;
  try {
    load_histogram(path);
    ADD_FAILURE() << "no error for: " << content;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find(expected_part), std::string::npos) << what;
  }
}

TEST(HistogramFile, BadInputIsAnErrorNamingFileAndLine) {
  expect_load_error("# c\n1\n2\nx\n", ":4:");
  expect_load_error("1\n-3\n", ":2: negative");
  expect_load_error("1\n2.5\n", ":2:");
  expect_load_error("1\n2 3\n", ":2:");
  expect_load_error("1\n\n2\n", ":2: empty line");
  expect_load_error("99999999999999999999999\n", ":1:");
  expect_load_error("", "no counts");
  expect_load_error("# only a comment\n", "no counts");
  EXPECT_THROW(load_histogram("/nonexistent/histogram.txt"), Error);
}

TEST(HistogramFile, CommentsCrlfAndTrailingBlankLines) {
  test::TempDir dir;
  const std::string path = dir.file("hist.txt");
  std::ofstream(path) << "# header\r\n0\r\n 2 \r\n# inside\n5\n\n\n";
  const LengthHistogram h = load_histogram(path);
  EXPECT_EQ(h.max_len, 3);
  EXPECT_EQ(h.counts, (std::vector<int64_t>{0, 0, 2, 5}));
  EXPECT_EQ(h.num_tokens(), 2 * 2 + 3 * 5);
  EXPECT_EQ(h, histogram_from_lengths({2, 3, 3, 2, 3, 3, 3}, 3));
}

// ---- the report ---------------------------------------------------------------------------

TEST(PackReport, TableHasEveryAlgorithm) {
  PackCommandOptions o;
  o.histogram_file = kWikipedia;
  o.max_seqs_per_pack = 12;
  o.algorithm = "all";
  std::ostringstream out;
  // NNLSHP at K=12 would need millions of strategies: skipped with a note, not an error.
  EXPECT_EQ(run_pack_command(o, out), 0);
  const std::string text = out.str();
  std::printf("%s", text.c_str());
  for (const char* name : {"spfhp", "lpfhp", "exact-fit", "skipped nnlshp", "99.6040", "99.8129"})
    EXPECT_NE(text.find(name), std::string::npos) << name;
  o.algorithm = "nnlshp";
  EXPECT_THROW(run_pack_command(o, out), Error);
}

TEST(PackReport, JsonReproducesTheHistogram) {
  test::TempDir dir;
  const std::string path = dir.file("h.txt");
  std::mt19937_64 rng(test::test_seed() + 6);
  const LengthHistogram h = random_histogram(rng, 128);
  {
    std::ofstream f(path);
    f << "# random\n";
    for (int l = 1; l <= h.max_len; ++l) f << h.counts[l] << "\n";
  }
  PackCommandOptions o;
  o.histogram_file = path;
  o.max_seq_len = 160;  // the file's 128 lengths fit
  o.max_seqs_per_pack = 3;
  o.json = true;
  std::ostringstream out;
  ASSERT_EQ(run_pack_command(o, out), 0);
  const nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["max_seq_len"], 160);
  EXPECT_EQ(j["results"].size(), 4u);
  const std::vector<int64_t> hist = j["histogram"];
  ASSERT_EQ(hist.size(), 160u);
  for (const auto& r : j["results"]) {
    std::vector<int64_t> used(161, 0);
    int64_t packs = 0;
    for (const auto& s : r["strategies"]) {
      const std::vector<int> lengths = s["lengths"];
      const int64_t repeat = s["repeat"];
      EXPECT_LE(lengths.size(), 3u);
      EXPECT_LE(std::accumulate(lengths.begin(), lengths.end(), 0), 160);
      for (int l : lengths) used[l] += repeat;
      packs += repeat;
    }
    EXPECT_EQ(packs, r["packs"].get<int64_t>()) << r["algorithm"];
    for (int l = 1; l <= 160; ++l) EXPECT_EQ(used[l], hist[l - 1]) << r["algorithm"] << " " << l;
  }
}

TEST(PackReport, OptionsAndDataDirectory) {
  PackCommandOptions o;
  std::ostringstream out;
  EXPECT_THROW(run_pack_command(o, out), Error);  // neither --histogram nor --data
  o.histogram_file = kWikipedia;
  o.max_seq_len = 256;  // the file has sequences of length 512
  EXPECT_THROW(run_pack_command(o, out), Error);
  o.max_seq_len = 512;
  o.algorithm = "best-fit";
  EXPECT_THROW(run_pack_command(o, out), Error);
  o.algorithm = "exact-fit";
  o.max_seqs_per_pack = -1;
  EXPECT_THROW(run_pack_command(o, out), Error);

  PackCommandOptions d;
  d.data_dir = "/some/shards";
  d.max_seq_len = 128;
  d.algorithm = "exact-fit";
  EXPECT_THROW(run_pack_command(d, out), Error);  // no reader wired
  std::string asked;
  auto reader = [&](const std::string& dir) {
    asked = dir;
    return std::vector<int>{100, 28, 64, 64, 128, 1};
  };
  std::ostringstream table;
  EXPECT_EQ(run_pack_command(d, table, reader), 0);
  EXPECT_EQ(asked, "/some/shards");
  EXPECT_NE(table.str().find("exact-fit"), std::string::npos);
  auto bad_reader = [](const std::string&) { return std::vector<int>{129}; };
  EXPECT_THROW(run_pack_command(d, table, bad_reader), Error);
}

}  // namespace
}  // namespace packbert
