// Inside the data loader: the per-step pipeline the loader thread runs (read, gather, plan,
// exchange), apart from the thread, queue and public API in loader.cpp.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/base/error.h"
#include "data/loader/epoch_order.h"
#include "data/loader/exchange.h"
#include "data/loader/loader.h"
#include "data/shards/shard.h"

namespace packbert::detail {

// An error raised on every rank alike (a failed read reported in the gather, a planner error
// on the identical input): the peers know, so nobody waits for this rank.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

// Thrown on every rank's loader thread when some rank asked to stop (its DataLoader is being
// destroyed); which rank is in `rank`.
struct LoaderStopped {
  int rank = 0;
};

// The next step to produce: positions [pos, ...) of epoch `epoch`'s order.
struct LoaderCursor {
  int64_t epoch = 0;
  int64_t pos = 0;
  int64_t step = 0;
  int64_t tokens = 0;  // real tokens of the steps before `step`
};

// The global batch of the step at cursor c (LoaderOptions::warmup).
inline int64_t batch_at(const LoaderCursor& c, const LoaderOptions& o) {
  return warmup_batch_size(o.warmup, o.global_batch_size, c.step, c.tokens);
}

// Moves a cursor past an epoch's end (or, under LastStepPolicy::drop, past a remainder shorter
// than the cursor's step's batch).
LoaderCursor normalize_cursor(LoaderCursor c, int64_t num_samples, const LoaderOptions& o);

// One block's samples, as read (ids already global).
struct LoadedBlock {
  int64_t begin = 0;  // first row
  std::vector<Sample> rows;
};

// Reads the blocks this rank owns on a thread of its own, in the order the steps will need
// them (window after window, epoch after epoch), up to read_ahead_windows windows beyond the
// newest window a step asked for. Reading thus runs beside the step's collectives and the
// trainer's compute, and a rank whose share of a window is large reads it during the steps
// of the window before, instead of stalling every rank at the gather of the step that needs it.
class BlockPrefetcher {
 public:
  struct Window {
    std::unordered_map<int64_t, LoadedBlock> blocks;  // this rank's blocks, by block number
  };

  BlockPrefetcher(const std::vector<std::string>& shards, const BlockLayout& layout,
                  const LoaderOptions& options, int rank, int num_ranks, LoaderCursor start);
  ~BlockPrefetcher();
  BlockPrefetcher(const BlockPrefetcher&) = delete;
  BlockPrefetcher& operator=(const BlockPrefetcher&) = delete;

  // Waits for windows [first, last] of `epoch` and returns them (the caller may move samples
  // out; the reader never touches a window again once it is handed over). When the reader
  // failed on one of them (or before), returns {} and sets error to its message.
  std::vector<Window*> wait(int64_t epoch, int64_t first, int64_t last, std::string& error);
  // Frees every window before (epoch, window).
  void release_before(int64_t epoch, int64_t window);
  // Stops and joins the reader thread (the destructor does too).
  void stop();

 private:
  int64_t seq(int64_t epoch, int64_t window) const { return epoch * windows_per_epoch_ + window; }
  void run(LoaderCursor start);
  std::unique_ptr<Window> read_window(int64_t epoch, const EpochOrder& order,
                                      const std::vector<int32_t>& owner, int64_t w);

  const std::vector<std::string>& shards_;
  const BlockLayout& layout_;
  LoaderOptions opt_;
  int rank_, num_ranks_;
  int64_t windows_per_epoch_;  // the same every epoch: ceil(blocks / window_blocks)
  std::unordered_map<int64_t, std::unique_ptr<ShardReader>> readers_;  // reader thread only

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::unique_ptr<Window>> windows_;  // complete windows, by seq()
  int64_t requested_ = 0;                               // the newest seq() a step asked for
  int64_t failed_seq_ = INT64_MAX;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

class StepProducer {
 public:
  StepProducer(LoaderComm& comm, const std::vector<std::string>& shards, const BlockLayout& layout,
               const LoaderOptions& options, LoaderCursor start);

  // The next step (collective on the loader communicator). With stop = true, tells the other
  // ranks this one stops and throws LoaderStopped. Throws LoaderStopped when another rank
  // stopped, CollectiveError (the same on every rank) when a rank failed to read.
  StepBatch produce(bool stop);
  // Where the next produce() starts.
  const LoaderCursor& cursor() const { return cursor_; }
  // Stops the reader thread, keeping every buffer (for an abandoned loader, see DataLoader).
  void stop_reading() { prefetcher_.stop(); }

 private:
  Sample& loaded_sample(int64_t id);
  std::vector<Candidate> gather_candidates(const std::vector<int64_t>& ids,
                                           const std::string& read_error, bool stop);
  void exchange(const StepPlan& plan, StepBatch& out);

  LoaderComm& comm_;
  const BlockLayout& layout_;
  LoaderOptions opt_;
  PlannerConfig planner_;
  LoaderCursor cursor_;
  std::unique_ptr<EpochOrder> order_;  // of cursor_.epoch
  std::vector<int32_t> owner_;         // shard -> rank reading it this epoch
  BlockPrefetcher prefetcher_;
  // The windows of the step being produced: windows_[w - first_window_].
  std::vector<BlockPrefetcher::Window*> windows_;
  int64_t first_window_ = 0;

  std::vector<char> send_, recv_;  // reused payload buffers
};

}  // namespace packbert::detail
