// Batch: one micro-batch of one rank as the model consumes it, in one of the three layouts of
// DESIGN.md. Built on the host from the loader's samples and packs (train/batching.h's
// make_batch); Bert::forward uploads it.
//
//   unpadded  sequences end to end: rows = tokens (no padding at all)
//   packed    rows of max_seq_len, each holding one pack (several sequences, positions
//             restarting at 0), the rest of the row padding
//   padded    one sequence per slot of max_seq_len rows (the classic BERT input)
//
// Whatever the layout, the model computes the same loss and gradients: attention and NSP read
// seq_start / seq_len, dropout is keyed by (sample id, position inside the sample), and padding
// rows never reach a loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/config.h"
#include "model/option_enums.h"

namespace packbert {

// BatchLayout (unpadded, packed, padded) and its names: model/option_enums.h.

// The extents that size a batch's activations (Bert::reserve for the largest expected).
struct BatchShape {
  int64_t rows = 0;
  int64_t masked = 0;
  int64_t seqs = 0;
  int32_t max_len = 0;
};

struct Batch {
  BatchLayout layout = BatchLayout::unpadded;
  int32_t max_seq_len = 0;  // the slot / pack length (packed, padded); informative for unpadded
  int64_t rows = 0;         // rows of every token-wise buffer
  int32_t max_len = 0;      // the longest sequence

  // Token-wise, [rows]. Padding rows: input id 0 ([PAD]), segment 0, token_seq -1, token_pos 0.
  std::vector<int32_t> input_ids;
  std::vector<int32_t> segment_ids;
  std::vector<int32_t> token_seq;  // sequence of each row, -1 for padding
  std::vector<int32_t> token_pos;  // position inside its sequence = position-embedding index

  // Per sequence, [num_seqs], in layout order (packs in order, sequences within a pack in
  // order). seq_start is also the row of each sequence's [CLS] token, which NSP reads.
  std::vector<int32_t> seq_start;
  std::vector<int32_t> seq_len;
  std::vector<int64_t> sample_id;   // the global sample id: the dropout key
  std::vector<int32_t> nsp_labels;  // 0: B follows A, 1: B is random

  // Per masked token, [num_masked]: its row in the token buffers and its original token id.
  // Sequence by sequence in layout order, positions ascending within a sequence.
  std::vector<int32_t> masked_rows;
  std::vector<int32_t> masked_labels;

  int64_t num_seqs() const { return static_cast<int64_t>(seq_len.size()); }
  int64_t num_masked() const { return static_cast<int64_t>(masked_rows.size()); }
  int64_t num_tokens() const;  // real tokens (rows minus padding)
  bool empty() const { return seq_len.empty(); }
  BatchShape shape() const { return {rows, num_masked(), num_seqs(), max_len}; }

  // The SeqLayout of backend.h over this batch's host arrays (valid while the batch lives).
  SeqLayout host_layout() const;
};

// The capacities batches are laid into when recorded CUDA graphs replay them (Bert with
// BertOptions::cuda_graphs): fixed from the largest batch expected (Bert::reserve, the
// planner's bound), so that a run's batches share a handful of shapes and nothing grows
// mid-run. Rows round up to a multiple of ceil(bound.rows / kRowBuckets), itself a multiple of
// row_quantum (8; the slot length in the padded and packed layouts, whose rows are whole
// slots); the masked tokens and the sequence slots are the bound's. A batch beyond the bound
// raises it. docs/performance.md says why these.
struct GraphCapacity {
  static constexpr int64_t kRowBuckets = 32;
  BatchShape bound;
  int64_t row_quantum = 8;
  // Raises each extent of the bound to hold s; true when any changed.
  bool cover(const BatchShape& s);
  // The capacity of a batch of shape s (within the bound): rows, masked and seqs as above,
  // max_len s's own.
  BatchShape of(const BatchShape& s) const;
};
// The batch with padding rows after its last row up to `rows` rows, empty sequence slots
// (seq_len 0, at the row after the last token, sample id 0, NSP label 0; SeqLayout::seq_len)
// after its last sequence up to `seqs`, and unused masked slots (row -1, label -1: the heads'
// ops leave them out, kernels/ops/losses.h gather_rows) after its last masked token up to `masked`
// (< 0: as many as it has): every token, label and sequence where it was, so the model computes
// the same loss and gradients.
Batch with_capacity(const Batch& b, int64_t rows, int64_t seqs, int64_t masked = -1);

// The model's rules for a batch (make_batch checked its structure): consistent array sizes,
// sequences within max_position_embeddings, ids of the real vocabulary and segments of the
// type vocabulary, masked tokens on real rows with labels of the real vocabulary, and global
// counts (the whole step's) at least the batch's own. Error naming the row or token.
void check_model_batch(const Batch& batch, const BertConfig& config, int64_t global_masked,
                       int64_t global_samples);

}  // namespace packbert
