// The gradient all-reduce's bucket scheduling (comm/bucket_scheduler.h) against a fake transport
// that records every call: the scheduling MPI runs on the CPU and NCCL on the GPU, checked here
// without either. The bucket plan's arithmetic is tests/unit/test_grad_buckets.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/base/error.h"
#include "comm/bucket_scheduler.h"
#include "test_util.h"

namespace packbert::test {
namespace {

// Records the calls; test() reports `done` buckets complete (as many as have started at most).
struct FakeTransport final : GradBucketTransport {
  std::vector<int> starts;  // bucket indices, in call order (this round)
  std::vector<GradBucket> started_buckets;
  int rounds = 0;
  int tests = 0;
  int complete_calls = 0;
  int started_at_complete = -1;  // starts seen when complete_all() came
  int done = 0;
  int throw_at_start = -1;  // start(k) of this k throws
  int launched_calls = 0;
  bool capturable = true;  // false: launched() is the base's (an Error)

  GradCollective collective = GradCollective::allreduce;

  void begin_round(GradCollective c) override {
    collective = c;
    ++rounds;
    starts.clear();
    started_buckets.clear();
    done = 0;
  }
  void allreduce_sum(const Tensor&) override {}
  void start(int k, const GradBucket& b) override {
    if (k == throw_at_start) throw std::runtime_error("injected transport failure");
    starts.push_back(k);
    started_buckets.push_back(b);
  }
  int test() override {
    ++tests;
    return std::min(done, static_cast<int>(starts.size()));
  }
  void complete_all() override {
    ++complete_calls;
    started_at_complete = static_cast<int>(starts.size());
  }
  void all_gather(const std::vector<GradBucket>&, const Tensor&) override {}
  void launched() override {
    if (!capturable) GradBucketTransport::launched();
    ++launched_calls;
  }
};

std::vector<GradSpan> random_table(std::mt19937_64& rng, int count, int64_t& num_elems) {
  std::uniform_int_distribution<int64_t> size(0, 300), gap(0, 30);
  std::vector<GradSpan> spans;
  int64_t at = gap(rng);
  for (int i = 0; i < count; ++i) {
    const int64_t s = size(rng);
    spans.push_back({at, s});
    at += s + gap(rng);
  }
  num_elems = at + gap(rng);
  return spans;
}

bool overlaps(const GradSpan& t, const GradBucket& b) {
  return t.size > 0 && t.offset < b.offset + b.size && t.offset + t.size > b.offset;
}

// After every ready(): the started buckets are exactly 0 .. s-1, each with all its overlapping
// tensors ready, and bucket s (if any) still waits for one of its tensors: buckets start as soon
// as the order allows and never earlier.
void check_started(const GradBucketScheduler& sched, const FakeTransport& fake,
                   const std::vector<GradSpan>& table, const std::vector<char>& is_ready) {
  const auto& buckets = sched.buckets();
  const int s = sched.buckets_started();
  ASSERT_EQ(static_cast<int>(fake.starts.size()), s);
  for (int k = 0; k < s; ++k) {
    ASSERT_EQ(fake.starts[static_cast<size_t>(k)], k) << "buckets start strictly in order";
    EXPECT_EQ(fake.started_buckets[static_cast<size_t>(k)].offset,
              buckets[static_cast<size_t>(k)].offset);
    for (size_t i = 0; i < table.size(); ++i)
      ASSERT_FALSE(overlaps(table[i], buckets[static_cast<size_t>(k)]) && !is_ready[i])
          << "bucket " << k << " started before tensor " << i << " was ready";
  }
  if (s < static_cast<int>(buckets.size())) {
    bool waits = false;
    for (size_t i = 0; i < table.size(); ++i)
      waits |= overlaps(table[i], buckets[static_cast<size_t>(s)]) && !is_ready[i];
    EXPECT_TRUE(waits) << "bucket " << s << " could have started";
  }
}

TEST(BucketScheduler, StartsStrictlyInOrderWhateverTheReadyOrder) {
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 30; ++trial) {
    int64_t n = 0;
    const std::vector<GradSpan> table = random_table(rng, 1 + trial, n);
    const size_t bytes = std::uniform_int_distribution<size_t>(4, 2000)(rng);
    // The scheduler takes the table in any order; ready_tensor() uses the caller's indices.
    std::vector<int> perm(table.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<GradSpan> given(table.size());
    for (size_t i = 0; i < table.size(); ++i) given[i] = table[static_cast<size_t>(perm[i])];
    GradBucketScheduler sched(given, n, bytes, "test all-reduce");
    FakeTransport fake;
    sched.set_transport(&fake);
    SCOPED_TRACE(testing::Message() << table.size() << " tensors, " << sched.buckets().size()
                                    << " buckets of " << bytes << " bytes, trial " << trial);
    for (int round = 0; round < 3; ++round) {
      // Round 0: reverse order (a backward pass); then random orders.
      std::vector<int> order(table.size());
      std::iota(order.begin(), order.end(), 0);
      if (round == 0)
        std::reverse(order.begin(), order.end());
      else
        std::shuffle(order.begin(), order.end(), rng);
      sched.begin();
      EXPECT_EQ(fake.rounds, round + 1);
      std::vector<char> is_ready(table.size(), 0);
      check_started(sched, fake, table, is_ready);
      for (int t : order) {
        // Sorted index t is the caller's index i with perm[i] == t.
        const int i = static_cast<int>(std::find(perm.begin(), perm.end(), t) - perm.begin());
        // (Empty tensors may share an offset: only the index names them for sure.)
        if (t % 2 || table[static_cast<size_t>(t)].size == 0)
          sched.ready_tensor(i);
        else
          sched.ready(table[static_cast<size_t>(t)].offset, table[static_cast<size_t>(t)].size);
        is_ready[static_cast<size_t>(t)] = 1;
        check_started(sched, fake, table, is_ready);
        if (HasFatalFailure()) return;
      }
      EXPECT_EQ(sched.buckets_started(), static_cast<int>(sched.buckets().size()));
      const GradReduceStats s = sched.finish();
      EXPECT_EQ(s.buckets, static_cast<int>(sched.buckets().size()));
      EXPECT_EQ(s.started_before_finish, s.buckets);
      EXPECT_EQ(fake.complete_calls, round + 1);
      EXPECT_EQ(fake.started_at_complete, s.buckets) << "complete_all() after the last start";
      EXPECT_FALSE(sched.in_round());
    }
  }
}

// An empty tensor at the offset where a non-empty one starts is no overlap, in whichever order
// the table gives them (a random table once drew this and the scheduler refused it).
TEST(BucketScheduler, EmptyTensorAtAnotherOnesOffsetInEitherOrder) {
  using Table = std::vector<GradSpan>;
  for (const Table& given : {Table{{0, 10}, {10, 0}, {10, 5}}, Table{{0, 10}, {10, 5}, {10, 0}}}) {
    GradBucketScheduler sched(given, 15, 16, "test all-reduce");
    sched.begin();
    for (int i = 0; i < 3; ++i) sched.ready_tensor(i);
    EXPECT_EQ(sched.finish().buckets, 4);
    sched.begin();
    sched.ready(10, 0);  // named by its row: the empty one, not the one sharing its offset
    sched.ready(10, 5);
    sched.ready(0, 10);
    EXPECT_EQ(sched.finish().started_before_finish, 4);
  }
}

TEST(BucketScheduler, ErrorsNameTheTensor) {
  // 16-element buckets over [0, 100) + [100, 140) + [160, 200) + an empty tensor at 200.
  const std::vector<GradSpan> table = {{100, 40}, {0, 100}, {160, 40}, {200, 0}};
  GradBucketScheduler sched(table, 220, 64, "test all-reduce");
  FakeTransport fake;
  sched.set_transport(&fake);
  EXPECT_NE(error_of([&] { sched.finish(); }).find("test all-reduce: finish() without begin()"),
            std::string::npos);
  sched.begin();
  sched.ready_tensor(2);
  std::string e = error_of([&] { sched.ready_tensor(2); });
  EXPECT_NE(e.find("test all-reduce: tensor 2 (offset 160, size 40) marked ready twice"),
            std::string::npos)
      << e;
  e = error_of([&] { sched.ready(160, 40); });
  EXPECT_NE(e.find("tensor 2 (offset 160, size 40) marked ready twice"), std::string::npos) << e;
  e = error_of([&] { sched.ready(161, 40); });
  EXPECT_NE(e.find("ready(161, 40) names no tensor"), std::string::npos) << e;
  e = error_of([&] { sched.ready_tensor(4); });
  EXPECT_NE(e.find("ready_tensor(4) of 4 tensors"), std::string::npos) << e;
  sched.ready(200, 0);
  sched.ready_tensor(1);
  // Tensor 0 [100, 140) is missing: finish() names it, starts nothing more and completes nothing.
  const int started = sched.buckets_started();
  e = error_of([&] { sched.finish(); });
  EXPECT_NE(e.find("test all-reduce: finish() but tensor 0 (offset 100, size 40) was never "
                   "marked ready"),
            std::string::npos)
      << e;
  EXPECT_EQ(sched.buckets_started(), started);
  EXPECT_EQ(fake.complete_calls, 0);
  EXPECT_TRUE(sched.in_round());
  e = error_of([&] { sched.begin(); });
  EXPECT_NE(e.find("begin() while a round is in flight"), std::string::npos) << e;
  e = error_of([&] { sched.set_transport(nullptr); });
  EXPECT_NE(e.find("transport changed inside a round"), std::string::npos) << e;
  // The round goes on once the tensor comes.
  sched.ready_tensor(0);
  EXPECT_EQ(sched.finish().buckets, static_cast<int>(sched.buckets().size()));
  EXPECT_EQ(fake.complete_calls, 1);
}

TEST(BucketScheduler, OutsideARoundReadyIsCheckedAndIgnored) {
  const std::vector<GradSpan> table = {{0, 50}, {50, 50}};
  GradBucketScheduler sched(table, 100, 40, "test all-reduce");
  FakeTransport fake;
  sched.set_transport(&fake);
  // Earlier micro-steps announce their tensors too: nothing starts, nothing is remembered.
  sched.ready_tensor(0);
  sched.ready_tensor(0);
  sched.ready(50, 50);
  EXPECT_THROW(sched.ready(10, 50), Error);
  EXPECT_THROW(sched.ready_tensor(-1), Error);
  EXPECT_EQ(fake.rounds, 0);
  EXPECT_TRUE(fake.starts.empty());
  sched.begin();
  EXPECT_TRUE(fake.starts.empty());
  sched.ready_tensor(1);  // [50, 100): buckets 0 [90, 100) .. 4 [50, 60)
  EXPECT_EQ(sched.buckets_started(), 5);
  EXPECT_EQ(fake.starts, (std::vector<int>{0, 1, 2, 3, 4}));
  sched.ready_tensor(0);
  EXPECT_EQ(sched.buckets_started(), 10);
  sched.finish();
}

TEST(BucketScheduler, CountsWhatCompletedBeforeFinish) {
  const std::vector<GradSpan> table = {{0, 64}, {64, 64}, {128, 64}};
  GradBucketScheduler sched(table, 192, 64 * 4, "test all-reduce");
  ASSERT_EQ(sched.buckets().size(), 3u);
  FakeTransport fake;
  sched.set_transport(&fake);
  sched.begin();
  sched.ready_tensor(2);
  sched.ready_tensor(1);
  EXPECT_EQ(sched.buckets_started(), 2);
  EXPECT_EQ(sched.buckets_completed(), 0);
  fake.done = 1;
  const int tests = fake.tests;
  sched.progress();  // polls the transport
  EXPECT_GT(fake.tests, tests);
  EXPECT_EQ(sched.buckets_completed(), 1);
  fake.done = 0;  // a transport's count never goes back: neither does the scheduler's
  sched.progress();
  EXPECT_EQ(sched.buckets_completed(), 1);
  fake.done = 2;
  sched.ready_tensor(0);
  const GradReduceStats s = sched.finish();
  EXPECT_EQ(s.buckets, 3);
  EXPECT_EQ(s.started_before_finish, 3);
  EXPECT_EQ(s.completed_before_finish, 2);
  EXPECT_EQ(sched.buckets_completed(), 3);  // complete_all() completes the round
  EXPECT_GE(s.finish_wait_s, 0.0);
}

TEST(BucketScheduler, WithoutTransportStartedMeansComplete) {
  const std::vector<GradSpan> table = {{0, 30}, {40, 30}};
  GradBucketScheduler sched(table, 80, 40, "test all-reduce");
  sched.begin();
  sched.ready_tensor(1);
  // [60, 70) [50, 60) [40, 50) and the gap [30, 40)
  EXPECT_EQ(sched.buckets_started(), 4);
  EXPECT_EQ(sched.buckets_completed(), 4);
  sched.ready_tensor(0);
  const GradReduceStats s = sched.finish();
  EXPECT_EQ(s.buckets, 7);
  EXPECT_EQ(s.started_before_finish, 7);
  EXPECT_EQ(s.completed_before_finish, 7);
}

TEST(BucketScheduler, TransportFailureLeavesTheRoundInFlight) {
  const std::vector<GradSpan> table = {{0, 32}, {32, 32}};
  GradBucketScheduler sched(table, 64, 32 * 4, "test all-reduce");
  FakeTransport fake;
  fake.throw_at_start = 1;
  sched.set_transport(&fake);
  sched.begin();
  sched.ready_tensor(1);  // bucket 0
  EXPECT_THROW(sched.ready_tensor(0), std::runtime_error);
  // The owner sees a round in flight with a bucket that never started: it must not wait.
  EXPECT_TRUE(sched.in_round());
  EXPECT_EQ(sched.buckets_started(), 1);
}

TEST(BucketScheduler, GapOnlyBucketsStartWithTheirNeighbours) {
  // [0, 8) and [100, 108) in 8-element buckets: bucket 0 is [100, 108); buckets 1 .. 11 cover
  // only the gap and start right after it, in order; the last two, [4, 12) and [0, 4), hold
  // [0, 8).
  const std::vector<GradSpan> table = {{0, 8}, {100, 8}};
  GradBucketScheduler sched(table, 108, 32, "test all-reduce");
  FakeTransport fake;
  sched.set_transport(&fake);
  const int nb = static_cast<int>(sched.buckets().size());
  ASSERT_EQ(nb, 14);  // ceil(108 / 8)
  sched.begin();
  EXPECT_EQ(sched.buckets_started(), 0);  // bucket 0 waits for tensor 1
  sched.ready_tensor(1);
  EXPECT_EQ(sched.buckets_started(), nb - 2);
  sched.ready_tensor(0);
  EXPECT_EQ(sched.buckets_started(), nb);
  std::vector<int> all(static_cast<size_t>(nb));
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(fake.starts, all);
  sched.finish();
}

// A round inside a CUDA graph (comm/grad_reducer.h, Graphs). Recorded: ready() and complete()
// run as in a capture, the transport completes the round there, the launch is then reported
// once, and finish() returns complete()'s statistics without completing again. Replayed:
// nothing is started, graph_launched() marks every tensor and bucket done, finish() reports
// every bucket started. Misuse is an Error.
TEST(BucketScheduler, RoundsInsideAGraph) {
  const std::vector<GradSpan> table = {{0, 64}, {64, 64}, {128, 64}};
  GradBucketScheduler sched(table, 192, 64 * 4, "test all-reduce");
  FakeTransport fake;
  sched.set_transport(&fake);

  // Recorded.
  sched.begin();
  for (int i : {2, 1, 0}) sched.ready_tensor(i);
  sched.complete();
  EXPECT_EQ(fake.complete_calls, 1);
  EXPECT_EQ(fake.started_at_complete, 3);
  EXPECT_FALSE(sched.in_round());
  EXPECT_THROW(sched.complete(), Error);  // twice
  EXPECT_THROW(sched.begin(), Error);     // finish() first
  sched.graph_launched();
  EXPECT_EQ(fake.launched_calls, 1);
  GradReduceStats s = sched.finish();
  EXPECT_EQ(fake.complete_calls, 1) << "finish() after complete() completed again";
  EXPECT_EQ(s.buckets, 3);
  EXPECT_EQ(s.started_before_finish, 3);
  EXPECT_EQ(s.graph, 1);
  EXPECT_THROW(sched.finish(), Error);  // the round is over

  // Replayed: the graph holds the starts and the join.
  for (int replay = 0; replay < 2; ++replay) {
    sched.begin();
    sched.graph_launched();
    EXPECT_TRUE(fake.starts.empty());
    EXPECT_EQ(fake.launched_calls, 2 + replay);
    EXPECT_EQ(fake.complete_calls, 1);
    EXPECT_EQ(sched.buckets_started(), 3);
    EXPECT_EQ(sched.buckets_completed(), 3);
    s = sched.finish();
    EXPECT_EQ(s.buckets, 3);
    EXPECT_EQ(s.started_before_finish, 3);
    EXPECT_EQ(s.graph, 2);
    sched.ready_tensor(0);  // outside a round: checked, ignored
  }

  // An eager round afterwards is as before.
  sched.begin();
  for (int i : {2, 1, 0}) sched.ready_tensor(i);
  s = sched.finish();
  EXPECT_EQ(fake.complete_calls, 2);
  EXPECT_EQ(s.graph, 0);

  // A replay after a tensor was announced: the graph would announce it again.
  sched.begin();
  sched.ready_tensor(2);
  const std::string e = error_of([&] { sched.graph_launched(); });
  EXPECT_NE(e.find("graph_launched() after tensor 2 was marked ready"), std::string::npos) << e;
  sched.ready_tensor(1);
  sched.ready_tensor(0);
  sched.finish();

  // A transport that cannot be captured refuses a launch.
  fake.capturable = false;
  sched.begin();
  const std::string e2 = error_of([&] { sched.graph_launched(); });
  EXPECT_NE(e2.find("cannot be captured"), std::string::npos) << e2;
}

}  // namespace
}  // namespace packbert::test
