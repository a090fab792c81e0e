// Argument checks shared by every backend, on host arrays. The CPU backend reads its layout in
// place; a device backend copies the arrays to the host first and runs the very same checks,
// so both reject the same inputs with the same messages.
#pragma once

#include <cstdint>

#include "kernels/base/error.h"
#include "kernels/common/philox.h"
#include "kernels/ops/lamb.h"
#include "kernels/ops/layout.h"

namespace packbert::checks {

// The five arrays of a SeqLayout, on the host.
struct HostLayoutArrays {
  const int32_t* seq_start;
  const int32_t* seq_len;
  const int64_t* sample_id;
  const int32_t* token_seq;
  const int32_t* token_pos;
};

// What an op makes of a sequence slot of length 0 (SeqLayout::seq_len): the token-wise ops
// skip it (no row names it); an op that reads each sequence's first row (NSP's [CLS]) refuses it.
enum class EmptySeqs { allowed, refused };

// Ranges, sequences disjoint, token_seq / token_pos consistent with seq_start / seq_len,
// max_len >= every length, sample ids inside the dropout key. O(rows).
inline void check_layout_arrays(const char* op, const SeqLayout& l, const HostLayoutArrays& a,
                                int64_t rows, EmptySeqs empty = EmptySeqs::allowed) {
  PB_REQUIRE(l.rows == rows, "{}: layout has {} rows, the buffers {}", op, l.rows, rows);
  PB_REQUIRE(l.num_seqs >= 0 && l.max_len >= 0, "{}: layout with {} sequences, max_len {}", op,
             l.num_seqs, l.max_len);
  int64_t covered = 0;
  for (int64_t i = 0; i < l.num_seqs; ++i) {
    const int64_t start = a.seq_start[i], len = a.seq_len[i];
    PB_REQUIRE(len >= 0 && len <= l.max_len && start >= 0 && start + len <= rows,
               "{}: sequence {} at row {} with length {} does not fit {} rows (max_len {})", op, i,
               start, len, rows, l.max_len);
    PB_REQUIRE(len >= 1 || empty == EmptySeqs::allowed,
               "{}: sequence {} is an empty slot (length 0): this op reads every sequence's "
               "first token",
               op, i);
    PB_REQUIRE(a.sample_id[i] >= 0 && static_cast<uint64_t>(a.sample_id[i]) < kDropoutMaxSampleId,
               "{}: sequence {} has sample id {} outside [0, 2^44)", op, i, a.sample_id[i]);
    for (int64_t p = 0; p < len; ++p) {
      const int64_t r = start + p;
      PB_REQUIRE(a.token_seq[r] == i && a.token_pos[r] == p,
                 "{}: row {} has token_seq {} / token_pos {}, sequence {} expects {} / {}", op, r,
                 a.token_seq[r], a.token_pos[r], i, i, p);
    }
    covered += len;
  }
  int64_t padding = 0;
  for (int64_t r = 0; r < rows; ++r) padding += a.token_seq[r] < 0;
  PB_REQUIRE(covered + padding == rows,
             "{}: {} rows name a sequence that does not contain them (sequences overlap?)", op,
             rows - covered - padding);
}

// The Philox stream of one dropout site after checking p, layer, site and that `elements` (per
// row: hidden size, or the sequence length for attention), heads and positions fit the key.
inline DropoutStream checked_dropout_stream(const char* op, const Dropout& d, int64_t elements,
                                            int64_t heads, int64_t max_position) {
  PB_REQUIRE(d.p >= 0.f && d.p < 1.f, "{}: dropout p = {} outside [0, 1)", op, d.p);
  if (d.p == 0.f) return DropoutStream{};
  const auto site = static_cast<uint32_t>(d.site);
  PB_REQUIRE(d.layer < kDropoutMaxLayer && site < kDropoutMaxSite,
             "{}: dropout layer {} / site {} outside the key ranges ({} / {})", op, d.layer, site,
             kDropoutMaxLayer, kDropoutMaxSite);
  PB_REQUIRE(elements <= kDropoutMaxElement && heads <= kDropoutMaxHead &&
                 max_position <= kDropoutMaxPosition,
             "{}: {} elements, {} heads, {} positions exceed the dropout key ranges", op, elements,
             heads, max_position);
  PB_REQUIRE(d.step < kDropoutMaxStep, "{}: dropout step {} outside the key range (< {})", op,
             d.step, kDropoutMaxStep);
  DropoutStream s = make_dropout_stream(d.p, d.seed, d.step, d.layer, site);
  if (d.device_step.defined()) {
    PB_REQUIRE(d.device_step.dtype == DType::i32 && d.device_step.numel() == 1,
               "{}: the dropout's device step is {}, expected i32[1]", op, d.device_step.str());
    s.step_at = static_cast<const uint32_t*>(d.device_step.data);
  }
  return s;
}

// Every index in [0, bound), or -1 where the op allows an unused slot (allow_none).
inline void check_indices(const char* op, const char* name, const int32_t* idx, int64_t n,
                          int64_t bound, bool allow_none = false) {
  for (int64_t i = 0; i < n; ++i)
    PB_REQUIRE((idx[i] >= 0 && idx[i] < bound) || (allow_none && idx[i] == -1),
               "{}: {}[{}] = {} outside [0, {}){}", op, name, i, idx[i], bound,
               allow_none ? " and not -1" : "");
}

// The LAMB table: rows ascend by offset without overlap, inside [0, n), decay 0 or 1.
inline void check_lamb_table(const char* op, const LambTensor* rows, int64_t num_tensors,
                             int64_t n) {
  int64_t end = 0;
  for (int64_t t = 0; t < num_tensors; ++t) {
    const LambTensor& e = rows[t];
    PB_REQUIRE(
        e.offset >= end && e.size >= 0 && e.offset + e.size <= n && (e.decay == 0 || e.decay == 1),
        "{}: table row {} (offset {}, size {}, decay {}) overlaps the previous row, leaves "
        "the {} elements or has a decay flag other than 0/1 (rows ascend by offset)",
        op, t, e.offset, e.size, e.decay, n);
    end = e.offset + e.size;
  }
}

}  // namespace packbert::checks
