// Data-parallel gradient all-reduce over MPI for the CPU backend: the flat gradient buffer is cut
// into buckets that are summed across ranks with non-blocking MPI_Iallreduce while the backward
// pass is still computing the earlier layers (DESIGN.md, Distribution).
//
// Buckets and their order are comm/bucket_scheduler.h's: this file is its MPI transport. Bucket
// 0 holds the end of the buffer (the backward finishes the last parameters first), a bucket
// starts once every tensor overlapping it is ready, and buckets start strictly in bucket order,
// so every rank issues the same sequence of MPI_Iallreduce calls on the communicator whatever
// order its tensors become ready in.
//
// Progress. OpenMPI has no progress thread for non-blocking collectives (libnbc advances only
// inside MPI calls), so ready() and progress() call MPI_Testsome on the started buckets: each
// call moves the transfers along while the compute continues.
//
// Determinism. The sum is in place (MPI_IN_PLACE, MPI_FLOAT, MPI_SUM). For a fixed rank count
// and fixed bucket sizes OpenMPI picks the same algorithm and the same summation order on every
// run (its choice depends on the communicator size and the message size only), so the result is
// bitwise reproducible, whatever the timing; tests/mpi/mpi_allreduce_driver checks this, and also
// that every rank receives the same bits (which the optimizer's equivalence across ranks needs).
// Across DIFFERENT rank counts the order differs: results agree to rounding only.
//
// Errors. The communicator is a duplicate of the parent (MPI_Comm_dup: its collectives never
// match the data loader's or anyone else's) with MPI_ERRORS_RETURN, so an MPI failure becomes a
// packbert::Error naming the call, file and line instead of an abort inside MPI.
//
// One rank (or MPI not initialized: unit tests, a bare run): every operation is a no-op that
// makes no MPI call. The object is used by one thread (the compute thread).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bucket_scheduler.h"

namespace packbert {

class GradAllreduce {
 public:
  // grads: the flat f32 gradient buffer [num_elems] in host memory (it must stay valid, and the
  // caller must not write a bucket between its start and finish()). tensors: the table in any
  // order. Collective over parent (it is duplicated). bucket_bytes: target bucket size (~25 MB is
  // a good default on a network, see tests/bench/bench_allreduce).
  GradAllreduce(MPI_Comm parent, float* grads, int64_t num_elems, std::vector<GradSpan> tensors,
                size_t bucket_bytes);
  // Frees the communicator. If a round is still in flight (an exception unwound the backward),
  // the communicator and requests are leaked instead: waiting could hang on a peer that died,
  // and the top-level handler is about to MPI_Abort anyway.
  ~GradAllreduce();
  GradAllreduce(const GradAllreduce&) = delete;
  GradAllreduce& operator=(const GradAllreduce&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::vector<GradBucket>& buckets() const { return sched_.buckets(); }
  // Buckets of the current round started so far (in order: 0 .. buckets_started() - 1).
  int buckets_started() const { return sched_.buckets_started(); }

  // Arms a round: call before the backward whose gradients are final (the last micro-step of a
  // global batch). ready() calls outside a round are ignored, so the model may call ready()
  // on every micro-step and let the trainer decide which one reduces.
  void begin();
  bool in_round() const { return sched_.in_round(); }

  // The gradient of tensor i (index into the table as given to the constructor) is final: no
  // op will write it again in this round. Throws Error if it was already marked in this round.
  void ready_tensor(int i);
  // The same, naming the tensor by its table row (offset and size must match one exactly).
  void ready(int64_t offset, int64_t size);
  // Lets MPI move the started buckets along; call it between long ops if ready() is rare.
  void progress();
  // Starts whatever has not started (every tensor must have been marked ready, else Error naming
  // the first missing one) and waits for all buckets: afterwards grads holds the sum over ranks.
  GradAllreduceStats finish();

  // In-place blocking sum over ranks of a few doubles (metrics: loss sums, token counts), on the
  // same communicator; must not be called inside a round.
  void allreduce_sum(double* data, int count);

 private:
  class MpiTransport;  // the scheduler's transport: MPI_Iallreduce / MPI_Testsome (the .cpp)

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  GradBucketScheduler sched_;
  std::unique_ptr<MpiTransport> transport_;  // null on one rank: no MPI call at all
};

}  // namespace packbert
