// Data-parallel gradient all-reduce over NCCL for the CUDA backend (DESIGN.md, Distribution): the
// flat device gradient buffer is cut into the same buckets as on the CPU (comm/bucket_scheduler.h:
// bucket 0 at the end of the buffer, started strictly in order once every tensor overlapping it
// is ready), and each bucket is summed on a communication stream while the compute stream runs
// the backward of the earlier layers. Built only with PACKBERT_HAVE_CUDA.
//
// Streams and events. ready() runs on the host when the backward has LAUNCHED the ops that
// produce a tensor's gradient; they may still be running. When a bucket becomes startable an
// event is recorded on the compute stream (the CUDA backend's, cuda_stream()): it completes when
// every op launched so far, so every write to that bucket, is done. The communication stream
// (non-blocking: it never orders with the legacy default stream) waits for that event and runs
// ncclAllReduce in place (ncclFloat, ncclSum) over the bucket, then records the bucket's done
// event. finish() makes the compute stream wait for the LAST bucket's done event (the
// communication stream runs buckets in order, so that one implies all): the optimizer, issued
// next on the compute stream, waits for the last bucket only, and the host never blocks. The
// compute stream must not write a bucket between its start and finish() (the backward writes
// each gradient once per round, before announcing it; the zeroing in Lamb::step comes after
// finish()).
//
// Bootstrap. Every rank makes its device current and creates its stream and events; an
// MPI_Allreduce of a success flag makes all ranks fail together when one cannot (instead of
// leaving the others in ncclCommInitRank), and an MPI_Allgather of each rank's GPU (host and PCI
// bus id) refuses two ranks on one GPU with an error naming them. Rank 0 then creates the unique
// id (its failure agreed on the same way), MPI_Bcast sends it and each rank joins with
// ncclCommInitRank, whose outcome is agreed on too. MPI is used for the bootstrap only, on a
// duplicate of the parent communicator that is freed afterwards.
//
// Determinism. NCCL's ring/tree choice and its summation order depend on the rank count, the
// topology and the message size, not on timing: for fixed bucket sizes on the same machines the
// result is reproducible run to run, and every rank receives the same bits (NCCL's all-reduce
// broadcasts the reduced chunks). Across rank counts the order differs: rounding only.
//
// Errors. Every CUDA and NCCL call is checked; a failure throws packbert::Error naming the call,
// the file:line and CUDA's or NCCL's message (ncclGetErrorString, ncclGetLastError). test()
// also asks ncclCommGetAsyncError, so a network failure surfaces at the next ready(). Once a
// round has failed, or when the object is destroyed while a round is in flight or during stack
// unwinding, the communicator is ended with ncclCommAbort: waiting could hang forever on a peer
// that died, and the top-level handler is about to MPI_Abort anyway.
//
// Hangs. The bootstrap is watched by the collective watchdog (core/watchdog.h); the rounds are
// not: finish() does not block the host (the compute stream waits), so a peer that never joins
// leaves the host blocked later in a CUDA synchronisation no scope covers. Seeing that needs
// the watchdog thread to poll the last done event (cudaEventQuery) and ncclCommAbort the
// communicator, as PyTorch's NCCL watchdog does: a known limit (DESIGN.md, Distribution).
//
// One rank (or MPI not initialized: tests, a bare run): no NCCL or CUDA call at all, exactly as
// GradAllreduce's one-rank no-op; the bookkeeping still runs. NCCL cannot put two ranks on one
// GPU, so more ranks need as many GPUs; to check the streams, events and NCCL calls on a machine
// with one GPU, NcclAllreduceOptions::nccl_on_one_rank runs the whole path over a communicator of
// one rank (tests/gpu/test_nccl_allreduce.cpp). The object is used by one thread (the compute
// thread).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bucket_scheduler.h"

namespace packbert {

struct NcclAllreduceOptions {
  // One rank: create a communicator of one and run every bucket through it anyway (tests).
  bool nccl_on_one_rank = false;
};

class NcclAllreduce {
 public:
  // grads: the flat f32 gradient buffer [num_elems] in the memory of GPU cuda_device (it must
  // stay valid). compute: the stream the backward and the optimizer run on. tensors: the table in
  // any order. Collective over parent. bucket_bytes: target bucket size (the CPU's default,
  // 25 MB, is also a good start for NVLink and InfiniBand).
  NcclAllreduce(MPI_Comm parent, int cuda_device, cudaStream_t compute, float* grads,
                int64_t num_elems, std::vector<GradSpan> tensors, size_t bucket_bytes,
                const NcclAllreduceOptions& options = {});
  // Finishes cleanly (waits for the last bucket, destroys the communicator) after a complete
  // round; aborts the communicator otherwise (see Errors above). Never throws.
  ~NcclAllreduce();
  NcclAllreduce(const NcclAllreduce&) = delete;
  NcclAllreduce& operator=(const NcclAllreduce&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // True when buckets go through NCCL (more than one rank, or nccl_on_one_rank).
  bool uses_nccl() const { return transport_ != nullptr; }
  const std::vector<GradBucket>& buckets() const { return sched_.buckets(); }
  int buckets_started() const { return sched_.buckets_started(); }

  // As GradAllreduce: begin() arms a round for the backward whose gradients are final;
  // ready_tensor(i) / ready(offset, size) announce a final gradient (Error on a repeat);
  // progress() polls the buckets in flight for completion and for asynchronous NCCL errors.
  void begin();
  bool in_round() const { return sched_.in_round(); }
  void ready_tensor(int i);
  void ready(int64_t offset, int64_t size);
  void progress();
  // Starts whatever has not started (every tensor must have been marked ready, else Error naming
  // the first missing one) and makes the compute stream wait for the last bucket: work issued on
  // it afterwards sees the sum over ranks. Does not block the host (finish_wait_s is the time to
  // issue that, not to reduce).
  GradAllreduceStats finish();

 private:
  class Transport;  // events, streams and ncclAllReduce (nccl_allreduce.cpp)

  int rank_ = 0;
  int size_ = 1;
  GradBucketScheduler sched_;
  std::unique_ptr<Transport> transport_;  // null on one rank: no CUDA or NCCL call at all
};

}  // namespace packbert
