// Step planner balance: for each configuration (ranks x samples per rank) and method, the mean
// and worst max/mean cost over ranks per step, with lengths drawn from the MLPerf Wikipedia
// histogram, and the planning time per step. A table, never a timed assertion. A second table
// holds the largest micro-batch of any plan against the planner's bound (micro_batch_bound,
// which sizes the activation arena): under lpt / lpt-search its sample count is not a bound.
//
// Usage: bench_balance [steps, default 1000] [histogram file, "" for the default]
//                      [search budget in probes, default PlannerConfig's]
//
// Planning time covers plan_step() without packing (pack_rank = kPackNoRanks): balancing over
// ranks, the micro split and the bookkeeping. Packing is per rank; its cost per rank (what a
// loader pays for its own rank) is reported separately.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "data/packing/packing.h"
#include "data/packing/planner.h"
#include "test_util.h"

namespace {

using namespace packbert;

struct Stats {
  double sum = 0, worst = 0;
  std::vector<double> us;
  void add(double ratio, double micros) {
    sum += ratio;
    worst = std::max(worst, ratio);
    us.push_back(micros);
  }
  double mean() const { return sum / us.size(); }
  double mean_us() const {
    double t = 0;
    for (double u : us) t += u;
    return t / us.size();
  }
  // The median is what a step usually pays; the mean also counts preemption on a busy machine.
  double median_us() const {
    std::vector<double> v = us;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }
};

// The MLPerf phase-2 data's max_predictions_per_seq.
constexpr int64_t kMaxPredictions = 76;

// One step's candidates: lengths from the histogram, ~15 % of tokens masked (at most 76, as in
// the MLPerf data), ids unique across steps.
std::vector<Candidate> draw_step(std::mt19937_64& rng, std::discrete_distribution<int>& draw, int n,
                                 int64_t first_id) {
  std::vector<Candidate> c(n);
  for (int i = 0; i < n; ++i) {
    const int len = draw(rng);
    c[i] = {first_id + i, len,
            std::min(static_cast<int>(kMaxPredictions), std::max(1, (len * 15 + 50) / 100))};
  }
  return c;
}

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// The largest micro-batch seen: samples, masked tokens, tokens, and the cells beyond the bound.
struct Largest {
  int64_t samples = 0, masked = 0, tokens = 0, over = 0, cells = 0;
  void add(const StepPlan& p, const MicroBatchBound& b, int64_t masked_bound) {
    for (const auto& r : p.ranks)
      for (const auto& mb : r.micro_batches) {
        const auto n = static_cast<int64_t>(mb.samples.size());
        samples = std::max(samples, n);
        masked = std::max(masked, mb.masked_tokens);
        tokens = std::max(tokens, mb.tokens);
        over += n > b.samples || mb.masked_tokens > masked_bound || mb.tokens > b.tokens;
        ++cells;
      }
  }
};

// max/mean over every (rank, micro-step) cell.
double cell_imbalance(const StepPlan& p) {
  double mx = 0, sum = 0;
  int cells = 0;
  for (const auto& r : p.ranks)
    for (const auto& mb : r.micro_batches) {
      mx = std::max(mx, mb.cost);
      sum += mb.cost;
      ++cells;
    }
  return sum > 0 ? mx / (sum / cells) : 1.0;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1000;
  const std::string path =
      argc > 2 && argv[2][0] != '\0'
          ? argv[2]
          : std::string(PACKBERT_REPO_DATA) + "/../tests/data/wikipedia-seqlen-histogram-512.txt";
  const LengthHistogram h = load_histogram(path);
  const int64_t budget = argc > 3 ? std::atoll(argv[3]) : PlannerConfig{}.search_budget;
  std::discrete_distribution<int> draw(h.counts.begin(), h.counts.end());
  const uint64_t seed = test::test_seed();
  const CostModel cost;
  std::printf(
      "histogram %s (L=%d); cost = %.4g*len + %.4g*len^2 + %.4g; search budget %lld; seed "
      "%llu\n\n",
      path.c_str(), h.max_len, cost.per_token, cost.per_token_pair, cost.per_sequence,
      static_cast<long long>(budget), static_cast<unsigned long long>(seed));

  const BalanceMethod methods[] = {BalanceMethod::none, BalanceMethod::sorted_round_robin,
                                   BalanceMethod::lpt, BalanceMethod::lpt_search};
  struct Config {
    int ranks, per_rank, micro_steps, steps;
  };
  const Config configs[] = {{8, 56, 1, steps},
                            {64, 8, 1, steps},
                            {1024, 8, 1, std::max(1, steps / 5)},
                            {8, 56, 4, steps},
                            {64, 8, 2, steps}};

  struct Row {
    std::string name;
    BalanceMethod method;
    MicroBatchBound bound;
    int64_t masked_bound;
    Largest largest;
  };
  std::vector<Row> largest_rows;
  std::printf("%-22s %-12s %14s %14s %14s %10s %10s %8s %8s\n", "configuration", "method",
              "mean max/mean", "worst max/mean", "cells max/mean", "mean us", "median us", "moves",
              "probes");
  for (const Config& cfg : configs) {
    const int n = cfg.ranks * cfg.per_rank;
    char name[64];
    std::snprintf(name, sizeof name, "%d x %d, %d micro", cfg.ranks, cfg.per_rank, cfg.micro_steps);
    for (BalanceMethod m : methods) {
      // Same steps for every method: reseed per method.
      std::mt19937_64 rng(seed + static_cast<uint64_t>(n) * 7919 + cfg.micro_steps);
      PlannerConfig pc;
      pc.num_ranks = cfg.ranks;
      pc.micro_steps = cfg.micro_steps;
      pc.packing = {h.max_len, 3};
      pc.method = m;
      pc.pack_rank = kPackNoRanks;
      pc.search_budget = budget;
      Stats st, cells;
      int64_t moves = 0, probes = 0;
      // The arena's bound (train/train_options.cpp largest_micro_batch): the planner's, with
      // at most kMaxPredictions masked tokens a sample.
      const MicroBatchBound bound = micro_batch_bound(pc, n);
      Row row{name, m, bound, std::min(bound.tokens, bound.samples * kMaxPredictions), {}};
      for (int s = 0; s < cfg.steps; ++s) {
        const auto cand = draw_step(rng, draw, n, int64_t{s} * n);
        const auto t0 = std::chrono::steady_clock::now();
        const StepPlan plan = plan_step(cand, pc);
        const double us = micros_since(t0);
        st.add(plan.imbalance(), us);
        cells.add(cell_imbalance(plan), 0);
        row.largest.add(plan, bound, row.masked_bound);
        moves += plan.search_moves;
        probes += plan.search_probes;
      }
      const double steps_run = static_cast<double>(st.us.size());
      std::printf("%-22s %-12s %14.5f %14.5f %14.5f %10.1f %10.1f %8.1f %8.0f\n", name,
                  balance_method_name(m), st.mean(), st.worst, cells.mean(), st.mean_us(),
                  st.median_us(), moves / steps_run, probes / steps_run);
      largest_rows.push_back(row);
    }
  }

  // What the activation arena is sized for against what the plans gave a micro-batch.
  std::printf(
      "\nthe largest micro-batch of any step against the planner's bound (micro_batch_bound; the "
      "arena's reserve)\n");
  std::printf("%-22s %-12s %16s %18s %20s %16s\n", "configuration", "method", "samples (bound)",
              "masked (bound)", "tokens (bound)", "cells beyond");
  for (const Row& r : largest_rows) {
    char samples[32], masked[32], tokens[32], beyond[32];
    std::snprintf(samples, sizeof samples, "%lld (%lld%s)",
                  static_cast<long long>(r.largest.samples),
                  static_cast<long long>(r.bound.samples), r.bound.samples_bounded ? "" : "*");
    std::snprintf(masked, sizeof masked, "%lld (%lld)", static_cast<long long>(r.largest.masked),
                  static_cast<long long>(r.masked_bound));
    std::snprintf(tokens, sizeof tokens, "%lld (%lld)", static_cast<long long>(r.largest.tokens),
                  static_cast<long long>(r.bound.tokens));
    std::snprintf(beyond, sizeof beyond, "%lld of %lld", static_cast<long long>(r.largest.over),
                  static_cast<long long>(r.largest.cells));
    std::printf("%-22s %-12s %16s %18s %20s %16s\n", r.name.c_str(), balance_method_name(r.method),
                samples, masked, tokens, beyond);
  }
  std::printf("* the count at max_seq_len, not a bound (lpt / lpt-search)\n");

  // What a loader pays on top: packing its own rank's micro-batches (pack_online).
  std::printf(
      "\npacking one rank (pack_online per micro-batch, K=3), plans of method lpt-search\n");
  std::printf("%-22s %16s\n", "configuration", "us per rank");
  for (const Config& cfg : {configs[0], configs[1], configs[2], configs[3]}) {
    const int n = cfg.ranks * cfg.per_rank;
    std::mt19937_64 rng(seed);
    PlannerConfig pc;
    pc.num_ranks = cfg.ranks;
    pc.micro_steps = cfg.micro_steps;
    pc.packing = {h.max_len, 3};
    pc.pack_rank = kPackNoRanks;
    double us = 0;
    int64_t packed = 0;
    for (int s = 0; s < std::min(cfg.steps, 50); ++s) {
      const StepPlan plan = plan_step(draw_step(rng, draw, n, int64_t{s} * n), pc);
      for (const RankPlan& rp : plan.ranks) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const MicroBatch& mb : rp.micro_batches) {
          std::vector<SeqRef> refs;
          for (const Candidate& c : mb.samples) refs.push_back({c.sample_id, c.length});
          pack_online(refs, pc.packing);
        }
        us += micros_since(t0);
        ++packed;
      }
    }
    char name[64];
    std::snprintf(name, sizeof name, "%d x %d, %d micro", cfg.ranks, cfg.per_rank, cfg.micro_steps);
    std::printf("%-22s %16.1f\n", name, us / packed);
  }
  return 0;
}
