// Non-negative least squares: min ||A x - b||_2 subject to x >= 0 (Lawson & Hanson, "Solving
// Least Squares Problems", 1974, chapter 23), for NNLS histogram packing.
//
// The packing matrix has 512 rows, tens of thousands of columns and at most K non-zeros per
// column, so A is held by sparse columns, and the passive set's least-squares problem is kept as
// a QR factorisation that is updated (one Householder reflection per added column, Givens
// rotations per removed one) instead of being re-solved from scratch every iteration.
#pragma once

#include <cstdint>
#include <vector>

namespace packbert {

// A matrix by columns in compressed form: column j's non-zeros are row_index/value
// [col_start[j], col_start[j + 1]).
struct SparseColumns {
  int rows = 0;
  std::vector<int64_t> col_start{0};
  std::vector<int> row_index;
  std::vector<double> value;

  int64_t cols() const { return static_cast<int64_t>(col_start.size()) - 1; }
  // Appends a column given as (row, value) pairs; rows must be in range.
  void add_column(const std::vector<std::pair<int, double>>& entries);
  // From a dense column-major m x n array.
  static SparseColumns from_dense(const std::vector<double>& a, int m, int n);
};

struct NnlsOptions {
  int64_t max_iterations = 0;  // outer + inner iterations; 0: 3 * cols + 100
  double tolerance = 0;        // on the gradient A^T (b - A x); 0: scaled from eps, A and b
};

struct NnlsResult {
  std::vector<double> x;
  double residual_norm = 0;  // ||A x - b||
  int64_t iterations = 0;
  bool converged = false;  // false: the iteration cap was hit first
};

NnlsResult solve_nnls(const SparseColumns& a, const std::vector<double>& b,
                      const NnlsOptions& options = {});

}  // namespace packbert
