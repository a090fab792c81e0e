#include "optim/sharding.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace packbert {

std::vector<int64_t> plan_tensor_shards(std::vector<LambParam> params, int64_t num_elems,
                                        int ranks) {
  PB_REQUIRE(ranks >= 1, "sharding: {} ranks", ranks);
  PB_REQUIRE(num_elems >= 0, "sharding: {} elements", num_elems);
  std::stable_sort(params.begin(), params.end(),
                   [](const LambParam& a, const LambParam& b) {
                     // An empty tensor before a non-empty one at the same offset.
                     return a.offset != b.offset ? a.offset < b.offset : a.size < b.size;
                   });
  // The places a cut may go: 0, every tensor's end, num_elems (a gap goes with the tensor
  // before it).
  std::vector<int64_t> cuts = {0};
  int64_t prev_end = 0;
  const LambParam* prev = nullptr;
  for (const LambParam& p : params) {
    PB_REQUIRE(p.offset >= prev_end && p.size >= 0 && p.offset + p.size <= num_elems,
               "sharding: tensor '{}' (offset {}, size {}) overlaps '{}' or leaves the {} "
               "elements",
               p.name, p.offset, p.size, prev ? prev->name : "", num_elems);
    prev_end = p.offset + p.size;
    prev = &p;
    cuts.push_back(prev_end);
  }
  cuts.push_back(num_elems);
  std::vector<int64_t> bounds = {0};
  for (int r = 1; r < ranks; ++r) {
    const int64_t target = num_elems * r / ranks;
    int64_t best = num_elems;
    for (int64_t c : cuts)
      if (c >= bounds.back() && std::llabs(c - target) < std::llabs(best - target)) best = c;
    bounds.push_back(best);
  }
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
