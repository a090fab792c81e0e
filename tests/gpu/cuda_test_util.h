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

// A bound on |loss - loss'| of two fp32 evaluations of the NSP loss in any summation order, from
// its fp32 inputs (a 16-bit input widened is exact in fp32) in double. With u = 2^-24 and g(n) = n u / (1 - n u)
// (a sum of n fp32 terms in any order is off by at most g(n) times the sum of their magnitudes),
// for sequence s, logit j, pooled unit k, each value is off by at most:
//   pre_sk    = bp_k + sum_i wp_ki x_si       g(h+1) P_sk, with P_sk = |bp_k| + sum_i |wp_ki x_si|
//   pooled_sk = tanh(pre_sk)                  g(h+1) P_sk + 4u |pooled_sk|
//                                             (|tanh'| <= 1; tanhf within 2 ulp)
//   z_sj      = bc_j + sum_k wc_jk pooled_sk  g(h+1) T_sj + sum_k |wc_jk| dpooled_sk, with
//                                             T_sj = |bc_j| + sum_k |wc_jk pooled_sk|
//   ce_s      = lse(z_s) - z_s,label          2 max_j dz_sj + 8u (1 + |lse| + |z_label|)
//                                             (exp, log and the adds, a few ulp each)
//   loss      = init + scale sum_s ce_s       scale sum_s dce_s + g(s+1) (|init| + scale sum|ce|)
// Each side is within that of the exact value, so the two are within twice it.
inline double nsp_loss_bound(const HostLayout& l, const std::vector<float>& x,
                             const std::vector<float>& wp, const std::vector<float>& bp,
                             const std::vector<float>& wc, const std::vector<float>& bc,
                             const std::vector<int32_t>& labels, double init, double scale,
                             int64_t h) {
  constexpr double u = 1.0 / (1 << 24);
  auto g = [](double n) { return n * u / (1 - n * u); };
  auto at = [](const std::vector<float>& v, int64_t i) {
    return static_cast<double>(v[static_cast<size_t>(i)]);
  };
  double dloss = 0, ce_sum = 0;
  for (size_t q = 0; q < l.seq_start.size(); ++q) {
    const int64_t row = l.seq_start[q];
    std::vector<double> pooled(static_cast<size_t>(h)), dpooled(static_cast<size_t>(h));
    for (int64_t k = 0; k < h; ++k) {
      double pre = at(bp, k), mag = std::abs(at(bp, k));
      for (int64_t i = 0; i < h; ++i) {
        pre += at(wp, k * h + i) * at(x, row * h + i);
        mag += std::abs(at(wp, k * h + i) * at(x, row * h + i));
      }
      pooled[static_cast<size_t>(k)] = std::tanh(pre);
      dpooled[static_cast<size_t>(k)] = g(h + 1) * mag + 4 * u * std::abs(std::tanh(pre));
    }
    double z[2], dz[2];
    for (int64_t j = 0; j < 2; ++j) {
      double a = at(bc, j), mag = std::abs(at(bc, j)), carried = 0;
      for (int64_t k = 0; k < h; ++k) {
        a += at(wc, j * h + k) * pooled[static_cast<size_t>(k)];
        mag += std::abs(at(wc, j * h + k) * pooled[static_cast<size_t>(k)]);
        carried += std::abs(at(wc, j * h + k)) * dpooled[static_cast<size_t>(k)];
      }
      z[j] = a;
      dz[j] = g(h + 1) * mag + carried;
    }
    const double m = std::max(z[0], z[1]);
    const double lse = m + std::log(std::exp(z[0] - m) + std::exp(z[1] - m));
    const double zl = z[labels[q]];
    ce_sum += lse - zl;
    dloss += scale * (2 * std::max(dz[0], dz[1]) + 8 * u * (1 + std::abs(lse) + std::abs(zl)));
  }
  const double s = static_cast<double>(l.seq_start.size());
  dloss += g(s + 1) * (std::abs(init) + scale * ce_sum);
  return 2 * dloss;
}


}  // namespace packbert::test
