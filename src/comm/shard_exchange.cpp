#include "comm/shard_exchange.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "core/mpi_check.h"
#include "kernels/base/error.h"
#include "core/watchdog.h"

namespace packbert {

void ShardExchange::all_gather(const Tensor& buffer) {
  GradReducer& r = reducer_;
  PB_REQUIRE(!r.sched_.in_round(), "shard exchange: all_gather() inside a gradient round");
  PB_REQUIRE(buffer.defined() && buffer.ndim == 1 && buffer.numel() == r.num_elems_,
             "shard exchange: all_gather of {}, expected [{}] laid out as the gradient",
             buffer.str(), r.num_elems_);
  const WatchScope watch("all-gather (shard exchange)");
  if (r.transport_) r.transport_->all_gather(r.sched_.buckets(), buffer);
}

std::vector<GradBucket> ShardExchange::pieces(const Tensor& buffer, const Ranges& ranges) const {
  const GradReducer& r = reducer_;
  PB_REQUIRE(buffer.defined() && buffer.ndim == 1 && buffer.numel() == r.num_elems_,
             "shard exchange: all_gather of {}, expected [{}] laid out as the gradient",
             buffer.str(), r.num_elems_);
  std::vector<GradBucket> out;
  int64_t prev_end = 0;
  for (const auto& [first, end] : ranges) {
    PB_REQUIRE(first >= prev_end && first <= end && end <= r.num_elems_,
               "shard exchange: range [{}, {}) of {} elements, after {} (ascending, disjoint)",
               first, end, r.num_elems_, prev_end);
    prev_end = end;
    for (const GradBucket& b : r.sched_.buckets()) {
      const int64_t lo = std::max(first, b.offset), hi = std::min(end, b.offset + b.size);
      if (lo < hi) out.push_back({lo, hi - lo, 0, -1});
    }
  }
  // The buckets run from the end of the buffer to its start; move them in the buffer's order.
  std::sort(out.begin(), out.end(),
            [](const GradBucket& a, const GradBucket& b) { return a.offset < b.offset; });
  return out;
}

void ShardExchange::all_gather(const Tensor& buffer, const Ranges& ranges) {
  GradReducer& r = reducer_;
  PB_REQUIRE(!r.sched_.in_round(), "shard exchange: all_gather() inside a gradient round");
  const std::vector<GradBucket> p = pieces(buffer, ranges);
  const WatchScope watch("all-gather (shard exchange)");
  if (r.transport_ && !p.empty()) r.transport_->all_gather(p, buffer);
}

void ShardExchange::start_gathers(
    const std::vector<std::vector<std::pair<Tensor, Ranges>>>& groups) {
  GradReducer& r = reducer_;
  PB_REQUIRE(!r.sched_.in_round(), "shard exchange: start_gathers() inside a gradient round");
  std::vector<std::vector<GradBucketTransport::GatherPart>> parts(groups.size());
  for (size_t g = 0; g < groups.size(); ++g)
    for (const auto& [buffer, ranges] : groups[g]) {
      std::vector<GradBucket> p = pieces(buffer, ranges);
      if (!p.empty()) parts[g].push_back({buffer, std::move(p)});
    }
  const WatchScope watch("all-gather (shard exchange, by layer)");
  if (r.transport_) r.transport_->start_groups(parts);
}

void ShardExchange::wait_gather(int group) {
  if (reducer_.transport_) reducer_.transport_->wait_group(group);
}

void ShardExchange::gather_to_all(const float* mine, float* all) {
  const GradReducer& r = reducer_;
  const std::vector<int64_t>& bounds = r.bounds_;
  PB_REQUIRE(!r.sched_.in_round(), "shard exchange: gather_to_all() inside a gradient round");
  PB_REQUIRE(r.num_elems_ <= std::numeric_limits<int>::max(),
             "shard exchange: gather_to_all of {} elements (MPI counts are int)", r.num_elems_);
  const auto me = static_cast<size_t>(r.rank_);
  const int64_t own = bounds[me + 1] - bounds[me];
  if (r.size_ == 1) {
    if (own > 0) std::memcpy(all, mine, static_cast<size_t>(own) * sizeof(float));
    return;
  }
  std::vector<int> counts, displs;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    counts.push_back(static_cast<int>(bounds[k + 1] - bounds[k]));
    displs.push_back(static_cast<int>(bounds[k]));
  }
  const WatchScope watch("MPI_Allgatherv (shard exchange)");
  PB_MPI_CHECK(MPI_Allgatherv(mine, static_cast<int>(own), MPI_FLOAT, all, counts.data(),
                              displs.data(), MPI_FLOAT, r.comm_));
}

void ShardExchange::gather_to_root(const float* mine, float* all, int root) {
  const GradReducer& r = reducer_;
  const int rank = r.rank_, size = r.size_;
  const std::vector<int64_t>& bounds = r.bounds_;
  PB_REQUIRE(!r.sched_.in_round(), "shard exchange: gather_to_root() inside a gradient round");
  PB_REQUIRE(root >= 0 && root < size, "shard exchange: gather_to_root to rank {} of {}", root,
             size);
  const auto me = static_cast<size_t>(rank);
  const int64_t own = bounds[me + 1] - bounds[me];
  PB_REQUIRE(r.num_elems_ <= std::numeric_limits<int>::max(),
             "shard exchange: gather_to_root of {} elements (MPI counts are int)", r.num_elems_);
  PB_REQUIRE(rank != root || all, "shard exchange: gather_to_root without the root's array");
  if (size == 1) {
    if (own > 0) std::memcpy(all, mine, static_cast<size_t>(own) * sizeof(float));
    return;
  }
  std::vector<int> counts, displs;
  if (rank == root) {
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      counts.push_back(static_cast<int>(bounds[k + 1] - bounds[k]));
      displs.push_back(static_cast<int>(bounds[k]));
    }
  }
  const WatchScope watch("MPI_Gatherv (shard exchange)");
  PB_MPI_CHECK(MPI_Gatherv(mine, static_cast<int>(own), MPI_FLOAT, all, counts.data(),
                           displs.data(), MPI_FLOAT, root, r.comm_));
}

void ShardExchange::sum(const Tensor& values) {
  GradReducer& r = reducer_;
  PB_REQUIRE(!r.sched_.in_round(), "shard exchange: sum() inside a gradient round");
  PB_REQUIRE(values.defined() && values.dtype == DType::f64 && values.ndim == 1 &&
                 values.numel() <= (int64_t{1} << 20),
             "shard exchange: sum of {}, expected f64 [n] (a few values)", values.str());
  if (!r.transport_ || values.numel() == 0) return;
  const WatchScope watch("all-reduce (shard exchange sums)");
  r.transport_->allreduce_sum(values);
}

void ShardExchange::graph_launched() {
  GradReducer& r = reducer_;
  PB_REQUIRE(r.capturable(),
             "shard exchange: a graph holding sums of the {} transport (only "
             "NCCL's can be captured)",
             r.transport_name());
  if (r.transport_) r.transport_->watch_launch("NCCL all-reduce (shard exchange sums, in a graph)");
}

}  // namespace packbert
