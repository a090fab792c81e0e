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
#include <vector>

#include "kernels/backend.h"
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

// An output buffer with guard regions on both sides filled with a NaN bit pattern. Outputs are
// pre-filled with NaN too, so "every element written" and "nothing outside written" are both
// checkable.
template <typename T>
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint32_t kPattern = 0x7FC0DEADu;  // a quiet NaN as f32

  Guarded(std::initializer_list<int64_t> dims) : dims_(dims) {
    n_ = 1;
    for (int64_t d : dims) n_ *= static_cast<size_t>(d);
    storage_.resize(n_ + 2 * kGuard);
    fill_pattern(storage_.data(), storage_.size());
  }
  // Outputs that accumulate (+=) start from given values instead of NaN.
  Guarded(std::initializer_list<int64_t> dims, const std::vector<T>& init) : Guarded(dims) {
    EXPECT_EQ(init.size(), n_);
    std::copy(init.begin(), init.end(), data());
  }

  T* data() { return storage_.data() + kGuard; }
  const T* data() const { return storage_.data() + kGuard; }
  size_t size() const { return n_; }
  Tensor tensor() {
    Tensor t(static_cast<void*>(data()), DTypeOf<T>::value, {});
    t.ndim = static_cast<int>(dims_.size());
    for (size_t i = 0; i < dims_.size(); ++i) t.shape[i] = dims_[i];
    return t;
  }
  std::vector<T> values() const { return {data(), data() + n_}; }
  std::vector<double> doubles() const { return {data(), data() + n_}; }

  // Both guards untouched.
  bool guards_intact() const {
    return std::memcmp(storage_.data(), pattern_of(kGuard).data(), kGuard * sizeof(T)) == 0 &&
           std::memcmp(storage_.data() + kGuard + n_, pattern_of(kGuard).data(),
                       kGuard * sizeof(T)) == 0;
  }
  // Elements still holding the pre-fill pattern (never written).
  size_t unwritten() const {
    size_t c = 0;
    const auto p = pattern_of(1);
    for (size_t i = 0; i < n_; ++i) c += std::memcmp(&data()[i], p.data(), sizeof(T)) == 0;
    return c;
  }
  // Any NaN / inf (floats only).
  size_t non_finite() const {
    size_t c = 0;
    for (size_t i = 0; i < n_; ++i) c += !std::isfinite(static_cast<double>(data()[i]));
    return c;
  }

 private:
  static void fill_pattern(T* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if constexpr (sizeof(T) == 4) {
        std::memcpy(&p[i], &kPattern, 4);
      } else {
        const uint64_t wide = (uint64_t{0x7FF8DEAD} << 32) | kPattern;
        std::memcpy(&p[i], &wide, sizeof(T));
      }
    }
  }
  static std::vector<T> pattern_of(size_t n) {
    std::vector<T> v(n);
    fill_pattern(v.data(), n);
    return v;
  }

  std::vector<int64_t> dims_;
  size_t n_ = 0;
  std::vector<T> storage_;
};

// Asserts the guards are intact and (for written outputs) that nothing still holds NaN.
#define EXPECT_OUTPUT_OK(buf)                                                        \
  do {                                                                               \
    EXPECT_TRUE((buf).guards_intact()) << #buf ": write outside the buffer";         \
    EXPECT_EQ((buf).non_finite(), 0u) << #buf ": unwritten or non-finite elements";  \
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
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lens[a] > lens[b]; });
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
