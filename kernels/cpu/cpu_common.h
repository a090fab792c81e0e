// Helpers shared by the CPU backend's files: argument checks and the per-row dropout keys.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "backend.h"
#include "common/philox.h"

namespace packbert::cpu {

// A required f32 / i32 / ... tensor on the CPU with the given dims (-1 = any).
void expect(const char* op, const char* name, const Tensor& t, DType dtype,
            std::initializer_list<int64_t> dims);
// Same when t is defined; a "none" view passes.
void expect_optional(const char* op, const char* name, const Tensor& t, DType dtype,
                     std::initializer_list<int64_t> dims);

// Validates a layout against `rows` token rows: ranges, sequences disjoint, token_seq and
// token_pos consistent with seq_start / seq_len, max_len >= every length. O(rows).
void check_layout(const char* op, const SeqLayout& layout, int64_t rows);

// The Philox stream of one dropout site, after checking p, layer and site and that `elements`
// (per row: hidden size, or sequence length for attention), heads and positions fit the key.
DropoutStream dropout_stream(const char* op, const Dropout& d, int64_t elements, int64_t heads,
                             int64_t max_position);

// The dropout multipliers (0 or 1/(1-p)) of `n` consecutive elements of one token row; all 1
// when dropout is disabled or the row is padding (token_seq < 0).
void row_dropout_factors(const DropoutStream& s, const SeqLayout& layout, int64_t row,
                         int64_t n, float* factors);

// out[c] += sum over rows of x[r * ld + c] for c < cols, summed in row order in double: the
// bias / gamma gradient reduction, parallel over column blocks.
void add_column_sums(const float* x, int64_t rows, int64_t cols, int64_t ld, float* out);

}  // namespace packbert::cpu
