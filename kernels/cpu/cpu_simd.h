// Vectorised elementwise helpers shared by the CPU backend's files (SSE2, the x86-64 baseline,
// with a scalar fallback of the same formula elsewhere).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__SSE2__)
#include <xmmintrin.h>  // _MM_TRANSPOSE4_PS
#include <emmintrin.h>
#endif

#include "kernels/common/math.h"
#include "kernels/common/philox.h"

namespace packbert::cpu {

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
inline void exp_shifted(float* p, float shift, int64_t n) {
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

inline float row_max(const float* p, int64_t n) {
  __m128 m = _mm_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) m = _mm_max_ps(m, _mm_loadu_ps(p + j));
  float lanes[4];
  _mm_storeu_ps(lanes, m);
  float mx = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  for (; j < n; ++j) mx = std::max(mx, p[j]);
  return mx;
}
// The sum over j < n of exp(x[j] - shift) in double, in a fixed order (four double lanes, then
// the lanes in order); with out, also out[j] = exp(x[j] - shift) (out may alias x). Every
// element, the tail included, goes through exp4: the tail is padded with arguments below
// kExpMin, whose exp4 is exactly 0.
inline double exp_shifted_sum(const float* x, float shift, int64_t n, float* out) {
  const __m128 s = _mm_set1_ps(shift);
  __m128d acc0 = _mm_setzero_pd(), acc1 = _mm_setzero_pd();
  auto step = [&](__m128 v) {
    const __m128 e = exp4(_mm_sub_ps(v, s));
    acc0 = _mm_add_pd(acc0, _mm_cvtps_pd(e));
    acc1 = _mm_add_pd(acc1, _mm_cvtps_pd(_mm_movehl_ps(e, e)));
    return e;
  };
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const __m128 e = step(_mm_loadu_ps(x + j));
    if (out) _mm_storeu_ps(out + j, e);
  }
  if (j < n) {
    float t[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    std::copy(x + j, x + n, t);
    _mm_storeu_ps(t, step(_mm_loadu_ps(t)));
    if (out) std::copy(t, t + (n - j), out + j);
  }
  double lanes[4];
  _mm_storeu_pd(lanes, acc0);
  _mm_storeu_pd(lanes + 2, acc1);
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}
#else
// Portable fallback: the same formula one element at a time.
inline void exp_shifted(float* p, float shift, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = p[j] - shift, xc = std::max(x, kExpMin);
    const float nf = (xc * kLog2e + kRound) - kRound;
    const float r = (xc - nf * kLn2Hi) - nf * kLn2Lo;
    float q = kExpPoly[0];
    for (int c = 1; c < 6; ++c) q = q * r + kExpPoly[c];
    p[j] = x < kExpMin ? 0.f : std::ldexp(q * (r * r) + r + 1.f, static_cast<int>(nf));
  }
}

inline float row_max(const float* p, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j]);
  return mx;
}
inline double exp_shifted_sum(const float* x, float shift, int64_t n, float* out) {
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    float e = x[j];
    exp_shifted(&e, shift, 1);
    sum += e;
    if (out) out[j] = e;
  }
  return sum;
}
#endif

// The dropout multipliers of `len` consecutive elements [first, first + len) of one (sample,
// head, position), into factors[0 .. len), first a multiple of 16 (a group of 4 calls never
// straddles a carry of the counter's element bits) -- an attention row (position = query,
// element = key) or a token row (head 0, element = hidden unit): the Philox words of
// kernels/common/philox.h, bit for bit. Each Philox call gives 4 keys; the SSE2 path runs 4
// calls (16 keys) side by side, one per lane -- on the scalar path Philox costs about as much as
// the attention GEMMs. The ragged tail computes whole groups and keeps the factors it needs
// (Philox is a pure function of the counter, so extra words change nothing).
#if defined(__SSE2__)
// The high and low 32 bits of a * m for the 4 lanes of a (SSE2 multiplies lanes 0 and 2).
inline void mulhilo4(__m128i a, __m128i m, __m128i& hi, __m128i& lo) {
  const __m128i p02 = _mm_mul_epu32(a, m);
  const __m128i p13 = _mm_mul_epu32(_mm_srli_epi64(a, 32), m);
  const __m128i low32 = _mm_set_epi32(0, -1, 0, -1);
  lo = _mm_or_si128(_mm_and_si128(p02, low32), _mm_slli_epi64(p13, 32));
  hi = _mm_or_si128(_mm_srli_epi64(p02, 32), _mm_andnot_si128(low32, p13));
}

inline void dropout_row(const DropoutStream& ds, uint64_t sample, uint32_t head, uint32_t qpos,
                        int64_t len, float* factors, int64_t first = 0) {
  const __m128i m0 = _mm_set1_epi32(static_cast<int32_t>(philox_detail::kM0));
  const __m128i m1 = _mm_set1_epi32(static_cast<int32_t>(philox_detail::kM1));
  // Counter words 1 and 2 are the same for every key of the row, word 3 for every group of 16
  // keys (its element bits change every 2^18 keys; see dropout_counter).
  const Philox4x32 row_ctr = dropout_counter(ds, sample, head, qpos, 0);
  const auto ctr1 = static_cast<int32_t>(row_ctr.v[1]);
  const auto ctr2 = static_cast<int32_t>(row_ctr.v[2]);
  // Unsigned bits >= threshold, as a signed compare after flipping the sign bits.
  const __m128i sign = _mm_set1_epi32(INT32_MIN);
  const __m128i thr = _mm_xor_si128(_mm_set1_epi32(static_cast<int32_t>(ds.threshold)), sign);
  const __m128 scale = _mm_set1_ps(ds.scale);
  for (int64_t j0 = 0; j0 < len; j0 += 16) {
    const Philox4x32 ctr =
        dropout_counter(ds, sample, head, qpos, static_cast<uint32_t>(first + j0));
    const auto c0 = static_cast<int32_t>(ctr.v[0]);
    const auto ctr3 = static_cast<int32_t>(ctr.v[3]);
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
inline void dropout_row(const DropoutStream& ds, uint64_t sample, uint32_t head, uint32_t qpos,
                        int64_t len, float* factors, int64_t first = 0) {
  for (int64_t j0 = 0; j0 < len; j0 += 4) {
    const Philox4x32 bits =
        dropout_bits4(ds, sample, head, qpos, static_cast<uint32_t>(first + j0));
    for (int64_t k = 0; k < 4 && j0 + k < len; ++k) factors[j0 + k] = dropout_factor(ds, bits.v[k]);
  }
}
#endif

// ---- GELU (erf form) ---------------------------------------------------------------------
// 1 + erf(z), 4 lanes: |z| < 1 by erf's Taylor series (12 terms, relative error ~1e-10 before
// rounding), |z| >= 1 by erfc(|z|) = t exp(-z^2 - 1.26551223 + t P(t)), t = 1 / (1 + |z|/2)
// (Numerical Recipes' erfcc, relative error < 1.2e-7 for every z >= 0), so 1 + erf(z) keeps its
// relative accuracy in the far negative tail, where GELU is tiny. Same formula scalar below.
constexpr float kErfTaylor[12] = {
    1.1283791670955126f,      -0.37612638903183754f,   0.11283791670955126f,
    -0.026866170645131252f,   0.005223977625442188f,   -0.0008548327023450852f,
    0.00012055332981789664f,  -1.492565035840625e-05f, 1.6462114365889246e-06f,
    -1.6365844691234924e-07f, 1.4807192815879218e-08f, -1.2290555301717926e-09f};
constexpr float kErfcPoly[9] = {
    -0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f,
    0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};  // Horner from 0.17087277
constexpr float kErfcLead = 0.17087277f;
constexpr float kSqrtHalf = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;

#if defined(__SSE2__)
inline __m128 one_plus_erf4(__m128 z) {
  const __m128 one = _mm_set1_ps(1.f);
  const __m128 az = _mm_andnot_ps(_mm_set1_ps(-0.0f), z);
  const __m128 z2 = _mm_mul_ps(z, z);
  __m128 p = _mm_set1_ps(kErfTaylor[11]);
  for (int i = 10; i >= 0; --i) p = _mm_add_ps(_mm_mul_ps(p, z2), _mm_set1_ps(kErfTaylor[i]));
  const __m128 small = _mm_add_ps(one, _mm_mul_ps(z, p));
  const __m128 t = _mm_div_ps(one, _mm_add_ps(one, _mm_mul_ps(_mm_set1_ps(0.5f), az)));
  __m128 q = _mm_set1_ps(kErfcLead);
  for (int i = 0; i < 8; ++i) q = _mm_add_ps(_mm_mul_ps(q, t), _mm_set1_ps(kErfcPoly[i]));
  // q = 1.00002368 + t (...): the exponent is -z^2 - 1.26551223 + t q.
  const __m128 arg = _mm_add_ps(_mm_sub_ps(_mm_mul_ps(t, q), z2), _mm_set1_ps(kErfcPoly[8]));
  const __m128 erfc = _mm_mul_ps(t, exp4(arg));
  const __m128 neg = _mm_cmplt_ps(z, _mm_setzero_ps());
  const __m128 large =
      _mm_or_ps(_mm_and_ps(neg, erfc), _mm_andnot_ps(neg, _mm_sub_ps(_mm_set1_ps(2.f), erfc)));
  const __m128 use_small = _mm_cmplt_ps(az, one);
  return _mm_or_ps(_mm_and_ps(use_small, small), _mm_andnot_ps(use_small, large));
}

inline __m128 gelu4(__m128 x) {
  return _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(0.5f), x),
                    one_plus_erf4(_mm_mul_ps(x, _mm_set1_ps(kSqrtHalf))));
}

// d gelu / dx = Phi(x) + x phi(x).
inline __m128 gelu_grad4(__m128 x) {
  const __m128 cdf =
      _mm_mul_ps(_mm_set1_ps(0.5f), one_plus_erf4(_mm_mul_ps(x, _mm_set1_ps(kSqrtHalf))));
  const __m128 pdf =
      _mm_mul_ps(_mm_set1_ps(kInvSqrt2Pi), exp4(_mm_mul_ps(_mm_set1_ps(-0.5f), _mm_mul_ps(x, x))));
  return _mm_add_ps(cdf, _mm_mul_ps(x, pdf));
}

// tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2 |u|) <= 1 (exp4's domain); absolute
// error a few ulp of 1, which is what GELU's 1 + tanh and 1 - tanh^2 see.
inline __m128 tanh4(__m128 u) {
  const __m128 sign = _mm_and_ps(u, _mm_set1_ps(-0.f));
  const __m128 a = _mm_andnot_ps(_mm_set1_ps(-0.f), u);
  const __m128 e = exp4(_mm_mul_ps(_mm_set1_ps(-2.f), a));
  const __m128 one = _mm_set1_ps(1.f);
  return _mm_or_ps(sign, _mm_div_ps(_mm_sub_ps(one, e), _mm_add_ps(one, e)));
}

// The tanh GELU and its derivative (kernels/common/math.h gelu_tanh, gelu_tanh_grad).
inline __m128 gelu_tanh_arg4(__m128 x) {
  const __m128 x3 = _mm_mul_ps(_mm_mul_ps(x, x), x);
  return _mm_mul_ps(_mm_set1_ps(kSqrt2OverPi),
                    _mm_add_ps(x, _mm_mul_ps(_mm_set1_ps(0.044715f), x3)));
}

inline __m128 gelu_tanh4(__m128 x) {
  const __m128 t = tanh4(gelu_tanh_arg4(x));
  return _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(0.5f), x), _mm_add_ps(_mm_set1_ps(1.f), t));
}

inline __m128 gelu_tanh_grad4(__m128 x) {
  const __m128 half = _mm_set1_ps(0.5f), one = _mm_set1_ps(1.f);
  const __m128 t = tanh4(gelu_tanh_arg4(x));
  const __m128 du =
      _mm_mul_ps(_mm_set1_ps(kSqrt2OverPi),
                 _mm_add_ps(one, _mm_mul_ps(_mm_set1_ps(0.134145f), _mm_mul_ps(x, x))));
  const __m128 sech2 = _mm_sub_ps(one, _mm_mul_ps(t, t));
  return _mm_add_ps(_mm_mul_ps(half, _mm_add_ps(one, t)),
                    _mm_mul_ps(_mm_mul_ps(half, x), _mm_mul_ps(sech2, du)));
}

// Applies f4 to n floats of x, 4 at a time; the tail is padded (with 0) and goes through the same
// 4-lane code, so an element's value never depends on its index or alignment.
template <typename F4, typename Store>
inline void map4(const float* x, int64_t n, F4 f4, Store store) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) store(j, f4(_mm_loadu_ps(x + j)), 4);
  if (j < n) {
    float t[4] = {0.f, 0.f, 0.f, 0.f};
    std::copy(x + j, x + n, t);
    store(j, f4(_mm_loadu_ps(t)), n - j);
  }
}

// y[j] = f4(x[j]) (y may alias x).
template <typename F4>
inline void map4_to(const float* x, float* y, int64_t n, F4 f4) {
  map4(x, n, f4, [y](int64_t j, __m128 v, int64_t cnt) {
    if (cnt == 4) {
      _mm_storeu_ps(y + j, v);
    } else {
      float t[4];
      _mm_storeu_ps(t, v);
      std::copy(t, t + cnt, y + j);
    }
  });
}

// g[j] *= f4(pre[j]).
template <typename F4>
inline void map4_mul(float* g, const float* pre, int64_t n, F4 f4) {
  map4(pre, n, f4, [g](int64_t j, __m128 v, int64_t cnt) {
    if (cnt == 4) {
      _mm_storeu_ps(g + j, _mm_mul_ps(_mm_loadu_ps(g + j), v));
    } else {
      float t[4];
      _mm_storeu_ps(t, v);
      for (int64_t i = 0; i < cnt; ++i) g[j + i] *= t[i];
    }
  });
}

// y[j] = gelu(x[j]) (y may alias x); g[j] *= gelu'(pre[j]); the same for the tanh form.
inline void gelu_to(const float* x, float* y, int64_t n) { map4_to(x, y, n, gelu4); }
inline void mul_gelu_grad(float* g, const float* pre, int64_t n) {
  map4_mul(g, pre, n, gelu_grad4);
}
inline void gelu_tanh_to(const float* x, float* y, int64_t n) { map4_to(x, y, n, gelu_tanh4); }
inline void mul_gelu_tanh_grad(float* g, const float* pre, int64_t n) {
  map4_mul(g, pre, n, gelu_tanh_grad4);
}
#else
inline float one_plus_erf(float z) {
  const float az = std::fabs(z), z2 = z * z;
  if (az < 1.f) {
    float p = kErfTaylor[11];
    for (int i = 10; i >= 0; --i) p = p * z2 + kErfTaylor[i];
    return 1.f + z * p;
  }
  const float t = 1.f / (1.f + 0.5f * az);
  float q = kErfcLead;
  for (int i = 0; i < 8; ++i) q = q * t + kErfcPoly[i];
  float e = (t * q - z2) + kErfcPoly[8];
  exp_shifted(&e, 0.f, 1);
  const float erfc = t * e;
  return z < 0.f ? erfc : 2.f - erfc;
}

inline void gelu_to(const float* x, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = 0.5f * x[j] * one_plus_erf(x[j] * kSqrtHalf);
}

inline void mul_gelu_grad(float* g, const float* pre, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = pre[j];
    float e = -0.5f * (x * x);
    exp_shifted(&e, 0.f, 1);
    g[j] *= 0.5f * one_plus_erf(x * kSqrtHalf) + x * (kInvSqrt2Pi * e);
  }
}

inline void gelu_tanh_to(const float* x, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = gelu_tanh(x[j]);
}

inline void mul_gelu_tanh_grad(float* g, const float* pre, int64_t n) {
  for (int64_t j = 0; j < n; ++j) g[j] *= gelu_tanh_grad(pre[j]);
}
#endif

}  // namespace packbert::cpu
