// A Bert's memory, as functions of its config and options: the activation plan of a batch, the
// shape the batch is laid into (laid_shape: the one place that decides it), the arena's carve
// and the MST chunk count, and the bytes every buffer of the model holds once training reserved
// it (plan_bert_memory, the model's part of train/memory_plan.h). Bert (model/bert.h) allocates
// from the same functions, so the plan and the allocations cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/activations.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/options.h"

namespace packbert {

// Activation memory (the arena) of a Bert, by kind of buffer (model/arena.h ActivationKind).
// The numbers are the carve of the arena, so they hold for every backend. A model with a
// gradient buffer counts only its forwards with gradients (training): an evaluation forward in
// between is not part of the report (a forward-only model counts its evaluation forwards).
struct ActivationReport {
  size_t peak_bytes = 0;           // high-water mark over all forward() calls so far
  ActivationBytes peak_by_kind{};  // its split (the step that set it)
  size_t step_bytes = 0;           // the last forward()
  ActivationBytes step_by_kind{};
  size_t capacity = 0;         // bytes allocated (>= peak, with growth headroom)
  int64_t allocations = 0;     // times the arena was (re)allocated: 1 when reserved once
  int64_t mst_chunks = 1;      // M of the last forward (auto resolved)
  int64_t mlp_chunk_rows = 0;  // rows per MLP chunk (0: intermediate kept per layer)
  int64_t mlm_chunk_rows = 0;  // masked rows per decoder call (0: all)
  // Outside the arena: the uploaded batch's two buffers (ids, layout arrays, labels; used in
  // turn, so that the next micro-batch's upload overlaps this one's compute), bytes allocated.
  size_t batch_buffer_bytes = 0;
  // Rows of the training forwards' batches so far, and of the capacities CUDA graphs laid them
  // into (the same without graphs): graphs cost laid_rows / rows - 1 in padding rows.
  int64_t rows = 0, laid_rows = 0;
};

// What training reserves a model for before its first step (Bert::reserve_training), so that no
// step allocates: the largest micro-batch (train/train_options.h largest_micro_batch), its
// layout (CUDA graphs lay batches into capacities by it) and how many forwards' metrics may wait
// to be read (MetricSlots: micro-steps x steps between reads).
struct BertReserve {
  BatchShape shape;
  BatchLayout layout = BatchLayout::unpadded;
  int64_t deferred_forwards = 0;
};

// The bytes a Bert's own buffers hold (Backend::alloc) once reserved.
struct BertMemory {
  size_t lowp_weights = 0;   // the 16-bit weight copy (bf16 / fp16 / fp8)
  size_t fp8_state = 0;      // FP8 scales, histories, amaxes and the FP8 weight copies
  size_t fp8_workspace = 0;  // one GEMM's FP8 operands
  size_t arena = 0;          // the activation arena's capacity
  size_t batch_buffers = 0;  // the two batch buffers together
  size_t metric_slots = 0;
  BatchShape laid;                  // the reserved shape as laid out (laid_shape)
  int64_t mst_chunks = 1;           // M of that shape
  ActivationBytes arena_by_kind{};  // that shape's carve by kind (before the auto-M margin)
  size_t total() const {
    return lowp_weights + fp8_state + fp8_workspace + arena + batch_buffers + metric_slots;
  }
};

// How a batch of `shape` is laid out in the arena with M = m chunks (BertOptions: MST,
// recomputation, precision).
ActivationPlan activation_plan(const BertOptions& options, const BatchShape& shape, bool gradients,
                               int64_t m);
// The arena bytes of that plan (carve_activations measured).
size_t activation_carve_bytes(const BertConfig& config, const BatchShape& shape,
                              const ActivationPlan& plan);
// The M a forward uses for a batch of this shape: BertOptions::mst_chunks, or under 0 (auto)
// the smallest of 1, 2, 4, .., 64 whose arena fits activation_budget_bytes (64 if none does).
int64_t mst_chunks_for(const BertConfig& config, const BertOptions& options,
                       const BatchShape& shape, bool gradients);

// The rows CUDA graphs lay a batch's capacity out in multiples of: 8 unpadded, the slot length
// (max_seq_len) padded or packed; with FP8 also a multiple of kFp8Rows.
int64_t row_quantum(BatchLayout layout, int64_t slot_len, bool fp8);
// The shape a batch of `shape` is computed in: with CUDA graphs (capacity: the bound so far,
// with its row quantum) the capacity it is laid into (GraphCapacity::of after covering it);
// without, FP8's rows rounded up to kFp8Rows; else, and for an empty batch, the shape itself.
BatchShape laid_shape(const BatchShape& shape, const GraphCapacity* capacity, bool fp8);

// The bytes of every buffer Bert::reserve_training allocates, without a model. graphs: CUDA
// graphs on (cuda_graphs != off on a backend that records them); ranks: the data-parallel world
// (the FP8 state's shared amaxes).
BertMemory plan_bert_memory(const BertConfig& config, const BertOptions& options, bool graphs,
                            int ranks, const BertReserve& r);

}  // namespace packbert
