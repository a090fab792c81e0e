// Helpers for the op tests (label ops): guarded output buffers, random inputs, error metrics,
// finite differences and the three token layouts. Header-only: each test_*.cpp is its own
// executable.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/common/fp8_convert.h"
#include "kernels/common/lowp_convert.h"
#include "measure.h"
#include "test_util.h"

namespace packbert::test {

// A generator per test, seeded from the run's fresh seed and a per-test salt.
inline std::mt19937_64 make_rng(uint64_t salt) {
  return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
}

// Uniform in [-scale, scale], never exactly zero (zeros hide missing terms).
inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float scale = 1.f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = u(rng);
    while (x == 0.f);
  }
  return v;
}

inline std::vector<int32_t> random_ints(std::mt19937_64& rng, size_t n, int32_t lo, int32_t hi) {
  std::uniform_int_distribution<int32_t> u(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

inline std::vector<double> to_double(const float* p, size_t n) { return {p, p + n}; }
inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ||a - b|| / ||b||; infinity when anything is NaN (NaN never passes).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Expects rel_l2(got, want) <= tol and prints it as a measure (measure.h), so a run of the ops
// tests doubles as an accuracy table and scripts/seed_sweep.py can take its worst over seeds.
inline void expect_close(const std::string& what, const std::vector<double>& got,
                         const std::vector<double>& want, double tol) {
  expect_measure(what, rel_l2(got, want), tol);
}

// The fp32-vs-fp64 tolerance of DESIGN.md, for forward outputs and for analytic gradients
// against finite differences of the double reference. Worst over the sweeps of
// tests/seed_sweeps.txt (1000 seeds, 100 to 200 for the slower tests): 2.8e-6 (test_ops_lamb:
// w - w0 after 6 steps, which carries the fp32 weights' own rounding), 2.1e-6 (test_ops_linear:
// a 1x1x1 product that cancels its bias), every other op below 1.3e-6; margins 3.5 and more
// (docs/testing.md#margins).
constexpr double kTol = 1e-5;

// ---- 16-bit formats ---------------------------------------------------------------------------
inline bool is_lowp(DType t) { return t == DType::bf16 || t == DType::f16; }
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
inline std::vector<float> widen16(DType t, const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = widen16(t, v[i]);
  return f;
}

// A host view of a vector (tests build their host tensors with it).
template <typename T>
Tensor hv(std::vector<T>& v, std::initializer_list<int64_t> dims) {
  return view(v.data(), dims);
}

// The dropout of one site of a test: layer 0 and step 1234 unless given.
inline Dropout make_dropout(float p, uint64_t seed, DropoutSite site, uint32_t layer = 0,
                            uint32_t step = 1234) {
  Dropout d;
  d.p = p;
  d.seed = seed;
  d.step = step;
  d.layer = layer;
  d.site = site;
  return d;
}

// Where a guarded buffer lives: host memory, or a device's (cuda_test_util.h's cuda_memory()),
// with the copies in and out. A device's copies see every op issued so far (cudaMemcpy waits for
// the backends' blocking streams).
struct Memory {
  Device device;
  void* (*allocate)(size_t bytes);
  void (*release)(void* p);
  void (*upload)(void* dst, const void* src, size_t bytes);    // host -> memory
  void (*download)(void* dst, const void* src, size_t bytes);  // memory -> host
};

inline const Memory& host_memory() {
  static const Memory m{Device::cpu, [](size_t bytes) -> void* { return ::operator new(bytes); },
                        [](void* p) { ::operator delete(p); },
                        [](void* d, const void* s, size_t b) { std::memcpy(d, s, b); },
                        [](void* d, const void* s, size_t b) { std::memcpy(d, s, b); }};
  return m;
}

// A buffer of n elements of one dtype between two guard regions of kGuard elements, in host or
// device memory (Memory). Guards and written outputs hold a NaN bit pattern (f32 0x7FC0DEAD, 8
// bytes 0x7FF8DEAD7FC0DEAD, 16 bits 0x7FC1, ints the same bytes), so "every element written"
// and "nothing outside written" are both checkable; inputs and accumulated outputs start from
// given values instead.
class GuardedBytes {
 public:
  static constexpr size_t kGuard = 64;

  GuardedBytes(const Memory& mem, DType t, std::vector<int64_t> dims)
      : mem_(&mem), dtype_(t), dims_(std::move(dims)), esize_(dtype_size(t)) {
    n_ = 1;
    for (int64_t d : dims_) n_ *= static_cast<size_t>(d);
    base_ = static_cast<uint8_t*>(mem_->allocate((n_ + 2 * kGuard) * esize_));
    const std::vector<uint8_t> p = pattern(n_ + 2 * kGuard);
    mem_->upload(base_, p.data(), p.size());
  }
  ~GuardedBytes() { mem_->release(base_); }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;

  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }
  void* raw() const { return base_ + kGuard * esize_; }
  Tensor tensor() const {
    Tensor t(raw(), dtype_, {}, mem_->device);
    t.ndim = static_cast<int>(dims_.size());
    for (size_t i = 0; i < dims_.size(); ++i) t.shape[i] = dims_[i];
    return t;
  }
  // The n elements' bytes, written and read back.
  void set_bytes(const void* src) { mem_->upload(raw(), src, n_ * esize_); }
  std::vector<uint8_t> bytes() const { return read(static_cast<const uint8_t*>(raw()), n_); }
  // The elements widened to double (16-bit floats through their format).
  std::vector<double> doubles() const;

  bool guards_intact() const {
    const std::vector<uint8_t> p = pattern(kGuard);
    return read(base_, kGuard) == p && read(base_ + (kGuard + n_) * esize_, kGuard) == p;
  }
  // Elements still holding the pre-fill pattern (never written).
  size_t unwritten() const {
    const std::vector<uint8_t> b = bytes(), p = pattern(1);
    size_t c = 0;
    for (size_t i = 0; i < n_; ++i) c += std::memcmp(&b[i * esize_], p.data(), esize_) == 0;
    return c;
  }
  // Any NaN / inf (float dtypes; ints have none).
  size_t non_finite() const {
    size_t c = 0;
    if (dtype_ == DType::i32 || dtype_ == DType::i64 || dtype_ == DType::i8 || dtype_ == DType::u8)
      return 0;
    for (double v : doubles()) c += !std::isfinite(v);
    return c;
  }

 private:
  std::vector<uint8_t> read(const uint8_t* src, size_t n) const {
    std::vector<uint8_t> h(n * esize_);
    if (n) mem_->download(h.data(), src, h.size());
    return h;
  }
  std::vector<uint8_t> pattern(size_t n) const {
    std::vector<uint8_t> v(n * esize_);
    const uint64_t wide = 0x7FF8DEAD7FC0DEADull;
    const uint32_t word = 0x7FC0DEADu;
    const uint16_t half = 0x7FC1;
    for (size_t i = 0; i < n; ++i) {
      uint8_t* p = &v[i * esize_];
      if (esize_ == 8)
        std::memcpy(p, &wide, 8);
      else if (esize_ == 4)
        std::memcpy(p, &word, 4);
      else if (esize_ == 2)
        std::memcpy(p, &half, 2);
      else
        *p = is_fp8(dtype_) ? 0x7F : 0xDE;  // FP8: a NaN, so "unwritten" reads non-finite
    }
    return v;
  }

  const Memory* mem_;
  DType dtype_;
  std::vector<int64_t> dims_;
  size_t esize_;
  size_t n_ = 0;
  uint8_t* base_ = nullptr;
};

// A typed GuardedBytes: Guarded<float> out({n, m}) in host memory, Guarded<float>(cuda_memory(),
// {n, m}, init) on the device; uint16_t holds bf16 or f16 (the dtype given).
template <typename T>
class Guarded : public GuardedBytes {
 public:
  explicit Guarded(std::initializer_list<int64_t> dims) : Guarded(host_memory(), dims) {}
  Guarded(std::initializer_list<int64_t> dims, const std::vector<T>& init)
      : Guarded(host_memory(), dims, init) {}
  Guarded(const Memory& mem, std::vector<int64_t> dims, DType t = default_dtype())
      : GuardedBytes(mem, t, std::move(dims)) {}
  Guarded(const Memory& mem, std::vector<int64_t> dims, const std::vector<T>& init,
          DType t = default_dtype())
      : GuardedBytes(mem, t, std::move(dims)) {
    set(init);
  }

  // The first element (host or device memory).
  T* data() const { return static_cast<T*>(raw()); }
  void set(const std::vector<T>& v) {
    EXPECT_EQ(v.size(), size());
    if (v.size() == size()) set_bytes(v.data());
  }
  std::vector<T> values() const {
    const std::vector<uint8_t> b = bytes();
    std::vector<T> v(size());
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }

 private:
  static constexpr DType default_dtype() {
    if constexpr (std::is_same_v<T, uint16_t>)
      return DType::bf16;
    else
      return DTypeOf<T>::value;
  }
};
inline std::vector<double> GuardedBytes::doubles() const {
  const std::vector<uint8_t> b = bytes();
  std::vector<double> d(n_);
  for (size_t i = 0; i < n_; ++i) {
    const uint8_t* p = &b[i * esize_];
    switch (dtype_) {
      case DType::f32: {
        float v;
        std::memcpy(&v, p, 4);
        d[i] = v;
        break;
      }
      case DType::f64: std::memcpy(&d[i], p, 8); break;
      case DType::i32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        d[i] = v;
        break;
      }
      case DType::i64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        d[i] = static_cast<double>(v);
        break;
      }
      case DType::bf16:
      case DType::f16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        d[i] = dtype_ == DType::bf16 ? lowp::bf16_to_float(v) : lowp::f16_to_float(v);
        break;
      }
      case DType::e4m3: d[i] = fp8::e4m3_to_float(*p); break;
      case DType::e5m2: d[i] = fp8::e5m2_to_float(*p); break;
      default: d[i] = *p; break;
    }
  }
  return d;
}

// Asserts the guards are intact and (for written outputs) that nothing still holds NaN.
#define EXPECT_OUTPUT_OK(buf)                                                                      \
  do {                                                                                             \
    EXPECT_TRUE((buf).guards_intact()) << #buf ": write outside the buffer";                       \
    EXPECT_EQ((buf).non_finite(), 0u) << #buf ": unwritten or non-finite elements";                \
  } while (0)

// Central differences of f at x for the given coordinates (x is restored).
inline std::vector<double> fd_gradient(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double>& x, const std::vector<size_t>& coords,
                                       double h = 1e-5) {
  std::vector<double> g;
  for (size_t i : coords) {
    const double xi = x[i];
    x[i] = xi + h;
    const double fp = f(x);
    x[i] = xi - h;
    const double fm = f(x);
    x[i] = xi;
    g.push_back((fp - fm) / (2 * h));
  }
  return g;
}

inline std::vector<size_t> all_coords(size_t n) {
  std::vector<size_t> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = i;
  return c;
}

inline std::vector<size_t> some_coords(std::mt19937_64& rng, size_t n, size_t k) {
  if (k >= n) return all_coords(n);
  std::vector<size_t> c = all_coords(n);
  std::shuffle(c.begin(), c.end(), rng);
  c.resize(k);
  std::sort(c.begin(), c.end());
  return c;
}

inline std::vector<double> pick(const std::vector<double>& v, const std::vector<size_t>& idx) {
  std::vector<double> r;
  for (size_t i : idx) r.push_back(v[i]);
  return r;
}

inline double dot_d(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// ---- layouts ---------------------------------------------------------------------------------
// Host arrays behind a SeqLayout.
struct HostLayout {
  int64_t rows = 0;
  int32_t max_len = 0;
  std::vector<int32_t> seq_start, seq_len, token_seq, token_pos;
  std::vector<int64_t> sample_id;

  SeqLayout view() const {
    SeqLayout l;
    l.rows = rows;
    l.num_seqs = static_cast<int32_t>(seq_len.size());
    l.max_len = max_len;
    const int64_t s = l.num_seqs;
    l.seq_start = packbert::view(seq_start.data(), {s});
    l.seq_len = packbert::view(seq_len.data(), {s});
    l.sample_id = packbert::view(sample_id.data(), {s});
    l.token_seq = packbert::view(token_seq.data(), {rows});
    l.token_pos = packbert::view(token_pos.data(), {rows});
    return l;
  }
  // Row of token p of sequence s.
  int64_t row(size_t s, int32_t p) const { return seq_start[s] + p; }
};

// A HostLayout's arrays in host or device memory (Memory), as a SeqLayout of that memory.
struct LayoutOn {
  LayoutOn(const Memory& mem, const HostLayout& h)
      : rows(h.rows),
        max_len(h.max_len),
        num_seqs(static_cast<int64_t>(h.seq_len.size())),
        seq_start(mem, {num_seqs}, h.seq_start),
        seq_len(mem, {num_seqs}, h.seq_len),
        sample_id(mem, {num_seqs}, h.sample_id),
        token_seq(mem, {rows}, h.token_seq),
        token_pos(mem, {rows}, h.token_pos) {}
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
  Guarded<int32_t> seq_start, seq_len;
  Guarded<int64_t> sample_id;
  Guarded<int32_t> token_seq, token_pos;
};

// Sequences placed at the given starts in a buffer of `rows` rows (the rest is padding).
inline HostLayout place(const std::vector<int32_t>& lens, const std::vector<int64_t>& ids,
                        const std::vector<int32_t>& starts, int64_t rows) {
  HostLayout l;
  l.rows = rows;
  l.seq_len = lens;
  l.sample_id = ids;
  l.seq_start = starts;
  l.token_seq.assign(rows, -1);
  l.token_pos.assign(rows, 0);
  for (size_t s = 0; s < lens.size(); ++s) {
    l.max_len = std::max(l.max_len, lens[s]);
    for (int32_t p = 0; p < lens[s]; ++p) {
      l.token_seq[starts[s] + p] = static_cast<int32_t>(s);
      l.token_pos[starts[s] + p] = p;
    }
  }
  return l;
}

// unpadded: end to end.
inline HostLayout unpadded(const std::vector<int32_t>& lens, const std::vector<int64_t>& ids) {
  std::vector<int32_t> starts;
  int32_t at = 0;
  for (int32_t n : lens) starts.push_back(at), at += n;
  return place(lens, ids, starts, at);
}

// padded: sequence s in row slot s of max_seq_len.
inline HostLayout padded(const std::vector<int32_t>& lens, const std::vector<int64_t>& ids,
                         int32_t max_seq_len) {
  std::vector<int32_t> starts;
  for (size_t s = 0; s < lens.size(); ++s) starts.push_back(static_cast<int32_t>(s) * max_seq_len);
  return place(lens, ids, starts, static_cast<int64_t>(lens.size()) * max_seq_len);
}

// packed: first fit of the sequences, longest first, into rows of max_seq_len (so sequence
// order and neighbours differ from the unpadded layout).
inline HostLayout packed(const std::vector<int32_t>& lens, const std::vector<int64_t>& ids,
                         int32_t max_seq_len) {
  std::vector<size_t> order(lens.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lens[a] > lens[b]; });
  std::vector<int32_t> fill;  // used tokens per pack row
  std::vector<int32_t> starts(lens.size());
  for (size_t s : order) {
    size_t r = 0;
    while (r < fill.size() && fill[r] + lens[s] > max_seq_len) ++r;
    if (r == fill.size()) fill.push_back(0);
    starts[s] = static_cast<int32_t>(r) * max_seq_len + fill[r];
    fill[r] += lens[s];
  }
  return place(lens, ids, starts, static_cast<int64_t>(fill.size()) * max_seq_len);
}

// A fixed-capacity batch's layout (model/batch.h with_capacity): `l` followed by `extra_rows`
// padding rows and `slots` empty sequence slots (length 0, at the row after the last, id 0).
inline HostLayout with_empty_slots(HostLayout l, int64_t extra_rows, int slots) {
  const auto end = static_cast<int32_t>(l.rows);
  l.rows += extra_rows;
  l.token_seq.resize(static_cast<size_t>(l.rows), -1);
  l.token_pos.resize(static_cast<size_t>(l.rows), 0);
  for (int i = 0; i < slots; ++i) {
    l.seq_start.push_back(end);
    l.seq_len.push_back(0);
    l.sample_id.push_back(0);
  }
  return l;
}

// Copies rows of sequence s from a [rows, width] buffer of layout `from` into the same
// sequence's rows of a buffer of layout `to` (moving a batch between layouts).
template <typename T>
std::vector<T> relayout(const std::vector<T>& src, const HostLayout& from, const HostLayout& to,
                        int64_t width, T fill) {
  std::vector<T> dst(static_cast<size_t>(to.rows * width), fill);
  for (size_t s = 0; s < from.seq_len.size(); ++s)
    for (int32_t p = 0; p < from.seq_len[s]; ++p)
      std::copy_n(src.begin() + from.row(s, p) * width, width, dst.begin() + to.row(s, p) * width);
  return dst;
}

// Distinct random sample ids spread over the whole 44-bit key range.
inline std::vector<int64_t> random_sample_ids(std::mt19937_64& rng, size_t n) {
  std::vector<int64_t> ids;
  std::uniform_int_distribution<int64_t> u(0, (int64_t{1} << 44) - 1);
  while (ids.size() < n) {
    const int64_t v = u(rng);
    if (std::find(ids.begin(), ids.end(), v) == ids.end()) ids.push_back(v);
  }
  return ids;
}

}  // namespace packbert::test
