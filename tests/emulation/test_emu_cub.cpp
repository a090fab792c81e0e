// The emulated cub algorithms (kernels/cuda_emu/cub_algorithms.h) against plain host
// references: std::stable_sort for the radix sort, loops for run-length encoding and the scan;
// then the temp-storage protocol, stream order, and the checks on arguments. The fault test is
// last: a fault is sticky for the whole process.
#include <cub/cub.cuh>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_emu/runtime.h"

namespace {

// A device buffer of n elements, freed at scope exit; fresh memory holds 0xff bytes.
template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n;
  explicit DeviceBuffer(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> download() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// Temp storage of `bytes` zero bytes: the algorithms must leave all of it 0xff (their scratch).
struct ZeroedTemp : DeviceBuffer<char> {
  explicit ZeroedTemp(size_t bytes) : DeviceBuffer<char>(bytes) {
    EXPECT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
  }
  bool all_scratch() const {
    const std::vector<char> bytes = download();
    return std::all_of(bytes.begin(), bytes.end(), [](char b) { return b == char(0xff); });
  }
};

template <typename T>
std::vector<T> random_values(size_t n, uint64_t below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(below ? rng() % below : rng());
  return v;
}

// Sorts on the legacy stream and checks keys and values against std::stable_sort of the pairs
// by the key bits [begin_bit, end_bit); values are the input positions, so a stable order is
// exactly the reference's.
template <typename Key>
void check_sort(const std::vector<Key>& keys, int begin_bit, int end_bit) {
  const size_t n = keys.size();
  std::vector<int32_t> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = static_cast<int32_t>(i);
  const int bits = end_bit - begin_bit;
  const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  auto sort_key = [&](Key k) { return bits == 0 ? 0 : (uint64_t{k} >> begin_bit) & mask; };
  std::vector<int32_t> order = values;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return sort_key(keys[a]) < sort_key(keys[b]); });

  DeviceBuffer<Key> keys_in(keys), keys_out(n);
  DeviceBuffer<int32_t> values_in(values), values_out(n);
  size_t temp_bytes = 0;
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.p, keys_out.p, values_in.p,
                                            values_out.p, n, begin_bit, end_bit),
            cudaSuccess);
  EXPECT_EQ(temp_bytes, n * (sizeof(Key) + sizeof(int32_t)) + 1024);
  ZeroedTemp temp(temp_bytes);
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, keys_in.p, keys_out.p, values_in.p,
                                            values_out.p, n, begin_bit, end_bit),
            cudaSuccess);
  const std::vector<Key> got_keys = keys_out.download();
  const std::vector<int32_t> got_values = values_out.download();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got_values[i], order[i])
        << "position " << i << ", bits [" << begin_bit << ", " << end_bit << ")";
    ASSERT_EQ(got_keys[i], keys[order[i]]) << "position " << i;
  }
  EXPECT_EQ(keys_in.download(), keys);  // the inputs are left as they were
  EXPECT_TRUE(temp.all_scratch());
}

TEST(EmuCub, SortPairsIsAStableSortOnRepeatedKeys) {
  check_sort(random_values<uint32_t>(5000, 37, 1), 0, 32);
  check_sort(random_values<uint32_t>(5000, 0, 2), 0, 32);  // few repeats, all 32 bits
  check_sort(random_values<uint8_t>(777, 0, 3), 0, 8);
}

TEST(EmuCub, SortPairsLooksAtTheBitRangeOnly) {
  const auto keys32 = random_values<uint32_t>(3000, 0, 4);
  using Range = std::pair<int, int>;
  for (const Range& r : std::vector<Range>{{0, 6}, {3, 11}, {20, 32}, {31, 32}, {9, 9}})
    check_sort(keys32, r.first, r.second);
  const auto keys64 = random_values<uint64_t>(3000, 0, 5);
  for (const Range& r : std::vector<Range>{{0, 64}, {40, 47}, {60, 64}})
    check_sort(keys64, r.first, r.second);
}

// Runs of a sorted array with repeats, and of an unsorted one (equal items apart are two runs).
TEST(EmuCub, EncodeMatchesALoop) {
  auto sorted = random_values<uint32_t>(4000, 200, 6);
  std::sort(sorted.begin(), sorted.end());
  for (const auto& items : {sorted, random_values<uint32_t>(4000, 3, 7)}) {
    std::vector<uint32_t> unique;
    std::vector<int32_t> counts;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i == 0 || items[i] != items[i - 1]) {
        unique.push_back(items[i]);
        counts.push_back(0);
      }
      ++counts.back();
    }
    const size_t n = items.size();
    DeviceBuffer<uint32_t> in(items), unique_out(n);
    DeviceBuffer<int32_t> counts_out(std::vector<int32_t>(n, -7)), num_runs(1);
    size_t temp_bytes = 0;
    ASSERT_EQ(cub::DeviceRunLengthEncode::Encode(nullptr, temp_bytes, in.p, unique_out.p,
                                                 counts_out.p, num_runs.p, n),
              cudaSuccess);
    EXPECT_EQ(temp_bytes, 1024u);
    ZeroedTemp temp(temp_bytes);
    ASSERT_EQ(cub::DeviceRunLengthEncode::Encode(temp.p, temp_bytes, in.p, unique_out.p,
                                                 counts_out.p, num_runs.p, n),
              cudaSuccess);
    ASSERT_EQ(num_runs.download()[0], static_cast<int32_t>(unique.size()));
    std::vector<uint32_t> got_unique = unique_out.download();
    std::vector<int32_t> got_counts = counts_out.download();
    EXPECT_TRUE(std::all_of(got_counts.begin() + unique.size(), got_counts.end(), [](int32_t c) {
      return c == -7;
    })) << "counts beyond the runs must be untouched";
    got_unique.resize(unique.size());
    got_counts.resize(unique.size());
    EXPECT_EQ(got_unique, unique);
    EXPECT_EQ(got_counts, counts);
    EXPECT_TRUE(temp.all_scratch());
  }
}

TEST(EmuCub, ExclusiveSumMatchesALoopOutOfPlaceAndInPlace) {
  const auto items = random_values<int32_t>(5000, 1000, 8);
  std::vector<int32_t> expected(items.size());
  int32_t sum = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    expected[i] = sum;
    sum += items[i];
  }
  const size_t n = items.size();
  DeviceBuffer<int32_t> in(items), out(n);
  size_t temp_bytes = 0;
  ASSERT_EQ(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, in.p, out.p, n), cudaSuccess);
  EXPECT_EQ(temp_bytes, 1024u);
  ZeroedTemp temp(temp_bytes);
  ASSERT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, temp_bytes, in.p, out.p, n), cudaSuccess);
  EXPECT_EQ(out.download(), expected);
  EXPECT_TRUE(temp.all_scratch());
  EXPECT_EQ(in.download(), items);
  ASSERT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, temp_bytes, in.p, in.p, n), cudaSuccess);
  EXPECT_EQ(in.download(), expected);
}

TEST(EmuCub, NoItemsDoNothingButCountNoRuns) {
  DeviceBuffer<uint32_t> keys(std::vector<uint32_t>{5, 4}), keys_out(std::vector<uint32_t>{9, 9});
  DeviceBuffer<int32_t> values(std::vector<int32_t>{1, 2}), values_out(std::vector<int32_t>{9, 9});
  DeviceBuffer<int32_t> num_runs(std::vector<int32_t>{42});
  DeviceBuffer<char> temp(1024);
  size_t temp_bytes = 1024;
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, keys.p, keys_out.p, values.p,
                                            values_out.p, 0),
            cudaSuccess);
  EXPECT_EQ(cub::DeviceRunLengthEncode::Encode(temp.p, temp_bytes, keys.p, keys_out.p, values_out.p,
                                               num_runs.p, 0),
            cudaSuccess);
  EXPECT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, temp_bytes, values.p, values_out.p, 0),
            cudaSuccess);
  EXPECT_EQ(keys_out.download(), (std::vector<uint32_t>{9, 9}));
  EXPECT_EQ(values_out.download(), (std::vector<int32_t>{9, 9}));
  EXPECT_EQ(num_runs.download()[0], 0);
}

// The query needs no memory and does no work; storage below what it reports is refused with
// both sizes on stderr, and is no fault.
TEST(EmuCub, TooSmallTempStorageIsInvalidValue) {
  const size_t n = 100;
  DeviceBuffer<uint32_t> keys(n), keys_out(n);
  DeviceBuffer<int32_t> values(n), values_out(n), num_runs(1);
  size_t need = 0;
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(nullptr, need, static_cast<const uint32_t*>(nullptr),
                                            static_cast<uint32_t*>(nullptr),
                                            static_cast<const int32_t*>(nullptr),
                                            static_cast<int32_t*>(nullptr), n, 0, 7),
            cudaSuccess);
  ASSERT_EQ(need, n * 8 + 1024);
  DeviceBuffer<char> temp(need);
  size_t short_bytes = need - 1;
  testing::internal::CaptureStderr();
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp.p, short_bytes, keys.p, keys_out.p, values.p,
                                            values_out.p, n),
            cudaErrorInvalidValue);
  const std::string message = testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find("SortPairs"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(need - 1)), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(need)), std::string::npos) << message;
  short_bytes = 1023;
  EXPECT_EQ(cub::DeviceRunLengthEncode::Encode(temp.p, short_bytes, keys.p, keys_out.p,
                                               values_out.p, num_runs.p, n),
            cudaErrorInvalidValue);
  EXPECT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, short_bytes, values.p, values_out.p, n),
            cudaErrorInvalidValue);
  EXPECT_FALSE(packbert::emu::faulted());
}

// cub sorts out of place, and its temp storage is its own.
TEST(EmuCub, AliasedBuffersAreInvalidValue) {
  const size_t n = 64;
  DeviceBuffer<uint32_t> keys(n), keys_out(n);
  DeviceBuffer<int32_t> values(n + 1), values_out(n);  // n + 1: values.p + 1 holds n too
  DeviceBuffer<char> temp(n * 8 + 1024);
  size_t temp_bytes = n * 8 + 1024;
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, keys.p, keys.p, values.p,
                                            values_out.p, n),
            cudaErrorInvalidValue);
  EXPECT_EQ(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, keys.p, keys_out.p, values.p,
                                            values.p + 1, n),
            cudaErrorInvalidValue);
  auto* inside_temp = reinterpret_cast<int32_t*>(temp.p + 256);
  EXPECT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, temp_bytes, values.p, inside_temp, n),
            cudaErrorInvalidValue);
  EXPECT_FALSE(packbert::emu::faulted());
}

// The work runs in stream order, when the stream runs: a copy queued before the sort is what
// it sorts, and another stream sees no result until the sort's stream is synchronised.
TEST(EmuCub, WorkRunsInStreamOrder) {
  const size_t n = 1000;
  const auto keys = random_values<uint32_t>(n, 50, 9);
  auto expected = keys;
  std::stable_sort(expected.begin(), expected.end());
  cudaStream_t stream, other;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  uint32_t *source = nullptr, *pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&source, n * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, n * sizeof(uint32_t)), cudaSuccess);
  std::copy(keys.begin(), keys.end(), source);
  DeviceBuffer<uint32_t> keys_in(n), keys_out(n);
  DeviceBuffer<int32_t> values_in(n), values_out(n);
  DeviceBuffer<char> temp(n * 8 + 1024);
  size_t temp_bytes = n * 8 + 1024;
  ASSERT_EQ(
      cudaMemcpyAsync(keys_in.p, source, n * sizeof(uint32_t), cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  ASSERT_EQ(cub::DeviceRadixSort::SortPairs(temp.p, temp_bytes, keys_in.p, keys_out.p, values_in.p,
                                            values_out.p, n, 0, 32, stream),
            cudaSuccess);
  std::fill(pinned, pinned + n, 0u);
  auto read_back = [&] {
    EXPECT_EQ(
        cudaMemcpyAsync(pinned, keys_out.p, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, other),
        cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
    return std::vector<uint32_t>(pinned, pinned + n);
  };
  EXPECT_EQ(read_back(), std::vector<uint32_t>(n, 0xffffffffu)) << "sorted before its stream ran";
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(read_back(), expected);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(source), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// Last in the file: the fault is sticky. One element past an allocation is an illegal address.
TEST(EmuCub, ArgumentOutsideDeviceMemoryFaults) {
  const size_t n = 100;
  DeviceBuffer<int32_t> in(n), out(n - 1);
  DeviceBuffer<char> temp(1024);
  size_t temp_bytes = 1024;
  testing::internal::CaptureStderr();
  EXPECT_EQ(cub::DeviceScan::ExclusiveSum(temp.p, temp_bytes, in.p, out.p, n),
            cudaErrorLaunchFailure);
  const std::string message = testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find("ExclusiveSum"), std::string::npos) << message;
  EXPECT_NE(message.find("d_out"), std::string::npos) << message;
  EXPECT_NE(message.find("400 bytes"), std::string::npos) << message;
  EXPECT_TRUE(packbert::emu::faulted());
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

}  // namespace
