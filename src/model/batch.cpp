#include "model/batch.h"

#include <algorithm>

#include "core/error.h"

namespace packbert {

const char* batch_layout_name(BatchLayout l) {
  switch (l) {
    case BatchLayout::unpadded: return "unpadded";
    case BatchLayout::packed: return "packed";
    case BatchLayout::padded: return "padded";
  }
  return "?";
}

BatchLayout parse_batch_layout(const std::string& name) {
  if (name == "unpadded") return BatchLayout::unpadded;
  if (name == "packed") return BatchLayout::packed;
  if (name == "padded") return BatchLayout::padded;
  PB_THROW("unknown batch layout '{}' (known: unpadded, packed, padded)", name);
}

int64_t Batch::num_tokens() const {
  int64_t n = 0;
  for (int32_t l : seq_len) n += l;
  return n;
}

SeqLayout Batch::host_layout() const {
  SeqLayout l;
  l.rows = rows;
  l.num_seqs = static_cast<int32_t>(seq_len.size());
  l.max_len = max_len;
  const int64_t s = l.num_seqs;
  l.seq_start = view(seq_start.data(), {s});
  l.seq_len = view(seq_len.data(), {s});
  l.sample_id = view(sample_id.data(), {s});
  l.token_seq = view(token_seq.data(), {rows});
  l.token_pos = view(token_pos.data(), {rows});
  l.host_seq_len = seq_len.empty() ? nullptr : seq_len.data();
  return l;
}

int64_t row_capacity(int64_t rows) {
  if (rows <= 0) return rows;
  int shift = 0;
  while ((int64_t{2} << shift) <= rows) ++shift;  // shift = floor(log2 rows)
  const int64_t step = int64_t{1} << std::max(4, shift - 4);
  return (rows + step - 1) / step * step;
}

Batch with_capacity(const Batch& b, int64_t rows, int64_t seqs, int64_t masked) {
  if (masked < 0) masked = b.num_masked();
  PB_REQUIRE(rows >= b.rows && seqs >= b.num_seqs() && masked >= b.num_masked(),
             "batch: a capacity of {} rows / {} sequences / {} masked tokens below the batch's "
             "{} / {} / {}",
             rows, seqs, masked, b.rows, b.num_seqs(), b.num_masked());
  Batch out = b;
  out.rows = rows;
  const auto r = static_cast<size_t>(rows), s = static_cast<size_t>(seqs);
  out.input_ids.resize(r, 0);
  out.segment_ids.resize(r, 0);
  out.token_seq.resize(r, -1);
  out.token_pos.resize(r, 0);
  out.seq_start.resize(s, static_cast<int32_t>(b.rows));
  out.seq_len.resize(s, 0);
  out.sample_id.resize(s, 0);
  out.nsp_labels.resize(s, 0);
  out.masked_rows.resize(static_cast<size_t>(masked), -1);
  out.masked_labels.resize(static_cast<size_t>(masked), -1);
  return out;
}

}  // namespace packbert
