// BertForPreTraining on the Backend interface: one code path for every backend and layout.
//
// A step of one micro-batch:
//   Bert::forward   embeddings -> L x post-LN encoder layer -> MLM head on the masked rows only
//                   -> pooler + NSP on each sequence's [CLS]; loss and metrics
//   Bert::backward  the encoder layers in reverse, then the embeddings
// Gradients accumulate (+=) into the flat gradient buffer, so micro-steps add up; the trainer
// zeroes it once per optimizer step.
//
// Loss normalisation (DESIGN.md): loss = sum(MLM token losses) / global masked count
// + sum(NSP losses) / global sample count, with the global counts of the whole optimizer step
// (all ranks, all micro-steps) given by the planner. Each micro-batch's gradient is therefore
// already its exact share, and an all-reduce of plain sums gives the global gradient.
//
// The heads' backward runs inside forward(): the loss is the end of the graph, so the MLM
// decoder's logits are turned into their gradient at once (backend.h mlm_loss) and never kept
// (with chunking, never more than one chunk of them exists). forward() with gradients on
// therefore already adds the head parameters' gradients (the word embeddings' decoder share
// included), and must be followed by backward().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/metric_slots.h"
#include "model/options.h"
#include "model/params.h"

namespace packbert {

// Activation memory (the arena) of a Bert, by kind of buffer (model/arena.h ActivationKind).
// The numbers are the carve of the arena, so they hold for every backend. A model with a
// gradient buffer counts only its forwards with gradients (training): an evaluation forward in
// between is not part of the report (a forward-only model counts its evaluation forwards).
struct ActivationReport {
  size_t peak_bytes = 0;            // high-water mark over all forward() calls so far
  ActivationBytes peak_by_kind{};   // its split (the step that set it)
  size_t step_bytes = 0;            // the last forward()
  ActivationBytes step_by_kind{};
  size_t capacity = 0;              // bytes allocated (>= peak, with growth headroom)
  int64_t allocations = 0;          // times the arena was (re)allocated: 1 when reserved once
  int64_t mst_chunks = 1;           // M of the last forward (auto resolved)
  int64_t mlp_chunk_rows = 0;       // rows per MLP chunk (0: intermediate kept per layer)
  int64_t mlm_chunk_rows = 0;       // masked rows per decoder call (0: all)
  // Outside the arena: the uploaded batch's two buffers (ids, layout arrays, labels; used in
  // turn, so that the next micro-batch's upload overlaps this one's compute), bytes allocated.
  size_t batch_buffer_bytes = 0;
  // Rows of the training forwards' batches so far, and of the capacities CUDA graphs laid them
  // into (the same without graphs): graphs cost laid_rows / rows - 1 in padding rows.
  int64_t rows = 0, laid_rows = 0;
};

// Inspection of the heads' logits in a forward pass without gradients, for tests: the losses
// recomputed from the logits (tests/model/test_model_forward.cpp) and the Hugging Face
// checkpoint round trip (tests/e2e/hf_roundtrip_tool.cpp). Evaluation does not use them: it
// takes forward()'s loss sums and correct counts, computed where the logits are
// (train/evaluate.h evaluate_batch). Called with host copies: MLM logits f32 [n, vocab_size] of the masked
// tokens first .. first + n - 1 (in the batch's masked order, once per decoder chunk), NSP
// logits f32 [num_seqs, 2] once.
using MlmLogitsHook = std::function<void(int64_t first, const std::vector<float>& logits, int64_t n)>;
using NspLogitsHook = std::function<void(const std::vector<float>& logits, int64_t num_seqs)>;

struct ForwardOptions {
  bool dropout = true;    // the config's dropout rates; false for evaluation
  bool gradients = true;  // backward() follows (the heads' gradients are computed here)
  // The loss's gradient is multiplied by this (fp16 loss scaling, optim/loss_scaler.h): every
  // gradient this step adds is scaled by it (the optimizer divides it out); the loss and the
  // metrics returned are not. 1 for fp32 / bf16.
  float loss_scale = 1.f;
  MlmLogitsHook mlm_logits;  // only with gradients off (with gradients the logits buffer
  NspLogitsHook nsp_logits;  // becomes their gradient in place)
  // Leave this micro-batch's loss sums and correct counts on the device instead of reading
  // them back (on a GPU a read-back waits for every op issued so far): forward() then returns
  // only what the host knows (masked_tokens, sequences), and Bert::deferred_results() reads
  // those of every deferred micro-batch at once -- the trainer's one wait per optimizer step.
  bool defer_metrics = false;
};

// Called by backward() with the index (into ParamTable::tensors()) of each tensor whose gradient
// no op of this micro-step writes again: the hook for the bucketed gradient reducer
// (comm/grad_reducer.h ready_tensor), which overlaps communication with the rest of the backward.
// Order: the heads (whose gradients forward() produced) first, then each encoder layer from the
// last to the first, then the embeddings (the word embeddings last of all: the tied decoder and
// the input lookup both add to them). Every tensor is announced exactly once per backward().
using GradientReady = std::function<void(int tensor_index)>;

// A gradient round that full graphs (CudaGraphs::full) take into the backward's graph: the
// collectives among the backward's ops, overlapping them as without graphs (the trainer's NCCL
// reducer; docs/communication.md#graphs). NCCL needs every rank to run, record and replay such a
// graph together, so the ranks decide together, from all their keys (all_ranks): the graph of
// a combination of every rank's shapes is run the first time, recorded the second, replayed
// from then on; if any rank cannot (an empty micro-batch), all run the ops.
struct GradientRound {
  GradientReady ready;             // as backward(ready), inside the ops
  std::function<void()> complete;  // after the last ready(), inside the ops (the round's join)
  std::function<void()> launched;  // after a launch of a graph holding the round, instead
  // Every rank's values of a vector of the same length, in rank order (GradReducer::all_ranks).
  std::function<std::vector<int64_t>(const std::vector<int64_t>&)> all_ranks;
  int64_t tag = 0;  // what the round does (the collective): a graph per tag
};

struct ActivationPlan;  // model/activations.h

// What training reserves a model for before its first step (Bert::reserve), so that no step
// allocates: the largest micro-batch (config/train_options.h largest_micro_batch), its layout
// (CUDA graphs lay batches into capacities by it) and how many forwards' metrics may wait to be
// read (MetricSlots: micro-steps x steps between reads).
struct BertReserve {
  BatchShape shape;
  BatchLayout layout = BatchLayout::unpadded;
  int64_t deferred_forwards = 0;
};

// The bytes a Bert's own buffers hold (Backend::alloc) once reserved: the model's part of the
// memory plan (train/memory_plan.h), computed without a model by Bert::memory and allocated by
// Bert::reserve from the same figures.
struct BertMemory {
  size_t lowp_weights = 0;   // the 16-bit weight copy (bf16 / fp16 / fp8)
  size_t fp8_state = 0;      // FP8 scales, histories, amaxes and the FP8 weight copies
  size_t fp8_workspace = 0;  // one GEMM's FP8 operands
  size_t arena = 0;          // the activation arena's capacity
  size_t batch_buffers = 0;  // the two batch buffers together
  size_t metric_slots = 0;
  BatchShape laid;           // the reserved shape as laid out (graphs' capacity, FP8's rows)
  int64_t mst_chunks = 1;    // M of that shape
  ActivationBytes arena_by_kind{};  // that shape's carve by kind (before the auto-M margin)
  size_t total() const {
    return lowp_weights + fp8_state + fp8_workspace + arena + batch_buffers + metric_slots;
  }
};

class Bert {
 public:
  // params, grads: f32 [table.total()] on the backend's device, owned by the caller (grads may
  // be none for an evaluation-only model). The activation arena and the low-precision weight
  // copy are the backend's memory (Backend::alloc).
  // fp32_weights (optional, bf16 / fp16 only): the fp32 values the ops read in a compact
  // buffer of their own (params.h bind_fp32_weights), params then none: a rank of a sharded
  // optimizer that keeps only its shard of the masters (model/replica.h shard_masters).
  Bert(const BertConfig& config, Backend& backend, const Tensor& params, const Tensor& grads,
       const BertOptions& options = {}, const Tensor& fp32_weights = Tensor());
  ~Bert();
  Bert(const Bert&) = delete;
  Bert& operator=(const Bert&) = delete;

  // One micro-batch. global_masked_tokens / global_samples: the step's counts over all ranks
  // and micro-steps (>= this batch's own). step and seed key the dropout masks. An empty batch
  // (a rank or micro-step without samples) returns zeros and adds nothing.
  ForwardResult forward(const Batch& batch, int64_t global_masked_tokens, int64_t global_samples,
                        uint32_t step, uint64_t seed, const ForwardOptions& options = {});
  // The complete results of the forward() calls with defer_metrics since the last call, in
  // call order, equal to what those calls would have returned without it; the list is then
  // empty again. One copy from the device (the host waits for every op issued so far).
  std::vector<ForwardResult> deferred_results();
  // The same in two parts, for a caller that reads the sums with other values in one wait
  // (Backend::read): the device bytes deferred_results() would copy (none: an undefined tensor),
  // then the results from a host copy of them (null when there were none).
  Tensor deferred_sums() const;
  std::vector<ForwardResult> take_deferred_results(const void* sums);
  // Gradients of the last forward() (which had gradients on) += into grads; `ready` (optional)
  // hears of each tensor as its gradient becomes final (see GradientReady).
  void backward(const GradientReady& ready = {});
  // The same with a gradient round; without full graphs, backward(round.ready) (the caller
  // completes the round). Collective over the ranks with full graphs (round.all_ranks).
  void backward(const GradientRound& round);

  // Sizes the arena and the two batch buffers for the largest micro-batch expected so that the
  // step loop never allocates; forward() grows them anyway when a batch needs more
  // (arena_allocations() counts the arena's).
  void reserve(const BatchShape& shape, bool gradients = true);
  // Training's reserve: every buffer of the model at the size Bert::memory gives, exactly (no
  // growth headroom), after which a training batch within r.shape, and an evaluation batch
  // that fits() memory()'s figures, allocates nothing. Call after set_data_parallel.
  void reserve(const BertReserve& r);
  // The same figures without a model. graphs: CUDA graphs on (cuda_graphs != off on a CUDA
  // device); ranks: the data-parallel world (the FP8 state's shared amaxes).
  static BertMemory memory(const BertConfig& config, const BertOptions& options, bool graphs,
                           int ranks, const BertReserve& r);
  // Whether a batch of this shape and layout runs within `limits` (memory()'s figures: what
  // training reserves), allocating nothing more: evaluation splits its batches until they do, in
  // training and in `packbert eval` alike, so that both evaluate the same batches.
  bool fits(const BertMemory& limits, const BatchShape& shape, BatchLayout layout,
            bool gradients) const;
  bool graphs_on() const { return graphs_.on(); }
  // Arena bytes a batch of this shape needs (with the M that forward() would use for it, and,
  // with graphs, in the capacity forward() lays it into).
  size_t activation_bytes(const BatchShape& shape, bool gradients = true) const;
  // The M forward() uses for a batch of this shape (mst_chunks, or auto from the budget).
  int64_t mst_chunks_for(const BatchShape& shape, bool gradients = true) const;
  ActivationReport activation_report() const;
  size_t arena_high_water() const { return arena_.high_water(); }
  size_t arena_capacity() const { return arena_.capacity(); }
  int64_t arena_allocations() const { return arena_.allocations(); }

  const BertConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  const BertOptions& options() const { return options_; }

  // The low-precision copy of the parameters that the GEMMs read (bf16 / f16 [table.total()]
  // on the backend's device, owned by the model; none for fp32). Pass it to Lamb::step, which
  // rewrites it from the master weights in its update pass. Whoever changes the master weights
  // any other way (initialisation, checkpoint load, a test) calls refresh_lowp_params().
  const Tensor& lowp_params() const { return params_lowp_; }
  void refresh_lowp_params();
  // The 16-bit copy from `whole`, f32 [table.total()] laid out as the masters (a model without
  // them: the sharded replica's loads).
  void refresh_lowp_params_from(const Tensor& whole);

  // Precision fp8 (model/fp8.h; null otherwise): the scaling state. The trainer tells the model
  // its data-parallel world once (the amax of a step is the maximum over every rank; this
  // resets the state), calls fp8_end_step after each optimizer step (the scales updated from
  // the step's amaxes, summed over the ranks by sum_over_ranks; the FP8 weight copies are cast
  // again before the next forward reads them), and weights_changed() whenever the master
  // weights change otherwise.
  Fp8State* fp8() const { return fp8_.get(); }
  void set_data_parallel(int ranks, int rank);
  void fp8_end_step(const std::function<void(const Tensor&)>& sum_over_ranks);
  void weights_changed();
  // The parts [begin, end) of the flat fp32 master weights that the ops read in fp32, ascending
  // and merged where adjacent: the whole buffer under fp32; under bf16 / fp16 everything but the
  // weight matrices and embedding tables, which the ops read from the 16-bit copy: the biases
  // and LayerNorm parameters. A sharded optimizer keeps these current on every rank, and the
  // 16-bit copy of everything (optim/distributed_lamb.h).
  const std::vector<std::pair<int64_t, int64_t>>& fp32_ranges() const { return fp32_ranges_; }
  // The parameters by the part of a forward that first reads them, in forward order: [0] the
  // embeddings, [1 + l] encoder layer l, [L + 1] the pooler and heads; each the range [begin,
  // end) of the flat buffer its tensors span (the table is laid out in this order: params.h).
  const std::vector<std::pair<int64_t, int64_t>>& forward_groups() const {
    return forward_groups_;
  }
  // Called with a group's index before a forward's first op that reads its weights: a sharded optimizer whose gather of the weights still runs makes the
  // backend's stream wait for that group only (optim/distributed_lamb.h). None: no call.
  void set_weights_ready(std::function<void(int group)> hook) { weights_ready_ = std::move(hook); }

  struct Activations;  // model/activations.h

 private:
  ActivationPlan plan(const BatchShape& shape, bool gradients, int64_t mst_chunks) const;
  size_t plan_bytes(const BatchShape& shape, const ActivationPlan& plan) const;
  Dropout dropout(DropoutSite site, uint32_t layer) const;
  void encoder_layer_forward(int64_t l);
  void encoder_layer_backward(int64_t l, const Tensor& dy, const Tensor& dx);
  void mlp_forward(int64_t l);
  void mlp_backward(int64_t l, const Tensor& dout, const Tensor& dh1);
  void heads(float mlm_scale, float nsp_scale, const ForwardOptions& options, const Tensor& sums);
  ActivationPlan lay_out(const Batch& batch, const ForwardOptions& options, Graphed graphed,
                         const std::vector<float>& grad_scales);
  // Encoder layer l's linear layer j (Fp8State::Linear): linear_forward / linear_backward, in
  // FP8 under precision fp8 once its scales are warm (before that in bf16, recording the
  // amaxes). `first`: the row of x / dout within the batch (an MST chunk's), for the padding
  // mask.
  void linear_fwd(int64_t l, int j, int64_t first, const Tensor& x, const Tensor& w,
                  const Tensor& bias, Epilogue epilogue, const Tensor& out, const Tensor& pre);
  void linear_bwd(int64_t l, int j, int64_t first, const Tensor& x, const Tensor& w,
                  const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& db,
                  const LinearBackwardOptions& options);

  BertConfig config_;
  Backend& backend_;
  BertOptions options_;
  ParamTable table_;
  BertWeights weights_;       // fp32 master weights
  // What the ops read: weights_ with every weight matrix (encoder, MLM transform and decoder,
  // pooler, NSP classifier) and the embedding tables a view of params_lowp_ under bf16 / fp16.
  // Biases and LayerNorm parameters stay fp32.
  BertWeights gemm_weights_;
  BertWeights grads_;
  Tensor params_;             // the master weights, for refresh_lowp_params()
  Tensor params_lowp_;
  BackendBuffer lowp_memory_;  // params_lowp_'s memory
  std::vector<std::pair<int64_t, int64_t>> fp32_ranges_;
  std::vector<std::pair<int64_t, int64_t>> forward_groups_;
  std::function<void(int)> weights_ready_;
  bool has_grads_ = false;
  // Tensor index ranges [first, last) in the order backward() finishes them: heads, layer
  // L-1 .. layer 0, embeddings.
  std::vector<std::pair<int, int>> ready_groups_;
  Arena arena_;
  // The uploaded batch: two buffers used in turn, so that a micro-batch's upload
  // (Backend::prefetch) overlaps the previous micro-step's compute. Model-owned, outside the
  // arena, grow-only (reserve() sizes both).
  BackendBuffer batch_buffers_[2];
  int next_batch_buffer_ = 0;
  void grow_batch_buffer(BackendBuffer& buffer, size_t bytes);
  std::unique_ptr<Activations> act_;
  int64_t last_mst_chunks_ = 1;
  BertGraphs graphs_;
  // Rows of the training forwards' batches, and of the capacities they were laid into.
  int64_t rows_ = 0, laid_rows_ = 0;
  // The backward's ops; announce_inside: `ready` hears of each group as its ops are issued
  // (otherwise the caller announces them).
  void backward_ops(const GradientReady& ready, bool announce_inside);
  void announce_all(const GradientReady& ready) const;
  // The step in flight (dropout keys, and whether backward() may run).
  uint32_t step_ = 0;
  uint64_t seed_ = 0;
  bool dropout_on_ = false;
  bool backward_pending_ = false;
  MetricSlots metrics_;  // the heads' sums, read at once or deferred
  std::unique_ptr<Fp8State> fp8_;
  std::vector<char> fp8_stale_;  // per layer: its FP8 weight copies predate the masters
};

}  // namespace packbert
