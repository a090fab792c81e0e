// The collectives of a buffer cut by rank, besides the gradient's reduce-scatter: what a sharded
// optimizer needs to give every rank the weights it updated, to bring its state to one rank for
// a checkpoint, and to sum its partial norms.
//
//   all_gather      each bucket's parts of a buffer laid out as the gradient (f32, bf16 or f16),
//                   from their owners to every rank, in place (the weights after an update)
//   gather_to_root  the owned parts of host arrays onto one rank (a checkpoint's moments)
//   sum             in-place sum over ranks of a few f64 values in the backend's memory
//
// Ownership is the gradient reducer's: rank r owns the elements [shard_bounds[r],
// shard_bounds[r + 1]) (GradReducerOptions::shard_bounds), and all_gather moves them bucket by
// bucket in the reducer's plan. The bytes travel through the reducer's transport (its
// duplicate MPI communicator, and on GPUs its NCCL communicator and communication stream: a
// second NCCL communicator would double their memory and bootstrap time), so the exchange
// must not outlive its reducer and runs between gradient rounds only (each call checks).
// Ordering: MPI calls return when done (a device buffer is staged through the host); NCCL ones
// are ordered on the backend's stream, which waits for them, and the host does not.
//
// Hangs: every call is watched by the collective watchdog (core/watchdog.h), by a WatchScope
// on the host, and on NCCL by an AsyncWatch on each collective (comm/nccl_transport.h).
#pragma once

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
  // The owned parts of host arrays onto rank root: mine holds this rank's elements
  // [shard_bounds[rank], shard_bounds[rank + 1]); all (root only; ignored elsewhere) receives
  // the whole [num_elems] array. Blocking and collective. One rank: a copy.
  void gather_to_root(const float* mine, float* all, int root);
  // In-place sum over ranks of a few f64 values (at most 2^20) in the backend's memory.
  void sum(const Tensor& values);

 private:
  GradReducer& reducer_;
};

}  // namespace packbert
