// Naive double-precision reference implementations of the backend's ops: plain loops written
// from the formulas, sharing nothing with kernels/cpu except the dropout mask definition
// (kernels/common/philox.h, itself checked against the Random123 known answers).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/philox.h"
#include "ops_test_util.h"

namespace packbert::test::ref {

using Vec = std::vector<double>;

inline double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
inline double gelu(double x, Gelu form) { return form == Gelu::tanh ? gelu_tanh(x) : gelu(x); }

// Dropout multiplier of element e of a token (head 0), from the shared mask definition.
inline double dropout_factor(const DropoutStream& s, const HostLayout& l, int64_t row, int64_t e) {
  if (!dropout_enabled(s) || l.token_seq[row] < 0) return 1.0;
  const auto sample = static_cast<uint64_t>(l.sample_id[l.token_seq[row]]);
  return dropout_keep(s, sample, 0, static_cast<uint32_t>(l.token_pos[row]),
                      static_cast<uint32_t>(e))
             ? static_cast<double>(s.scale)
             : 0.0;
}

// y = x w^T + b: x [n, k], w [m, k].
inline Vec linear(const Vec& x, const Vec& w, const Vec* b, int64_t n, int64_t k, int64_t m) {
  Vec y(n * m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = b ? (*b)[j] : 0.0;
      for (int64_t c = 0; c < k; ++c) s += x[i * k + c] * w[j * k + c];
      y[i * m + j] = s;
    }
  return y;
}

// LayerNorm of each row of h [rows, width] (beta empty: none); optionally returns mean and rstd.
inline Vec layernorm(const Vec& h, const Vec& gamma, const Vec& beta, int64_t rows, int64_t width,
                     Vec* mean = nullptr, Vec* rstd = nullptr, double eps = 1e-12) {
  Vec y(h.size());
  if (mean) mean->assign(rows, 0.0);
  if (rstd) rstd->assign(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < width; ++c) mu += h[r * width + c];
    mu /= width;
    for (int64_t c = 0; c < width; ++c) var += (h[r * width + c] - mu) * (h[r * width + c] - mu);
    var /= width;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < width; ++c)
      y[r * width + c] = (h[r * width + c] - mu) * rs * gamma[c] + (beta.empty() ? 0.0 : beta[c]);
    if (mean) (*mean)[r] = mu;
    if (rstd) (*rstd)[r] = rs;
  }
  return y;
}

// pos, type, beta empty: the model has none.
struct EmbeddingInputs {
  Vec word, pos, type, gamma, beta;
  int64_t hidden;
  double eps = 1e-12;
};

inline Vec embedding(const EmbeddingInputs& p, const std::vector<int32_t>& ids,
                     const std::vector<int32_t>& segs, const HostLayout& l, const DropoutStream& ds,
                     Vec* mean = nullptr, Vec* rstd = nullptr) {
  const int64_t h = p.hidden;
  Vec sum(l.rows * h);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t c = 0; c < h; ++c)
      sum[r * h + c] = p.word[ids[r] * h + c] +
                       (p.pos.empty() ? 0.0 : p.pos[l.token_pos[r] * h + c]) +
                       (p.type.empty() ? 0.0 : p.type[segs[r] * h + c]);
  Vec y = layernorm(sum, p.gamma, p.beta, l.rows, h, mean, rstd, p.eps);
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t c = 0; c < h; ++c) y[r * h + c] *= dropout_factor(ds, l, r, c);
  return y;
}

// out = LayerNorm(dropout(x + bias) + residual); bias / residual / beta may be empty.
inline Vec residual_layernorm(const Vec& x, const Vec& bias, const Vec& residual, const Vec& gamma,
                              const Vec& beta, int64_t rows, int64_t h, const HostLayout* l,
                              const DropoutStream& ds, Vec* hin = nullptr, Vec* mean = nullptr,
                              Vec* rstd = nullptr, double eps = 1e-12) {
  Vec hv(rows * h);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < h; ++c) {
      double v = x[r * h + c] + (bias.empty() ? 0.0 : bias[c]);
      if (l) v *= dropout_factor(ds, *l, r, c);
      hv[r * h + c] = v + (residual.empty() ? 0.0 : residual[r * h + c]);
    }
  if (hin) *hin = hv;
  return layernorm(hv, gamma, beta, rows, h, mean, rstd, eps);
}

// Whether query i attends key j of its sequence under a window (kernels/ops/attention.h: 0 is
// global; w > 0 keeps |i - j| <= w / 2).
inline bool attends(int64_t i, int64_t j, int64_t window) {
  return window == 0 || std::abs(i - j) <= window / 2;
}

// The dropout multiplier of (query i, key j) of sequence s and head hd.
inline double attention_dropout(const DropoutStream& ds, const HostLayout& l, size_t s, int64_t hd,
                                int64_t i, int64_t j) {
  if (!dropout_enabled(ds)) return 1.0;
  return dropout_keep(ds, static_cast<uint64_t>(l.sample_id[s]), static_cast<uint32_t>(hd),
                      static_cast<uint32_t>(i), static_cast<uint32_t>(j))
             ? static_cast<double>(ds.scale)
             : 0.0;
}

// Attention of one sequence s: returns its rows of out [len, H] and optionally lse [len, heads].
// Each query attends the keys of its window (attends).
inline Vec attention_seq(const Vec& qkv, const HostLayout& l, size_t s, int64_t heads,
                         int64_t hidden, const DropoutStream& ds, Vec* lse = nullptr,
                         int64_t window = 0) {
  const int64_t d = hidden / heads, ld = 3 * hidden, len = l.seq_len[s];
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec out(len * hidden, 0.0);
  if (lse) lse->assign(len * heads, 0.0);
  Vec sc(len);
  for (int64_t hd = 0; hd < heads; ++hd)
    for (int64_t i = 0; i < len; ++i) {
      const double* q = &qkv[l.row(s, static_cast<int32_t>(i)) * ld + hd * d];
      double mx = -1e300;
      for (int64_t j = 0; j < len; ++j) {
        if (!attends(i, j, window)) continue;
        const double* k = &qkv[l.row(s, static_cast<int32_t>(j)) * ld + hidden + hd * d];
        double dotp = 0;
        for (int64_t c = 0; c < d; ++c) dotp += q[c] * k[c];
        sc[j] = dotp * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < len; ++j)
        if (attends(i, j, window)) sum += std::exp(sc[j] - mx);
      if (lse) (*lse)[i * heads + hd] = mx + std::log(sum);
      for (int64_t j = 0; j < len; ++j) {
        if (!attends(i, j, window)) continue;
        const double p = std::exp(sc[j] - mx) / sum * attention_dropout(ds, l, s, hd, i, j);
        const double* v = &qkv[l.row(s, static_cast<int32_t>(j)) * ld + 2 * hidden + hd * d];
        for (int64_t c = 0; c < d; ++c) out[i * hidden + hd * d + c] += p * v[c];
      }
    }
  return out;
}

// The gradient of sum(dout * out) wrt the qkv rows of sequence s (attention_seq's out): returns
// [len, 3H] from the formulas P = softmax(S) over the window, O = (P F) V, dP = F (dO V^T),
// dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q, dV = (P F)^T dO, in double.
inline Vec attention_seq_backward(const Vec& qkv, const Vec& dout, const HostLayout& l, size_t s,
                                  int64_t heads, int64_t hidden, const DropoutStream& ds,
                                  int64_t window = 0) {
  const int64_t d = hidden / heads, ld = 3 * hidden, len = l.seq_len[s];
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Vec g(len * ld, 0.0), p(len), dp(len);
  auto at = [&](int64_t i, int64_t part, int64_t hd) {
    return &qkv[l.row(s, static_cast<int32_t>(i)) * ld + part * hidden + hd * d];
  };
  for (int64_t hd = 0; hd < heads; ++hd)
    for (int64_t i = 0; i < len; ++i) {
      const double* q = at(i, 0, hd);
      const double* dy = &dout[l.row(s, static_cast<int32_t>(i)) * hidden + hd * d];
      double mx = -1e300;
      for (int64_t j = 0; j < len; ++j) {
        p[j] = 0.0;
        if (!attends(i, j, window)) continue;
        const double* k = at(j, 1, hd);
        double dotp = 0;
        for (int64_t c = 0; c < d; ++c) dotp += q[c] * k[c];
        p[j] = dotp * scale;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < len; ++j) {
        p[j] = attends(i, j, window) ? std::exp(p[j] - mx) : 0.0;
        sum += p[j];
      }
      double rowsum = 0;  // sum_j P_ij dP_ij = dO_i . O_i
      for (int64_t j = 0; j < len; ++j) {
        p[j] /= sum;
        dp[j] = 0.0;
        if (!attends(i, j, window)) continue;
        const double* v = at(j, 2, hd);
        double dotp = 0;
        for (int64_t c = 0; c < d; ++c) dotp += dy[c] * v[c];
        dp[j] = attention_dropout(ds, l, s, hd, i, j) * dotp;
        rowsum += p[j] * dp[j];
      }
      for (int64_t j = 0; j < len; ++j) {
        if (!attends(i, j, window)) continue;
        const double dsij = p[j] * (dp[j] - rowsum) * scale;
        const double pf = p[j] * attention_dropout(ds, l, s, hd, i, j);
        const double* k = at(j, 1, hd);
        for (int64_t c = 0; c < d; ++c) {
          g[i * ld + hd * d + c] += dsij * k[c];
          g[j * ld + hidden + hd * d + c] += dsij * q[c];
          g[j * ld + 2 * hidden + hd * d + c] += pf * dy[c];
        }
      }
    }
  return g;
}

// Per-row cross-entropy of logits [m, v]; returns the summed loss, counts first-argmax hits and
// optionally the scaled gradient. A label of -1 leaves its row out (no loss, gradient 0).
inline double softmax_xent(const Vec& z, const std::vector<int32_t>& labels, int64_t m, int64_t v,
                           double scale, int* correct = nullptr, Vec* dz = nullptr) {
  double total = 0;
  if (correct) *correct = 0;
  if (dz) dz->assign(m * v, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    if (labels[i] < 0) continue;
    double mx = z[i * v];
    int64_t am = 0;
    for (int64_t c = 1; c < v; ++c)
      if (z[i * v + c] > mx) mx = z[i * v + c], am = c;
    double sum = 0;
    for (int64_t c = 0; c < v; ++c) sum += std::exp(z[i * v + c] - mx);
    const double lse = mx + std::log(sum);
    total += lse - z[i * v + labels[i]];
    if (correct) *correct += am == labels[i];
    if (dz) {
      for (int64_t c = 0; c < v; ++c) (*dz)[i * v + c] = std::exp(z[i * v + c] - lse) * scale;
      (*dz)[i * v + labels[i]] -= scale;
    }
  }
  return total;
}

// The NSP loss of the [CLS] rows (sum over sequences, unscaled); empty slots (length 0) are
// left out.
inline double nsp(const Vec& x, const HostLayout& l, int64_t h, const Vec& wp, const Vec& bp,
                  const Vec& wc, const Vec& bc, const std::vector<int32_t>& labels,
                  int* correct = nullptr) {
  const int64_t s = static_cast<int64_t>(l.seq_len.size());
  Vec cls(s * h);
  std::vector<int32_t> kept = labels;
  for (int64_t i = 0; i < s; ++i) {
    if (l.seq_len[i] == 0) kept[i] = -1;
    for (int64_t c = 0; c < h && l.seq_len[i] > 0; ++c) cls[i * h + c] = x[l.seq_start[i] * h + c];
  }
  Vec pooled = linear(cls, wp, &bp, s, h, h);
  for (auto& p : pooled) p = std::tanh(p);
  const Vec logits = linear(pooled, wc, &bc, s, h, 2);
  return softmax_xent(logits, kept, s, 2, 1.0, correct);
}

}  // namespace packbert::test::ref
