// Helpers shared by the CPU backend's files: argument checks and the per-row dropout keys.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/backend.h"
#include "kernels/common/op_checks.h"
#include "kernels/common/philox.h"

namespace packbert::cpu {

// A required f32 / i32 / ... tensor on the CPU with the given dims (-1 = any).
void expect(const char* op, const char* name, const Tensor& t, DType dtype,
            std::initializer_list<int64_t> dims);
// Same when t is defined; a "none" view passes.
void expect_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                     std::initializer_list<int64_t> dims);

// Validates a layout against `rows` token rows: ranges, sequences disjoint, token_seq and
// token_pos consistent with seq_start / seq_len, max_len >= every length; an empty slot
// (length 0) only where `empty` allows it. O(rows).
void check_layout(const char* op, const SeqLayout& layout, int64_t rows,
                  checks::EmptySeqs empty = checks::EmptySeqs::allowed);

// The Philox stream of one dropout site, after checking p, layer and site and that `elements`
// (per row: hidden size, or sequence length for attention), heads and positions fit the key.
DropoutStream dropout_stream(const char* op, const Dropout& d, int64_t elements, int64_t heads,
                             int64_t max_position);

// The dropout multipliers (0 or 1/(1-p)) of `n` consecutive elements of one token row; all 1
// when dropout is disabled or the row is padding (token_seq < 0).
void row_dropout_factors(const DropoutStream& s, const SeqLayout& layout, int64_t row, int64_t n,
                         float* factors);

// out[c] += sum over rows of x[r * ld + c] for c < cols, summed in row order in double: the
// bias / gamma gradient reduction, parallel over column blocks.
void add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out);
// The same, one block of columns at a time (block < column_blocks(cols)): for callers that run
// the blocks as tasks among others. Each block gives the same bits as add_column_sums.
int64_t column_blocks(int64_t cols);
void add_column_sums_block(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t block,
                           float* out);

// The fixed-order sum of squares of one block (at most kSumBlock floats): four interleaved
// double accumulators (a fixed order that still pipelines), combined in a fixed order. Long
// sums (l2_norm, LAMB's norms) cut their buffer into kSumBlock blocks from its start and add
// the blocks' sums in order: the same bits for any thread count.
constexpr int64_t kSumBlock = 8192;
inline double block_sum_squares(const float* x, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// OpenBLAS runs one thread while this guard lives (set on the calling thread, outside any
// parallel region, restored afterwards): the CPU backend's GEMMs then run on our OpenMP threads
// only, never on OpenBLAS's own pool beside them (see gemm below). A no-op with the OpenMP
// build of OpenBLAS, which is single-threaded inside our parallel regions by itself.
class BlasSingleThread {
 public:
  BlasSingleThread();
  ~BlasSingleThread();
  BlasSingleThread(const BlasSingleThread&) = delete;
  BlasSingleThread& operator=(const BlasSingleThread&) = delete;

 private:
  int threads_;
};

// Row-major C = alpha op(A) op(B) + beta C (C: m x n, op(A): m x k, op(B): k x n), run on the
// OpenMP threads: C is cut into tiles along its longer side (so the operand every tile packs
// again is the smaller one), each tile a single-threaded cblas_sgemm. The tiling depends only on
// the shape, never on the thread count, and every element is one sgemm dot product over the
// whole k, so the bits do not depend on the thread count. Why not OpenBLAS's own threads: the
// Debian OpenBLAS is the pthread build, whose pool and libgomp's would each spin or yield while
// the other works (on 2 cores a fifth of a training step's cycles went to that).
// Call from outside parallel regions only.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace packbert::cpu
