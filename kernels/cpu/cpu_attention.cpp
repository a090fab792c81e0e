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
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "cpu/cpu_backend.h"
#include "cpu/cpu_common.h"

namespace packbert {

using cpu::expect;

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

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
  const int64_t d = hidden / num_heads;
  return AttnShape{layout.rows, hidden, num_heads, d, ld,
                   static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}

// The dropout multipliers of query row `qpos` against keys [0, len) of one (sample, head).
void attention_dropout_row(const DropoutStream& ds, uint64_t sample, uint32_t head,
                           uint32_t qpos, int64_t len, float* factors) {
  if (!dropout_enabled(ds)) {
    std::fill(factors, factors + len, 1.0f);
    return;
  }
  for (int64_t j0 = 0; j0 < len; j0 += 4) {
    const Philox4x32 bits = dropout_bits4(ds, sample, head, qpos, static_cast<uint32_t>(j0));
    for (int64_t k = 0; k < 4 && j0 + k < len; ++k) factors[j0 + k] = dropout_factor(ds, bits.v[k]);
  }
}

// Rows that belong to no sequence: attention writes zeros there (see backend.h).
template <typename F>
void for_padding_rows(const SeqLayout& layout, F&& f) {
  const int32_t* tseq = layout.token_seq.ptr<int32_t>();
  for (int64_t r = 0; r < layout.rows; ++r)
    if (tseq[r] < 0) f(r);
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
  const size_t scratch = 2 * static_cast<size_t>(layout.max_len) + static_cast<size_t>(d);
  reserve_thread_scratch(scratch);
  const int64_t tasks = static_cast<int64_t>(layout.num_seqs) * a.heads;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t s = t / a.heads, head = t % a.heads, len = lens[s], start = starts[s];
    float* p = thread_scratch(omp_get_thread_num(), scratch);  // [len] probabilities
    float* f = p + layout.max_len;                             // [len] dropout factors
    float* acc = f + layout.max_len;                           // [d] output row
    const float* q0 = base + start * a.ld + head * d;
    const float* k0 = q0 + a.hidden;
    const float* v0 = k0 + a.hidden;
    for (int64_t i = 0; i < len; ++i) {
      const float* qi = q0 + i * a.ld;
      float mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        p[j] = a.scale * dot(qi, k0 + j * a.ld, d);
        mx = std::max(mx, p[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < len; ++j) sum += std::exp(static_cast<double>(p[j] - mx));
      const float lse_i = mx + static_cast<float>(std::log(sum));
      attention_dropout_row(ds, static_cast<uint64_t>(samples[s]), static_cast<uint32_t>(head),
                            static_cast<uint32_t>(i), len, f);
      std::fill(acc, acc + d, 0.f);
      for (int64_t j = 0; j < len; ++j) {
        const float pj = std::exp(p[j] - lse_i) * f[j];
        if (pj != 0.f) axpy(pj, v0 + j * a.ld, acc, d);
      }
      std::copy(acc, acc + d, o + (start + i) * a.hidden + head * d);
      l[(start + i) * a.heads + head] = lse_i;
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
  const auto max_len = static_cast<size_t>(layout.max_len);
  const size_t scratch = 2 * max_len + 2 * max_len * static_cast<size_t>(d) + static_cast<size_t>(d);
  reserve_thread_scratch(scratch);
  const int64_t tasks = static_cast<int64_t>(layout.num_seqs) * a.heads;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t s = t / a.heads, head = t % a.heads, len = lens[s], start = starts[s];
    float* p = thread_scratch(omp_get_thread_num(), scratch);  // [len] probabilities (no dropout)
    float* f = p + max_len;                                    // [len] dropout factors
    float* dk = f + max_len;                                   // [len, d] accumulated dK
    float* dv = dk + max_len * d;                              // [len, d] accumulated dV
    float* dq = dv + max_len * d;                              // [d] one dQ row
    std::fill(dk, dk + len * d, 0.f);
    std::fill(dv, dv + len * d, 0.f);
    const float* q0 = base + start * a.ld + head * d;
    const float* k0 = q0 + a.hidden;
    const float* v0 = k0 + a.hidden;
    for (int64_t i = 0; i < len; ++i) {
      const int64_t row = start + i;
      const float* qi = q0 + i * a.ld;
      const float* doi = dO + row * a.hidden + head * d;
      const float di = dot(doi, o + row * a.hidden + head * d, d);
      const float lse_i = l[row * a.heads + head];
      for (int64_t j = 0; j < len; ++j) p[j] = std::exp(a.scale * dot(qi, k0 + j * a.ld, d) - lse_i);
      attention_dropout_row(ds, static_cast<uint64_t>(samples[s]), static_cast<uint32_t>(head),
                            static_cast<uint32_t>(i), len, f);
      std::fill(dq, dq + d, 0.f);
      for (int64_t j = 0; j < len; ++j) {
        // out_i = sum_j p_ij f_ij v_j:  dV_j += p_ij f_ij dO_i;  dP_ij = f_ij (dO_i . v_j);
        // dS_ij = p_ij (dP_ij - D_i);  dQ_i += dS_ij k_j;  dK_j += dS_ij q_i (times scale).
        const float* vj = v0 + j * a.ld;
        if (f[j] != 0.f) axpy(p[j] * f[j], doi, dv + j * d, d);
        const float ds_ij = p[j] * (f[j] * dot(doi, vj, d) - di);
        axpy(ds_ij, k0 + j * a.ld, dq, d);
        axpy(ds_ij, qi, dk + j * d, d);
      }
      float* dqi = dbase + row * a.ld + head * d;
      for (int64_t c = 0; c < d; ++c) dqi[c] = dq[c] * a.scale;
    }
    for (int64_t j = 0; j < len; ++j) {
      float* dkj = dbase + (start + j) * a.ld + a.hidden + head * d;
      float* dvj = dkj + a.hidden;
      for (int64_t c = 0; c < d; ++c) {
        dkj[c] = dk[j * d + c] * a.scale;
        dvj[c] = dv[j * d + c];
      }
    }
  }
}

}  // namespace packbert
