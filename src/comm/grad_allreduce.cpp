#include "comm/grad_allreduce.h"

#include <algorithm>
#include <climits>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/watchdog.h"
#include "comm/mpi_check.h"

namespace packbert {

// One MPI_Iallreduce per bucket, in place on the host buffer; MPI_Testsome for progress.
class GradAllreduce::MpiTransport final : public GradBucketTransport {
 public:
  MpiTransport(MPI_Comm comm, float* grads, size_t num_buckets)
      : comm_(comm), grads_(grads), requests_(num_buckets, MPI_REQUEST_NULL),
        completed_indices_(num_buckets, 0) {}

  void begin_round() override {
    std::fill(requests_.begin(), requests_.end(), MPI_REQUEST_NULL);
    started_ = 0;
    completed_ = 0;
  }

  void start(int k, const GradBucket& b) override {
    PB_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, grads_ + b.offset, static_cast<int>(b.size),
                                MPI_FLOAT, MPI_SUM, comm_, &requests_[static_cast<size_t>(k)]));
    started_ = k + 1;
  }

  int test() override {
    if (completed_ == started_) return completed_;
    // Testsome over every started request: completed ones are MPI_REQUEST_NULL and ignored. Any
    // MPI test also runs OpenMPI's progress engine for all of them.
    int outcount = 0;
    PB_MPI_CHECK(MPI_Testsome(started_, requests_.data(), &outcount, completed_indices_.data(),
                              MPI_STATUSES_IGNORE));
    if (outcount != MPI_UNDEFINED) completed_ += outcount;
    return completed_;
  }

  // Test and yield rather than MPI_Waitall: OpenMPI's wait spins a core that the data loader's
  // thread (and, oversubscribed, another rank) may need, while each test still progresses.
  void complete_all() override {
    while (test() < started_) std::this_thread::yield();
  }

 private:
  MPI_Comm comm_;
  float* grads_;
  std::vector<MPI_Request> requests_;   // MPI_REQUEST_NULL once complete (or never started)
  std::vector<int> completed_indices_;  // MPI_Testsome scratch
  int started_ = 0;
  int completed_ = 0;
};

GradAllreduce::GradAllreduce(MPI_Comm parent, float* grads, int64_t num_elems,
                             std::vector<GradSpan> tensors, size_t bucket_bytes)
    : sched_(std::move(tensors), num_elems, bucket_bytes, "grad all-reduce") {
  PB_REQUIRE(grads != nullptr || num_elems == 0, "grad all-reduce: no gradient buffer");
  // Without MPI (unit tests, a bare run) this is world size 1 and no MPI call is ever made.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  PB_MPI_CHECK(MPI_Comm_size(parent, &size_));
  if (size_ == 1) return;
  WatchScope watch("MPI_Comm_dup (gradient all-reduce)");
  PB_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  PB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  PB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  transport_ = std::make_unique<MpiTransport>(comm_, grads, sched_.buckets().size());
  sched_.set_transport(transport_.get());
}

GradAllreduce::~GradAllreduce() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A pending non-blocking collective cannot be freed or cancelled (MPI forbids both for
  // collectives): leave it and the communicator to MPI_Abort.
  const bool pending = sched_.in_round() && sched_.buckets_started() > sched_.buckets_completed();
  if (!finalized && !pending) MPI_Comm_free(&comm_);
}

void GradAllreduce::begin() { sched_.begin(); }
void GradAllreduce::ready_tensor(int i) { sched_.ready_tensor(i); }
void GradAllreduce::ready(int64_t offset, int64_t size) { sched_.ready(offset, size); }
void GradAllreduce::progress() { sched_.progress(); }
GradAllreduceStats GradAllreduce::finish() {
  WatchScope watch("MPI_Iallreduce (gradient all-reduce)");  // at the watchdog's step
  return sched_.finish();
}

void GradAllreduce::allreduce_sum(double* data, int count) {
  PB_REQUIRE(!sched_.in_round(), "grad all-reduce: allreduce_sum() inside a gradient round");
  PB_REQUIRE(count >= 0 && (data || count == 0), "grad all-reduce: allreduce_sum of {} values",
             count);
  if (size_ == 1 || count == 0) return;
  WatchScope watch("MPI_Allreduce (step metrics)");
  PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_SUM, comm_));
}

}  // namespace packbert
