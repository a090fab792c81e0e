// Lawson-Hanson NNLS with an updated QR factorisation of the passive columns.
//
// Notation: P is the passive set (columns allowed to be non-zero, in the order they entered),
// Z the rest. We keep an orthogonal Q^T (m x m, explicit) and R (upper triangular, p x p) with
// Q^T A_P = [R; 0], and qtb = Q^T b. Then the least-squares solution on P is R z = qtb[0:p].
// Adding a column costs O(m * nnz + (m - p) * m), removing one O(p * (p + m)); the
// textbook version's fresh O(m p^2) solve per iteration would make NNLSHP ~100x slower.
#include "data/packing/nnls.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/base/error.h"

namespace packbert {

void SparseColumns::add_column(const std::vector<std::pair<int, double>>& entries) {
  for (const auto& [row, v] : entries) {
    PB_CHECK(row >= 0 && row < rows, "row {} outside 0..{}", row, rows - 1);
    row_index.push_back(row);
    value.push_back(v);
  }
  col_start.push_back(static_cast<int64_t>(row_index.size()));
}

SparseColumns SparseColumns::from_dense(const std::vector<double>& a, int m, int n) {
  PB_CHECK(static_cast<int64_t>(a.size()) == int64_t{m} * n, "dense size {} != {} x {}", a.size(),
           m, n);
  SparseColumns s;
  s.rows = m;
  for (int j = 0; j < n; ++j) {
    std::vector<std::pair<int, double>> col;
    const double* aj = a.data() + static_cast<size_t>(j) * m;
    for (int i = 0; i < m; ++i)
      if (aj[i] != 0) col.emplace_back(i, aj[i]);
    s.add_column(col);
  }
  return s;
}

namespace {

constexpr double kEps = std::numeric_limits<double>::epsilon();

class UpdatedQr {
 public:
  UpdatedQr(int m, const std::vector<double>& b)
      : m_(m), qt_(size_t(m) * m, 0.0), r_(size_t(m) * m, 0.0), qtb_(b) {
    for (int i = 0; i < m; ++i) qt_[size_t(i) * m + i] = 1.0;
  }

  int size() const { return p_; }

  // Tries to append column (rows, vals) as passive column number p. Refused (returns false, no
  // change) when the column is numerically dependent on the passive ones, or when the new
  // least-squares solution would not give it a positive coefficient: Lawson and Hanson's guard
  // against cycling, since such a column would leave again at once.
  bool try_add(const int* rows, const double* vals, int64_t nnz) {
    if (p_ >= m_) return false;
    v_.assign(m_, 0.0);
    double col_norm2 = 0;
    for (int64_t e = 0; e < nnz; ++e) {
      col_norm2 += vals[e] * vals[e];
      const double* qcol = &qt_[rows[e]];
      for (int i = 0; i < m_; ++i) v_[i] += qcol[size_t(i) * m_] * vals[e];
    }
    double below2 = 0;
    for (int i = p_; i < m_; ++i) below2 += v_[i] * v_[i];
    const double below = std::sqrt(below2);
    if (below <= 1e3 * kEps * std::sqrt(col_norm2)) return false;
    // Householder reflection H = I - u u^T / beta mapping v[p:] to (alpha, 0, ..., 0).
    const double alpha = v_[p_] > 0 ? -below : below;
    u_.assign(v_.begin() + p_, v_.end());
    u_[0] -= alpha;
    const double beta = below2 - alpha * v_[p_];  // = u.u / 2
    double s = 0;
    for (int i = 0; i < m_ - p_; ++i) s += u_[i] * qtb_[p_ + i];
    const double new_qtb_p = qtb_[p_] - s / beta * u_[0];
    // Back substitution's last step: z_new = new_qtb_p / alpha; the earlier ones do not change it.
    if (!(new_qtb_p / alpha > 0)) return false;
    for (int i = 0; i < m_ - p_; ++i) qtb_[p_ + i] -= s / beta * u_[i];
    // Q^T rows p..m-1: compute all dot products first, then update (row-major, contiguous).
    dots_.assign(m_, 0.0);
    for (int i = 0; i < m_ - p_; ++i) {
      const double ui = u_[i];
      const double* row = &qt_[size_t(p_ + i) * m_];
      for (int j = 0; j < m_; ++j) dots_[j] += ui * row[j];
    }
    for (int i = 0; i < m_ - p_; ++i) {
      const double c = u_[i] / beta;
      double* row = &qt_[size_t(p_ + i) * m_];
      for (int j = 0; j < m_; ++j) row[j] -= c * dots_[j];
    }
    double* rcol = &r_[size_t(p_) * m_];
    for (int i = 0; i < p_; ++i) rcol[i] = v_[i];
    rcol[p_] = alpha;
    ++p_;
    return true;
  }

  // Removes passive column k (0-based position), restoring triangular R with Givens rotations.
  void remove(int k) {
    for (int c = k; c + 1 < p_; ++c)
      std::copy_n(&r_[size_t(c + 1) * m_], c + 2, &r_[size_t(c) * m_]);
    --p_;
    for (int c = k; c < p_; ++c) {
      double* rc = &r_[size_t(c) * m_];
      const double a = rc[c], b = rc[c + 1];
      const double h = std::hypot(a, b);
      if (h == 0) continue;
      const double cs = a / h, sn = b / h;
      rc[c] = h;
      rc[c + 1] = 0;
      for (int j = c + 1; j < p_; ++j) {
        double* rj = &r_[size_t(j) * m_];
        const double x = rj[c], y = rj[c + 1];
        rj[c] = cs * x + sn * y;
        rj[c + 1] = -sn * x + cs * y;
      }
      double* q0 = &qt_[size_t(c) * m_];
      double* q1 = &qt_[size_t(c + 1) * m_];
      for (int j = 0; j < m_; ++j) {
        const double x = q0[j], y = q1[j];
        q0[j] = cs * x + sn * y;
        q1[j] = -sn * x + cs * y;
      }
      const double x = qtb_[c], y = qtb_[c + 1];
      qtb_[c] = cs * x + sn * y;
      qtb_[c + 1] = -sn * x + cs * y;
    }
  }

  // z (size p): the least-squares solution on the passive columns.
  void solve(std::vector<double>& z) const {
    z.assign(p_, 0.0);
    for (int i = p_ - 1; i >= 0; --i) {
      double s = qtb_[i];
      for (int j = i + 1; j < p_; ++j) s -= r_[size_t(j) * m_ + i] * z[j];
      z[i] = s / r_[size_t(i) * m_ + i];
    }
  }

 private:
  int m_;
  int p_ = 0;
  std::vector<double> qt_;  // row-major m x m
  std::vector<double> r_;   // column-major, column c holds rows 0..c
  std::vector<double> qtb_;
  std::vector<double> v_, u_, dots_;
};

}  // namespace

NnlsResult solve_nnls(const SparseColumns& a, const std::vector<double>& b,
                      const NnlsOptions& options) {
  const int m = a.rows;
  const int64_t n = a.cols();
  PB_REQUIRE(static_cast<int64_t>(b.size()) == m, "NNLS: b has {} entries, A has {} rows", b.size(),
             m);
  NnlsResult res;
  res.x.assign(n, 0.0);
  const int64_t max_iter = options.max_iterations > 0 ? options.max_iterations : 3 * n + 100;

  double amax = 0, bnorm = 0;
  for (double v : a.value) amax = std::max(amax, std::abs(v));
  for (double v : b) bnorm += v * v;
  bnorm = std::sqrt(bnorm);
  // The gradient of a column that truly belongs in P is zero up to rounding of order
  // eps * |a| * |b| times the problem size; anything above that is a real descent direction.
  const double tol = options.tolerance > 0
                         ? options.tolerance
                         : 10 * kEps * std::max<double>(m, double(n)) * std::max(amax, 1.0) *
                               std::max(bnorm, 1.0) / std::sqrt(std::max<double>(m, 1));

  UpdatedQr qr(m, b);
  std::vector<int64_t> passive;   // column of each passive position
  std::vector<char> state(n, 0);  // 0: Z, 1: P, 2: refused this outer iteration
  std::vector<double> r(b), w(n), z;

  auto residual = [&] {
    r = b;
    for (int64_t j : passive)
      for (int64_t e = a.col_start[j]; e < a.col_start[j + 1]; ++e)
        r[a.row_index[e]] -= a.value[e] * res.x[j];
  };

  while (res.iterations < max_iter) {
    // Gradient of -||Ax - b||^2 / 2 on the columns outside P.
    for (int64_t j = 0; j < n; ++j) {
      if (state[j] == 1) continue;
      state[j] = 0;
      double s = 0;
      for (int64_t e = a.col_start[j]; e < a.col_start[j + 1]; ++e)
        s += a.value[e] * r[a.row_index[e]];
      w[j] = s;
    }
    int64_t t = -1;
    for (;;) {
      int64_t best = -1;
      double best_w = tol;
      for (int64_t j = 0; j < n; ++j)
        if (state[j] == 0 && w[j] > best_w) best_w = w[j], best = j;
      if (best < 0) break;
      const int64_t s = a.col_start[best];
      if (qr.try_add(&a.row_index[s], &a.value[s], a.col_start[best + 1] - s)) {
        t = best;
        break;
      }
      state[best] = 2;
    }
    if (t < 0) {
      res.converged = true;
      break;
    }
    state[t] = 1;
    passive.push_back(t);
    // Inner loop: step towards the passive least-squares solution until it is feasible.
    for (;;) {
      ++res.iterations;
      qr.solve(z);
      int64_t limiting = -1;
      double step = 1.0;
      for (size_t k = 0; k < passive.size(); ++k) {
        if (z[k] > 0) continue;
        const double xk = res.x[passive[k]];
        const double s = xk / (xk - z[k]);
        if (limiting < 0 || s < step) step = s, limiting = static_cast<int64_t>(k);
      }
      if (limiting < 0) {
        for (size_t k = 0; k < passive.size(); ++k) res.x[passive[k]] = z[k];
        break;
      }
      double xscale = 0;
      for (size_t k = 0; k < passive.size(); ++k) {
        double& xk = res.x[passive[k]];
        xk += step * (z[k] - xk);
        xscale = std::max(xscale, std::abs(xk));
      }
      res.x[passive[limiting]] = 0;
      // Leave P: the limiting column and any other that reached zero (back to front, so that
      // positions still to be removed keep their index).
      for (int k = static_cast<int>(passive.size()) - 1; k >= 0; --k) {
        double& xk = res.x[passive[k]];
        if (xk <= 1e-14 * xscale) {
          xk = 0;
          state[passive[k]] = 0;
          qr.remove(k);
          passive.erase(passive.begin() + k);
        }
      }
      if (res.iterations >= max_iter) break;
    }
    residual();
  }
  residual();
  double rn = 0;
  for (double v : r) rn += v * v;
  res.residual_norm = std::sqrt(rn);
  return res;
}

}  // namespace packbert
