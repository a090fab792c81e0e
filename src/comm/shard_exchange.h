// The collectives of a buffer cut by rank, besides the gradient's reduce-scatter: a sharded
// optimizer's weights to every rank (all_gather, by layer with start_gathers / wait_gather), its
// state to one rank for a checkpoint (gather_to_root), and its partial norms summed (sum).
// Ownership and transport are the gradient reducer's (its communicators and stream), so the
// exchange must not outlive it and runs between gradient rounds only (each call checks). MPI
// calls return when done; NCCL ones are ordered on the backend's stream, not the host. Every call
// is watched (core/watchdog.h). Why it shares the reducer's transport:
// docs/communication.md#the-shard-exchange.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/grad_reducer.h"

namespace packbert {

class ShardExchange {
 public:
  explicit ShardExchange(GradReducer& reducer) : reducer_(reducer) {}
  ShardExchange(const ShardExchange&) = delete;
  ShardExchange& operator=(const ShardExchange&) = delete;

  // Each bucket's parts of buffer (f32, bf16 or f16 [num_elems] on the backend's device, laid
  // out as the gradient) from their owners to every rank, in place.
  void all_gather(const Tensor& buffer);
  // The same over the ranges [first, second) of the buffer only (ascending, not overlapping):
  // the parts of them each rank owns, to every rank.
  void all_gather(const Tensor& buffer, const std::vector<std::pair<int64_t, int64_t>>& ranges);
  // Ranges of buffers (as all_gather's) in groups: groups[g] lists (buffer, ranges) pairs.
  // Started in order after the work issued so far; wait_gather(g) makes the reader (NCCL: the
  // backend's stream; MPI moves every group before start_gathers returns) wait for group g
  // only. Every group must be waited for before its buffers are written again. Inside a
  // capture (NCCL's, the optimizer's graph) the groups end inside the captured work: there is
  // no group to wait for after it.
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  void start_gathers(const std::vector<std::vector<std::pair<Tensor, Ranges>>>& groups);
  void wait_gather(int group);
  // The owned parts of host arrays onto rank root: mine holds this rank's elements
  // [shard_bounds[rank], shard_bounds[rank + 1]); all (root only; ignored elsewhere) receives
  // the whole [num_elems] array. Blocking and collective. One rank: a copy.
  void gather_to_root(const float* mine, float* all, int root);
  // The same onto every rank (all: [num_elems] on every rank).
  void gather_to_all(const float* mine, float* all);
  // In-place sum over ranks of a few f64 values (at most 2^20) in the backend's memory.
  void sum(const Tensor& values);
  // A graph holding sum() calls (recorded with the transport's capture: NCCL's) was just
  // launched on the backend's stream: the transport watches it.
  void graph_launched();

 private:
  // The ranges as pieces inside the reducer's buckets (each fits an int count), by offset.
  std::vector<GradBucket> pieces(const Tensor& buffer, const Ranges& ranges) const;
  GradReducer& reducer_;
};

}  // namespace packbert
