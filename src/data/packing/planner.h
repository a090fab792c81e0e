// The step planner: which rank trains which sample in one optimizer step, in which micro-step,
// packed how, and the global counts the loss is normalised by (DESIGN.md, "Data flow" and
// "equivalence").
//
// Every rank allgathers the step's candidates (id, length, masked count) and calls plan_step()
// with the same input; the function is pure and deterministic (integer loads, ties broken by
// sample id and rank index, iteration budgets instead of wall-clock time), so every rank computes
// the same plan without further communication.
//
// Promise on candidate order: for the methods sorted_round_robin, lpt and lpt_search the plan
// depends only on the *multiset* of candidates, not on the order of the vector (everything is
// sorted by (length descending, id ascending) first). The method none is defined by candidate
// order (it is the "split the batch as it comes" baseline). Sample ids must be unique (checked).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/packing/packing.h"

namespace packbert {

// What the planner knows of a sample before its payload moves.
struct Candidate {
  int64_t sample_id = 0;
  int32_t length = 0;        // tokens, 1..max_seq_len
  int32_t masked_count = 0;  // MLM positions, 0..length
};

// Relative compute cost of one sample of `length` tokens, in "token equivalents":
//
//   cost(length) = per_token * length + per_token_pair * length^2 + per_sequence
//
// Why these defaults (BERT-Large, hidden H = 1024; forward FLOPs per layer, backward is ~2x
// forward for both terms so the ratio holds for a training step):
//   - linear part per token: Q, K, V and output projections 4 H^2 MACs, the MLP 8 H^2 MACs,
//     12 H^2 MACs = 24 H^2 FLOPs. This is the unit: per_token = 1.
//   - attention per token: Q K^T and P V each take len * H MACs (summed over heads), so
//     4 H len FLOPs per token, 4 H len^2 per sequence.
//   - dividing by 24 H^2: cost = len + len^2 / (6 H), so per_token_pair = 1 / (6 H) = 1/6144.
//     At len = 512 attention adds 42.7 token equivalents (8.3 %), at len = 128 only 2 %.
//   - the layer count multiplies both terms and cancels. Layer norms, GELU, dropout and the
//     embedding are linear in tokens (part of per_token). The MLM head runs on masked positions
//     only: 2 H V FLOPs (V = 30522) ~ 0.1 token equivalents of a 24-layer encoder per masked
//     token, and ~15 % of tokens are masked, so it adds ~1.5 % to per_token: folded in, because
//     balancing only needs relative costs.
//   - per_sequence = 8: work that does not scale with length (the pooler and NSP head on [CLS],
//     per-sequence tile scheduling and bookkeeping in variable-length attention). It is a small
//     guess, to be calibrated by regressing measured per-rank step times on (tokens, sum len^2,
//     sequences); it also stops a rank from collecting many short sequences for free.
// All three must be >= 0 (so cost never decreases with length) and cost(1) > 0.
struct CostModel {
  double per_token = 1.0;
  double per_token_pair = 1.0 / 6144.0;
  double per_sequence = 8.0;

  // The defaults above for another hidden size: per_token_pair = 1 / (6 * hidden).
  static CostModel for_hidden(int hidden);
  double operator()(int length) const {
    return per_token * length + per_token_pair * double(length) * length + per_sequence;
  }
};

// How samples are spread over ranks (and over the micro-steps of a rank).
enum class BalanceMethod {
  none,                // contiguous split in candidate order, equal sample counts (+-1)
  sorted_round_robin,  // Baidu, MLPerf v2.0: sort by length descending, deal round-robin
  lpt,                 // longest processing time first, no local search (for comparison)
  lpt_search,          // LPT, then local search on the most loaded bin
};
const char* balance_method_name(BalanceMethod m);
// "none", "round-robin", "lpt", "lpt-search"; anything else is an Error ("ours", the former
// name of lpt-search, says the new one).
BalanceMethod parse_balance_method(const std::string& name);

// Which ranks get packs in plan_step(): packing is per rank (~tens of us each), so a loader
// packs only its own rank; tests and tools pack all of them.
constexpr int kPackAllRanks = -1;
constexpr int kPackNoRanks = -2;

struct PlannerConfig {
  int num_ranks = 1;
  // Gradient-accumulation micro-steps per optimizer step (>= 1). Design: balance the whole step
  // over ranks first, then split each rank's share into micro_steps micro-batches of balanced
  // cost with the same method. With accumulation, ranks synchronise once, at the all-reduce
  // after the last micro-step, so each rank's *total* decides the step time and gets the finest
  // granularity (all its samples); balancing micro-batches inside a rank then makes every
  // (rank, micro-step) cell ~ total / micro_steps, which keeps the activation arena (sized per
  // micro-batch) even across micro-steps and ranks. Balancing R * micro_steps cells directly
  // would instead split the totals at a coarser grain (64 x 8 with 2 micro-steps: 4 samples a
  // cell). Equivalence is untouched: every micro-step scales its local loss sums by the step's
  // global counts below, and the gradients add up. A micro-batch is empty only when its rank has
  // fewer samples than micro_steps.
  int micro_steps = 1;
  PackingLimits packing;  // max_seq_len (every length must fit) and max_seqs_per_pack
  CostModel cost;
  BalanceMethod method = BalanceMethod::lpt_search;
  // Local-search work, in probes (one binary search for a move or swap partner each), for the
  // split over ranks; each rank's micro split gets max(64, search_budget / num_ranks), or 0 when
  // the budget is 0. A count, never wall-clock, so every rank stops at the same point. At 8 x 56
  // and 64 x 8 the search reaches a local optimum in ~600 / ~3000 probes; at 1024 x 8 it would
  // take ~160k, and 2^14 keeps the plan under 1 ms there (~10 ns a probe) while more than
  // halving LPT's excess over perfect balance.
  int64_t search_budget = int64_t{1} << 14;
  // kPackAllRanks, kPackNoRanks or one rank index. The only field that may differ between
  // ranks: it changes which packs are computed, never the assignment.
  int pack_rank = kPackAllRanks;
};

// One gradient-accumulation micro-step of one rank. Costs are in token equivalents (the planner
// sums them in fixed point, 1/1024 of a token equivalent per sample, so they are exact).
struct MicroBatch {
  std::vector<Candidate> samples;           // ascending sample id
  std::vector<std::vector<int64_t>> packs;  // sample ids per pack (pack_online), when packed
  double cost = 0;
  int64_t tokens = 0;
  int64_t masked_tokens = 0;
};

struct RankPlan {
  std::vector<MicroBatch> micro_batches;  // exactly micro_steps of them
  bool packed = false;                    // micro_batches[*].packs were computed
  double cost = 0;
  int64_t tokens = 0;
  int64_t masked_tokens = 0;
  int64_t samples = 0;

  // The rank's samples: micro-batch 0's, then micro-batch 1's, ... (each by ascending id). Built
  // on demand: plan_step() keeps to one allocation per micro-batch (1024 ranks: ~1 ms budget).
  std::vector<int64_t> sample_ids() const;
};

struct StepPlan {
  std::vector<RankPlan> ranks;
  // What the loss is normalised by (sums over all ranks, known before the step runs):
  // loss = sum(MLM token losses) / global_masked_tokens + sum(NSP losses) / global_samples.
  int64_t global_masked_tokens = 0;
  int64_t global_samples = 0;
  int64_t global_tokens = 0;
  double max_cost = 0;  // the most loaded rank: what the step waits for
  double mean_cost = 0;
  int64_t search_moves = 0;   // improving moves/swaps the local search applied (all problems)
  int64_t search_probes = 0;  // local-search work spent (all problems)

  // max_cost / mean_cost (1 when there is no work): 1.0 is perfect balance.
  double imbalance() const { return mean_cost > 0 ? max_cost / mean_cost : 1.0; }
};

// The plan of one step. Throws Error on bad config (num_ranks or micro_steps < 1, a negative
// cost coefficient, pack_rank out of range) or bad candidates (length outside 1..max_seq_len,
// masked_count outside 0..length, a duplicate sample id).
StepPlan plan_step(const std::vector<Candidate>& candidates, const PlannerConfig& config);

// The most one micro-batch of plan_step() can hold, known before any data (to size buffers
// once), for global_batch_size samples of at most config.packing.max_seq_len tokens each. With
// S = ceil(ceil(G / ranks) / micro_steps) (G = global_batch_size):
// - none, round-robin: equal sample counts, so at most S samples and S * max_seq_len tokens.
// - lpt, lpt-search: list scheduling puts each sample on the least loaded bin, and the local
//   search only makes moves that lower the largest load, so a rank's cost stays at most the
//   mean plus one sample's, and a micro-batch's at most its rank's share plus one sample's: at
//   most C = (G / (ranks * micro_steps) + 1 / micro_steps + 1) * cost(max_seq_len), hence at
//   most C / per_token tokens (cost(len) >= per_token * len). The sample count has no such
//   bound (many short samples fit in the same cost): samples_bounded is false and samples is
//   S + 2, the count at max_seq_len.
struct MicroBatchBound {
  int64_t samples = 0;
  int64_t tokens = 0;
  bool samples_bounded = true;  // false: samples is the count at max_seq_len, not a bound
};
MicroBatchBound micro_batch_bound(const PlannerConfig& config, int64_t global_batch_size);

// Lengths of one pack's samples, in pack order (for sequence_layout()).
std::vector<int32_t> pack_lengths(const MicroBatch& mb, size_t pack_index);

// The variable-length layout of sequences laid end to end (the unpadded layout of a micro-batch,
// or one row of the packed layout): cu_seqlens[i] is where sequence i starts (n + 1 entries,
// cu_seqlens[n] = total tokens) and position_ids restart at 0 for every sequence.
struct SequenceLayout {
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> position_ids;
};
// Throws Error on a length < 1 or a total beyond int32.
SequenceLayout sequence_layout(const std::vector<int32_t>& lengths);

}  // namespace packbert
