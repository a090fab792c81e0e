// The order in which one epoch visits the samples of all shards, and which rank reads which
// shard. Pure functions of (seed, epoch, the sorted shard list with its sample counts, block and
// window sizes): never of the rank count, the timing or the history of the run. That is what
// makes the data loader rank-equivalent (step s trains the same samples whatever the number of
// ranks) and resumable from (epoch, cursor) alone, with no RNG state to save.
//
// The shuffle (why blocks and windows): a full per-sample permutation of an epoch would make
// every rank read single rows scattered over its shards, one HDF5 hyperslab each, far from
// the reader's chunked throughput. Instead:
//   1. every shard is cut into blocks of block_rows contiguous rows (the last one shorter);
//   2. all blocks of all shards are permuted, with a generator keyed by (seed, epoch);
//   3. consecutive runs of window_blocks permuted blocks form windows; the samples of a window
//      are permuted together, keyed by (seed, epoch, window);
//   4. the epoch's order is window 0's permutation, then window 1's, ...
// A rank reads each block it owns with one sequential read, and a step draws its samples from
// window_blocks * block_rows samples taken from window_blocks random places of the dataset.
// The cost: the loader holds about one window (plus the prefetched steps) in memory, spread
// over the ranks, and mixing is over a window rather than the whole epoch (prepare already
// shuffles instances within each input file, so neighbouring rows are not related).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace packbert {

// Global sample id: the shard's index in the sorted shard list (upper bits) and the row.
// Ids fit in the 44 bits a dropout key carries (kernels/common/philox.h), so that dropout masks
// are keyed by sample: 64M rows a shard (real shards hold 1e5..1e6) and 256K shards.
constexpr int kSampleIdBits = 44;
constexpr int kSampleRowBits = 26;
inline int64_t make_sample_id(int64_t shard, int64_t row) {
  return (shard << kSampleRowBits) | row;
}
inline int64_t sample_id_shard(int64_t id) { return id >> kSampleRowBits; }
inline int64_t sample_id_row(int64_t id) { return id & ((int64_t{1} << kSampleRowBits) - 1); }

// A counter-based generator (splitmix64 over a key): the same key gives the same stream on
// every platform, unlike std::shuffle and the std distributions.
class OrderRng {
 public:
  OrderRng(uint64_t seed, uint64_t tag, uint64_t a = 0, uint64_t b = 0);
  uint64_t next();
  uint64_t below(uint64_t n);  // in [0, n), n > 0 (multiply-shift; bias < n / 2^64)
  template <typename T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};

// The shards of a run cut into blocks; fixed for the run.
class BlockLayout {
 public:
  BlockLayout(std::vector<int64_t> shard_sizes, int64_t block_rows);
  int64_t num_shards() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_samples() const { return num_samples_; }
  int64_t num_blocks() const { return first_block_.back(); }
  int64_t block_rows() const { return block_rows_; }
  const std::vector<int64_t>& shard_sizes() const { return sizes_; }

  struct Block {
    int64_t shard = 0;
    int64_t begin = 0;  // first row
    int64_t end = 0;    // one past the last row
  };
  Block block(int64_t b) const;
  int64_t block_of(int64_t sample_id) const {
    return first_block_[sample_id_shard(sample_id)] + sample_id_row(sample_id) / block_rows_;
  }

 private:
  std::vector<int64_t> sizes_;
  int64_t block_rows_ = 0;
  int64_t num_samples_ = 0;
  std::vector<int64_t> first_block_;  // [num_shards + 1]: blocks of shard i are [f[i], f[i+1])
};

// One epoch's order (see the top of the file).
class EpochOrder {
 public:
  EpochOrder(const BlockLayout& layout, uint64_t seed, int64_t window_blocks, int64_t epoch);

  int64_t epoch() const { return epoch_; }
  int64_t num_samples() const { return window_begin_.back(); }
  int64_t num_windows() const { return static_cast<int64_t>(window_begin_.size()) - 1; }
  // Positions [window_begin(w), window_begin(w + 1)) of the order are window w's samples.
  int64_t window_begin(int64_t w) const { return window_begin_[w]; }
  int64_t window_of_position(int64_t position) const;
  int64_t window_of_block(int64_t block) const { return block_window_[block]; }
  // The blocks of window w, in permuted order.
  std::vector<int64_t> window_blocks(int64_t w) const;
  // Appends the sample ids at positions [begin, end) of the order to out.
  void samples(int64_t begin, int64_t end, std::vector<int64_t>& out);

 private:
  const std::vector<int64_t>& window_ids(int64_t w);

  const BlockLayout* layout_;
  uint64_t seed_;
  int64_t window_blocks_;
  int64_t epoch_;
  std::vector<int64_t> block_order_;   // permuted block numbers
  std::vector<int64_t> block_window_;  // block number -> its window
  std::vector<int64_t> window_begin_;  // [num_windows + 1]
  // The last few windows' sample ids (a step rarely spans more than two windows).
  std::vector<std::pair<int64_t, std::vector<int64_t>>> cache_;
};

// Which rank reads each shard in an epoch: shards in an order shuffled by (seed, epoch), each
// to the rank with the fewest rows so far (ties: lowest rank), so reading work is balanced by
// rows even when shard sizes differ. With fewer shards than ranks some ranks read nothing (they
// still train: samples move to them in the exchange).
std::vector<int32_t> assign_shard_owners(const std::vector<int64_t>& shard_sizes, int num_ranks,
                                         uint64_t seed, int64_t epoch);

}  // namespace packbert
