// The data-parallel gradient reducer: one object sums the flat gradient buffer over ranks,
// bucket by bucket while the backward still runs (DESIGN.md, Distribution). The bucket plan and
// its order are comm/bucket_scheduler.h's; the bytes move through one of two transports:
//
//   mpi   host memory: one MPI_Iallreduce (or MPI_Ireduce_scatter) per bucket, in place,
//         progressed by MPI_Testsome from ready() and progress() (OpenMPI has no progress
//         thread for non-blocking collectives). A gradient in device memory is staged through
//         the host bucket by bucket (the backend's copies): slow, but the path NCCL is compared
//         with, and a fallback where NCCL cannot run.
//   nccl  device memory: per bucket an event on the backend's stream, a wait and the collective
//         on a communication stream of its own, a done event the backend's stream waits for at
//         finish() (comm/nccl_transport.h). The host never blocks.
//
// One rank (or MPI not initialised: unit tests, a bare run) needs no transport: nothing moves and
// no MPI, CUDA or NCCL call is made, but the bookkeeping runs, so a model that forgets or repeats
// a tensor fails in a single-process run too (nccl_on_one_rank runs the NCCL path anyway).
//
// Collectives. A round (begin() .. finish()) either all-reduces every bucket, or reduce-scatters
// it: rank r then holds the sum over ranks of the part of each bucket it owns (shard(k)): the
// elements [shard_bounds[r], shard_bounds[r + 1]) of the buffer (GradReducerOptions); the rest
// of the bucket is left unspecified. The reducer does gradients only; the way back (the weights'
// all-gather), a checkpoint's gather to one rank and the optimizer's sums are the
// ShardExchange's (comm/shard_exchange.h), which shares this reducer's communicators, and a
// step's metric sums are MetricSums' (comm/metric_sums.h). MPI moves a bucket's parts with one
// MPI_Ireduce_scatter / MPI_Iallgatherv (counts per owner, zero for ranks owning none of it);
// NCCL with one ncclReduce / ncclBroadcast per owner in a group.
//
// Determinism. For a fixed rank count and bucket plan, OpenMPI and NCCL pick their algorithm and
// summation order from the communicator size and message size only: the result is bitwise
// reproducible run to run and the same on every rank. Across rank counts the order differs:
// rounding only (tests/mpi/mpi_allreduce_driver checks both for MPI).
//
// Graphs. With NCCL (or no transport: one rank) a round can run inside a CUDA graph, the
// collectives among the backward's ops (Bert's train.cuda_graphs = "full"). The first time, the
// ops run as usual; at the recording, ready_tensor() and complete() (finish()'s work, the last
// buckets and the backend stream's wait for them) run inside the capture, which records them;
// a replay issues nothing, and graph_launched() after it does the bookkeeping instead. Either
// way finish() then returns the statistics. NCCL requires a captured collective's launch to be
// uniform over the ranks, and each launch of a graph to pair with the graphs the other ranks
// recorded together with it: the caller keeps that by deciding together (all_ranks, one
// MPI_Allgather of a few values) when to run, record and replay.
//
// Errors. MPI runs on a duplicate of the parent communicator (its collectives match no one
// else's) with MPI_ERRORS_RETURN: a failure is a packbert::Error naming the call. NCCL's are
// described in comm/nccl_transport.h. The object is used by one thread (the compute thread).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "comm/bucket_scheduler.h"

namespace packbert {

// How a device gradient travels (the CPU backend's host gradient always goes through MPI).
enum class GradTransport { nccl, mpi };

struct GradReducerOptions {
  // Target bucket size (~25 MB suits a network, NVLink and InfiniBand alike; see
  // tests/bench/bench_allreduce).
  size_t bucket_bytes = size_t{25} << 20;
  GradTransport device_transport = GradTransport::nccl;
  // NCCL: the GPU of the backend (ranks of one host need different ones: NCCL wants one GPU per
  // rank, and the bootstrap refuses two ranks on one GPU naming them).
  int cuda_device = 0;
  // One rank: run the NCCL path over a communicator of one anyway (tests of the stream, event
  // and NCCL calls on a machine with one GPU).
  bool nccl_on_one_rank = false;
  // Who owns what in a reduce-scatter and an all-gather: rank r owns the elements
  // [shard_bounds[r], shard_bounds[r + 1]); size + 1 values, ascending, from 0 to num_elems.
  // Empty: equal parts (the last rank takes the remainder).
  std::vector<int64_t> shard_bounds;
};

class GradReducer {
 public:
  // grads: the flat f32 gradient buffer [num_elems] on the backend's device (it must stay
  // valid; the caller must not write a bucket between its start and finish()). tensors: the
  // table in any order; ready_tensor(i) takes the index i into it. Collective over parent.
  GradReducer(MPI_Comm parent, Backend& backend, const Tensor& grads,
              std::vector<GradSpan> tensors, const GradReducerOptions& options = {});
  // Frees the communicator. If a round is still in flight (an exception unwound the backward),
  // MPI's communicator and requests are leaked instead and NCCL's is aborted: waiting could
  // hang on a peer that died, and the top-level handler is about to MPI_Abort anyway.
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "none" (one rank), "mpi", "mpi via host" (a device gradient staged) or "nccl".
  const char* transport_name() const { return transport_name_; }
  const std::vector<GradBucket>& buckets() const { return sched_.buckets(); }
  int buckets_started() const { return sched_.buckets_started(); }

  // Arms a round for the backward whose gradients are final (the last micro-step of a global
  // batch). ready() calls outside a round are checked and otherwise ignored, so the model may
  // announce tensors on every micro-step and let the trainer decide which one reduces.
  void begin(GradCollective collective = GradCollective::allreduce);
  bool in_round() const { return sched_.in_round(); }
  // The gradient of tensor i is final: no op writes it again in this round (Error on a repeat).
  void ready_tensor(int i);
  // The same, naming the tensor by its table row (offset and size must match one exactly).
  void ready(int64_t offset, int64_t size);
  // Lets the transport move the started buckets along; call it between long ops.
  void progress();
  // Starts whatever has not started (every tensor must have been marked ready, else Error naming
  // the first missing one) and completes the round: with MPI the host buffer holds the result on
  // return; with NCCL the backend's stream waits for it (work issued next sees it).
  GradReduceStats finish();

  // Whether a round can run inside a CUDA graph (see Graphs): NCCL's transport, or none.
  bool capturable() const { return !transport_ || std::strcmp(transport_name_, "nccl") == 0; }
  // finish()'s work at the end of the backward's ops (recorded when they are captured); finish()
  // then returns its statistics only.
  void complete();
  // A graph holding this round (recorded at an earlier round, or at this one) was launched on the
  // backend's stream (see Graphs); Error if the reducer is not capturable().
  void graph_launched();
  // Every rank's `local` (the same length on each), in rank order: one MPI_Allgather on the
  // reducer's communicator (watched), or `local` itself on one rank.
  std::vector<int64_t> all_ranks(const std::vector<int64_t>& local);

  // The part of bucket k this rank owns (reduce-scatter): elements [offset, offset + size),
  // possibly empty.
  GradBucket shard(int k) const;
  // The ownership bounds in use (size() + 1 values; see GradReducerOptions::shard_bounds).
  const std::vector<int64_t>& shard_bounds() const { return bounds_; }

 private:
  friend class ShardExchange;  // moves its bytes through this reducer's transport
  int rank_ = 0;
  int size_ = 1;
  int64_t num_elems_ = 0;
  const char* transport_name_ = "none";
  const char* collective_name_ = "all-reduce (gradient reducer)";  // the watchdog's name
  MPI_Comm comm_ = MPI_COMM_NULL;  // the duplicate (more than one rank)
  std::vector<int64_t> bounds_;    // shard_bounds, checked or made
  GradBucketScheduler sched_;
  std::unique_ptr<GradBucketTransport> transport_;  // null on one rank
};

}  // namespace packbert
