// The gradient reducer's bucket plan (pure arithmetic) and its bookkeeping on one rank, where
// no MPI call is made at all (this test never initializes MPI). The multi-rank behaviour is
// tests/mpi/mpi_allreduce_driver.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "kernels/base/error.h"
#include "comm/grad_reducer.h"
#include "comm/metric_sums.h"
#include "comm/shard_exchange.h"
#include "test_util.h"

namespace packbert::test {
namespace {

std::vector<GradSpan> random_spans(std::mt19937_64& rng, int count, int64_t& num_elems) {
  std::uniform_int_distribution<int64_t> size(0, 700), gap(0, 40);
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

// Checks every promise of plan_grad_buckets against brute force.
void check_plan(const std::vector<GradSpan>& spans, int64_t n, size_t bytes) {
  const auto buckets = plan_grad_buckets(spans, n, bytes);
  const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4));
  const int64_t lo = spans.front().offset, hi = spans.back().offset + spans.back().size;
  SCOPED_TRACE(testing::Message() << spans.size() << " tensors, bucket " << bytes << " bytes");
  ASSERT_FALSE(buckets.empty());
  int64_t end = hi;
  for (size_t k = 0; k < buckets.size(); ++k) {
    const GradBucket& b = buckets[k];
    // Bucket 0 holds the end of the span; buckets are contiguous, descending, full-sized except
    // the last one (which reaches the span's start).
    EXPECT_EQ(b.offset + b.size, end) << k;
    EXPECT_GT(b.size, 0) << k;
    EXPECT_LE(b.size, elems) << k;
    if (k + 1 < buckets.size()) {
      EXPECT_EQ(b.size, elems) << k;
    }
    end = b.offset;
    int first = 1 << 30, last = -1;
    for (size_t i = 0; i < spans.size(); ++i) {
      const GradSpan& t = spans[i];
      if (t.size > 0 && t.offset < b.offset + b.size && t.offset + t.size > b.offset) {
        first = std::min(first, static_cast<int>(i));
        last = std::max(last, static_cast<int>(i));
      }
    }
    EXPECT_EQ(b.last_tensor, last) << k;
    if (last >= 0) {
      EXPECT_EQ(b.first_tensor, first) << k;
    }
  }
  EXPECT_EQ(end, lo);
}

TEST(GradBuckets, PlanCoversTheSpanFromTheEnd) {
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 20; ++trial) {
    int64_t n = 0;
    const auto spans = random_spans(rng, 1 + trial * 3, n);
    if (spans.back().offset + spans.back().size == spans.front().offset) continue;  // all empty
    for (size_t bytes :
         {size_t{1}, size_t{4}, size_t{100}, size_t{1024}, size_t{4096 + 12}, size_t{1} << 20})
      check_plan(spans, n, bytes);
  }
}

TEST(GradBuckets, BoundariesInsideTensorsAndGapOnlyBuckets) {
  // 16-element buckets over [0, 10) + gap + [1000, 1010): the middle buckets hold only the gap.
  const std::vector<GradSpan> spans = {{0, 10}, {1000, 10}};
  const auto b = plan_grad_buckets(spans, 1010, 64);
  ASSERT_EQ(b.size(), 64u);  // ceil(1010 / 16)
  EXPECT_EQ(b[0].offset, 1010 - 16);
  EXPECT_EQ(b[0].first_tensor, 1);
  EXPECT_EQ(b[0].last_tensor, 1);
  EXPECT_EQ(b[1].last_tensor, -1);  // gap only
  EXPECT_EQ(b.back().offset, 0);
  EXPECT_EQ(b.back().last_tensor, 0);
  // One tensor of 100 elements in 32-element buckets: boundaries at 68, 36, 4 inside it.
  const auto c = plan_grad_buckets({{0, 100}}, 100, 128);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].offset, 68);
  EXPECT_EQ(c[3].offset, 0);
  EXPECT_EQ(c[3].size, 4);
}

TEST(GradBuckets, RejectsBadTables) {
  EXPECT_THROW(plan_grad_buckets({{0, 10}, {5, 10}}, 100, 64), Error);   // overlap
  EXPECT_THROW(plan_grad_buckets({{0, 10}, {95, 10}}, 100, 64), Error);  // past the end
  EXPECT_THROW(plan_grad_buckets({{-1, 10}}, 100, 64), Error);
  EXPECT_TRUE(plan_grad_buckets({}, 100, 64).empty());
}

// Without MPI the object is world size 1: the buffer is untouched, the bookkeeping still runs
// (so model bugs show in single-process runs too) and no MPI function is called (MPI is not even
// initialized in this process; any MPI call but MPI_Initialized would abort).
TEST(GradReducerOneRank, NoOpWithFullBookkeeping) {
  auto backend = make_cpu_backend();
  std::vector<float> grads(1000);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i) + 0.5f;
  const std::vector<float> before = grads;
  // Given out of order: ready_tensor(i) uses the caller's indices.
  const std::vector<GradSpan> spans = {{500, 300}, {0, 100}, {120, 380}, {800, 0}};
  GradReducerOptions options;
  options.bucket_bytes = 256;
  GradReducer ar(MPI_COMM_WORLD, *backend, view(grads.data(), {1000}), spans, options);
  EXPECT_EQ(ar.size(), 1);
  EXPECT_EQ(ar.rank(), 0);
  EXPECT_STREQ(ar.transport_name(), "none");
  EXPECT_EQ(ar.buckets().size(), 13u);  // ceil(800 / 64)

  ar.ready_tensor(0);  // outside a round: ignored
  ar.begin();
  ar.ready_tensor(0);
  ar.ready(120, 380);
  ar.ready(800, 0);
  EXPECT_THROW(ar.ready_tensor(0), Error);  // twice
  EXPECT_THROW(ar.ready(121, 380), Error);  // names no tensor
  EXPECT_THROW(ar.ready_tensor(4), Error);  // out of range
  try {
    ar.finish();
    FAIL() << "finish() with tensor 1 not ready";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 1 (offset 0, size 100)"), std::string::npos)
        << e.what();
  }
  ar.ready_tensor(1);
  const GradReduceStats s = ar.finish();
  EXPECT_EQ(s.buckets, 13);
  EXPECT_EQ(s.started_before_finish, 13);
  EXPECT_EQ(s.completed_before_finish, 13);
  EXPECT_EQ(grads, before);
  EXPECT_THROW(ar.finish(), Error);  // no round

  // Bucket order: buckets run from the end of the buffer [0, 800) in 64-element pieces and
  // start strictly in order, so readying the first tensors starts nothing; the last tensor
  // [500, 800) then starts buckets 0-3 (bucket 4, [480, 544), also waits for [120, 500)).
  ar.begin();
  ar.ready_tensor(1);
  ar.ready_tensor(3);
  EXPECT_EQ(ar.buckets_started(), 0);
  ar.ready_tensor(0);
  EXPECT_EQ(ar.buckets_started(), 4);
  ar.ready_tensor(2);
  EXPECT_EQ(ar.buckets_started(), 13);
  EXPECT_EQ(ar.finish().started_before_finish, 13);
  ar.begin();
  ar.ready_tensor(1);
  EXPECT_THROW(ar.begin(), Error);  // a round is in flight
  ar.ready_tensor(0);
  ar.ready_tensor(2);
  ar.ready_tensor(3);
  ar.finish();

  double metrics[2] = {1.5, 2.5};
  MetricSums(MPI_COMM_WORLD).sum(metrics, 2, "MPI_Allreduce (test metrics)");
  EXPECT_EQ(metrics[0], 1.5);
  EXPECT_EQ(metrics[1], 2.5);

  // Reduce-scatter on one rank: the whole bucket is the shard, nothing moves; all_gather too.
  ar.begin(GradCollective::reduce_scatter);
  for (int i = 0; i < 4; ++i) ar.ready_tensor(i);
  ar.finish();
  EXPECT_EQ(ar.shard(0).offset, ar.buckets()[0].offset);
  EXPECT_EQ(ar.shard(0).size, ar.buckets()[0].size);
  EXPECT_THROW(ar.shard(13), Error);
  ShardExchange exchange(ar);
  exchange.all_gather(view(grads.data(), {1000}));
  EXPECT_EQ(grads, before);
  EXPECT_THROW(exchange.all_gather(view(grads.data(), {999})),
               Error);  // not laid out as the gradient
  ar.begin();
  EXPECT_THROW(exchange.all_gather(view(grads.data(), {1000})), Error);  // inside a round
  for (int i = 0; i < 4; ++i) ar.ready_tensor(i);
  ar.finish();
}

TEST(GradReducerOneRank, RejectsABufferThatIsNotAFlatF32Gradient) {
  auto backend = make_cpu_backend();
  std::vector<float> grads(64);
  EXPECT_THROW(GradReducer(MPI_COMM_WORLD, *backend, Tensor(), {{0, 64}}), Error);
  EXPECT_THROW(GradReducer(MPI_COMM_WORLD, *backend, view(grads.data(), {8, 8}), {{0, 64}}), Error);
  EXPECT_THROW(GradReducer(MPI_COMM_WORLD, *backend,
                           Tensor(grads.data(), DType::f32, {64}, Device::cuda), {{0, 64}}),
               Error);  // memory of another device than the backend's
}

}  // namespace
}  // namespace packbert::test
