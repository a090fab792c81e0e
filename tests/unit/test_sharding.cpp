// The sharded optimizer's cut (optim/sharding.h) and the figures it reports
// (optim/distributed_lamb.h: state per rank, bytes sent per step), for rank counts no test can
// launch: the cut's bounds at random sizes and rank counts, BERT-Large's balance at every rank
// count up to 1024, and a bf16 step's traffic against the replicated all-reduce's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "measure.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/distributed_lamb.h"
#include "optim/sharding.h"
#include "test_util.h"

namespace packbert::test {
namespace {

// Every rank gets floor or ceil of units / N aligned units (the last rank's last unit may be
// short), so the largest range exceeds the mean by less than one unit, kShardAlign elements.
TEST(PlanShards, EqualAlignedRangesAtAnyRankCount) {
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(0, int64_t{1} << 34)(rng) >>
                      std::uniform_int_distribution<int>(0, 34)(rng);
    const int ranks = std::uniform_int_distribution<int>(1, 2048)(rng);
    const std::vector<int64_t> b = plan_shards(n, ranks);
    ASSERT_EQ(b.size(), static_cast<size_t>(ranks) + 1) << n << " over " << ranks;
    ASSERT_EQ(b.front(), 0);
    ASSERT_EQ(b.back(), n);
    int64_t largest = 0;
    for (int r = 0; r < ranks; ++r) {
      ASSERT_LE(b[r], b[r + 1]) << n << " over " << ranks << ", rank " << r;
      if (r > 0) {
        ASSERT_TRUE(b[r] % kShardAlign == 0 || b[r] == n) << b[r];
      }
      largest = std::max(largest, b[r + 1] - b[r]);
    }
    ASSERT_LT(static_cast<double>(largest),
              static_cast<double>(n) / ranks + static_cast<double>(kShardAlign))
        << n << " over " << ranks;
  }
  EXPECT_THROW(plan_shards(10, 0), Error);
  EXPECT_THROW(plan_shards(-1, 2), Error);
}

OptimizerLayout layout_of(const ParamTable& table, bool bf16) {
  OptimizerLayout l;
  l.num_elems = table.total();
  for (const ParamTensor& t : table.tensors())
    l.table.push_back({t.name, t.offset, t.size, t.no_decay});
  l.lowp_bytes = bf16 ? 2 : 0;
  l.fp32_ranges = fp32_read_ranges(table, bf16);
  l.masters_sharded = bf16;  // sharded bf16 keeps the rank's range of the masters
  return l;
}

// BERT-Large (the required balance: max / mean <= 1.01 up to 1024 ranks; the bound above gives
// 1 + 64 N / n <= 1.0002 there).
TEST(PlanShards, BertLargeStaysBalancedUpTo1024Ranks) {
  const ParamTable table(bert_preset("large"));
  double worst = 1.0;
  for (int ranks = 1; ranks <= 1024; ++ranks)
    worst = std::max(worst, shard_imbalance(plan_shards(table.total(), ranks)));
  expect_measure("BERT-Large, 1..1024 ranks: largest range over the mean, worst", worst, 1.01);
}

// A bf16 sharded step sends less than the replicated all-reduce from every rank: reduce-scatter
// (4 B), 16-bit weights (2 B), fp32 biases and LayerNorm and the two sums, against 2 x 4 B.
// fp32 sends the same to within the sums (reduce-scatter + all-gather = all-reduce). And the
// largest rank's state is about 1/N of the moments: at 4 ranks at most 0.3x of one rank's.
TEST(OptimizerFigures, ShardedTrafficAndStateAgainstReplicated) {
  for (const char* preset : {"tiny", "base", "large"}) {
    const ParamTable table(bert_preset(preset));
    for (bool bf16 : {false, true}) {
      const OptimizerLayout l = layout_of(table, bf16);
      double worst_ratio = 0;
      for (int ranks : {2, 3, 4, 8, 16, 64, 256, 1024}) {
        const std::vector<int64_t> b = plan_shards(l.num_elems, ranks);
        int64_t sharded = 0, replicated = 0;
        size_t state = 0;
        for (int r = 0; r < ranks; ++r) {
          sharded = std::max(sharded, optimizer_bytes_sent(l, b, true, r));
          replicated = std::max(replicated, optimizer_bytes_sent(l, b, false, r));
          state = std::max(state, optimizer_state_bytes(l, b, true, r));
        }
        const double ratio = static_cast<double>(sharded) / static_cast<double>(replicated);
        worst_ratio = std::max(worst_ratio, ratio);
        if (bf16) {
          EXPECT_LE(sharded, replicated) << preset << " bf16 at " << ranks << " ranks";
        } else {
          EXPECT_LE(ratio, 1.001) << preset << " fp32 at " << ranks << " ranks";
        }
        // The required saving of the sharded fp32 masters: BERT-Large in bf16 at 8 ranks, the
        // largest rank's state at most 0.3x of the replicated one's (12 B / 8 per parameter
        // and the fp32 biases and LayerNorm, against 12 B).
        if (ranks == 8 && bf16 && std::string(preset) == "large")
          expect_measure("large bf16: state at 8 ranks, sharded over replicated",
                         static_cast<double>(state) /
                             static_cast<double>(optimizer_state_bytes(l, b, false, 0)),
                         0.3);
        if (ranks == 4 && !bf16)
          expect_measure(std::string(preset) + " fp32: state at 4 ranks over 1 rank's",
                         static_cast<double>(state) / static_cast<double>(optimizer_state_bytes(
                                                          l, {0, l.num_elems}, false, 0)),
                         0.3);
      }
      print_measure(std::string(preset) + (bf16 ? " bf16" : " fp32") +
                        ": bytes sent, sharded over replicated, worst of 2..1024 ranks",
                    worst_ratio, bf16 ? 1.0 : 1.001);
    }
  }
}

}  // namespace
}  // namespace packbert::test
