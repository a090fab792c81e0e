#include "data/loader/epoch_order.h"

#include <algorithm>
#include <numeric>

#include "kernels/base/error.h"

namespace packbert {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Stream tags: each use of randomness gets its own stream, so adding one never shifts another.
constexpr uint64_t kTagBlocks = 0x626c6f636b73;  // "blocks"
constexpr uint64_t kTagWindow = 0x77696e646f77;  // "window"
constexpr uint64_t kTagOwners = 0x6f776e657273;  // "owners"
constexpr size_t kWindowCache = 3;

}  // namespace

OrderRng::OrderRng(uint64_t seed, uint64_t tag, uint64_t a, uint64_t b)
    : state_(mix64(seed ^ mix64(tag ^ mix64(a ^ mix64(b))))) {}

uint64_t OrderRng::next() {
  state_ += 0x9e3779b97f4a7c15ull;
  return mix64(state_);
}

uint64_t OrderRng::below(uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

BlockLayout::BlockLayout(std::vector<int64_t> shard_sizes, int64_t block_rows)
    : sizes_(std::move(shard_sizes)), block_rows_(block_rows) {
  PB_REQUIRE(block_rows > 0, "data loader: shuffle block size must be positive, got {}",
             block_rows);
  PB_REQUIRE(num_shards() <= (int64_t{1} << (kSampleIdBits - kSampleRowBits)),
             "data loader: {} shards are more than sample ids can address", num_shards());
  first_block_.assign(sizes_.size() + 1, 0);
  for (size_t i = 0; i < sizes_.size(); ++i) {
    PB_REQUIRE(sizes_[i] >= 0 && sizes_[i] < (int64_t{1} << kSampleRowBits),
               "data loader: shard {} has {} samples, outside what sample ids can address", i,
               sizes_[i]);
    num_samples_ += sizes_[i];
    first_block_[i + 1] = first_block_[i] + (sizes_[i] + block_rows - 1) / block_rows;
  }
}

BlockLayout::Block BlockLayout::block(int64_t b) const {
  PB_CHECK(b >= 0 && b < num_blocks(), "block {} of {}", b, num_blocks());
  // The shard whose block range holds b: the last i with first_block_[i] <= b.
  const auto it = std::upper_bound(first_block_.begin(), first_block_.end(), b);
  const int64_t shard = (it - first_block_.begin()) - 1;
  Block out;
  out.shard = shard;
  out.begin = (b - first_block_[shard]) * block_rows_;
  out.end = std::min(out.begin + block_rows_, sizes_[shard]);
  return out;
}

EpochOrder::EpochOrder(const BlockLayout& layout, uint64_t seed, int64_t window_blocks,
                       int64_t epoch)
    : layout_(&layout), seed_(seed), window_blocks_(window_blocks), epoch_(epoch) {
  PB_REQUIRE(window_blocks > 0, "data loader: shuffle window must hold at least one block, got {}",
             window_blocks);
  const int64_t nb = layout.num_blocks();
  block_order_.resize(static_cast<size_t>(nb));
  std::iota(block_order_.begin(), block_order_.end(), int64_t{0});
  OrderRng(seed, kTagBlocks, static_cast<uint64_t>(epoch)).shuffle(block_order_);
  block_window_.resize(static_cast<size_t>(nb));
  window_begin_.assign(1, 0);
  for (int64_t i = 0; i < nb; i += window_blocks) {
    const int64_t w = i / window_blocks;
    int64_t rows = 0;
    for (int64_t j = i; j < std::min(nb, i + window_blocks); ++j) {
      block_window_[block_order_[j]] = w;
      const BlockLayout::Block b = layout.block(block_order_[j]);
      rows += b.end - b.begin;
    }
    window_begin_.push_back(window_begin_.back() + rows);
  }
}

int64_t EpochOrder::window_of_position(int64_t position) const {
  PB_CHECK(position >= 0 && position < num_samples(), "position {} of {}", position, num_samples());
  // Empty shards give no blocks, so windows are never empty and the search is exact.
  const auto it = std::upper_bound(window_begin_.begin(), window_begin_.end(), position);
  return (it - window_begin_.begin()) - 1;
}

std::vector<int64_t> EpochOrder::window_blocks(int64_t w) const {
  PB_CHECK(w >= 0 && w < num_windows(), "window {} of {}", w, num_windows());
  const auto first = block_order_.begin() + w * window_blocks_;
  const auto last =
      block_order_.begin() + std::min<int64_t>((w + 1) * window_blocks_, block_order_.size());
  return std::vector<int64_t>(first, last);
}

const std::vector<int64_t>& EpochOrder::window_ids(int64_t w) {
  for (const auto& entry : cache_)
    if (entry.first == w) return entry.second;
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(window_begin_[w + 1] - window_begin_[w]));
  for (const int64_t b : window_blocks(w)) {
    const BlockLayout::Block blk = layout_->block(b);
    for (int64_t row = blk.begin; row < blk.end; ++row)
      ids.push_back(make_sample_id(blk.shard, row));
  }
  OrderRng(seed_, kTagWindow, static_cast<uint64_t>(epoch_), static_cast<uint64_t>(w)).shuffle(ids);
  if (cache_.size() >= kWindowCache) cache_.erase(cache_.begin());
  cache_.emplace_back(w, std::move(ids));
  return cache_.back().second;
}

void EpochOrder::samples(int64_t begin, int64_t end, std::vector<int64_t>& out) {
  PB_CHECK(0 <= begin && begin <= end && end <= num_samples(), "positions [{}, {}) of {}", begin,
           end, num_samples());
  int64_t p = begin;
  while (p < end) {
    const int64_t w = window_of_position(p);
    const std::vector<int64_t>& ids = window_ids(w);
    const int64_t stop = std::min(end, window_begin_[w + 1]);
    out.insert(out.end(), ids.begin() + (p - window_begin_[w]),
               ids.begin() + (stop - window_begin_[w]));
    p = stop;
  }
}

std::vector<int32_t> assign_shard_owners(const std::vector<int64_t>& shard_sizes, int num_ranks,
                                         uint64_t seed, int64_t epoch) {
  PB_REQUIRE(num_ranks >= 1, "data loader: {} ranks", num_ranks);
  std::vector<int64_t> order(shard_sizes.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  OrderRng(seed, kTagOwners, static_cast<uint64_t>(epoch)).shuffle(order);
  std::vector<int32_t> owner(shard_sizes.size(), 0);
  std::vector<int64_t> rows(static_cast<size_t>(num_ranks), 0);
  for (const int64_t shard : order) {
    const auto least = std::min_element(rows.begin(), rows.end());  // first minimum: lowest rank
    owner[shard] = static_cast<int32_t>(least - rows.begin());
    *least += shard_sizes[shard];
  }
  return owner;
}

}  // namespace packbert
