#include "model/batch.h"

#include <algorithm>

#include "kernels/base/error.h"

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

namespace {
int64_t round_up(int64_t n, int64_t step) { return (n + step - 1) / step * step; }
}  // namespace

bool GraphCapacity::cover(const BatchShape& s) {
  const BatchShape old = bound;
  bound.rows = std::max(bound.rows, s.rows);
  bound.masked = std::max(bound.masked, s.masked);
  bound.seqs = std::max(bound.seqs, s.seqs);
  bound.max_len = std::max(bound.max_len, s.max_len);
  return bound.rows != old.rows || bound.masked != old.masked || bound.seqs != old.seqs ||
         bound.max_len != old.max_len;
}

BatchShape GraphCapacity::of(const BatchShape& s) const {
  const int64_t row_step =
      round_up(std::max<int64_t>(1, round_up(bound.rows, kRowBuckets) / kRowBuckets), row_quantum);
  BatchShape c = s;
  c.rows = round_up(s.rows, row_step);
  c.masked = std::max(bound.masked, s.masked);
  c.seqs = std::max(bound.seqs, s.seqs);
  return c;
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

void check_model_batch(const Batch& b, const BertConfig& config, int64_t global_masked,
                       int64_t global_samples) {
  const auto rows = static_cast<size_t>(b.rows);
  const size_t seqs = b.seq_len.size(), masked = b.masked_rows.size();
  PB_REQUIRE(
      b.input_ids.size() == rows && b.segment_ids.size() == rows && b.token_seq.size() == rows &&
          b.token_pos.size() == rows && b.seq_start.size() == seqs && b.sample_id.size() == seqs &&
          b.nsp_labels.size() == seqs && b.masked_labels.size() == masked,
      "model: inconsistent batch ({} rows, {} sequences, {} masked tokens)", b.rows, seqs, masked);
  PB_REQUIRE(b.max_len <= config.max_position_embeddings,
             "model: a sequence of {} tokens exceeds max_position_embeddings {}", b.max_len,
             config.max_position_embeddings);
  // The model's own rules (make_batch checked the structure): ids of the real vocabulary, the
  // padded rows of the embedding exist only for the GEMM's shape.
  for (size_t r = 0; r < rows; ++r)
    PB_REQUIRE(b.input_ids[r] >= 0 && b.input_ids[r] < config.real_vocab_size &&
                   (!config.token_types ||
                    (b.segment_ids[r] >= 0 && b.segment_ids[r] < config.type_vocab_size)),
               "model: row {} (sample id {}) has token id {} (vocab {}) / segment {} (types {})", r,
               b.token_seq[r] >= 0 ? b.sample_id[b.token_seq[r]] : -1, b.input_ids[r],
               config.real_vocab_size, b.segment_ids[r], config.type_vocab_size);
  for (size_t i = 0; i < masked; ++i)
    PB_REQUIRE(b.masked_labels[i] >= 0 && b.masked_labels[i] < config.real_vocab_size &&
                   b.masked_rows[i] >= 0 && b.masked_rows[i] < b.rows &&
                   b.token_seq[b.masked_rows[i]] >= 0,
               "model: masked token {} has label {} (vocab {}) at row {} of {} (padding?)", i,
               b.masked_labels[i], config.real_vocab_size, b.masked_rows[i], b.rows);
  PB_REQUIRE(
      global_masked >= static_cast<int64_t>(masked) && global_samples >= static_cast<int64_t>(seqs),
      "model: global counts ({} masked tokens, {} samples) below this batch's own ({}, "
      "{}): pass the whole step's counts",
      global_masked, global_samples, masked, seqs);
}

}  // namespace packbert
