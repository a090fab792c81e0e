// The attention work list (kernels/common/fmha_work_list.h) that the CUDA backend launches as one
// grid per length bucket: every sequence in exactly one bucket, buckets ascending and non-empty,
// each bucket's members inside its bound and sorted longest first, max_len its longest member, the
// totals, determinism, and edge cases (no sequences, one, every bound exactly, longer than 512);
// and the fixed launch's single grid.
// Plain host C++: runs in CI although the kernels it feeds do not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/fmha_work_list.h"
#include "data/packing/packing.h"
#include "test_util.h"

namespace packbert {
namespace {

// Every property of a plan of these lengths; the failure names the case.
void check_plan(const std::vector<int32_t>& lens, const char* what) {
  SCOPED_TRACE(what);
  const FmhaPlan plan = plan_fmha(lens.data(), static_cast<int64_t>(lens.size()));
  ASSERT_EQ(plan.order.size(), lens.size());
  std::vector<int> seen(lens.size(), 0);
  for (int32_t s : plan.order) {
    ASSERT_GE(s, 0);
    ASSERT_LT(static_cast<size_t>(s), lens.size());
    ++seen[static_cast<size_t>(s)];
  }
  for (size_t s = 0; s < lens.size(); ++s) EXPECT_EQ(seen[s], 1) << "sequence " << s;

  int64_t next = 0, tokens = 0, work = 0;
  int prev_index = -1;
  for (const FmhaBucket& b : plan.buckets) {
    EXPECT_EQ(b.first, next) << "buckets tile the order without gaps";
    EXPECT_GT(b.count, 0) << "no empty buckets";
    EXPECT_GT(b.index, prev_index) << "buckets ascend";
    EXPECT_LE(b.index, kFmhaNumBounds);
    prev_index = b.index;
    const int32_t lo = b.index == 0 ? 0 : kFmhaBucketBounds[b.index - 1];
    const int32_t hi = b.index < kFmhaNumBounds ? kFmhaBucketBounds[b.index] : INT32_MAX;
    int32_t longest = 0;
    for (int64_t i = b.first; i < b.first + b.count; ++i) {
      const int32_t len = lens[static_cast<size_t>(plan.order[static_cast<size_t>(i)])];
      EXPECT_GT(len, lo) << "member of bucket " << b.index;
      EXPECT_LE(len, hi) << "member of bucket " << b.index;
      EXPECT_EQ(fmha_bucket_of(len), b.index);
      if (i > b.first) {
        const int32_t s_prev = plan.order[static_cast<size_t>(i - 1)];
        const int32_t s = plan.order[static_cast<size_t>(i)];
        const int32_t prev = lens[static_cast<size_t>(s_prev)];
        EXPECT_TRUE(prev > len || (prev == len && s_prev < s)) << "longest first, ties by index";
      }
      longest = std::max(longest, len);
      tokens += len;
      work += int64_t{len} * len;
    }
    EXPECT_EQ(b.max_len, longest);
    EXPECT_EQ(lens[static_cast<size_t>(plan.order[static_cast<size_t>(b.first)])], b.max_len);
    next += b.count;
  }
  EXPECT_EQ(next, static_cast<int64_t>(lens.size()));
  EXPECT_EQ(plan.tokens, tokens);
  EXPECT_EQ(plan.work, work);
  // A pure function of the lengths.
  const FmhaPlan again = plan_fmha(lens.data(), static_cast<int64_t>(lens.size()));
  EXPECT_EQ(again.order, plan.order);
  ASSERT_EQ(again.buckets.size(), plan.buckets.size());
}

TEST(FmhaPlan, BucketOfBounds) {
  EXPECT_EQ(fmha_bucket_of(1), 0);
  EXPECT_EQ(fmha_bucket_of(128), 0);
  EXPECT_EQ(fmha_bucket_of(129), 1);
  EXPECT_EQ(fmha_bucket_of(256), 1);
  EXPECT_EQ(fmha_bucket_of(257), 2);
  EXPECT_EQ(fmha_bucket_of(384), 2);
  EXPECT_EQ(fmha_bucket_of(385), 3);
  EXPECT_EQ(fmha_bucket_of(512), 3);
  EXPECT_EQ(fmha_bucket_of(513), 4);
  EXPECT_EQ(fmha_bucket_of(65536), 4);
  // Bounds are multiples of both kernels' query tiles (64 and 16), ascending.
  for (int b = 0; b < kFmhaNumBounds; ++b) {
    EXPECT_EQ(kFmhaBucketBounds[b] % 64, 0);
    if (b) {
      EXPECT_GT(kFmhaBucketBounds[b], kFmhaBucketBounds[b - 1]);
    }
  }
}

TEST(FmhaPlan, EdgeCases) {
  const FmhaPlan empty = plan_fmha(nullptr, 0);
  EXPECT_TRUE(empty.order.empty());
  EXPECT_TRUE(empty.buckets.empty());
  EXPECT_EQ(empty.tokens, 0);

  check_plan({1}, "one token");
  check_plan({512}, "one full sequence");
  check_plan({128, 129, 256, 257, 384, 385, 512, 513}, "every bound and one past it");
  check_plan({7, 7, 7, 7}, "ties");
  check_plan({2000, 1, 600, 513}, "longer than 512");

  const std::vector<int32_t> bounds = {512, 1, 384, 128, 256};
  const FmhaPlan p = plan_fmha(bounds.data(), 5);
  ASSERT_EQ(p.buckets.size(), 4u);
  EXPECT_EQ(p.buckets[0].count, 2);  // 128 and 1
  EXPECT_EQ(p.buckets[0].max_len, 128);
  EXPECT_EQ(p.order, (std::vector<int32_t>{3, 1, 4, 2, 0}));
}

TEST(FmhaPlan, RandomBatches) {
  std::mt19937_64 rng(test::test_seed() ^ 0xF3A);
  for (int round = 0; round < 50; ++round) {
    std::uniform_int_distribution<int32_t> n_dist(1, 300);
    std::uniform_int_distribution<int32_t> len_dist(1, round % 5 == 0 ? 1500 : 512);
    std::vector<int32_t> lens(static_cast<size_t>(n_dist(rng)));
    for (auto& l : lens) l = len_dist(rng);
    check_plan(lens, "random");
  }
}

TEST(FmhaPlan, WikipediaHistogram) {
  // A batch drawn from the MLPerf Wikipedia length histogram (what bench_fmha_gpu times): every
  // bucket is used, and the work a single grid sized by 512 would launch is at least the
  // bucketed grids' (tiles of 64 query rows per sequence).
  const LengthHistogram h =
      load_histogram(std::string(PACKBERT_TEST_DATA) + "/wikipedia-seqlen-histogram-512.txt");
  std::discrete_distribution<int> pick(h.counts.begin(), h.counts.end());
  std::mt19937_64 rng(test::test_seed() ^ 0x51D);
  std::vector<int32_t> lens(512);
  for (auto& l : lens) l = pick(rng) + 1;
  check_plan(lens, "wikipedia");
  const FmhaPlan plan = plan_fmha(lens.data(), static_cast<int64_t>(lens.size()));
  int64_t bucketed = 0;
  for (const FmhaBucket& b : plan.buckets) bucketed += b.count * ((b.max_len + 63) / 64);
  const int32_t longest = *std::max_element(lens.begin(), lens.end());
  const int64_t single = static_cast<int64_t>(lens.size()) * ((longest + 63) / 64);
  EXPECT_LE(bucketed, single);
  EXPECT_GE(plan.buckets.size(), 2u);
}

// A fixed launch's plan (SeqLayout::fixed_launch): one grid of every sequence in layout order,
// sized by the bound, whatever the lengths; nothing for no sequences.
TEST(FmhaPlan, FixedLaunch) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4096}})
    for (int32_t bound : {1, 128, 129, 512, 777}) {
      const FmhaPlan p = plan_fmha_fixed(n, bound);
      ASSERT_EQ(p.buckets.size(), 1u);
      EXPECT_TRUE(p.order.empty());  // layout order: the kernels take 0 .. count-1
      EXPECT_EQ(p.buckets[0].count, n);
      EXPECT_EQ(p.buckets[0].first, 0);
      EXPECT_EQ(p.buckets[0].max_len, bound);
      EXPECT_EQ(p.buckets[0].index, fmha_bucket_of(bound));
    }
  EXPECT_TRUE(plan_fmha_fixed(0, 512).buckets.empty());
}

}  // namespace
}  // namespace packbert
