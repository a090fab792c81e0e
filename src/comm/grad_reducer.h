// The data-parallel gradient reducer: sums the flat gradient buffer over ranks, bucket by
// bucket while the backward still runs (buckets: comm/bucket_scheduler.h). A round
// (begin() .. finish()) all-reduces every bucket or reduce-scatters it by owner (shard(k)).
// Transports: MPI on host memory (a device gradient staged through the host), NCCL on device
// memory (comm/nccl_transport.h); one rank moves nothing but keeps the bookkeeping. Results
// are bitwise reproducible for a fixed rank count and bucket plan. With NCCL or one rank a round
// can be captured into a CUDA graph. Errors are packbert::Error naming the call; one thread
// (the compute thread) uses the object. The reasoning: docs/communication.md.
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
  GradReducer(MPI_Comm parent, Backend& backend, const Tensor& grads, std::vector<GradSpan> tensors,
              const GradReducerOptions& options = {});
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

  // Whether a round can run inside a CUDA graph (docs/communication.md#graphs): NCCL's transport,
  // or none.
  bool capturable() const { return !transport_ || std::strcmp(transport_name_, "nccl") == 0; }
  // finish()'s work at the end of the backward's ops (recorded when they are captured); finish()
  // then returns its statistics only.
  void complete();
  // A graph holding this round (recorded at an earlier round, or at this one) was launched on the
  // backend's stream (docs/communication.md#graphs); Error if the reducer is not capturable().
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
