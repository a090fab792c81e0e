// DataLoader: gives every rank its share of each optimizer step, read, planned, exchanged and
// packed on a thread of its own while the previous steps compute (DESIGN.md, "Data flow").
//
// Global order (rank equivalence): an epoch visits all samples of the sorted shard list in an
// order fixed by (seed, epoch) alone (data/loader/epoch_order.h). Step s trains the next
// global_batch_size positions of that order, so the *set* of samples of a step does not depend
// on the number of ranks; only who trains which does (the planner, by cost).
//
// One step on the loader thread, on every rank:
//   1. read: a reader thread of each rank has read the blocks it owns of the shuffle windows
//      the step touches, ahead of time (shards are owned per epoch, data/loader/epoch_order.h:
//      assign_shard_owners);
//   2. gather: all ranks allgather (id, length, masked count) of the candidates they own,
//      plus a failure flag and message (a rank that cannot read makes all ranks fail here, at
//      the same step, with its message);
//   3. plan: plan_step() on identical input, so every rank computes the same plan;
//   4. exchange: MPI_Ialltoallv moves payloads from readers to trainers (a rank keeps its own
//      samples without copying);
//   5. the batch waits in a queue of prefetch_steps for next().
//
// Last partial step: see LastStepPolicy. Errors: see DataLoader.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/loader/batch_warmup.h"
#include "data/masking/masking.h"
#include "data/packing/planner.h"
#include "data/shards/sample.h"

namespace packbert {

// An epoch of N samples and a global batch of B when B does not divide N.
enum class LastStepPolicy {
  // The epoch's last step trains the N mod B remaining samples: every sample exactly once per
  // epoch. The loss stays an exact mean (it is normalised by the step's own global counts);
  // only that step's gradient is noisier. Default.
  partial,
  // The remainder is not trained in this epoch (the next epoch's shuffle drops other samples):
  // every step has exactly B samples, as MLPerf's fixed-batch trainers assume.
  drop,
};
const char* last_step_policy_name(LastStepPolicy p);
LastStepPolicy parse_last_step_policy(const std::string& name);  // "partial" | "drop"

struct LoaderOptions {
  int64_t global_batch_size = 256;  // samples per optimizer step, all ranks together
  BatchWarmup warmup;               // a smaller batch first (off by default): batch_warmup.h
  int micro_steps = 1;              // gradient-accumulation micro-steps per step
  int max_seq_len = 512;            // pack length; longer samples are an error naming them
  int max_seqs_per_pack = 3;        // 0: no limit
  uint64_t seed = 42;
  int prefetch_steps = 2;  // steps ready ahead of next() (>= 1)
  // Planner (PlannerConfig's num_ranks, micro_steps, packing and pack_rank come from above).
  CostModel cost;
  BalanceMethod balance = BalanceMethod::lpt_search;
  int64_t search_budget = int64_t{1} << 14;
  // What every sample must satisfy; max_seq_len 0 (or above max_seq_len) becomes max_seq_len.
  SampleRules rules;
  // Shuffle granularity (data/loader/epoch_order.h): contiguous rows read at once, and blocks whose
  // samples are shuffled together. 4096 rows is ShardWriter's HDF5 chunk, so a block is one
  // chunk read.
  int64_t shuffle_block_rows = 4096;
  int64_t shuffle_window_blocks = 8;
  // Windows a rank's reader thread reads beyond the newest one a step needs (>= 0). Memory:
  // about (2 + read_ahead_windows) windows of samples spread over the ranks, plus the
  // prefetched steps.
  int read_ahead_windows = 1;
  LastStepPolicy last_step = LastStepPolicy::partial;
  // Dynamic masking (none: the shards' static masks): each sample masked again as it is read,
  // by mask_dynamic with (seed, the epoch, its global id), so the masks of a step do not
  // depend on the ranks, the layout, the prefetch depth or a resume.
  struct Masking {
    MaskRule rule;
    MaskVocab vocab;
  };
  std::shared_ptr<const Masking> masking;
};

// Where the loader stands: enough to continue exactly where an uninterrupted run would. The
// order is a function of (seed, epoch), so no RNG state or shard order needs saving; the other
// fields identify the order and the data, and a resume with different ones is an error. The
// rank count, batch size, micro-steps and planner settings may change on resume: the epoch
// still visits every sample once.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t epoch_cursor = 0;  // positions of the epoch's order already trained
  int64_t step = 0;          // optimizer steps delivered since training started
  int64_t tokens = 0;        // real tokens of those steps (a batch warmup in tokens); -1: unknown
  uint64_t seed = 0;
  int64_t shuffle_block_rows = 0;
  int64_t shuffle_window_blocks = 0;
  int64_t num_shards = 0;
  int64_t num_samples = 0;
  uint64_t shards_hash = 0;  // over the shard file names (not directories) and sample counts

  bool operator==(const LoaderPosition& o) const;
};
std::string loader_position_to_json(const LoaderPosition& p);
LoaderPosition loader_position_from_json(const std::string& json);  // Error on bad input

// One micro-step of this rank.
struct LoaderMicroBatch {
  std::vector<Sample> samples;  // ascending Sample::id; the id is the global one (epoch_order.h)
  std::vector<std::vector<int32_t>> packs;  // indices into samples, per pack (pack_online)
  int64_t tokens = 0;
  int64_t masked_tokens = 0;
  double cost = 0;  // planner cost, token equivalents
};

// Seconds the loader thread spent on one step (hidden behind compute unless next() waited).
struct LoaderStepTimes {
  double read = 0;      // waiting for this rank's reader thread (reads not done ahead)
  double gather = 0;    // metadata allgather, including waiting for the slowest rank
  double plan = 0;      // plan_step (the whole step's plan, on every rank) and packing
  double exchange = 0;  // encode, alltoallv, decode
};

// This rank's part of one optimizer step.
struct StepBatch {
  int64_t step = 0;  // since training started (LoaderPosition::step)
  int64_t epoch = 0;
  int64_t epoch_begin = 0;  // the step trains positions [epoch_begin, epoch_end) of the epoch
  int64_t epoch_end = 0;
  std::vector<LoaderMicroBatch> micro_batches;  // micro_steps of them (some may be empty)
  // The loss normalisers: sums over all ranks (DESIGN.md, "equivalence").
  int64_t global_samples = 0;
  int64_t global_masked_tokens = 0;
  int64_t global_tokens = 0;
  std::vector<int32_t> global_lengths;  // every sample of the step, all ranks (model FLOPs)
  double imbalance = 1;                 // planner: max rank cost / mean rank cost
  double wait_seconds = 0;              // exposed wait: how long next() blocked for this batch
  LoaderStepTimes times;

  int64_t num_samples() const;  // this rank's samples, all micro-batches
};

// Errors: a shard that cannot be opened or holds a bad sample fails every rank with the same
// message naming the shard and sample (thrown from the constructor, or from next() at the
// step that needs it, after the earlier steps were delivered). Any other failure on the loader
// thread is rethrown from that rank's next(); the top-level handler's MPI_Abort then ends the
// peers waiting in the loader's collectives. Collective: construction, and destruction outside
// of stack unwinding (the threads agree to stop). Destroyed during unwinding, the loader
// abandons its communication at once, so the exception reaches the handler (and MPI_Abort).
class DataLoader {
 public:
  // shard_paths: shard files or directories (list_shards); the union is sorted by path. Every
  // rank must see the same list. resume: continue from a saved position().
  DataLoader(MPI_Comm comm, const std::vector<std::string>& shard_paths,
             const LoaderOptions& options,
             const std::optional<LoaderPosition>& resume = std::nullopt);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // This rank's samples of the next step (blocks until ready).
  StepBatch next();
  // The position after the last batch next() returned (the start position before the first).
  LoaderPosition position() const;

  const std::vector<std::string>& shards() const;
  int64_t num_samples() const;
  // Steps of a whole epoch under the policy (ceil or floor of num_samples / global batch).
  int64_t steps_per_epoch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace packbert
