// Data-parallel gradient all-reduce over MPI for the CPU backend: the flat gradient buffer is cut
// into buckets that are summed across ranks with non-blocking MPI_Iallreduce while the backward
// pass is still computing the earlier layers (DESIGN.md, Distribution).
//
// Buckets. The buffer's span (first tensor's offset to last tensor's end) is cut into pieces of
// bucket_bytes, starting from its END: the backward produces the gradients of the last
// parameters (MLM head, top encoder layers) first, so bucket 0 holds the end of the buffer and
// is the first one complete. A bucket boundary may fall inside a tensor (the word embeddings
// alone are ~94 MB in BERT-base); a bucket starts once every tensor overlapping it is ready.
//
// Order. MPI requires every rank to start collectives on one communicator in the same order.
// Buckets therefore start strictly in bucket order (0, 1, 2, ...): a bucket whose tensors are all
// ready still waits for its predecessors. So the result is right even if ranks mark tensors ready
// in different orders, and ready() never deadlocks.
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
#include <vector>

namespace packbert {

// One tensor of the flat gradient buffer (a row of the parameter table).
struct GradSpan {
  int64_t offset = 0;  // first element
  int64_t size = 0;    // elements
};

// A contiguous piece of the buffer reduced by one MPI_Iallreduce.
struct GradBucket {
  int64_t offset = 0;
  int64_t size = 0;          // elements (fits an MPI int count)
  int first_tensor = 0;      // tensors overlapping it, as indices into the sorted table:
  int last_tensor = -1;      // [first_tensor, last_tensor]; empty for a gap-only bucket
};

// The bucket plan (pure arithmetic, no MPI): tensors sorted by offset, non-overlapping, inside
// [0, num_elems). Buckets cover [first offset, last end) in pieces of bucket_bytes / 4 elements
// (at least 1), bucket 0 at the end. Throws Error on a bad table.
std::vector<GradBucket> plan_grad_buckets(const std::vector<GradSpan>& sorted_tensors,
                                          int64_t num_elems, size_t bucket_bytes);

// What happened in one round (begin() .. finish()).
struct GradAllreduceStats {
  int buckets = 0;
  int started_before_finish = 0;    // started by ready() (the rest start in finish())
  int completed_before_finish = 0;  // seen complete by MPI_Test before finish() was called:
                                    // communication hidden behind compute
  double finish_wait_s = 0;         // time finish() spent waiting (exposed communication)
};

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
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Buckets of the current round started so far (in order: 0 .. buckets_started() - 1).
  int buckets_started() const { return next_to_start_; }

  // Arms a round: call before the backward whose gradients are final (the last micro-step of a
  // global batch). ready() calls outside a round are ignored, so the model may call ready()
  // on every micro-step and let the trainer decide which one reduces.
  void begin();
  bool in_round() const { return in_round_; }

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
  void start_ready_buckets();
  void test_started();
  int tensor_index(int64_t offset, int64_t size) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  float* grads_;
  int64_t num_elems_;
  std::vector<GradSpan> tensors_;       // sorted by offset
  std::vector<int> sorted_index_;       // constructor's index -> sorted index
  std::vector<int> original_index_;     // sorted index -> constructor's index
  std::vector<GradBucket> buckets_;
  std::vector<int> tensor_first_bucket_, tensor_last_bucket_;  // buckets each tensor overlaps

  // Per round.
  bool in_round_ = false;
  std::vector<char> tensor_ready_;
  std::vector<int> bucket_pending_;     // tensors of the bucket not ready yet
  std::vector<MPI_Request> requests_;   // MPI_REQUEST_NULL once complete (or never started)
  std::vector<int> completed_indices_;  // MPI_Testsome scratch
  int next_to_start_ = 0;
  int completed_ = 0;
};

}  // namespace packbert
