// gpu label: GraphCache (kernels/graph_cache.h) on the CUDA backend, which records graphs: a key's
// ops run at its first use, are recorded and launched at its second, and replay after that
// without being called (a replay copies what the source holds then); a new key that overflows
// the capacity drops the unrecorded entries first, then the oldest, down to half, and weights
// count; key_equal and key_words derive from the key's field list.
#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <tuple>
#include <vector>

#include "kernels/device.h"
#include "kernels/graph_cache.h"

namespace packbert::test {
namespace {

enum class Side { left = 3, right = 7 };

struct Inner {
  int32_t a = 0;
  bool b = false;
  auto fields() const { return std::tie(a, b); }
  bool operator==(const Inner& o) const { return key_equal(*this, o); }
};

struct Key {
  int64_t id = 0;
  const void* where = nullptr;
  uint64_t seed = 0;
  Side side = Side::left;
  Inner inner;
  auto fields() const { return std::tie(id, where, seed, side, inner); }
  bool operator==(const Key& o) const { return key_equal(*this, o); }
};

TEST(GraphCacheKeys, EqualityAndWordsFollowTheFieldList) {
  int x = 0;
  Key k;
  k.id = -5;
  k.where = &x;
  k.seed = 0x8000000000000001ull;
  k.side = Side::right;
  k.inner = {42, true};
  const std::vector<int64_t> want = {-5,
                                     static_cast<int64_t>(reinterpret_cast<intptr_t>(&x)),
                                     static_cast<int64_t>(0x8000000000000001ull),
                                     7,
                                     42,
                                     1};
  EXPECT_EQ(key_words(k), want);
  // Each field alone makes two keys differ.
  Key o = k;
  EXPECT_TRUE(o == k);
  for (int f = 0; f < 6; ++f) {
    Key d = k;
    switch (f) {
      case 0: d.id = 6; break;
      case 1: d.where = nullptr; break;
      case 2: d.seed = 1; break;
      case 3: d.side = Side::left; break;
      case 4: d.inner.a = 41; break;
      case 5: d.inner.b = false; break;
    }
    EXPECT_FALSE(d == k) << "field " << f;
    EXPECT_NE(key_words(d), want) << "field " << f;
  }
}

}  // namespace
}  // namespace packbert::test

#ifdef PACKBERT_HAVE_CUDA
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"

namespace packbert::test {
namespace {

// dst = src as a backend op; calls counts the times the ops were issued (run or recorded).
struct CopyOps {
  explicit CopyOps(Backend& be) : be(be), src({4}), dst({4}) {}
  void set(float v) {
    const std::vector<float> host(4, v);
    be.copy(src.tensor(), view(const_cast<float*>(host.data()), {4}));
    be.synchronize();
  }
  float got() {
    be.synchronize();
    return dst.values()[0];
  }
  std::function<void()> ops() {
    return [this] {
      ++calls;
      be.copy(dst.tensor(), src.tensor());
    };
  }
  Backend& be;
  DevBuf<float> src, dst;
  int calls = 0;
};

Key key(int64_t id) {
  Key k;
  k.id = id;
  return k;
}

using Cache = GraphCache<Key>;

// A backend that records graphs: one that validates indices waits for the device, and cannot.
std::unique_ptr<Backend> graph_backend() {
  CudaBackendOptions bo;
  bo.validate_indices = false;
  return make_cuda_backend(0, bo);
}

TEST(GraphCache, RunsRecordsThenReplaysWhatTheMemoryHoldsThen) {
  PB_REQUIRE_CUDA_DEVICE();
  auto gpu = graph_backend();
  ASSERT_TRUE(gpu->supports_graphs());
  CopyOps c(*gpu);
  Cache cache(*gpu, 4);
  const int64_t graphs0 = gpu->counters().graph_launches;
  c.set(1.f);
  EXPECT_EQ(cache.run(key(1), c.ops()), Cache::Use::ran);
  EXPECT_EQ(c.got(), 1.f);
  EXPECT_EQ(gpu->counters().graph_launches, graphs0);
  c.set(2.f);
  EXPECT_EQ(cache.run(key(1), c.ops()), Cache::Use::recorded);
  EXPECT_EQ(c.got(), 2.f);
  EXPECT_EQ(gpu->counters().graph_launches, graphs0 + 1);
  EXPECT_EQ(c.calls, 2);
  for (int k = 3; k < 6; ++k) {
    c.set(static_cast<float>(k));
    EXPECT_EQ(cache.run(key(1), c.ops()), Cache::Use::replayed);
    EXPECT_EQ(c.got(), static_cast<float>(k));
  }
  EXPECT_EQ(c.calls, 2) << "a replay issues no op";
  EXPECT_EQ(gpu->counters().graph_launches, graphs0 + 4);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.recorded(), 1u);
}

TEST(GraphCache, EvictsTheUnrecordedFirstThenTheOldestDownToHalf) {
  PB_REQUIRE_CUDA_DEVICE();
  auto gpu = graph_backend();
  CopyOps c(*gpu);
  {
    Cache cache(*gpu, 4);
    cache.run(key(1), c.ops());
    cache.run(key(1), c.ops());                                // recorded
    for (int64_t id : {2, 3, 4}) cache.run(key(id), c.ops());  // seen once: 4 of 4
    EXPECT_EQ(cache.run(key(5), c.ops()), Cache::Use::ran);    // 2, 3, 4 go; 1 stays
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_EQ(cache.run(key(1), c.ops()), Cache::Use::replayed);
    EXPECT_EQ(cache.run(key(2), c.ops()), Cache::Use::ran);  // forgotten: runs again
  }
  {
    Cache cache(*gpu, 4);
    for (int64_t id : {1, 2, 3, 4}) {
      cache.run(key(id), c.ops());
      cache.run(key(id), c.ops());
    }
    EXPECT_EQ(cache.recorded(), 4u);
    EXPECT_EQ(cache.run(key(5), c.ops()), Cache::Use::ran);  // 1 and 2 go: 2 of 4 left, + 5
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_EQ(cache.run(key(3), c.ops()), Cache::Use::replayed);
    EXPECT_EQ(cache.run(key(4), c.ops()), Cache::Use::replayed);
    EXPECT_EQ(cache.run(key(1), c.ops()), Cache::Use::ran);
  }
  {
    // Weights: a key of weight 3 in a capacity of 4 leaves room for one of weight 1.
    Cache cache(*gpu, 4);
    cache.run(key(1), c.ops(), 3);
    cache.run(key(1), c.ops(), 3);
    cache.run(key(2), c.ops());
    cache.run(key(2), c.ops());
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_EQ(cache.run(key(3), c.ops()), Cache::Use::ran);  // 5 > 4: both recorded, 1 goes
    EXPECT_EQ(cache.size(), 2u);
    EXPECT_EQ(cache.run(key(2), c.ops()), Cache::Use::replayed);
    EXPECT_EQ(cache.run(key(1), c.ops(), 3), Cache::Use::ran);
  }
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(GraphCache, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
