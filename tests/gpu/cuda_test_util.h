// Helpers for the CUDA backend tests (label gpu): the skip rule, device buffers with NaN-pattern
// guard regions on both sides (and NaN-prefilled outputs), device copies of a HostLayout.
// Only meaningful in a CUDA build; every test file includes it under PACKBERT_HAVE_CUDA.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "../ops/ops_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device.h"

namespace packbert::test {

// The emulated CUDA build (PACKBERT_CUDA=EMULATED) runs these tests on the CPU, one fiber per
// CUDA thread, where an attention over a 512-token sequence takes tens of seconds: there the
// tests that would take minutes use shorter sequences that still cover tile tails, several
// tiles per sequence, both dropouts and every dtype. Tolerances are the same everywhere.
#ifdef PACKBERT_CUDA_EMULATION
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// True when a CUDA device is present; otherwise prints the skip line ctest looks for.
inline bool have_cuda_device() {
  if (cuda_device_count() > 0) return true;
  std::cout << "skipped: no CUDA device (" << describe_devices() << ")" << std::endl;
  return false;
}

#define PB_REQUIRE_CUDA_DEVICE() \
  if (!::packbert::test::have_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device"

inline void cuda_ok(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

// Device memory of n elements between two guard regions of kGuard elements, all filled with a
// NaN bit pattern; the n elements then take the given values (inputs, accumulated outputs) or
// keep the pattern (written outputs: every element must be overwritten).
template <typename T>
class DevBuf {
 public:
  static constexpr size_t kGuard = 64;

  explicit DevBuf(std::initializer_list<int64_t> dims) : dims_(dims) {
    n_ = 1;
    for (int64_t d : dims_) n_ *= static_cast<size_t>(d);
    std::vector<T> pattern(n_ + 2 * kGuard);
    fill_pattern(pattern.data(), pattern.size());
    base_ = static_cast<T*>(cuda_alloc(pattern.size() * sizeof(T)));
    cuda_ok(cudaMemcpy(base_, pattern.data(), pattern.size() * sizeof(T), cudaMemcpyHostToDevice),
            "DevBuf fill");
  }
  DevBuf(std::initializer_list<int64_t> dims, const std::vector<T>& init) : DevBuf(dims) {
    EXPECT_EQ(init.size(), n_);
    set(init);
  }
  ~DevBuf() { cuda_free(base_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  void set(const std::vector<T>& v) {
    cuda_ok(cudaMemcpy(data(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "DevBuf set");
  }
  T* data() const { return base_ + kGuard; }
  size_t size() const { return n_; }
  Tensor tensor() const {
    Tensor t(static_cast<void*>(data()), DTypeOf<T>::value, {}, Device::cuda);
    t.ndim = static_cast<int>(dims_.size());
    for (size_t i = 0; i < dims_.size(); ++i) t.shape[i] = dims_[i];
    return t;
  }
  // cudaMemcpy runs on the legacy default stream, which waits for the backend's blocking
  // stream: the values are those after every op issued so far.
  std::vector<T> values() const { return read(data(), n_); }
  std::vector<double> doubles() const {
    const std::vector<T> v = values();
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = static_cast<double>(v[i]);
    return d;
  }
  bool guards_intact() const {
    std::vector<T> p(kGuard);
    fill_pattern(p.data(), kGuard);
    const std::vector<T> lo = read(base_, kGuard), hi = read(data() + n_, kGuard);
    return std::memcmp(lo.data(), p.data(), kGuard * sizeof(T)) == 0 &&
           std::memcmp(hi.data(), p.data(), kGuard * sizeof(T)) == 0;
  }
  size_t non_finite() const {
    size_t c = 0;
    for (const T& x : values()) c += !std::isfinite(static_cast<double>(x));
    return c;
  }

 private:
  static std::vector<T> read(const T* src, size_t n) {
    std::vector<T> h(n);
    if (n) cuda_ok(cudaMemcpy(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost), "DevBuf read");
    return h;
  }
  static void fill_pattern(T* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if constexpr (sizeof(T) == 4) {
        const uint32_t bits = 0x7FC0DEADu;
        std::memcpy(&p[i], &bits, 4);
      } else {
        const uint64_t bits = 0x7FF8DEAD7FC0DEADull;
        std::memcpy(&p[i], &bits, sizeof(T));
      }
    }
  }

  std::vector<int64_t> dims_;
  size_t n_ = 0;
  T* base_ = nullptr;
};

// Guards intact and every element written and finite.
#define EXPECT_DEV_OUTPUT_OK(buf)                                                      \
  do {                                                                                 \
    EXPECT_TRUE((buf).guards_intact()) << #buf ": write outside the buffer";           \
    EXPECT_EQ((buf).non_finite(), 0u) << #buf ": unwritten or non-finite elements";    \
  } while (0)

// A HostLayout's arrays on the device.
struct DevLayout {
  explicit DevLayout(const HostLayout& h)
      : rows(h.rows),
        max_len(h.max_len),
        num_seqs(static_cast<int64_t>(h.seq_len.size())),
        seq_start({num_seqs}, h.seq_start),
        seq_len({num_seqs}, h.seq_len),
        sample_id({num_seqs}, h.sample_id),
        token_seq({rows}, h.token_seq),
        token_pos({rows}, h.token_pos) {}
  SeqLayout view() const {
    SeqLayout l;
    l.rows = rows;
    l.num_seqs = static_cast<int32_t>(num_seqs);
    l.max_len = max_len;
    l.seq_start = seq_start.tensor();
    l.seq_len = seq_len.tensor();
    l.sample_id = sample_id.tensor();
    l.token_seq = token_seq.tensor();
    l.token_pos = token_pos.tensor();
    return l;
  }
  int64_t rows;
  int32_t max_len;
  int64_t num_seqs;
  DevBuf<int32_t> seq_start, seq_len;
  DevBuf<int64_t> sample_id;
  DevBuf<int32_t> token_seq, token_pos;
};

inline std::vector<double> dbl(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace packbert::test
