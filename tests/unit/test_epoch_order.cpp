// The loader's pure parts: sample ids, blocks, the epoch order, shard owners, the wire format.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "kernels/base/error.h"
#include "data/loader/epoch_order.h"
#include "data/loader/exchange.h"
#include "test_util.h"

namespace packbert {
namespace {

std::vector<int64_t> all_ids(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> ids;
  for (size_t s = 0; s < sizes.size(); ++s)
    for (int64_t r = 0; r < sizes[s]; ++r) ids.push_back(make_sample_id(int64_t(s), r));
  return ids;
}

TEST(SampleId, PacksShardAndRow) {
  const int64_t id = make_sample_id(12345, (int64_t{1} << kSampleRowBits) - 1);
  EXPECT_EQ(sample_id_shard(id), 12345);
  EXPECT_EQ(sample_id_row(id), (int64_t{1} << kSampleRowBits) - 1);
  // The largest id fits the bits a dropout key carries.
  const int64_t last = make_sample_id((int64_t{1} << (kSampleIdBits - kSampleRowBits)) - 1,
                                      (int64_t{1} << kSampleRowBits) - 1);
  EXPECT_LT(last, int64_t{1} << kSampleIdBits);
  EXPECT_LT(make_sample_id(3, 999), make_sample_id(4, 0));  // ids sort by (shard, row)
}

TEST(OrderRng, ReproducibleAndInRange) {
  OrderRng a(7, 1, 2, 3), b(7, 1, 2, 3), c(7, 1, 2, 4);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.below(13);
    EXPECT_LT(x, 13u);
    EXPECT_EQ(x, b.below(13));
    differs |= x != c.below(13);
  }
  EXPECT_TRUE(differs);
}

TEST(BlockLayout, BlocksCoverEveryRowOnce) {
  const std::vector<int64_t> sizes = {10, 0, 7, 30, 1};
  const BlockLayout layout(sizes, 4);
  EXPECT_EQ(layout.num_samples(), 48);
  EXPECT_EQ(layout.num_blocks(), 3 + 0 + 2 + 8 + 1);
  std::vector<int64_t> seen;
  for (int64_t b = 0; b < layout.num_blocks(); ++b) {
    const BlockLayout::Block blk = layout.block(b);
    EXPECT_GT(blk.end, blk.begin);
    EXPECT_LE(blk.end - blk.begin, 4);
    for (int64_t r = blk.begin; r < blk.end; ++r) {
      const int64_t id = make_sample_id(blk.shard, r);
      EXPECT_EQ(layout.block_of(id), b);
      seen.push_back(id);
    }
  }
  EXPECT_EQ(seen, all_ids(sizes));
  EXPECT_THROW(BlockLayout({1}, 0), Error);
}

TEST(EpochOrder, EveryEpochIsAPermutationOfAllSamples) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> sizes(1 + rng() % 6);
    for (int64_t& s : sizes) s = static_cast<int64_t>(rng() % 200);
    sizes[0] += 1;  // never an empty dataset
    const BlockLayout layout(sizes, 1 + static_cast<int64_t>(rng() % 50));
    const int64_t window = 1 + static_cast<int64_t>(rng() % 5);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      EpochOrder order(layout, rng(), window, epoch);
      ASSERT_EQ(order.num_samples(), layout.num_samples());
      std::vector<int64_t> ids;
      // Read in uneven slices, as steps of any batch size would.
      for (int64_t p = 0; p < order.num_samples();) {
        const int64_t q = std::min(order.num_samples(), p + 1 + static_cast<int64_t>(rng() % 97));
        order.samples(p, q, ids);
        p = q;
      }
      std::sort(ids.begin(), ids.end());
      EXPECT_EQ(ids, all_ids(sizes));
    }
  }
}

TEST(EpochOrder, DependsOnSeedAndEpochOnly) {
  const BlockLayout layout({500, 300, 250}, 64);
  auto order_of = [&](uint64_t seed, int64_t epoch) {
    EpochOrder o(layout, seed, 3, epoch);
    std::vector<int64_t> ids;
    o.samples(0, o.num_samples(), ids);
    return ids;
  };
  EXPECT_EQ(order_of(1, 0), order_of(1, 0));
  EXPECT_NE(order_of(1, 0), order_of(1, 1));
  EXPECT_NE(order_of(1, 0), order_of(2, 0));
  // Samples within a shard are shuffled too (not just blocks).
  const std::vector<int64_t> ids = order_of(1, 0);
  int in_row_order = 0;
  for (size_t i = 1; i < ids.size(); ++i) in_row_order += ids[i] == ids[i - 1] + 1;
  EXPECT_LT(in_row_order, 50);
}

TEST(EpochOrder, WindowsHoldTheirBlocksSamples) {
  const BlockLayout layout({100, 37, 64}, 16);
  EpochOrder order(layout, 99, 4, 2);
  int64_t blocks = 0;
  for (int64_t w = 0; w < order.num_windows(); ++w) {
    std::set<int64_t> expected;
    for (const int64_t b : order.window_blocks(w)) {
      EXPECT_EQ(order.window_of_block(b), w);
      const BlockLayout::Block blk = layout.block(b);
      for (int64_t r = blk.begin; r < blk.end; ++r) expected.insert(make_sample_id(blk.shard, r));
      ++blocks;
    }
    std::vector<int64_t> got;
    order.samples(order.window_begin(w), order.window_begin(w + 1), got);
    EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()), expected);
    EXPECT_EQ(order.window_of_position(order.window_begin(w)), w);
    EXPECT_EQ(order.window_of_position(order.window_begin(w + 1) - 1), w);
  }
  EXPECT_EQ(blocks, layout.num_blocks());
}

TEST(ShardOwners, BalancedByRowsAndShuffledPerEpoch) {
  const std::vector<int64_t> equal(16, 1000);
  for (int ranks : {1, 2, 3, 4, 5, 16, 20}) {
    const std::vector<int32_t> owner = assign_shard_owners(equal, ranks, 5, 0);
    std::vector<int> count(ranks, 0);
    for (const int32_t o : owner) {
      ASSERT_GE(o, 0);
      ASSERT_LT(o, ranks);
      ++count[o];
    }
    const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
    EXPECT_LE(*hi - *lo, 1) << ranks << " ranks";
  }
  EXPECT_EQ(assign_shard_owners(equal, 4, 5, 0), assign_shard_owners(equal, 4, 5, 0));
  EXPECT_NE(assign_shard_owners(equal, 4, 5, 0), assign_shard_owners(equal, 4, 5, 1));
  // Unequal shards: the greedy keeps the most loaded rank within one shard of the least.
  const std::vector<int64_t> sizes = {5000, 100, 100, 100, 2000, 2000, 300, 4000, 50};
  const std::vector<int32_t> owner = assign_shard_owners(sizes, 3, 1, 0);
  std::vector<int64_t> rows(3, 0);
  for (size_t i = 0; i < sizes.size(); ++i) rows[owner[i]] += sizes[i];
  const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end());
  EXPECT_LE(*hi - *lo, 5000);
}

TEST(SampleCodec, RoundTripAndBounds) {
  std::mt19937_64 rng(test::test_seed());
  std::vector<Sample> samples;
  size_t bytes = 0;
  for (int i = 0; i < 50; ++i) {
    samples.push_back(test::random_sample(rng, 5, 512, 80));
    samples.back().id = make_sample_id(i, 1000 + i);
    bytes += encoded_sample_bytes(samples.back().length(), samples.back().num_masked());
  }
  std::vector<char> buf(bytes);
  char* put = buf.data();
  for (const Sample& s : samples) put = encode_sample(s, put);
  EXPECT_EQ(put, buf.data() + buf.size());
  const char* get = buf.data();
  for (const Sample& s : samples) {
    Sample d;
    get = decode_sample(get, buf.data() + buf.size(), d);
    EXPECT_EQ(d, s);
    EXPECT_EQ(d.id, s.id);
  }
  Sample d;
  EXPECT_THROW(decode_sample(buf.data(), buf.data() + 20, d), Error);
}

}  // namespace
}  // namespace packbert
