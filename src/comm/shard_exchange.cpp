#include "comm/shard_exchange.h"

#include <cstring>
#include <limits>
#include <vector>

#include "comm/mpi_check.h"
#include "core/error.h"
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

}  // namespace packbert
