#include "comm/bucket_scheduler.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <numeric>
#include <utility>

#include "kernels/base/error.h"
#include "kernels/base/trace.h"

namespace packbert {

namespace {

// Elements per bucket: counts are int (MPI's and NCCL's APIs alike take an int or size_t; int
// bounds both), and 1 element is the smallest piece.
int64_t bucket_elems_of(size_t bucket_bytes) {
  return std::clamp<int64_t>(static_cast<int64_t>(bucket_bytes / sizeof(float)), 1, INT_MAX);
}

// The element index of bucket k's end (exclusive): buckets are cut from the end of the span.
int64_t bucket_end(int64_t span_end, int64_t bucket_elems, int64_t k) {
  return span_end - k * bucket_elems;
}

}  // namespace

std::vector<GradBucket> plan_grad_buckets(const std::vector<GradSpan>& tensors, int64_t num_elems,
                                          size_t bucket_bytes) {
  PB_REQUIRE(num_elems >= 0, "grad all-reduce: {} gradient elements", num_elems);
  const int64_t bucket_elems = bucket_elems_of(bucket_bytes);
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

std::vector<int64_t> bucket_part_counts(const GradBucket& b, const std::vector<int64_t>& bounds) {
  std::vector<int64_t> counts(bounds.empty() ? 0 : bounds.size() - 1, 0);
  const int64_t lo = b.offset, hi = b.offset + b.size;
  for (size_t r = 0; r < counts.size(); ++r)
    counts[r] = std::max<int64_t>(0, std::min(hi, bounds[r + 1]) - std::max(lo, bounds[r]));
  return counts;
}

GradBucketScheduler::GradBucketScheduler(std::vector<GradSpan> tensors, int64_t num_elems,
                                         size_t bucket_bytes, std::string label)
    : label_(std::move(label)) {
  PB_REQUIRE(tensors.size() < static_cast<size_t>(INT_MAX), "{}: {} tensors", label_,
             tensors.size());
  // Sort by offset, remembering where each of the caller's rows went (ready_tensor(i) takes the
  // caller's index).
  std::vector<int> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  // By offset, an empty tensor before a non-empty one at the same offset (it lies at its start;
  // the other order would read as an overlap).
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return tensors[a].offset != tensors[b].offset ? tensors[a].offset < tensors[b].offset
                                                  : tensors[a].size < tensors[b].size;
  });
  sorted_index_.assign(tensors.size(), 0);
  original_index_ = order;
  tensors_.reserve(tensors.size());
  for (size_t j = 0; j < order.size(); ++j) {
    sorted_index_[static_cast<size_t>(order[j])] = static_cast<int>(j);
    tensors_.push_back(tensors[static_cast<size_t>(order[j])]);
  }
  buckets_ = plan_grad_buckets(tensors_, num_elems, bucket_bytes);
  const int64_t bucket_elems = bucket_elems_of(bucket_bytes);
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
}

void GradBucketScheduler::set_transport(GradBucketTransport* transport) {
  PB_REQUIRE(!in_round_, "{}: transport changed inside a round", label_);
  transport_ = transport;
}

void GradBucketScheduler::begin(GradCollective collective) {
  PB_REQUIRE(!in_round_ && !completed_early_,
             "{}: begin() while a round is in flight (finish() first)", label_);
  std::fill(tensor_ready_.begin(), tensor_ready_.end(), 0);
  std::fill(bucket_pending_.begin(), bucket_pending_.end(), 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    for (int k = tensor_first_bucket_[i]; k <= tensor_last_bucket_[i]; ++k) ++bucket_pending_[k];
  next_to_start_ = 0;
  completed_ = 0;
  if (transport_) transport_->begin_round(collective);
  in_round_ = true;
  start_ready_buckets();  // buckets of gaps only have nothing to wait for
}

int GradBucketScheduler::tensor_index(int64_t offset, int64_t size) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), offset,
                                   [](const GradSpan& t, int64_t o) { return t.offset < o; });
  // Zero-size tensors may share an offset with the next one: look for the exact row.
  for (auto j = it; j != tensors_.end() && j->offset == offset; ++j)
    if (j->size == size) return static_cast<int>(j - tensors_.begin());
  PB_THROW("{}: ready({}, {}) names no tensor of the table", label_, offset, size);
}

void GradBucketScheduler::ready_tensor(int i) {
  PB_REQUIRE(i >= 0 && static_cast<size_t>(i) < tensors_.size(),
             "{}: ready_tensor({}) of {} tensors", label_, i, tensors_.size());
  if (!in_round_) return;
  const int j = sorted_index_[static_cast<size_t>(i)];
  PB_REQUIRE(!tensor_ready_[j],
             "{}: tensor {} (offset {}, size {}) marked ready twice in one round", label_, i,
             tensors_[j].offset, tensors_[j].size);
  tensor_ready_[j] = 1;
  for (int k = tensor_first_bucket_[j]; k <= tensor_last_bucket_[j]; ++k) --bucket_pending_[k];
  start_ready_buckets();
  test_started();
}

void GradBucketScheduler::ready(int64_t offset, int64_t size) {
  // Checked even outside a round, so a wrong table shows on every micro-step.
  ready_tensor(original_index_[static_cast<size_t>(tensor_index(offset, size))]);
}

void GradBucketScheduler::progress() {
  if (in_round_) test_started();
}

void GradBucketScheduler::start_ready_buckets() {
  const int num = static_cast<int>(buckets_.size());
  // Strictly in bucket order, so every rank starts the same sequence of collectives.
  while (next_to_start_ < num && bucket_pending_[next_to_start_] == 0) {
    const trace::Range range("grad_bucket");  // also on one rank: where the bucket was ready
    if (transport_) {
      transport_->start(next_to_start_, buckets_[next_to_start_]);
    } else {
      ++completed_;  // nothing to do on one rank: done as soon as it is "started"
    }
    ++next_to_start_;
  }
}

void GradBucketScheduler::test_started() {
  if (!transport_ || completed_ == next_to_start_) return;
  completed_ = std::max(completed_, std::min(transport_->test(), next_to_start_));
}

GradReduceStats GradBucketScheduler::finish() {
  if (completed_early_) {
    completed_early_ = false;
    return early_;
  }
  PB_REQUIRE(in_round_, "{}: finish() without begin()", label_);
  for (size_t j = 0; j < tensors_.size(); ++j) {
    if (tensor_ready_[j]) continue;
    const int i = original_index_[j];
    PB_THROW(
        "{}: finish() but tensor {} (offset {}, size {}) was never marked ready in this "
        "round",
        label_, i, tensors_[j].offset, tensors_[j].size);
  }
  GradReduceStats stats;
  stats.buckets = static_cast<int>(buckets_.size());
  test_started();
  stats.started_before_finish = next_to_start_;
  stats.completed_before_finish = completed_;
  start_ready_buckets();  // every tensor is ready: this starts the rest
  PB_CHECK(next_to_start_ == stats.buckets, "{} of {} buckets started with every tensor ready",
           next_to_start_, stats.buckets);
  const auto t0 = std::chrono::steady_clock::now();
  const trace::Range range("grad_wait");
  if (transport_) {
    transport_->complete_all();
    completed_ = next_to_start_;
  }
  stats.finish_wait_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  in_round_ = false;
  return stats;
}

void GradBucketTransport::launched() {
  PB_THROW(
      "grad reducer: a graph holding this transport's collectives was launched, but they "
      "cannot be captured (only NCCL's can)");
}

void GradBucketTransport::watch_launch(const char*) { launched(); }

void GradBucketScheduler::complete() {
  PB_REQUIRE(!completed_early_, "{}: complete() twice in one round", label_);
  early_ = finish();
  completed_early_ = true;
}

void GradBucketScheduler::graph_launched() {
  if (completed_early_) {  // the recording's launch: ready() and complete() ran in the capture
    if (transport_) transport_->launched();
    early_.graph = 1;
    return;
  }
  PB_REQUIRE(in_round_, "{}: graph_launched() without begin()", label_);
  for (size_t j = 0; j < tensors_.size(); ++j)
    PB_REQUIRE(!tensor_ready_[j],
               "{}: graph_launched() after tensor {} was marked ready: a replayed round is "
               "announced by its graph alone",
               label_, original_index_[j]);
  if (transport_) transport_->launched();
  std::fill(tensor_ready_.begin(), tensor_ready_.end(), 1);
  std::fill(bucket_pending_.begin(), bucket_pending_.end(), 0);
  early_ = GradReduceStats{};
  early_.buckets = static_cast<int>(buckets_.size());
  early_.started_before_finish = early_.buckets;  // in the graph, among the backward's ops
  early_.completed_before_finish = completed_;
  early_.graph = 2;
  next_to_start_ = early_.buckets;
  completed_ = next_to_start_;
  in_round_ = false;
  completed_early_ = true;
}

}  // namespace packbert
