#include "data/loader/exchange.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/mpi_check.h"
#include "kernels/base/error.h"
#include "core/watchdog.h"

namespace packbert {

namespace {

template <typename T>
char* put(char* out, const T& v) {
  std::memcpy(out, &v, sizeof(T));
  return out + sizeof(T);
}

template <typename T>
char* put_array(char* out, const std::vector<T>& v) {
  if (!v.empty()) std::memcpy(out, v.data(), v.size() * sizeof(T));
  return out + v.size() * sizeof(T);
}

template <typename T>
const char* get_array(const char* in, size_t n, std::vector<T>& v) {
  v.resize(n);
  if (n > 0) std::memcpy(v.data(), in, n * sizeof(T));
  return in + n * sizeof(T);
}

// The MPI thread level's name, for the error that asks for another.
const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown level";
  }
}

// MPI counts are int: a step that moves 2 GiB to one rank is an error with a hint, not a wrap.
int to_count(int64_t n, const char* what) {
  PB_REQUIRE(n >= 0 && n <= INT_MAX,
             "data loader: {} of {} bytes exceeds MPI's int count in one step (lower "
             "global_batch_size or use more ranks)",
             what, n);
  return static_cast<int>(n);
}

}  // namespace

char* encode_sample(const Sample& s, char* out) {
  out = put<int64_t>(out, s.id);
  out = put<int32_t>(out, s.length());
  out = put<int32_t>(out, s.num_masked());
  out = put<int8_t>(out, s.next_sentence_label);
  out = put_array(out, s.input_ids);
  out = put_array(out, s.masked_lm_positions);
  out = put_array(out, s.masked_lm_ids);
  return put_array(out, s.segment_ids);
}

const char* decode_sample(const char* in, const char* end, Sample& out) {
  PB_REQUIRE(end - in >= 17, "data loader: truncated sample record ({} bytes)", end - in);
  int32_t length = 0, masked = 0;
  std::memcpy(&out.id, in, 8);
  std::memcpy(&length, in + 8, 4);
  std::memcpy(&masked, in + 12, 4);
  std::memcpy(&out.next_sentence_label, in + 16, 1);
  PB_REQUIRE(length >= 0 && masked >= 0 &&
                 encoded_sample_bytes(length, masked) <= static_cast<size_t>(end - in),
             "data loader: sample record {} (length {}, {} masked) does not fit its {} bytes",
             out.id, length, masked, end - in);
  in += 17;
  in = get_array(in, static_cast<size_t>(length), out.input_ids);
  in = get_array(in, static_cast<size_t>(masked), out.masked_lm_positions);
  in = get_array(in, static_cast<size_t>(masked), out.masked_lm_ids);
  return get_array(in, static_cast<size_t>(length), out.segment_ids);
}

LoaderComm::LoaderComm(MPI_Comm parent, const std::atomic<bool>* abandon) : abandon_(abandon) {
  int provided = 0;
  PB_MPI_CHECK(MPI_Query_thread(&provided));
  // The loader thread calls MPI while the trainer's thread does too.
  PB_REQUIRE(provided >= MPI_THREAD_MULTIPLE,
             "data loader: MPI was initialised with {}, and the loader needs "
             "MPI_THREAD_MULTIPLE (its threads call MPI while the trainer does): initialise it "
             "with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) and use an MPI library built "
             "with thread support",
             thread_level_name(provided));
  {
    WatchScope watch("MPI_Comm_dup (data loader)");
    PB_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  }
  // The duplicate keeps the parent's error handler: under MPI_COMM_WORLD's default
  // (MPI_ERRORS_ARE_FATAL) a failing call aborts inside MPI and these checks never fire; they
  // turn a failure into an Error where the parent returns errors (MPI_ERRORS_RETURN).
  PB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  PB_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

LoaderComm::~LoaderComm() {
  // An abandoned communicator may still have a pending request; freeing it then is an error,
  // and the process is on its way to MPI_Abort anyway.
  if (comm_ != MPI_COMM_NULL && !abandoned_ && !(abandon_ && abandon_->load()))
    MPI_Comm_free(&comm_);
}

void LoaderComm::wait(MPI_Request& req, const char* collective, int max_nap_us) {
  using namespace std::chrono;
  WatchScope watch(collective, step_);
  // Yield first (a peer is usually microseconds away), then sleep with a growing period so a
  // rank waiting for a slow peer costs no core; 200 us is small against a training step.
  int rounds = 0;
  microseconds nap(5);
  for (;;) {
    int done = 0;
    PB_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (abandon_ && abandon_->load()) {
      abandoned_ = true;
      throw LoaderAbandoned{};
    }
    if (++rounds < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, microseconds(max_nap_us));
    }
  }
}

std::vector<LoaderComm::Contribution> LoaderComm::gather_status(const std::vector<char>& mine,
                                                                bool failed, bool stop) {
  header_[0] = static_cast<int64_t>(mine.size());
  header_[1] = failed ? 1 : 0;
  header_[2] = stop ? 1 : 0;
  headers_.assign(3 * static_cast<size_t>(size_), 0);
  MPI_Request req;
  PB_MPI_CHECK(
      MPI_Iallgather(header_, 3, MPI_INT64_T, headers_.data(), 3, MPI_INT64_T, comm_, &req));
  wait(req, "MPI_Iallgather (data loader status)");

  counts_a_.assign(size_, 0);
  displs_a_.assign(size_, 0);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts_a_[r] = to_count(headers_[3 * r], "a rank's step metadata");
    displs_a_[r] = to_count(total, "the step metadata");
    total += headers_[3 * r];
  }
  to_count(total, "the step metadata");
  gathered_.resize(static_cast<size_t>(total));
  sent_ = mine;
  PB_MPI_CHECK(MPI_Iallgatherv(sent_.data(), counts_a_[rank_], MPI_BYTE, gathered_.data(),
                               counts_a_.data(), displs_a_.data(), MPI_BYTE, comm_, &req));
  wait(req, "MPI_Iallgatherv (data loader status)");

  std::vector<Contribution> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    out[r].failed = headers_[3 * r + 1] != 0;
    out[r].stop = headers_[3 * r + 2] != 0;
    out[r].bytes.assign(gathered_.begin() + displs_a_[r],
                        gathered_.begin() + displs_a_[r] + counts_a_[r]);
  }
  return out;
}

void LoaderComm::alltoallv(const std::vector<char>& send, const std::vector<int64_t>& send_counts,
                           std::vector<char>& recv, const std::vector<int64_t>& recv_counts) {
  counts_a_.assign(size_, 0);
  displs_a_.assign(size_, 0);
  counts_b_.assign(size_, 0);
  displs_b_.assign(size_, 0);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    counts_a_[r] = to_count(send_counts[r], "a payload");
    displs_a_[r] = to_count(sent, "this rank's outgoing payload");
    sent += send_counts[r];
    counts_b_[r] = to_count(recv_counts[r], "a payload");
    displs_b_[r] = to_count(received, "this rank's incoming payload");
    received += recv_counts[r];
  }
  PB_CHECK(
      sent <= static_cast<int64_t>(send.size()) && received <= static_cast<int64_t>(recv.size()),
      "alltoallv buffers: send {} of {}, recv {} of {}", sent, send.size(), received, recv.size());
  MPI_Request req;
  PB_MPI_CHECK(MPI_Ialltoallv(send.data(), counts_a_.data(), displs_a_.data(), MPI_BYTE,
                              recv.data(), counts_b_.data(), displs_b_.data(), MPI_BYTE, comm_,
                              &req));
  // Every rank entered the exchange right after the same gather: poll briskly, since each
  // round of the non-blocking schedule moves on only when both sides test.
  wait(req, "MPI_Ialltoallv (data loader samples)", 20);
}

}  // namespace packbert
