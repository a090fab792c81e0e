// BertForPreTraining on the Backend interface: one code path for every backend and layout,
// composed of parts (model/parts.h) over the layer list:
//   forward   Embeddings -> L x (AttentionBlock, MlpBlock) -> MlmHead on the masked rows only,
//             NspHead on each sequence's [CLS]; loss and metrics
//   backward  the layers in reverse (MlpBlock, then AttentionBlock), then the Embeddings
// Gradients accumulate (+=) into the flat gradient buffer, so micro-steps add up; the trainer
// zeroes it once per optimizer step.
//
// Loss normalisation (DESIGN.md): loss = sum(MLM token losses) / global masked count
// + sum(NSP losses) / global sample count, with the global counts of the whole optimizer step
// (all ranks, all micro-steps) given by the planner. Each micro-batch's gradient is therefore
// already its exact share, and an all-reduce of plain sums gives the global gradient.
//
// The heads' backward runs inside forward() (model/heads.h): forward() with gradients on
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
#include "model/attention_block.h"
#include "model/batch.h"
#include "model/bert_graphs.h"
#include "model/bert_memory.h"
#include "model/config.h"
#include "model/embeddings.h"
#include "model/heads.h"
#include "model/linears.h"
#include "model/metric_slots.h"
#include "model/mlp_block.h"
#include "model/options.h"
#include "model/params.h"
#include "model/weights.h"

namespace packbert {

struct ForwardOptions {
  bool dropout = true;    // the config's dropout rates; false for evaluation
  bool gradients = true;  // backward() follows (the heads' gradients are computed here)
  // The loss's gradient is multiplied by this (fp16 loss scaling, optim/loss_scaler.h): every
  // gradient this step adds is scaled by it (the optimizer divides it out); the loss and the
  // metrics returned are not. 1 for fp32 / bf16.
  float loss_scale = 1.f;
  // Host copies of the heads' logits (model/heads.h), for tests: only with gradients off (with
  // gradients the logits buffer becomes their gradient in place).
  MlmLogitsHook mlm_logits;
  NspLogitsHook nsp_logits;
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

// A gradient round: the collectives that reduce the gradient as the backward finishes it (the
// trainer's reducer). Full graphs (CudaGraphs::full) take it into the backward's graph when the
// reducer can be captured (in_graph: NCCL, or one rank), overlapping it as without graphs
// (docs/communication.md#graphs). NCCL needs every rank to run, record and replay such a graph
// together, so the ranks decide together, from all their keys (all_ranks): the graph of a
// combination of every rank's shapes is run the first time, recorded the second, replayed from
// then on; if any rank cannot (an empty micro-batch), all run the ops.
struct GradientRound {
  GradientReady ready;             // as backward(ready), inside the ops
  std::function<void()> complete;  // after the last ready(), inside the ops (the round's join)
  std::function<void()> launched;  // after a launch of a graph holding the round, instead
  // Every rank's values of a vector of the same length, in rank order (GradReducer::all_ranks).
  std::function<std::vector<int64_t>(const std::vector<int64_t>&)> all_ranks;
  int64_t tag = 0;        // what the round does (the collective): a graph per tag
  bool in_graph = false;  // the reducer's collectives can be recorded (GradReducer::capturable)
};

class Bert {
 public:
  // params, grads, fp32_weights: as ModelWeights' (model/weights.h). The activation arena and
  // the low-precision weight copy are the backend's memory (Backend::alloc).
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
  // Gradients of the last forward() (which had gradients on) += into grads; `ready` (optional)
  // hears of each tensor as its gradient becomes final (see GradientReady).
  void backward(const GradientReady& ready = {});
  // backward(round.ready), and with full graphs and round.in_graph the round's collectives
  // inside the backward's graph, completed there; otherwise the caller completes the round.
  // Collective over the ranks in that case (round.all_ranks).
  void backward_and_reduce(const GradientRound& round);

  // The complete results of the forward() calls with defer_metrics since the last call, in
  // call order, equal to what those calls would have returned without it; the list is then
  // empty again. One copy from the device (the host waits for every op issued so far).
  std::vector<ForwardResult> deferred_results();
  // The same in two parts, for a caller that reads the sums with other values in one wait
  // (Backend::read): the device bytes deferred_results() would copy (none: an undefined tensor),
  // then the results from a host copy of them (null when there were none).
  Tensor deferred_sums() const;
  std::vector<ForwardResult> take_deferred_results(const void* sums);

  // ---- memory (model/bert_memory.h has the plan without a model) ---------------------------
  // Training's reserve: every buffer of the model at the size plan_bert_memory gives, exactly
  // (no growth headroom), after which a training batch within r.shape, and an evaluation batch
  // that fits() its figures, allocates nothing. Call after set_data_parallel.
  void reserve_training(const BertReserve& r);
  // Grows the arena and the batch buffers (with headroom) to hold a batch of this shape;
  // forward() grows them anyway when a batch needs more (activation_report().allocations).
  void grow_for(const BatchShape& shape, bool gradients = true);
  // Whether a batch of this shape and layout runs within `limits` (what training reserves),
  // allocating nothing more: evaluation splits its batches until they do, in training and in
  // `packbert eval` alike, so that both evaluate the same batches.
  bool fits(const BertMemory& limits, const BatchShape& shape, BatchLayout layout,
            bool gradients) const;
  // Arena bytes a batch of this shape needs, in the shape forward() lays it into (laid_shape)
  // with the M forward() would use for it; that M.
  size_t activation_bytes(const BatchShape& shape, bool gradients = true) const;
  int64_t mst_chunks_for(const BatchShape& shape, bool gradients = true) const;
  ActivationReport activation_report() const;

  const BertConfig& config() const { return config_; }
  const ParamTable& table() const { return table_; }
  const BertOptions& options() const { return options_; }
  bool graphs_on() const { return graphs_.on(); }

  // ---- weights ---------------------------------------------------------------------------
  // The views, the 16-bit copy and the table's groups (model/weights.h).
  const ModelWeights& weights() const { return weights_; }
  // Whoever changes the master weights other than through Lamb::step (initialisation,
  // checkpoint load, a test) calls one of these: the 16-bit copy converted again (from the
  // masters, or from `whole`, f32 [table.total()] laid out as them, for a model without them),
  // and the FP8 copies marked stale. weights_changed(): the FP8 copies only.
  void refresh_lowp_params();
  void refresh_lowp_params_from(const Tensor& whole);
  void weights_changed() { linears_.weights_changed(); }
  // Called with a group's index (ModelWeights::forward_groups) before a forward's first op
  // that reads its weights: a sharded optimizer whose gather of the weights still runs makes
  // the backend's stream wait for that group only (optim/distributed_lamb.h). None: no call.
  void set_weights_ready(std::function<void(int group)> hook) { weights_ready_ = std::move(hook); }

  // ---- precision fp8 (model/fp8.h; null otherwise) -----------------------------------------
  // The trainer tells the model its data-parallel world once (the amax of a step is the maximum
  // over every rank; this resets the state) and calls fp8_end_step after each optimizer step
  // (the scales updated from the step's amaxes, summed over the ranks by sum_over_ranks).
  Fp8State* fp8() const { return linears_.fp8(); }
  void set_data_parallel(int ranks, int rank) { linears_.set_data_parallel(ranks, rank); }
  void fp8_end_step(const std::function<void(const Tensor&)>& sum_over_ranks) {
    linears_.end_step(sum_over_ranks);
  }

 private:
  // bert_memory.cpp: the batch on the device and the arena carved for it.
  ActivationPlan lay_out(const Batch& batch, const ForwardOptions& options, Graphed graphed,
                         const std::vector<float>& grad_scales);
  void grow_batch_buffer(BackendBuffer& buffer, size_t bytes);
  const GraphCapacity* graph_bound(bool gradients) const { return graphs_.bound(gradients); }
  // bert.cpp: the parts of a step.
  GraphKey graph_key(const ActivationPlan& plan, const Tensor& sums, float mlm_scale,
                     bool gradients) const;
  void forward_ops(Graphed graphed, float mlm_scale, float nsp_scale, const ForwardOptions& options,
                   const Tensor& sums);
  void layer_forward(int64_t l);
  void layer_backward(int64_t l, const Tensor& dy, const Tensor& dx);
  void heads(float mlm_scale, float nsp_scale, const ForwardOptions& options, const Tensor& sums);
  // The backward's ops; announce_inside: `ready` hears of each group as its ops are issued
  // (otherwise the caller announces them).
  void backward_ops(const GradientReady& ready, bool announce_inside);
  void announce(const GradientReady& ready, size_t group) const;
  void announce_all(const GradientReady& ready) const;
  void begin_backward();

  BertConfig config_;
  Backend& backend_;
  BertOptions options_;
  ParamTable table_;
  ModelWeights weights_;
  std::unique_ptr<StepActivations> act_;
  EncoderLinears linears_;
  ModelRefs refs_;
  Embeddings embeddings_;
  AttentionBlock attention_;
  MlpBlock mlp_;
  MlmHead mlm_head_;
  NspHead nsp_head_;
  std::function<void(int)> weights_ready_;
  Arena arena_;
  // The uploaded batch: two buffers used in turn, so that a micro-batch's upload
  // (Backend::prefetch) overlaps the previous micro-step's compute. Model-owned, outside the
  // arena, grow-only.
  BackendBuffer batch_buffers_[2];
  int next_batch_buffer_ = 0;
  int64_t last_mst_chunks_ = 1;
  BertGraphs graphs_;
  // Rows of the training forwards' batches, and of the capacities they were laid into.
  int64_t rows_ = 0, laid_rows_ = 0;
  bool backward_pending_ = false;  // a forward with gradients waits for its backward
  MetricSlots metrics_;            // the heads' sums, read at once or deferred
};

}  // namespace packbert
