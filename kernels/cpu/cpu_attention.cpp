// Variable-length multi-head attention over (sequence start, length) ranges of a token buffer.
//
// One task per (sequence, head), scheduled dynamically, longest sequences first (lengths vary;
// a long sequence left for last would keep one thread busy while the others wait); a task owns
// the q/k/v slots of its head in its sequence's rows, so tasks never write the same element and
// every sum runs in a fixed order: results do not depend on the thread count, nor on where the
// sequence sits in the buffer (the packed-vs-unpadded tests compare bits).
//
// Like FlashAttention, forward saves only the log-sum-exp of each query row; backward recomputes
// the probabilities from it and the dropout mask from the Philox key, and uses
// D_i = dO_i . O_i for the softmax gradient (with dropout, sum_j P_ij dP_ij = dO_i . O_i still).
//
// Speed: a task works on blocks of kQueryBlock query rows against the keys that any of them
// attends (all keys of its sequence, or with a local window of half-width h the keys
// [i0 - h, i0 + rows + h) of a block [i0, i0 + rows), clipped to the sequence): the loop bounds,
// not a mask over the whole row, so a local layer's work grows with len x (kQueryBlock + 2h).
// Inside that range a row's keys beyond its own window are set to probability 0 (the range's
// edges only). The score block S = Q K^T, the outputs P V and the backward products (dP = dO V^T,
// dV = P^T dO, dQ = dS K, dK = dS^T Q) are single-threaded cblas_sgemm calls on strided views of
// the qkv buffer (ld = 3H); only the elementwise softmax / dropout work runs in our own loops, with
// the exp and the Philox mask in SSE2 (cpu_simd.h; scalar, each cost as much as all the GEMMs).
// Why single-threaded BLAS inside our OpenMP loop, and why that is safe:
// - Parallelism comes from the (sequence, head) tasks; per-head GEMMs (d = 64, len <= 512) are
//   too small to split across threads profitably.
// - The Debian OpenBLAS is the pthread build. Concurrent calls from several threads are safe
//   when OpenBLAS itself runs one thread (its FAQ's advice for threaded applications): the call
//   then runs entirely in the caller, and its buffer allocator takes a lock. With more than one
//   OpenBLAS thread, concurrent calls would share OpenBLAS's thread server, which older versions
//   do not protect. So BlasSingleThread sets OpenBLAS to 1 thread on the calling (master)
//   thread, outside the parallel region, and restores it afterwards (openblas_set_num_threads
//   is not safe to call from inside the region). The Backend contract (one host thread at a
//   time) makes this process-wide setting safe.
// - Determinism: every task runs the same single-threaded GEMM sequence on the same shapes
//   whatever thread picks it up, and OpenBLAS packs its operands into its own aligned buffers,
//   so results depend neither on the thread count nor on the sequence's row offset. The
//   elementwise loops are plain IEEE +, * and compares, so a vectorised and a scalar (peeled
//   or tail) iteration give the same bits wherever the scratch buffer sits; the SSE2 exp runs
//   every element, tails included, through the same 4-lane code.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_lowp.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_simd.h"

namespace packbert {

using cpu::expect;

namespace {

// Query rows per block: the score and gradient blocks (2 x 128 x 512 floats at 512 tokens, or
// 2 x 128 x (128 + 2h) with a local window) stay in a core's L2, and a 128-row GEMM is large
// enough for OpenBLAS's kernels. Longer global sequences outgrow L2 (8 MiB at 8192 tokens).
constexpr int64_t kQueryBlock = 128;

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

using cpu::exp_shifted;
using cpu::row_max;

// Single-threaded cblas_sgemm, row-major: C = alpha op(A) op(B) + beta C.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

using cpu::BlasSingleThread;

// Shapes of one attention call, checked once.
struct AttnShape {
  int64_t rows, hidden, heads, head_dim, ld;  // ld = 3 * hidden, the qkv row stride
  float scale;                                // 1 / sqrt(head_dim)
};

AttnShape attention_shape(const char* op, const SeqLayout& layout, const Tensor& qkv,
                          int num_heads) {
  expect(op, "qkv", qkv, DType::f32, {layout.rows, kAnyDim});
  const int64_t ld = qkv.dim(1), hidden = checks::qkv_hidden(op, ld, num_heads);
  PB_REQUIRE(ld <= 0x7fffffff && layout.max_len <= 0x7fffffff / 4,
             "{}: qkv width {} or max_len {} exceeds the BLAS int range", op, ld, layout.max_len);
  const int64_t d = hidden / num_heads;
  return AttnShape{layout.rows, hidden,
                   num_heads,   d,
                   ld,          static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}

// The dropout multipliers of query row `qpos` against keys [lo, hi) of one (sample, head):
// returns the factor of key lo (the words are computed from the multiple of 16 at or below lo, in
// factors[0 ..)).
inline const float* attention_dropout_row(const DropoutStream& ds, uint64_t sample, uint32_t head,
                                          uint32_t qpos, int64_t lo, int64_t hi, float* factors) {
  const int64_t first = lo & ~int64_t{15};
  cpu::dropout_row(ds, sample, head, qpos, hi - first, factors, first);
  return factors + (lo - first);
}

// The keys [lo, hi) that some query of rows [i0, i0 + rows) attends in a sequence of len tokens,
// half the window's half-width (checks::attention_half_window).
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange block_keys(int64_t i0, int64_t rows, int64_t len, int64_t half) {
  return {std::max<int64_t>(0, i0 - half), std::min(len, i0 + rows + half)};
}
// The keys of query qi inside a block's range r, relative to r.lo: [a, b).
inline KeyRange row_keys(int64_t qi, const KeyRange& r, int64_t half) {
  return {std::max(qi - half, r.lo) - r.lo, std::min(qi + half + 1, r.hi) - r.lo};
}
// Widest key range of a block of a sequence of len tokens.
inline int64_t range_width(int64_t block, int64_t len, int64_t half) {
  return std::min(len, block + 2 * half);
}

// Rows that belong to no sequence: attention writes zeros there (kernels/ops/attention.h).
template <typename F>
void for_padding_rows(const SeqLayout& layout, F&& f) {
  const int32_t* tseq = layout.token_seq.ptr<int32_t>();
  for (int64_t r = 0; r < layout.rows; ++r)
    if (tseq[r] < 0) f(r);
}

// Floats of per-thread scratch: two [block, width] blocks and one dropout row.
size_t attention_scratch(const SeqLayout& layout, int64_t half) {
  const int64_t block = std::min<int64_t>(kQueryBlock, layout.max_len);
  return static_cast<size_t>(2 * block * range_width(block, layout.max_len, half) + layout.max_len);
}

}  // namespace

void CpuBackend::attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                   int64_t window, const Dropout& dropout, const Tensor& out,
                                   const Tensor& lse) {
  const char* op = "attention_forward";
  const int64_t half = checks::attention_half_window(op, window, layout.max_len);
  if (lowp::any({&qkv, &out, &lse}))
    return lowp::attention_forward(*this, lowp_, layout, qkv, num_heads, window, dropout, out, lse);
  const AttnShape a = attention_shape(op, layout, qkv, num_heads);
  expect(op, "out", out, DType::f32, {a.rows, a.hidden});
  expect(op, "lse", lse, DType::f32, {a.rows, a.heads});
  cpu::check_layout(op, layout, a.rows);
  const DropoutStream ds =
      cpu::dropout_stream(op, dropout, layout.max_len, a.heads, layout.max_len);
  const bool drop = dropout_enabled(ds);

  const float* base = qkv.ptr<float>();
  float* o = out.ptr<float>();
  float* l = lse.ptr<float>();
  for_padding_rows(layout, [&](int64_t r) {
    std::fill(o + r * a.hidden, o + (r + 1) * a.hidden, 0.f);
    std::fill(l + r * a.heads, l + (r + 1) * a.heads, 0.f);
  });
  const int32_t* starts = layout.seq_start.ptr<int32_t>();
  const int32_t* lens = layout.seq_len.ptr<int32_t>();
  const int64_t* samples = layout.sample_id.ptr<int64_t>();
  const int64_t d = a.head_dim;
  const size_t scratch = attention_scratch(layout, half);
  reserve_thread_scratch(scratch);
  const int64_t tasks = static_cast<int64_t>(layout.num_seqs) * a.heads;
  const int32_t* order = longest_first(layout);
  const BlasSingleThread blas_guard;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t s = order[t / a.heads], head = t % a.heads, len = lens[s], start = starts[s];
    const int64_t block = std::min(kQueryBlock, len);
    float* sc = thread_scratch(omp_get_thread_num(), scratch);  // [block, n] scores -> probs
    float* f = sc + 2 * block * range_width(block, len, half);  // dropout factors
    const float* q0 = base + start * a.ld + head * d;
    const float* k0 = q0 + a.hidden;
    const float* v0 = k0 + a.hidden;
    for (int64_t i0 = 0; i0 < len; i0 += block) {
      const int64_t rows = std::min(block, len - i0);
      const KeyRange kr = block_keys(i0, rows, len, half);
      const int64_t n = kr.hi - kr.lo;
      gemm(false, true, rows, n, d, a.scale, q0 + i0 * a.ld, a.ld, k0 + kr.lo * a.ld, a.ld, 0.f, sc,
           n);
      for (int64_t i = 0; i < rows; ++i) {
        const KeyRange w = row_keys(i0 + i, kr, half);  // >= 1 key: the query's own
        float* row = sc + i * n;
        float* p = row + w.lo;
        const int64_t m = w.hi - w.lo;
        const float mx = row_max(p, m);
        exp_shifted(p, mx, m);
        // The sum in double, over 8 interleaved partial sums combined in a fixed order (the
        // partials hide the add latency; the order never depends on the thread).
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + 8 <= m; j += 8)
          for (int c = 0; c < 8; ++c) part[c] += p[j + c];
        for (; j < m; ++j) part[0] += p[j];
        const double sum = ((part[0] + part[1]) + (part[2] + part[3])) +
                           ((part[4] + part[5]) + (part[6] + part[7]));
        l[(start + i0 + i) * a.heads + head] = mx + static_cast<float>(std::log(sum));
        const auto inv = static_cast<float>(1.0 / sum);
        if (drop) {
          const float* fr = attention_dropout_row(
              ds, static_cast<uint64_t>(samples[s]), static_cast<uint32_t>(head),
              static_cast<uint32_t>(i0 + i), kr.lo + w.lo, kr.lo + w.hi, f);
          for (int64_t c = 0; c < m; ++c) p[c] = p[c] * inv * fr[c];
        } else {
          for (int64_t c = 0; c < m; ++c) p[c] = p[c] * inv;
        }
        std::fill(row, p, 0.f);  // keys of the range outside this row's window
        std::fill(p + m, row + n, 0.f);
      }
      gemm(false, false, rows, d, n, 1.f, sc, n, v0 + kr.lo * a.ld, a.ld, 0.f,
           o + (start + i0) * a.hidden + head * d, a.hidden);
    }
  }
}

void CpuBackend::attention_backward(const SeqLayout& layout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const Tensor& dout, int num_heads,
                                    int64_t window, const Dropout& dropout, const Tensor& dqkv) {
  const char* op = "attention_backward";
  const int64_t half = checks::attention_half_window(op, window, layout.max_len);
  if (lowp::any({&qkv, &out, &lse, &dout, &dqkv}))
    return lowp::attention_backward(*this, lowp_, layout, qkv, out, lse, dout, num_heads, window,
                                    dropout, dqkv);
  const AttnShape a = attention_shape(op, layout, qkv, num_heads);
  expect(op, "out", out, DType::f32, {a.rows, a.hidden});
  expect(op, "lse", lse, DType::f32, {a.rows, a.heads});
  expect(op, "dout", dout, DType::f32, {a.rows, a.hidden});
  expect(op, "dqkv", dqkv, DType::f32, {a.rows, a.ld});
  cpu::check_layout(op, layout, a.rows);
  const DropoutStream ds =
      cpu::dropout_stream(op, dropout, layout.max_len, a.heads, layout.max_len);
  const bool drop = dropout_enabled(ds);

  const float* base = qkv.ptr<float>();
  const float* o = out.ptr<float>();
  const float* l = lse.ptr<float>();
  const float* dO = dout.ptr<float>();
  float* dbase = dqkv.ptr<float>();
  for_padding_rows(layout,
                   [&](int64_t r) { std::fill(dbase + r * a.ld, dbase + (r + 1) * a.ld, 0.f); });
  const int32_t* starts = layout.seq_start.ptr<int32_t>();
  const int32_t* lens = layout.seq_len.ptr<int32_t>();
  const int64_t* samples = layout.sample_id.ptr<int64_t>();
  const int64_t d = a.head_dim;
  const size_t scratch = attention_scratch(layout, half);
  reserve_thread_scratch(scratch);
  const int64_t tasks = static_cast<int64_t>(layout.num_seqs) * a.heads;
  const int32_t* order = longest_first(layout);
  const BlasSingleThread blas_guard;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t s = order[t / a.heads], head = t % a.heads, len = lens[s], start = starts[s];
    const int64_t block = std::min(kQueryBlock, len), width = range_width(block, len, half);
    float* pb = thread_scratch(omp_get_thread_num(), scratch);  // [block, n] P, then P * F
    float* gb = pb + block * width;                             // [block, n] dP, then dS
    float* f = gb + block * width;                              // dropout factors
    const float* q0 = base + start * a.ld + head * d;
    const float* k0 = q0 + a.hidden;
    const float* v0 = k0 + a.hidden;
    const float* do0 = dO + start * a.hidden + head * d;
    const float* o0 = o + start * a.hidden + head * d;
    float* dq0 = dbase + start * a.ld + head * d;
    float* dk0 = dq0 + a.hidden;
    float* dv0 = dk0 + a.hidden;
    // out_i = sum_j p_ij f_ij v_j:  dV = (P*F)^T dO;  dP_ij = f_ij (dO_i . v_j);
    // dS_ij = p_ij (dP_ij - D_i);  dQ = scale dS K;  dK = scale dS^T Q. Query blocks add their
    // dK and dV shares in block order over their key ranges, which ascend and overlap or touch
    // (every key is in its own query's range): keys [0, written) hold a share already, the
    // range's keys past `written` are written (beta = 0 for a range wholly past it, else zeroed
    // first and beta = 1).
    int64_t written = 0;
    for (int64_t i0 = 0; i0 < len; i0 += block) {
      const int64_t rows = std::min(block, len - i0);
      const KeyRange kr = block_keys(i0, rows, len, half);
      const int64_t n = kr.hi - kr.lo;
      const float* kr0 = k0 + kr.lo * a.ld;
      gemm(false, true, rows, n, d, a.scale, q0 + i0 * a.ld, a.ld, kr0, a.ld, 0.f, pb, n);
      gemm(false, true, rows, n, d, 1.f, do0 + i0 * a.hidden, a.hidden, v0 + kr.lo * a.ld, a.ld,
           0.f, gb, n);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t qi = i0 + i;
        const KeyRange w = row_keys(qi, kr, half);
        const int64_t m = w.hi - w.lo;
        const float di = dot(do0 + qi * a.hidden, o0 + qi * a.hidden, d);
        const float lse_i = l[(start + qi) * a.heads + head];
        float* p = pb + i * n + w.lo;
        float* g = gb + i * n + w.lo;
        exp_shifted(p, lse_i, m);  // P = exp(S - lse)
        if (drop) {
          const float* fr = attention_dropout_row(
              ds, static_cast<uint64_t>(samples[s]), static_cast<uint32_t>(head),
              static_cast<uint32_t>(qi), kr.lo + w.lo, kr.lo + w.hi, f);
          for (int64_t j = 0; j < m; ++j) {
            const float pj = p[j];
            g[j] = pj * (fr[j] * g[j] - di);
            p[j] = pj * fr[j];
          }
        } else {
          for (int64_t j = 0; j < m; ++j) g[j] = p[j] * (g[j] - di);
        }
        // Keys of the range outside this row's window: P = dS = 0.
        std::fill(pb + i * n, p, 0.f);
        std::fill(p + m, pb + (i + 1) * n, 0.f);
        std::fill(gb + i * n, g, 0.f);
        std::fill(g + m, gb + (i + 1) * n, 0.f);
      }
      float beta = 0.f;
      if (written > kr.lo) {
        for (int64_t j = written; j < kr.hi; ++j) {
          std::fill(dk0 + j * a.ld, dk0 + j * a.ld + d, 0.f);
          std::fill(dv0 + j * a.ld, dv0 + j * a.ld + d, 0.f);
        }
        beta = 1.f;
      }
      written = std::max(written, kr.hi);
      gemm(true, false, n, d, rows, 1.f, pb, n, do0 + i0 * a.hidden, a.hidden, beta,
           dv0 + kr.lo * a.ld, a.ld);
      gemm(false, false, rows, d, n, a.scale, gb, n, kr0, a.ld, 0.f, dq0 + i0 * a.ld, a.ld);
      gemm(true, false, n, d, rows, a.scale, gb, n, q0 + i0 * a.ld, a.ld, beta, dk0 + kr.lo * a.ld,
           a.ld);
    }
  }
}

}  // namespace packbert
