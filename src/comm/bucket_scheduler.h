// The bucket scheduling of the gradient reducer (comm/grad_reducer.h), apart from the transport
// that moves the bytes: the same bookkeeping drives MPI and NCCL. The buffer's span is cut into
// buckets of bucket_bytes from its END (bucket 0 is the first complete in the backward; a
// boundary may fall inside a tensor), and buckets start strictly in order, each once every
// tensor overlapping it is ready, so every rank starts collectives in the same order whatever
// order it marks tensors in. begin() arms a round; ready() outside one is checked and ignored;
// finish() names the first tensor never marked. Without a transport (one rank) a started bucket
// is complete at once. Why: docs/communication.md#buckets. Pure host C++ (no MPI, no CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/base/tensor.h"

namespace packbert {

// One tensor of the flat gradient buffer (a row of the parameter table).
struct GradSpan {
  int64_t offset = 0;  // first element
  int64_t size = 0;    // elements
};

// A contiguous piece of the buffer reduced by one collective.
struct GradBucket {
  int64_t offset = 0;
  int64_t size = 0;      // elements (fits an int count, MPI's and NCCL's alike)
  int first_tensor = 0;  // tensors overlapping it, as indices into the sorted table:
  int last_tensor = -1;  // [first_tensor, last_tensor]; empty for a gap-only bucket
};

// The bucket plan (pure arithmetic): tensors sorted by offset, non-overlapping, inside
// [0, num_elems). Buckets cover [first offset, last end) in pieces of bucket_bytes / 4 elements
// (at least 1), bucket 0 at the end. Throws Error on a bad table.
std::vector<GradBucket> plan_grad_buckets(const std::vector<GradSpan>& sorted_tensors,
                                          int64_t num_elems, size_t bucket_bytes);

// The part of bucket b each rank owns when rank r owns the elements [bounds[r], bounds[r + 1]):
// counts in rank order (0 for a rank owning none of it), tiling the bucket from its offset.
std::vector<int64_t> bucket_part_counts(const GradBucket& b, const std::vector<int64_t>& bounds);

// What happened in one round (begin() .. finish()).
struct GradReduceStats {
  int buckets = 0;
  int started_before_finish = 0;    // started by ready() (the rest start in finish())
  int completed_before_finish = 0;  // seen complete by the transport before finish() was
                                    // called: communication hidden behind compute
  double finish_wait_s = 0;         // time finish() spent waiting (exposed communication; on
                                    // the GPU the host does not wait, the compute stream does)
  int graph = 0;                    // 0: issued op by op; 1: recorded into a CUDA graph (and
                                    // launched); 2: replayed from one (comm/grad_reducer.h)
};

// What a round does to each bucket (GradReducer explains the shards).
enum class GradCollective { allreduce, reduce_scatter };

// How the buckets' bytes move. The scheduler calls start(k) exactly once per bucket and round,
// for k = 0, 1, 2, ... in order, and complete_all() once at the end of the round, after the
// last start().
class GradBucketTransport {
 public:
  virtual ~GradBucketTransport() = default;
  // A round begins (no bucket started yet).
  virtual void begin_round(GradCollective collective) = 0;
  // Starts the sum over ranks of buckets[k] (its tensors' gradients are final).
  virtual void start(int k, const GradBucket& bucket) = 0;
  // Without blocking: lets started buckets progress and returns how many of the buckets started
  // in this round are known complete (never decreasing within a round).
  virtual int test() = 0;
  // Every bucket of the round is complete for whoever reads the buffer next (the host for MPI,
  // the compute stream for NCCL).
  virtual void complete_all() = 0;
  // The round's collectives were captured into a CUDA graph that has just been launched on the
  // reader's stream (the recording's own launch, or a replay: GradBucketScheduler::
  // graph_launched): nothing to issue; the transport watches the launch. Only a transport whose
  // calls a capture can record has one (NCCL's).
  // The default throws Error: a transport that is not NCCL's cannot be in a graph.
  virtual void launched();
  // Outside a round, the same for a graph holding other collectives of this transport
  // (ShardExchange::graph_launched): the launch is watched under that name.
  virtual void watch_launch(const char* collective);
  // While the host waits in MPI (GradReducer::all_ranks): lets the device run what was issued
  // (a GPU does anyway; the emulated one runs its streams only when the host asks).
  virtual void poll() {}
  // Outside a round: the owned parts of every bucket of buffer (laid out as the gradient) from
  // their owners to every rank (ShardExchange::all_gather).
  virtual void all_gather(const std::vector<GradBucket>& buckets, const Tensor& buffer) = 0;
  // Outside a round: the in-place sum over ranks of a few f64 values in the buffer's memory,
  // ordered as all_gather (ShardExchange::sum).
  virtual void allreduce_sum(const Tensor& values) = 0;
  // Outside a round: all-gathers in groups that the reader waits for one by one
  // (ShardExchange::start_gathers): group g's parts (each the owned parts of `pieces` of its
  // buffer, from their owners to every rank), started in order after the work issued so far;
  // wait_group(g) makes whoever reads next (the compute stream for NCCL) wait for group g
  // only. The host transport moves each group when started and has nothing to wait for.
  struct GatherPart {
    Tensor buffer;
    std::vector<GradBucket> pieces;
  };
  virtual void start_groups(const std::vector<std::vector<GatherPart>>& groups) {
    for (const auto& group : groups)
      for (const GatherPart& part : group) all_gather(part.pieces, part.buffer);
  }
  virtual void wait_group(int /*group*/) {}
};

class GradBucketScheduler {
 public:
  // tensors: the table in any order (ready_tensor(i) takes the caller's index i). label prefixes
  // every error message ("grad reducer").
  GradBucketScheduler(std::vector<GradSpan> tensors, int64_t num_elems, size_t bucket_bytes,
                      std::string label);

  // nullptr (the default): one rank, a started bucket is complete at once. Not owned; set it
  // between rounds only.
  void set_transport(GradBucketTransport* transport);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  // Buckets of the current (or last) round started / known complete so far.
  int buckets_started() const { return next_to_start_; }
  int buckets_completed() const { return completed_; }

  void begin(GradCollective collective = GradCollective::allreduce);
  bool in_round() const { return in_round_; }
  // The gradient of tensor i is final. Throws Error if i is out of range or i was already marked
  // in this round (naming the tensor).
  void ready_tensor(int i);
  // The same, naming the tensor by its table row (offset and size must match one exactly).
  void ready(int64_t offset, int64_t size);
  // Lets the transport move the started buckets along.
  void progress();
  // Starts whatever has not started and completes the round (see GradBucketTransport). After
  // complete() or graph_launched() it returns their statistics only.
  GradReduceStats finish();

  // A round inside a CUDA graph (docs/communication.md#graphs). complete() is finish()'s work
  // done at the end of the backward's ops, so that a capture records the last buckets and the
  // reader's wait for them; the round is then over but for finish(). graph_launched(): a graph
  // holding the round was launched: after complete() (the recording's launch) the transport
  // watches it; otherwise (a replay, with no ready() since begin()) every tensor counts as ready
  // and every bucket as started without the transport being asked, and the round is over but
  // for finish() too.
  void complete();
  void graph_launched();

 private:
  void start_ready_buckets();
  void test_started();
  int tensor_index(int64_t offset, int64_t size) const;

  std::string label_;
  GradBucketTransport* transport_ = nullptr;
  std::vector<GradSpan> tensors_;    // sorted by offset
  std::vector<int> sorted_index_;    // constructor's index -> sorted index
  std::vector<int> original_index_;  // sorted index -> constructor's index
  std::vector<GradBucket> buckets_;
  std::vector<int> tensor_first_bucket_, tensor_last_bucket_;  // buckets each tensor overlaps

  // Per round.
  bool in_round_ = false;
  std::vector<char> tensor_ready_;
  std::vector<int> bucket_pending_;  // tensors of the bucket not ready yet
  int next_to_start_ = 0;
  int completed_ = 0;
  bool completed_early_ = false;  // complete() or graph_launched(): finish() returns early_
  GradReduceStats early_;
};

}  // namespace packbert
