// Variable-length multi-head attention over (sequence start, length) ranges of a token buffer.
//
// One task per (sequence, head), scheduled dynamically (lengths vary); a task owns the q/k/v
// slots of its head in its sequence's rows, so tasks never write the same element and every sum
// runs in a fixed order: results do not depend on the thread count, nor on where the sequence
// sits in the buffer (the packed-vs-unpadded tests compare bits).
//
// Like FlashAttention, forward saves only the log-sum-exp of each query row; backward recomputes
// the probabilities from it and the dropout mask from the Philox key, and uses
// D_i = dO_i . O_i for the softmax gradient (with dropout, sum_j P_ij dP_ij = dO_i . O_i still).
//
// Speed: a task works on blocks of kQueryBlock query rows against all keys of its sequence. The
// score block S = Q K^T, the outputs P V and the backward products (dP = dO V^T, dV = P^T dO,
// dQ = dS K, dK = dS^T Q) are single-threaded cblas_sgemm calls on strided views of the qkv
// buffer (ld = 3H); only the elementwise softmax / dropout work runs in our own loops, with
// the exp and the Philox mask in SSE2 (scalar, each cost as much as all the GEMMs).
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

#if defined(__SSE2__)
#include <xmmintrin.h>  // _MM_TRANSPOSE4_PS
#include <emmintrin.h>
#endif

#include "cpu/cpu_backend.h"
#include "cpu/cpu_common.h"

namespace packbert {

using cpu::expect;

namespace {

// Query rows per block: the score and gradient blocks (2 x 128 x 512 floats at most) stay in a
// core's L2, and a 128-row GEMM is large enough for OpenBLAS's kernels.
constexpr int64_t kQueryBlock = 128;

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// exp(x) for x <= 0 (softmax arguments after subtracting the row max or the lse), Cephes' expf
// polynomial (about 1 ulp): x = n ln2 + r with |r| <= ln2/2, exp(x) = 2^n e^r; x < -87 (where
// exp leaves the normal floats) gives 0. Written with SSE2 intrinsics (baseline x86-64): GCC
// does not vectorise the scalar form, and the exp is as costly as the GEMMs when scalar. Every
// element, the ragged tail included, goes through the same 4-lane code, so an element's value
// never depends on its index or alignment.
constexpr float kExpMin = -87.0f;
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to integer
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#if defined(__SSE2__)
inline __m128 exp4(__m128 x) {
  const __m128 lo = _mm_set1_ps(kExpMin), round = _mm_set1_ps(kRound);
  const __m128 under = _mm_cmplt_ps(x, lo);
  const __m128 xc = _mm_max_ps(x, lo);
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(xc, _mm_set1_ps(kLog2e)), round), round);
  const __m128 r = _mm_sub_ps(_mm_sub_ps(xc, _mm_mul_ps(n, _mm_set1_ps(kLn2Hi))),
                              _mm_mul_ps(n, _mm_set1_ps(kLn2Lo)));
  __m128 p = _mm_set1_ps(kExpPoly[0]);
  for (int c = 1; c < 6; ++c) p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(kExpPoly[c]));
  const __m128 er = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(r, r)), r), _mm_set1_ps(1.f));
  const __m128i two_n =
      _mm_slli_epi32(_mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127)), 23);  // 2^n
  return _mm_andnot_ps(under, _mm_mul_ps(er, _mm_castsi128_ps(two_n)));
}

// p[j] = exp(p[j] - shift) for j < n (all arguments <= 0 up to rounding).
void exp_shifted(float* p, float shift, int64_t n) {
  const __m128 s = _mm_set1_ps(shift);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) _mm_storeu_ps(p + j, exp4(_mm_sub_ps(_mm_loadu_ps(p + j), s)));
  if (j < n) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    std::copy(p + j, p + n, t);
    _mm_storeu_ps(t, exp4(_mm_sub_ps(_mm_loadu_ps(t), s)));
    std::copy(t, t + (n - j), p + j);
  }
}

float row_max(const float* p, int64_t n) {
  __m128 m = _mm_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) m = _mm_max_ps(m, _mm_loadu_ps(p + j));
  float lanes[4];
  _mm_storeu_ps(lanes, m);
  float mx = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  for (; j < n; ++j) mx = std::max(mx, p[j]);
  return mx;
}
#else
// Portable fallback: the same formula one element at a time.
void exp_shifted(float* p, float shift, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = p[j] - shift, xc = std::max(x, kExpMin);
    const float nf = (xc * kLog2e + kRound) - kRound;
    const float r = (xc - nf * kLn2Hi) - nf * kLn2Lo;
    float q = kExpPoly[0];
    for (int c = 1; c < 6; ++c) q = q * r + kExpPoly[c];
    p[j] = x < kExpMin ? 0.f : std::ldexp(q * (r * r) + r + 1.f, static_cast<int>(nf));
  }
}

float row_max(const float* p, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j]);
  return mx;
}
#endif

// Single-threaded cblas_sgemm, row-major: C = alpha op(A) op(B) + beta C.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// OpenBLAS runs one thread while an attention op's OpenMP tasks call it (see the top).
class BlasSingleThread {
 public:
  BlasSingleThread() : threads_(openblas_get_num_threads()) {
    if (threads_ != 1) openblas_set_num_threads(1);
  }
  ~BlasSingleThread() {
    if (threads_ != 1) openblas_set_num_threads(threads_);
  }
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int threads_;
};

// Shapes of one attention call, checked once.
struct AttnShape {
  int64_t rows, hidden, heads, head_dim, ld;  // ld = 3 * hidden, the qkv row stride
  float scale;                                // 1 / sqrt(head_dim)
};

AttnShape attention_shape(const char* op, const SeqLayout& layout, const Tensor& qkv,
                          int num_heads) {
  expect(op, "qkv", qkv, DType::f32, {layout.rows, kAnyDim});
  const int64_t ld = qkv.dim(1), hidden = ld / 3;
  PB_REQUIRE(ld % 3 == 0 && num_heads >= 1 && hidden % num_heads == 0,
             "{}: qkv width {} is not 3 x hidden with hidden divisible by {} heads", op, ld,
             num_heads);
  PB_REQUIRE(ld <= 0x7fffffff && layout.max_len <= 0x7fffffff / 4,
             "{}: qkv width {} or max_len {} exceeds the BLAS int range", op, ld, layout.max_len);
  const int64_t d = hidden / num_heads;
  return AttnShape{layout.rows, hidden, num_heads, d, ld,
                   static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}

// The dropout multipliers of query row `qpos` against keys [0, len) of one (sample, head): the
// Philox words of kernels/common/philox.h, bit for bit. Each Philox call gives 4 keys; the SSE2
// path runs 4 calls (16 keys) side by side, one per lane -- on the scalar path Philox costs
// about as much as the attention GEMMs. The ragged tail computes whole groups and keeps the
// factors it needs (Philox is a pure function of the counter, so extra words change nothing).
#if defined(__SSE2__)
// The high and low 32 bits of a * m for the 4 lanes of a (SSE2 multiplies lanes 0 and 2).
inline void mulhilo4(__m128i a, __m128i m, __m128i& hi, __m128i& lo) {
  const __m128i p02 = _mm_mul_epu32(a, m);
  const __m128i p13 = _mm_mul_epu32(_mm_srli_epi64(a, 32), m);
  const __m128i low32 = _mm_set_epi32(0, -1, 0, -1);
  lo = _mm_or_si128(_mm_and_si128(p02, low32), _mm_slli_epi64(p13, 32));
  hi = _mm_or_si128(_mm_srli_epi64(p02, 32), _mm_andnot_si128(low32, p13));
}

void attention_dropout_row(const DropoutStream& ds, uint64_t sample, uint32_t head,
                           uint32_t qpos, int64_t len, float* factors) {
  const __m128i m0 = _mm_set1_epi32(static_cast<int32_t>(philox_detail::kM0));
  const __m128i m1 = _mm_set1_epi32(static_cast<int32_t>(philox_detail::kM1));
  // Counter words 1..3 are the same for every key of the row (see dropout_bits4).
  const auto ctr1 = static_cast<int32_t>(ds.layer_site | (head << 12) |
                                         (static_cast<uint32_t>(sample >> 32) << 20));
  const auto ctr2 = static_cast<int32_t>(static_cast<uint32_t>(sample));
  const auto ctr3 = static_cast<int32_t>(ds.step);
  // Unsigned bits >= threshold, as a signed compare after flipping the sign bits.
  const __m128i sign = _mm_set1_epi32(INT32_MIN);
  const __m128i thr = _mm_xor_si128(_mm_set1_epi32(static_cast<int32_t>(ds.threshold)), sign);
  const __m128 scale = _mm_set1_ps(ds.scale);
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const auto c0 = static_cast<int32_t>((static_cast<uint32_t>(j0) >> 2) | (qpos << 16));
    __m128i v0 = _mm_add_epi32(_mm_set1_epi32(c0), _mm_set_epi32(3, 2, 1, 0));
    __m128i v1 = _mm_set1_epi32(ctr1), v2 = _mm_set1_epi32(ctr2), v3 = _mm_set1_epi32(ctr3);
    uint32_t k0 = ds.key0, k1 = ds.key1;
    for (int r = 0; r < 10; ++r) {
      if (r > 0) {
        k0 += philox_detail::kW0;
        k1 += philox_detail::kW1;
      }
      __m128i hi0, lo0, hi1, lo1;
      mulhilo4(v0, m0, hi0, lo0);
      mulhilo4(v2, m1, hi1, lo1);
      v0 = _mm_xor_si128(_mm_xor_si128(hi1, v1), _mm_set1_epi32(static_cast<int32_t>(k0)));
      v1 = lo1;
      v2 = _mm_xor_si128(_mm_xor_si128(hi0, v3), _mm_set1_epi32(static_cast<int32_t>(k1)));
      v3 = lo0;
    }
    // Word w of lane l is key j0 + 4 l + w: factor = scale where kept, else 0; then transpose
    // so each lane's 4 words become 4 consecutive keys.
    __m128 f[4];
    const __m128i* words[4] = {&v0, &v1, &v2, &v3};
    for (int w = 0; w < 4; ++w) {
      const __m128i dropped = _mm_cmplt_epi32(_mm_xor_si128(*words[w], sign), thr);
      f[w] = _mm_andnot_ps(_mm_castsi128_ps(dropped), scale);
    }
    _MM_TRANSPOSE4_PS(f[0], f[1], f[2], f[3]);
    if (j0 + 16 <= len) {
      for (int l = 0; l < 4; ++l) _mm_storeu_ps(factors + j0 + 4 * l, f[l]);
    } else {
      float t[16];
      for (int l = 0; l < 4; ++l) _mm_storeu_ps(t + 4 * l, f[l]);
      std::copy(t, t + (len - j0), factors + j0);
    }
  }
}
#else
void attention_dropout_row(const DropoutStream& ds, uint64_t sample, uint32_t head,
                           uint32_t qpos, int64_t len, float* factors) {
  for (int64_t j0 = 0; j0 < len; j0 += 4) {
    const Philox4x32 bits = dropout_bits4(ds, sample, head, qpos, static_cast<uint32_t>(j0));
    for (int64_t k = 0; k < 4 && j0 + k < len; ++k) factors[j0 + k] = dropout_factor(ds, bits.v[k]);
  }
}
#endif

// Rows that belong to no sequence: attention writes zeros there (see backend.h).
template <typename F>
void for_padding_rows(const SeqLayout& layout, F&& f) {
  const int32_t* tseq = layout.token_seq.ptr<int32_t>();
  for (int64_t r = 0; r < layout.rows; ++r)
    if (tseq[r] < 0) f(r);
}

// Floats of per-thread scratch: two [block, max_len] blocks and one dropout row.
size_t attention_scratch(const SeqLayout& layout) {
  const auto len = static_cast<size_t>(layout.max_len);
  return 2 * static_cast<size_t>(std::min<int64_t>(kQueryBlock, layout.max_len)) * len + len;
}

}  // namespace

void CpuBackend::attention_forward(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                   const Dropout& dropout, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_forward";
  const AttnShape a = attention_shape(op, layout, qkv, num_heads);
  expect(op, "out", out, DType::f32, {a.rows, a.hidden});
  expect(op, "lse", lse, DType::f32, {a.rows, a.heads});
  cpu::check_layout(op, layout, a.rows);
  const DropoutStream ds = cpu::dropout_stream(op, dropout, layout.max_len, a.heads, layout.max_len);
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
  const size_t scratch = attention_scratch(layout);
  reserve_thread_scratch(scratch);
  const int64_t tasks = static_cast<int64_t>(layout.num_seqs) * a.heads;
  const BlasSingleThread blas_guard;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t s = t / a.heads, head = t % a.heads, len = lens[s], start = starts[s];
    const int64_t block = std::min(kQueryBlock, len);
    float* sc = thread_scratch(omp_get_thread_num(), scratch);  // [block, len] scores -> probs
    float* f = sc + 2 * block * len;                             // [len] dropout factors
    const float* q0 = base + start * a.ld + head * d;
    const float* k0 = q0 + a.hidden;
    const float* v0 = k0 + a.hidden;
    for (int64_t i0 = 0; i0 < len; i0 += block) {
      const int64_t rows = std::min(block, len - i0);
      gemm(false, true, rows, len, d, a.scale, q0 + i0 * a.ld, a.ld, k0, a.ld, 0.f, sc, len);
      for (int64_t i = 0; i < rows; ++i) {
        float* p = sc + i * len;
        const float mx = row_max(p, len);
        exp_shifted(p, mx, len);
        // The sum in double, over 8 interleaved partial sums combined in a fixed order (the
        // partials hide the add latency; the order never depends on the thread).
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + 8 <= len; j += 8)
          for (int c = 0; c < 8; ++c) part[c] += p[j + c];
        for (; j < len; ++j) part[0] += p[j];
        const double sum = ((part[0] + part[1]) + (part[2] + part[3])) +
                           ((part[4] + part[5]) + (part[6] + part[7]));
        l[(start + i0 + i) * a.heads + head] = mx + static_cast<float>(std::log(sum));
        const auto inv = static_cast<float>(1.0 / sum);
        if (drop) {
          attention_dropout_row(ds, static_cast<uint64_t>(samples[s]), static_cast<uint32_t>(head),
                                static_cast<uint32_t>(i0 + i), len, f);
          for (int64_t c = 0; c < len; ++c) p[c] = p[c] * inv * f[c];
        } else {
          for (int64_t c = 0; c < len; ++c) p[c] = p[c] * inv;
        }
      }
      gemm(false, false, rows, d, len, 1.f, sc, len, v0, a.ld, 0.f,
           o + (start + i0) * a.hidden + head * d, a.hidden);
    }
  }
}

void CpuBackend::attention_backward(const SeqLayout& layout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const Tensor& dout, int num_heads,
                                    const Dropout& dropout, const Tensor& dqkv) {
  const char* op = "attention_backward";
  const AttnShape a = attention_shape(op, layout, qkv, num_heads);
  expect(op, "out", out, DType::f32, {a.rows, a.hidden});
  expect(op, "lse", lse, DType::f32, {a.rows, a.heads});
  expect(op, "dout", dout, DType::f32, {a.rows, a.hidden});
  expect(op, "dqkv", dqkv, DType::f32, {a.rows, a.ld});
  cpu::check_layout(op, layout, a.rows);
  const DropoutStream ds = cpu::dropout_stream(op, dropout, layout.max_len, a.heads, layout.max_len);
  const bool drop = dropout_enabled(ds);

  const float* base = qkv.ptr<float>();
  const float* o = out.ptr<float>();
  const float* l = lse.ptr<float>();
  const float* dO = dout.ptr<float>();
  float* dbase = dqkv.ptr<float>();
  for_padding_rows(layout, [&](int64_t r) { std::fill(dbase + r * a.ld, dbase + (r + 1) * a.ld, 0.f); });
  const int32_t* starts = layout.seq_start.ptr<int32_t>();
  const int32_t* lens = layout.seq_len.ptr<int32_t>();
  const int64_t* samples = layout.sample_id.ptr<int64_t>();
  const int64_t d = a.head_dim;
  const size_t scratch = attention_scratch(layout);
  reserve_thread_scratch(scratch);
  const int64_t tasks = static_cast<int64_t>(layout.num_seqs) * a.heads;
  const BlasSingleThread blas_guard;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t s = t / a.heads, head = t % a.heads, len = lens[s], start = starts[s];
    const int64_t block = std::min(kQueryBlock, len);
    float* pb = thread_scratch(omp_get_thread_num(), scratch);  // [block, len] P, then P * F
    float* gb = pb + block * len;                                // [block, len] dP, then dS
    float* f = gb + block * len;                                 // [len] dropout factors
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
    // dK and dV shares in block order (beta = 1 after the first).
    for (int64_t i0 = 0; i0 < len; i0 += block) {
      const int64_t rows = std::min(block, len - i0);
      const float beta = i0 == 0 ? 0.f : 1.f;
      gemm(false, true, rows, len, d, a.scale, q0 + i0 * a.ld, a.ld, k0, a.ld, 0.f, pb, len);
      gemm(false, true, rows, len, d, 1.f, do0 + i0 * a.hidden, a.hidden, v0, a.ld, 0.f, gb, len);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t qi = i0 + i;
        const float di = dot(do0 + qi * a.hidden, o0 + qi * a.hidden, d);
        const float lse_i = l[(start + qi) * a.heads + head];
        float* p = pb + i * len;
        float* g = gb + i * len;
        exp_shifted(p, lse_i, len);  // P = exp(S - lse)
        if (drop) {
          attention_dropout_row(ds, static_cast<uint64_t>(samples[s]), static_cast<uint32_t>(head),
                                static_cast<uint32_t>(qi), len, f);
          for (int64_t j = 0; j < len; ++j) {
            const float pj = p[j];
            g[j] = pj * (f[j] * g[j] - di);
            p[j] = pj * f[j];
          }
        } else {
          for (int64_t j = 0; j < len; ++j) g[j] = p[j] * (g[j] - di);
        }
      }
      gemm(true, false, len, d, rows, 1.f, pb, len, do0 + i0 * a.hidden, a.hidden, beta, dv0, a.ld);
      gemm(false, false, rows, d, len, a.scale, gb, len, k0, a.ld, 0.f, dq0 + i0 * a.ld, a.ld);
      gemm(true, false, len, d, rows, a.scale, gb, len, q0 + i0 * a.ld, a.ld, beta, dk0, a.ld);
    }
  }
}

}  // namespace packbert
