// Helpers of the low-precision gpu tests (test_cuda_precision.cpp, test_cuda_lowp_ops.cpp): 16-bit
// buffers on the host and the device, the rounding helpers of the formats, and the comparisons
// against the CPU backend's emulation (widen, fp32 op, round). Only meaningful in a CUDA build.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../model/model_test_util.h"  // rel_l2 of float buffers
#include "kernels/common/lowp_convert.h"
#include "cuda_test_util.h"

namespace packbert::test {

inline std::vector<uint16_t> read16(const uint16_t* d, size_t n) {
  std::vector<uint16_t> h(n);
  cuda_ok(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost), "read16");
  return h;
}

// A bf16 / f16 buffer in both places: host bits, device copy.
struct Lowp16 {
  DType t;
  std::vector<int64_t> dims;
  std::vector<uint16_t> host;
  uint16_t* dev = nullptr;
  Lowp16(DType type, const std::vector<float>& v, std::vector<int64_t> d)
      : t(type), dims(std::move(d)) {
    for (float x : v) host.push_back(t == DType::bf16 ? lowp::float_to_bf16(x) : lowp::float_to_f16(x));
    dev = static_cast<uint16_t*>(cuda_alloc(host.size() * 2));
    cuda_ok(cudaMemcpy(dev, host.data(), host.size() * 2, cudaMemcpyHostToDevice), "Lowp16");
  }
  ~Lowp16() { cuda_free(dev); }
  Lowp16(const Lowp16&) = delete;
  Lowp16& operator=(const Lowp16&) = delete;
  Tensor on(void* p, Device d) const {
    Tensor v(p, t, {}, d);
    v.ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) v.shape[i] = dims[i];
    return v;
  }
  Tensor gpu() const { return on(dev, Device::cuda); }
  Tensor cpu() { return on(host.data(), Device::cpu); }
  std::vector<float> gpu_values() const {
    const std::vector<uint16_t> b = read16(dev, host.size());
    return widen(b);
  }
  std::vector<float> cpu_values() const { return widen(host); }
  std::vector<float> widen(const std::vector<uint16_t>& b) const {
    std::vector<float> f;
    for (uint16_t h : b) f.push_back(t == DType::bf16 ? lowp::bf16_to_float(h) : lowp::f16_to_float(h));
    return f;
  }
};

// A CUDA backend on device 0 that synchronises after every op (an error names its op).
inline auto make_synced_cuda_backend() {
  CudaBackendOptions co;
  co.sync_each_op = true;
  return make_cuda_backend(0, co);
}

inline std::vector<float> randn(std::mt19937_64& rng, size_t n, float s = 1.f) {
  std::normal_distribution<float> nd(0.f, s);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// rel L2 of a device result against the CPU's emulation, printed and bounded.
inline void expect_rel_l2(const std::vector<float>& gpu, const std::vector<float>& cpu,
                          double tol, const std::string& what) {
  expect_measure(what, rel_l2(gpu.data(), cpu.data(), static_cast<int64_t>(cpu.size())), tol);
}

// ---- element-by-element comparison of the native bf16 / f16 kernels ---------------------------
// The tolerance is derived in test_cuda_lowp_ops.cpp (above its LayerNorm tests). Swept
// (tests/seed_sweeps.txt: embeddings 200 seeds, residual LayerNorm 50): the worst element is
// 1 ulp, half the 2-ulp bound, and the worst fraction not bit-exact 9.0e-4 against the 0.02
// that kMinExact allows (margin 22).
inline constexpr double kFp32Tol = 1e-5;
inline constexpr double kMinExact = 0.98;
inline constexpr uint16_t kNaN16 = 0x7FC1;  // a NaN as bf16 and as f16

inline uint16_t round16(DType t, float x) {
  return t == DType::bf16 ? lowp::float_to_bf16(x) : lowp::float_to_f16(x);
}
inline float widen16(DType t, uint16_t b) {
  return t == DType::bf16 ? lowp::bf16_to_float(b) : lowp::f16_to_float(b);
}
inline std::vector<uint16_t> round16(DType t, const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = round16(t, v[i]);
  return b;
}
inline Tensor view16(std::vector<uint16_t>& v, DType t, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), t, dims, Device::cpu);
}

// One unit in the last place of the format at |x|.
inline double ulp16(DType t, double x) {
  const int mant = t == DType::bf16 ? 7 : 10;
  int e = 0;
  std::frexp(x == 0.0 ? 1e-30 : std::abs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
  const double u = std::ldexp(1.0, e - 1 - mant);
  return t == DType::f16 ? std::max(u, std::ldexp(1.0, -24)) : u;
}

// A bf16 / f16 device buffer between NaN guards, NaN-filled (written outputs) or set.
class Guarded16 {
 public:
  static constexpr size_t kGuard = 64;
  Guarded16(DType t, std::vector<int64_t> dims) : t_(t), dims_(std::move(dims)) {
    n_ = 1;
    for (int64_t d : dims_) n_ *= static_cast<size_t>(d);
    base_ = static_cast<uint16_t*>(cuda_alloc((n_ + 2 * kGuard) * 2));
    const std::vector<uint16_t> pattern(n_ + 2 * kGuard, kNaN16);
    cuda_ok(cudaMemcpy(base_, pattern.data(), pattern.size() * 2, cudaMemcpyHostToDevice),
            "Guarded16 fill");
  }
  Guarded16(DType t, std::vector<int64_t> dims, const std::vector<uint16_t>& bits)
      : Guarded16(t, std::move(dims)) {
    EXPECT_EQ(bits.size(), n_);
    cuda_ok(cudaMemcpy(base_ + kGuard, bits.data(), n_ * 2, cudaMemcpyHostToDevice),
            "Guarded16 set");
  }
  ~Guarded16() { cuda_free(base_); }
  Guarded16(const Guarded16&) = delete;
  Guarded16& operator=(const Guarded16&) = delete;
  Tensor tensor() const {
    Tensor v(base_ + kGuard, t_, {}, Device::cuda);
    v.ndim = static_cast<int>(dims_.size());
    for (size_t i = 0; i < dims_.size(); ++i) v.shape[i] = dims_[i];
    return v;
  }
  std::vector<uint16_t> bits() const { return read16(base_ + kGuard, n_); }
  bool guards_intact() const {
    for (const uint16_t* p : {base_, base_ + kGuard + n_})
      for (uint16_t b : read16(p, kGuard))
        if (b != kNaN16) return false;
    return true;
  }

 private:
  DType t_;
  std::vector<int64_t> dims_;
  size_t n_ = 0;
  uint16_t* base_ = nullptr;
};

// The 16-bit output `got` (device) against the emulation's `want`: guards, every element written
// and finite, per-element ulps, the fraction of exact matches (see the tolerance above).
inline void expect_lowp_match(const std::string& what, DType t, const Guarded16& got,
                       const std::vector<uint16_t>& want) {
  EXPECT_TRUE(got.guards_intact()) << what << ": write outside the buffer";
  const std::vector<uint16_t> g = got.bits();
  ASSERT_EQ(g.size(), want.size()) << what;
  double ss = 0;
  for (uint16_t w : want) ss += static_cast<double>(widen16(t, w)) * widen16(t, w);
  const double floor = 1e-5 * std::sqrt(ss / static_cast<double>(std::max<size_t>(want.size(), 1)));
  size_t exact = 0, bad = 0, non_finite = 0;
  double worst = 0, worst_of_bound = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = widen16(t, g[i]), b = widen16(t, want[i]);
    if (!std::isfinite(a) || !std::isfinite(b)) {  // NaN never passes
      ++non_finite;
      continue;
    }
    exact += g[i] == want[i];
    const double ulps = std::abs(a - b) / ulp16(t, b);
    worst = std::max(worst, ulps);
    worst_of_bound = std::max(worst_of_bound, std::abs(a - b) / (2 * ulp16(t, b) + floor));
    if (std::abs(a - b) > 2 * ulp16(t, b) + floor) {
      if (bad++ < 5)
        ADD_FAILURE() << what << ": element " << i << " is " << a << ", the emulation's " << b;
    }
  }
  const double frac = g.empty() ? 1.0 : static_cast<double>(exact) / static_cast<double>(g.size());
  std::printf("[lowp-error] %-62s worst %.1f ulp\n", what.c_str(), worst);
  EXPECT_EQ(non_finite, 0u) << what << ": unwritten or non-finite elements (either side)";
  EXPECT_EQ(bad, 0u) << what << ": elements beyond 2 ulp";
  print_bound(what + ": worst element / (2 ulp + floor)", worst_of_bound, 1.0);
  expect_measure(what + ": fraction not bit-exact", 1 - frac, 1 - kMinExact);
}

inline void expect_fp32_close(const std::string& what, const std::vector<float>& got,
                       const std::vector<float>& want) {
  expect_measure(what, rel_l2(got.data(), want.data(), static_cast<int64_t>(want.size())),
                 kFp32Tol);
}

inline Dropout lowp_dropout(bool on, uint64_t seed, DropoutSite site, uint32_t layer) {
  Dropout d;
  d.p = on ? 0.1f : 0.f;
  d.seed = seed;
  d.step = 4321;
  d.layer = layer;
  d.site = site;
  return d;
}

}  // namespace packbert::test
