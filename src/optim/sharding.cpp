#include "optim/sharding.h"

#include <algorithm>
#include <limits>

#include "kernels/base/error.h"

namespace packbert {

std::vector<int64_t> plan_shards(int64_t num_elems, int ranks, int64_t align) {
  PB_REQUIRE(ranks >= 1, "sharding: {} ranks", ranks);
  PB_REQUIRE(num_elems >= 0, "sharding: {} elements", num_elems);
  PB_REQUIRE(align >= 1, "sharding: alignment {}", align);
  const int64_t units = num_elems / align + (num_elems % align != 0);
  PB_REQUIRE(units <= std::numeric_limits<int64_t>::max() / ranks,
             "sharding: {} elements over {} ranks overflow the plan", num_elems, ranks);
  std::vector<int64_t> bounds = {0};
  for (int r = 1; r < ranks; ++r) bounds.push_back(std::min(num_elems, units * r / ranks * align));
  bounds.push_back(num_elems);
  return bounds;
}

double shard_imbalance(const std::vector<int64_t>& bounds) {
  if (bounds.size() < 2 || bounds.back() == 0) return 1.0;
  int64_t largest = 0;
  for (size_t r = 0; r + 1 < bounds.size(); ++r)
    largest = std::max(largest, bounds[r + 1] - bounds[r]);
  const double mean = static_cast<double>(bounds.back()) / static_cast<double>(bounds.size() - 1);
  return static_cast<double>(largest) / mean;
}

}  // namespace packbert
