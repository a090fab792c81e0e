#include "dist/grad_allreduce.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <numeric>
#include <thread>
#include <utility>

#include "core/error.h"
#include "dist/mpi_check.h"

namespace packbert {

namespace {

// The element index of bucket k's end (exclusive): buckets are cut from the end of the span.
int64_t bucket_end(int64_t span_end, int64_t bucket_elems, int64_t k) {
  return span_end - k * bucket_elems;
}

}  // namespace

std::vector<GradBucket> plan_grad_buckets(const std::vector<GradSpan>& tensors, int64_t num_elems,
                                          size_t bucket_bytes) {
  PB_REQUIRE(num_elems >= 0, "grad all-reduce: {} gradient elements", num_elems);
  // MPI counts are int; a bucket never exceeds that (and 1 element is the smallest piece).
  const int64_t bucket_elems =
      std::clamp<int64_t>(static_cast<int64_t>(bucket_bytes / sizeof(float)), 1, INT_MAX);
  int64_t prev_end = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GradSpan& t = tensors[i];
    PB_REQUIRE(t.offset >= prev_end && t.size >= 0 && t.offset + t.size <= num_elems,
               "grad all-reduce: tensor {} (offset {}, size {}) overlaps the previous one or "
               "leaves the {} gradient elements (tensors ascend by offset)",
               i, t.offset, t.size, num_elems);
    prev_end = t.offset + t.size;
  }
  std::vector<GradBucket> buckets;
  if (tensors.empty()) return buckets;
  const int64_t lo = tensors.front().offset, hi = prev_end;
  for (int64_t k = 0; bucket_end(hi, bucket_elems, k) > lo; ++k) {
    const int64_t end = bucket_end(hi, bucket_elems, k);
    const int64_t start = std::max(lo, end - bucket_elems);
    buckets.push_back({start, end - start, INT_MAX, -1});
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GradSpan& t = tensors[i];
    if (t.size == 0) continue;
    // Buckets are numbered from the end: element e sits in bucket (hi - 1 - e) / bucket_elems.
    const int64_t first = (hi - (t.offset + t.size)) / bucket_elems;
    const int64_t last = (hi - 1 - t.offset) / bucket_elems;
    for (int64_t k = first; k <= last; ++k) {
      GradBucket& b = buckets[static_cast<size_t>(k)];
      b.first_tensor = std::min(b.first_tensor, static_cast<int>(i));
      b.last_tensor = std::max(b.last_tensor, static_cast<int>(i));
    }
  }
  for (GradBucket& b : buckets)
    if (b.last_tensor < 0) b.first_tensor = 0;  // gap only: the documented empty range
  return buckets;
}

GradAllreduce::GradAllreduce(MPI_Comm parent, float* grads, int64_t num_elems,
                             std::vector<GradSpan> tensors, size_t bucket_bytes)
    : grads_(grads), num_elems_(num_elems) {
  PB_REQUIRE(grads != nullptr || num_elems == 0, "grad all-reduce: no gradient buffer");
  PB_REQUIRE(tensors.size() < static_cast<size_t>(INT_MAX), "grad all-reduce: {} tensors",
             tensors.size());
  // Sort by offset, remembering where each of the caller's rows went (ready_tensor(i) takes the
  // caller's index).
  std::vector<int> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return tensors[a].offset < tensors[b].offset; });
  sorted_index_.assign(tensors.size(), 0);
  original_index_ = order;
  tensors_.reserve(tensors.size());
  for (size_t j = 0; j < order.size(); ++j) {
    sorted_index_[static_cast<size_t>(order[j])] = static_cast<int>(j);
    tensors_.push_back(tensors[static_cast<size_t>(order[j])]);
  }
  buckets_ = plan_grad_buckets(tensors_, num_elems_, bucket_bytes);
  const int64_t bucket_elems =
      std::clamp<int64_t>(static_cast<int64_t>(bucket_bytes / sizeof(float)), 1, INT_MAX);
  const int64_t hi = tensors_.empty() ? 0 : tensors_.back().offset + tensors_.back().size;
  tensor_first_bucket_.assign(tensors_.size(), 0);
  tensor_last_bucket_.assign(tensors_.size(), -1);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GradSpan& t = tensors_[i];
    if (t.size == 0) continue;  // overlaps no bucket; ready() is still required of it
    tensor_first_bucket_[i] = static_cast<int>((hi - (t.offset + t.size)) / bucket_elems);
    tensor_last_bucket_[i] = static_cast<int>((hi - 1 - t.offset) / bucket_elems);
  }
  tensor_ready_.assign(tensors_.size(), 0);
  bucket_pending_.assign(buckets_.size(), 0);
  requests_.assign(buckets_.size(), MPI_REQUEST_NULL);
  completed_indices_.assign(buckets_.size(), 0);

  // Without MPI (unit tests, a bare run) this is world size 1 and no MPI call is ever made.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  PB_MPI_CHECK(MPI_Comm_size(parent, &size_));
  if (size_ == 1) return;
  PB_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  PB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  PB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
}

GradAllreduce::~GradAllreduce() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A pending non-blocking collective cannot be freed or cancelled (MPI forbids both for
  // collectives): leave it and the communicator to MPI_Abort.
  const bool pending = in_round_ && next_to_start_ > completed_;
  if (!finalized && !pending) MPI_Comm_free(&comm_);
}

void GradAllreduce::begin() {
  PB_REQUIRE(!in_round_, "grad all-reduce: begin() while a round is in flight (finish() first)");
  std::fill(tensor_ready_.begin(), tensor_ready_.end(), 0);
  std::fill(bucket_pending_.begin(), bucket_pending_.end(), 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    for (int k = tensor_first_bucket_[i]; k <= tensor_last_bucket_[i]; ++k) ++bucket_pending_[k];
  std::fill(requests_.begin(), requests_.end(), MPI_REQUEST_NULL);
  next_to_start_ = 0;
  completed_ = 0;
  in_round_ = true;
  start_ready_buckets();  // buckets of gaps only have nothing to wait for
}

int GradAllreduce::tensor_index(int64_t offset, int64_t size) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), offset,
                                   [](const GradSpan& t, int64_t o) { return t.offset < o; });
  // Zero-size tensors may share an offset with the next one: look for the exact row.
  for (auto j = it; j != tensors_.end() && j->offset == offset; ++j)
    if (j->size == size) return static_cast<int>(j - tensors_.begin());
  PB_THROW("grad all-reduce: ready({}, {}) names no tensor of the table", offset, size);
}

void GradAllreduce::ready_tensor(int i) {
  PB_REQUIRE(i >= 0 && static_cast<size_t>(i) < tensors_.size(),
             "grad all-reduce: ready_tensor({}) of {} tensors", i, tensors_.size());
  if (!in_round_) return;
  const int j = sorted_index_[static_cast<size_t>(i)];
  PB_REQUIRE(!tensor_ready_[j],
             "grad all-reduce: tensor {} (offset {}, size {}) marked ready twice in one round", i,
             tensors_[j].offset, tensors_[j].size);
  tensor_ready_[j] = 1;
  for (int k = tensor_first_bucket_[j]; k <= tensor_last_bucket_[j]; ++k) --bucket_pending_[k];
  start_ready_buckets();
  test_started();
}

void GradAllreduce::ready(int64_t offset, int64_t size) {
  // Checked even outside a round, so a wrong table shows on every micro-step.
  ready_tensor(original_index_[static_cast<size_t>(tensor_index(offset, size))]);
}

void GradAllreduce::progress() {
  if (in_round_) test_started();
}

void GradAllreduce::start_ready_buckets() {
  const int num = static_cast<int>(buckets_.size());
  // Strictly in bucket order, so every rank starts the same sequence of collectives.
  while (next_to_start_ < num && bucket_pending_[next_to_start_] == 0) {
    const GradBucket& b = buckets_[next_to_start_];
    if (size_ > 1) {
      PB_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, grads_ + b.offset, static_cast<int>(b.size),
                                  MPI_FLOAT, MPI_SUM, comm_, &requests_[next_to_start_]));
    } else {
      ++completed_;  // nothing to do on one rank: done as soon as it is "started"
    }
    ++next_to_start_;
  }
}

void GradAllreduce::test_started() {
  if (size_ == 1 || completed_ == next_to_start_) return;
  // Testsome over every started request: completed ones are MPI_REQUEST_NULL and ignored. Any
  // MPI test also runs OpenMPI's progress engine for all of them.
  int outcount = 0;
  PB_MPI_CHECK(MPI_Testsome(next_to_start_, requests_.data(), &outcount,
                            completed_indices_.data(), MPI_STATUSES_IGNORE));
  if (outcount != MPI_UNDEFINED) completed_ += outcount;
}

GradAllreduceStats GradAllreduce::finish() {
  PB_REQUIRE(in_round_, "grad all-reduce: finish() without begin()");
  for (size_t j = 0; j < tensors_.size(); ++j) {
    if (tensor_ready_[j]) continue;
    const int i = original_index_[j];
    PB_THROW("grad all-reduce: finish() but tensor {} (offset {}, size {}) was never marked "
             "ready in this round",
             i, tensors_[j].offset, tensors_[j].size);
  }
  GradAllreduceStats stats;
  stats.buckets = static_cast<int>(buckets_.size());
  test_started();
  stats.started_before_finish = next_to_start_;
  stats.completed_before_finish = completed_;
  start_ready_buckets();  // every tensor is ready: this starts the rest
  PB_CHECK(next_to_start_ == stats.buckets, "{} of {} buckets started with every tensor ready",
           next_to_start_, stats.buckets);
  const auto t0 = std::chrono::steady_clock::now();
  // Test and yield rather than MPI_Waitall: OpenMPI's wait spins a core that the data loader's
  // thread (and, oversubscribed, another rank) may need, while each test still progresses.
  while (completed_ < next_to_start_) {
    test_started();
    if (completed_ < next_to_start_) std::this_thread::yield();
  }
  stats.finish_wait_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  in_round_ = false;
  return stats;
}

void GradAllreduce::allreduce_sum(double* data, int count) {
  PB_REQUIRE(!in_round_, "grad all-reduce: allreduce_sum() inside a gradient round");
  PB_REQUIRE(count >= 0 && (data || count == 0), "grad all-reduce: allreduce_sum of {} values",
             count);
  if (size_ == 1 || count == 0) return;
  PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, MPI_DOUBLE, MPI_SUM, comm_));
}

}  // namespace packbert
