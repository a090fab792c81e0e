// The cub device-wide algorithms the CUDA backend calls (embedding_scatter.cu), emulated on the
// CPU with cub's names, signatures and documented semantics:
//   - cub::DeviceRadixSort::SortPairs: a stable radix sort of key-value pairs by the key bits
//     [begin_bit, end_bit), keys unsigned integers; equal keys keep their input order; the
//     output buffers must not overlap the input buffers.
//   - cub::DeviceRunLengthEncode::Encode: the runs of equal consecutive items: each run's item,
//     its length, and the number of runs; outputs beyond the runs are untouched.
//   - cub::DeviceScan::ExclusiveSum: out[0] = 0, out[i] = in[0] + ... + in[i-1]; may be in place.
//   - the temp-storage protocol: a call with d_temp_storage == nullptr only sets
//     temp_storage_bytes and does no work; a call with storage runs the algorithm on `stream`.
// See cub's documentation of cub::DeviceRadixSort, cub::DeviceRunLengthEncode and
// cub::DeviceScan.
//
// What the emulation adds, so that the bugs that corrupt data on a GPU show here:
//   - temp_storage_bytes below what the query gives for the same arguments is
//     cudaErrorInvalidValue, with both sizes on stderr; so are a negative num_items, a bad bit
//     range, sort outputs overlapping its inputs, and temp storage overlapping any argument.
//   - every device pointer must lie, for its whole extent, inside one device allocation (or
//     pinned host memory); otherwise it is a sticky fault (runtime.h), as an illegal address
//     would be, and the call returns cudaErrorLaunchFailure.
//   - the work is queued on the stream (packbert::emu::enqueue) and reads its inputs when it
//     runs, in stream order; it first fills all temp_storage_bytes of the temp storage with 0xff,
//     as cub uses it as scratch, so data the caller keeps there does not survive the call.
//   - the reported temp sizes: SortPairs num_items * (sizeof(KeyT) + sizeof(ValueT)) + 1024 (cub
//     sorts through a second key and value buffer of its own), Encode and ExclusiveSum 1024.
//
// Only raw pointers are accepted where cub takes iterators (packbert passes nothing else): the
// emulation must know an argument's extent in device memory to check it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_emu/runtime.h"

namespace cub {
namespace emulation {

constexpr size_t kFixedTempBytes = 1024;

// Queues a call's work and counts it as one launch (runtime.h, counters).
inline cudaError_t enqueue_counted(cudaStream_t stream, const char* call,
                                   std::function<void()> work) {
  const cudaError_t e = packbert::emu::enqueue(stream, call, std::move(work));
  if (e == cudaSuccess) packbert::emu::count_launch();
  return e;
}

template <typename NumItemsT>
size_t item_count(NumItemsT num_items) {
  static_assert(std::is_integral<NumItemsT>::value, "cub: num_items must be an integer type");
  return num_items > 0 ? static_cast<size_t>(num_items) : 0;
}

template <typename NumItemsT>
cudaError_t check_count(const char* call, NumItemsT num_items) {
  if constexpr (std::is_signed<NumItemsT>::value) {
    if (num_items < 0) {
      std::fprintf(stderr, "cuda emulation: %s: num_items is %lld, negative\n", call,
                   static_cast<long long>(num_items));
      return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

inline cudaError_t check_temp_size(const char* call, size_t given, size_t needed) {
  if (given >= needed) return cudaSuccess;
  std::fprintf(stderr,
               "cuda emulation: %s: temp_storage_bytes is %zu, but these arguments need %zu "
               "(the size a call with d_temp_storage == nullptr reports)\n",
               call, given, needed);
  return cudaErrorInvalidValue;
}

// A device argument: its name and byte range, for the checks below.
struct Extent {
  const char* name;
  const void* p;
  size_t bytes;
};

inline bool overlap(const Extent& a, const Extent& b) {
  if (a.bytes == 0 || b.bytes == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.p), b0 = reinterpret_cast<uintptr_t>(b.p);
  return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

inline cudaError_t check_disjoint(const char* call, const Extent& a, const Extent& b) {
  if (!overlap(a, b)) return cudaSuccess;
  std::fprintf(stderr,
               "cuda emulation: %s: %s (%zu bytes at %p) overlaps %s (%zu bytes at %p), which cub "
               "does not allow\n",
               call, a.name, a.bytes, a.p, b.name, b.bytes, b.p);
  return cudaErrorInvalidValue;
}

// The temp storage must not overlap any argument: the call overwrites it.
template <size_t N>
cudaError_t check_temp_apart(const char* call, const Extent& temp, const Extent (&args)[N]) {
  for (const Extent& a : args) {
    const cudaError_t e = check_disjoint(call, temp, a);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// An access outside device memory is an illegal address on a GPU: a sticky fault here.
template <size_t N>
cudaError_t check_device(const char* call, const Extent (&args)[N]) {
  for (const Extent& a : args) {
    if (a.bytes == 0 || packbert::emu::device_range(a.p, a.bytes)) continue;
    char what[128];
    std::snprintf(what, sizeof(what), "%zu bytes at %p", a.bytes, a.p);
    packbert::emu::fault(std::string(call) + ": " + a.name + ": " + what +
                         " do not lie inside one device allocation");
    return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

template <typename T>
using value_of = std::remove_cv_t<typename std::iterator_traits<T>::value_type>;

// One step of the scan. Integers wrap, as on the device (signed overflow is undefined on the
// host, so it is computed unsigned).
template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral<T>::value && std::is_signed<T>::value) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return static_cast<T>(a + b);
  }
}

template <typename It>
void require_pointer() {
  static_assert(std::is_pointer<It>::value,
                "the cub emulation takes raw device pointers only, not fancy iterators");
}

}  // namespace emulation

struct DeviceRadixSort {
  template <typename KeyT, typename ValueT, typename NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes,
                               const KeyT* d_keys_in, KeyT* d_keys_out, const ValueT* d_values_in,
                               ValueT* d_values_out, NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(KeyT) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_integral<KeyT>::value && std::is_unsigned<KeyT>::value &&
                      !std::is_same<std::remove_cv_t<KeyT>, bool>::value,
                  "the cub emulation sorts unsigned integer keys only");
    namespace em = emulation;
    constexpr const char* kCall = "cub::DeviceRadixSort::SortPairs";
    const size_t n = em::item_count(num_items);
    const size_t needed = n * (sizeof(KeyT) + sizeof(ValueT)) + em::kFixedTempBytes;
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = needed;
      return cudaSuccess;
    }
    cudaError_t e = em::check_count(kCall, num_items);
    if (e != cudaSuccess) return e;
    constexpr int kKeyBits = static_cast<int>(sizeof(KeyT) * 8);
    if (begin_bit < 0 || begin_bit > end_bit || end_bit > kKeyBits) {
      std::fprintf(stderr,
                   "cuda emulation: %s: bit range [%d, %d) is not within the key's %d bits\n",
                   kCall, begin_bit, end_bit, kKeyBits);
      return cudaErrorInvalidValue;
    }
    if ((e = em::check_temp_size(kCall, temp_storage_bytes, needed)) != cudaSuccess) return e;
    const em::Extent temp{"d_temp_storage", d_temp_storage, temp_storage_bytes};
    const em::Extent args[] = {{"d_keys_in", d_keys_in, n * sizeof(KeyT)},
                               {"d_keys_out", d_keys_out, n * sizeof(KeyT)},
                               {"d_values_in", d_values_in, n * sizeof(ValueT)},
                               {"d_values_out", d_values_out, n * sizeof(ValueT)}};
    // cub sorts out of place: each output may overlap neither input.
    for (const em::Extent& out : {args[1], args[3]})
      for (const em::Extent& in : {args[0], args[2]})
        if ((e = em::check_disjoint(kCall, out, in)) != cudaSuccess) return e;
    if ((e = em::check_disjoint(kCall, args[1], args[3])) != cudaSuccess) return e;
    if ((e = em::check_temp_apart(kCall, temp, args)) != cudaSuccess) return e;
    const em::Extent all[] = {temp, args[0], args[1], args[2], args[3]};
    if ((e = em::check_device(kCall, all)) != cudaSuccess) return e;

    const size_t temp_bytes = temp_storage_bytes;
    return em::enqueue_counted(stream, kCall, [=] {
      std::memset(d_temp_storage, 0xff, temp_bytes);
      if (n == 0) return;
      const int bits = end_bit - begin_bit;
      const uint64_t mask = bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
      std::vector<uint64_t> sort_key(n);
      for (size_t i = 0; i < n; ++i)
        sort_key[i] = bits == 0 ? 0 : (static_cast<uint64_t>(d_keys_in[i]) >> begin_bit) & mask;
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&sort_key](size_t a, size_t b) { return sort_key[a] < sort_key[b]; });
      for (size_t i = 0; i < n; ++i) {
        d_keys_out[i] = d_keys_in[order[i]];
        d_values_out[i] = d_values_in[order[i]];
      }
    });
  }
};

struct DeviceRunLengthEncode {
  template <typename InputIteratorT, typename UniqueOutputIteratorT,
            typename LengthsOutputIteratorT, typename NumRunsOutputIteratorT, typename NumItemsT>
  static cudaError_t Encode(void* d_temp_storage, size_t& temp_storage_bytes, InputIteratorT d_in,
                            UniqueOutputIteratorT d_unique_out, LengthsOutputIteratorT d_counts_out,
                            NumRunsOutputIteratorT d_num_runs_out, NumItemsT num_items,
                            cudaStream_t stream = 0) {
    namespace em = emulation;
    em::require_pointer<InputIteratorT>();
    em::require_pointer<UniqueOutputIteratorT>();
    em::require_pointer<LengthsOutputIteratorT>();
    em::require_pointer<NumRunsOutputIteratorT>();
    using Item = em::value_of<InputIteratorT>;
    using Unique = em::value_of<UniqueOutputIteratorT>;
    using Length = em::value_of<LengthsOutputIteratorT>;
    using NumRuns = em::value_of<NumRunsOutputIteratorT>;
    constexpr const char* kCall = "cub::DeviceRunLengthEncode::Encode";
    const size_t n = em::item_count(num_items);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = em::kFixedTempBytes;
      return cudaSuccess;
    }
    cudaError_t e = em::check_count(kCall, num_items);
    if (e != cudaSuccess) return e;
    if ((e = em::check_temp_size(kCall, temp_storage_bytes, em::kFixedTempBytes)) != cudaSuccess)
      return e;
    const em::Extent temp{"d_temp_storage", d_temp_storage, temp_storage_bytes};
    const em::Extent args[] = {{"d_in", d_in, n * sizeof(Item)},
                               {"d_unique_out", d_unique_out, n * sizeof(Unique)},
                               {"d_counts_out", d_counts_out, n * sizeof(Length)},
                               {"d_num_runs_out", d_num_runs_out, sizeof(NumRuns)}};
    if ((e = em::check_temp_apart(kCall, temp, args)) != cudaSuccess) return e;
    const em::Extent all[] = {temp, args[0], args[1], args[2], args[3]};
    if ((e = em::check_device(kCall, all)) != cudaSuccess) return e;

    const size_t temp_bytes = temp_storage_bytes;
    return em::enqueue_counted(stream, kCall, [=] {
      std::memset(d_temp_storage, 0xff, temp_bytes);
      size_t runs = 0;
      for (size_t i = 0; i < n;) {
        const Item item = d_in[i];
        size_t end = i + 1;
        while (end < n && d_in[end] == item) ++end;
        d_unique_out[runs] = static_cast<Unique>(item);
        d_counts_out[runs] = static_cast<Length>(end - i);
        ++runs;
        i = end;
      }
      *d_num_runs_out = static_cast<NumRuns>(runs);
    });
  }
};

struct DeviceScan {
  template <typename InputIteratorT, typename OutputIteratorT, typename NumItemsT>
  static cudaError_t ExclusiveSum(void* d_temp_storage, size_t& temp_storage_bytes,
                                  InputIteratorT d_in, OutputIteratorT d_out, NumItemsT num_items,
                                  cudaStream_t stream = 0) {
    namespace em = emulation;
    em::require_pointer<InputIteratorT>();
    em::require_pointer<OutputIteratorT>();
    using Input = em::value_of<InputIteratorT>;
    using Output = em::value_of<OutputIteratorT>;
    // cub accumulates in the type of input + input (its accumulator_t for cub::Sum).
    using Accumulator = decltype(Input{} + Input{});
    constexpr const char* kCall = "cub::DeviceScan::ExclusiveSum";
    const size_t n = em::item_count(num_items);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = em::kFixedTempBytes;
      return cudaSuccess;
    }
    cudaError_t e = em::check_count(kCall, num_items);
    if (e != cudaSuccess) return e;
    if ((e = em::check_temp_size(kCall, temp_storage_bytes, em::kFixedTempBytes)) != cudaSuccess)
      return e;
    const em::Extent temp{"d_temp_storage", d_temp_storage, temp_storage_bytes};
    const em::Extent args[] = {{"d_in", d_in, n * sizeof(Input)},
                               {"d_out", d_out, n * sizeof(Output)}};
    if ((e = em::check_temp_apart(kCall, temp, args)) != cudaSuccess) return e;
    const em::Extent all[] = {temp, args[0], args[1]};
    if ((e = em::check_device(kCall, all)) != cudaSuccess) return e;

    const size_t temp_bytes = temp_storage_bytes;
    return em::enqueue_counted(stream, kCall, [=] {
      std::memset(d_temp_storage, 0xff, temp_bytes);
      Accumulator sum{};
      for (size_t i = 0; i < n; ++i) {
        const Input item = d_in[i];  // read before the write: d_out may be d_in
        d_out[i] = static_cast<Output>(sum);
        sum = em::add(sum, static_cast<Accumulator>(item));
      }
    });
  }
};

}  // namespace cub
