// The data loader's MPI traffic: a communicator of its own (MPI_Comm_dup, so its collectives
// never match the trainer's), an allgather that carries each rank's failure along with its
// data (so a rank that cannot read its shard makes every rank fail at the same step instead of
// leaving the others in a collective), and the payload alltoallv. Every call is non-blocking
// and completed by polling MPI_Test with a backoff: the loader thread neither spins a core the
// trainer needs (OpenMPI's MPI_Wait busy-polls) nor stays stuck in MPI when its owner gives up
// (see LoaderComm::abandon()). Each wait is watched by the collective watchdog (core/watchdog.h)
// under the step set_step() names.
//
// Also the wire format of a sample (encode_sample / decode_sample), MPI-free.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/watchdog.h"
#include "data/shards/sample.h"

namespace packbert {

// Bytes of one encoded sample: a 17-byte header (id, length, masked count, NSP label), then
// input_ids and masked_lm_positions/ids as int32, segment_ids as int8. Both sides of the
// exchange know (length, masked count) from the planner's candidates, so receive counts need
// no extra message.
inline size_t encoded_sample_bytes(int64_t length, int64_t masked) {
  return 17 + 5 * static_cast<size_t>(length) + 8 * static_cast<size_t>(masked);
}
// Writes s at out (encoded_sample_bytes(s.length(), s.num_masked()) bytes); returns the end.
char* encode_sample(const Sample& s, char* out);
// Reads one sample written by encode_sample from [in, end) into out; returns where it ended.
// Throws Error when the record does not fit or its header is implausible.
const char* decode_sample(const char* in, const char* end, Sample& out);

// Thrown out of a wait when the loader's owner abandoned it (the loader thread exits quietly).
struct LoaderAbandoned {};

class LoaderComm {
 public:
  // Duplicates parent (collective over it). abandon, when set, makes waits give up.
  LoaderComm(MPI_Comm parent, const std::atomic<bool>* abandon);
  ~LoaderComm();
  LoaderComm(const LoaderComm&) = delete;
  LoaderComm& operator=(const LoaderComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The optimizer step (1-based) the next collectives carry samples for, as the watchdog's
  // message names it; until set, the watchdog's own step (the training loop's).
  void set_step(int64_t step) { step_ = step; }

  // Completes req by polling (yield, then sleeps growing to max_nap_us), inside a WatchScope
  // naming the collective (a string literal). Throws LoaderAbandoned when abandoned: the
  // request is left pending, and the communicator is not freed (the process is about to
  // abort); the object and the buffers of the call must then be leaked. Every other MPI failure
  // is fatal (MPI_ERRORS_ARE_FATAL).
  void wait(MPI_Request& req, const char* collective, int max_nap_us = 200);

  // What every rank contributed to a gather_status(): its bytes, or its error message.
  struct Contribution {
    bool failed = false;
    bool stop = false;
    std::vector<char> bytes;  // data, or the error message when failed
  };
  // Allgather of each rank's bytes plus two flags (failed: bytes hold an error message; stop:
  // the rank's owner is shutting the loader down). Collective on the loader communicator.
  std::vector<Contribution> gather_status(const std::vector<char>& mine, bool failed, bool stop);

  // Non-blocking alltoallv of bytes, completed by polling: send holds the parts for rank 0, 1,
  // ... back to back (send_counts), recv receives them likewise; both may be larger.
  void alltoallv(const std::vector<char>& send, const std::vector<int64_t>& send_counts,
                 std::vector<char>& recv, const std::vector<int64_t>& recv_counts);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  const std::atomic<bool>* abandon_;
  bool abandoned_ = false;
  int64_t step_ = WatchScope::kCurrentStep;
  // Buffers of the last non-blocking call: they must outlive it (MPI uses them until done,
  // and an abandoned call is never done; see DataLoader's destructor).
  std::vector<int> counts_a_, displs_a_, counts_b_, displs_b_;
  int64_t header_[3] = {0, 0, 0};
  std::vector<int64_t> headers_;
  std::vector<char> sent_, gathered_;
};

}  // namespace packbert
