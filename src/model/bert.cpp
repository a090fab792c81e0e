// One micro-batch through BertForPreTraining, forward then backward, top to bottom: the parts
// (model/parts.h) over the layer list, with the CUDA graphs' decisions (model/bert_graphs.h)
// around them. Every computation is a part's backend op; the buffers are carved in
// bert_memory.cpp.
#include "model/bert.h"

#include <cmath>

#include "kernels/base/error.h"
#include "kernels/base/trace.h"

namespace packbert {

namespace {
const BertOptions& checked(const BertOptions& options) {
  PB_REQUIRE(options.mlm_chunk_rows >= 0, "model: mlm_chunk_rows {} must be >= 0",
             options.mlm_chunk_rows);
  PB_REQUIRE(options.mst_chunks >= 0, "model: mst_chunks {} must be >= 1 (0 = auto)",
             options.mst_chunks);
  PB_REQUIRE(options.mst_chunks > 0 || options.activation_budget_bytes > 0,
             "model: mst_chunks = 0 (auto) needs an activation budget (activation_budget_bytes)");
  return options;
}
}  // namespace

Bert::Bert(const BertConfig& config, Backend& backend, const Tensor& params, const Tensor& grads,
           const BertOptions& options, const Tensor& fp32_weights)
    : config_(config),
      backend_(backend),
      options_(checked(options)),
      table_(config),
      weights_(table_, backend, options.precision, params, grads, fp32_weights),
      act_(std::make_unique<StepActivations>()),
      linears_(backend, config, options.precision == Precision::fp8, options.fp8, *act_),
      refs_{backend, config_, weights_.read(), weights_.grads(), *act_, linears_},
      embeddings_(refs_),
      attention_(refs_),
      mlp_(refs_),
      mlm_head_(refs_),
      nsp_head_(refs_),
      arena_(backend),
      graphs_(backend, options.cuda_graphs, config.layers),
      metrics_(backend) {}

Bert::~Bert() = default;

void Bert::refresh_lowp_params() {
  weights_.refresh_lowp();
  linears_.weights_changed();
}

void Bert::refresh_lowp_params_from(const Tensor& whole) {
  weights_.refresh_lowp_from(whole);
  linears_.weights_changed();
}

ForwardResult Bert::forward(const Batch& batch, int64_t global_masked, int64_t global_samples,
                            uint32_t step, uint64_t seed, const ForwardOptions& options) {
  const trace::Range range("forward");
  PB_REQUIRE(!options.gradients || weights_.has_grads(),
             "model: forward with gradients on a model built without a gradient buffer");
  PB_REQUIRE(!options.gradients || (!options.mlm_logits && !options.nsp_logits),
             "model: logits hooks need a forward without gradients");
  PB_REQUIRE(options.loss_scale > 0.f && std::isfinite(options.loss_scale),
             "model: loss_scale {} must be a positive finite number", options.loss_scale);
  backward_pending_ = false;
  check_model_batch(batch, config_, global_masked, global_samples);
  ForwardResult result;
  if (batch.empty()) {  // a rank or micro-step without samples contributes nothing
    backward_pending_ = options.gradients;
    graphs_.begin(GraphKey{}, Graphed::none);
    act_->shape = BatchShape{};
    if (options.defer_metrics) metrics_.defer(result, global_masked, global_samples, false);
    return result;
  }
  act_->keys = DropoutKeys{options.dropout, seed, step};
  // The one graph decision (model/bert_graphs.h): which parts run as graphs.
  const Graphed graphed = graphs_.plan(options.mlm_logits || options.nsp_logits);
  const bool graph_heads = graphed == Graphed::layers_and_heads || graphed == Graphed::whole;
  // The heads' gradient factors, read from the batch buffer when the ops run (GradScale).
  const auto mlm_scale = static_cast<float>(
      global_masked > 0 ? options.loss_scale / static_cast<double>(global_masked) : 0.0);
  const auto nsp_scale =
      static_cast<float>(options.loss_scale / static_cast<double>(global_samples));
  const ActivationPlan p = lay_out(batch, options, graphed, {mlm_scale, nsp_scale});
  // The metric slot this forward's sums go to (first: it may move them); graphed heads write
  // slot 0 (one graph for every slot), copied to the slot after it.
  const Tensor out_sums = metrics_.next(options.defer_metrics);
  const Tensor sums = graph_heads ? metrics_.slot(0) : out_sums;
  graphs_.begin(graph_key(p, sums, mlm_scale, options.gradients), graphed);
  forward_ops(graphed, mlm_scale, nsp_scale, options, sums);
  if (out_sums.data != sums.data) backend_.copy(out_sums, sums);

  result.masked_tokens = batch.num_masked();
  result.sequences = batch.num_seqs();
  backward_pending_ = options.gradients;
  if (!options.defer_metrics) return metrics_.read(sums, result, global_masked, global_samples);
  metrics_.defer(result, global_masked, global_samples, true);
  return result;
}

// Everything the recorded parts' host arguments depend on.
GraphKey Bert::graph_key(const ActivationPlan& p, const Tensor& sums, float mlm_scale,
                         bool gradients) const {
  const StepActivations& a = *act_;
  Fp8State* fp8 = linears_.fp8();
  GraphKey key;
  key.batch = a.input_ids.data;
  key.arena = arena_.data();
  key.rows = a.shape.rows;
  key.seqs = a.shape.seqs;
  key.masked = a.shape.masked;
  key.max_len = a.layout.max_len;
  key.mlp_chunk_rows = p.mlp_chunk_rows;
  key.mlm_chunk_rows = p.mlm_chunk_rows;
  key.sums = sums.data;
  key.mlm_scale_exponent = options_.precision == Precision::fp16 && mlm_scale > 0.f
                               ? std::ilogb(mlm_scale)
                               : 0;  // f16: the decoder's range scaling
  key.layer_recompute = p.layer_recompute;
  key.fp8_workspace = fp8 ? fp8->workspace(0).data : nullptr;
  key.fp8_warm = fp8 && fp8->warm();
  key.gradients = gradients;
  key.dropout = a.keys.on;
  key.seed = a.keys.seed;
  return key;
}

// The forward's parts, each as the graphs decided. weights_ready: before the part that reads a
// group's weights; all of them before a whole step's graph. FP8: a layer's weight copies cast
// again after an optimizer step, once its weights are there and outside any recorded part (a
// graph replays without them). They are cast from the 16-bit copy the GEMMs read: a sharded
// optimizer keeps that copy current on every rank, but only the rank's range of the fp32 masters.
void Bert::forward_ops(Graphed graphed, float mlm_scale, float nsp_scale,
                       const ForwardOptions& options, const Tensor& sums) {
  const bool whole = graphed == Graphed::whole;
  const int64_t layers = config_.layers;
  const LayerWeights* weights = weights_.read().layers.data();
  if (whole) {
    for (int64_t g = 0; g < layers + 2 && weights_ready_; ++g) weights_ready_(static_cast<int>(g));
    for (int64_t l = 0; l < layers; ++l) linears_.cast_weights(l, weights[l]);
  }
  auto weights_ready = [&](int64_t group) {
    if (weights_ready_ && !whole) weights_ready_(static_cast<int>(group));
  };
  graphs_.whole(false, [&] {
    weights_ready(0);
    embeddings_.forward();
    for (int64_t l = 0; l < layers; ++l) {
      weights_ready(l + 1);
      linears_.cast_weights(l, weights[l]);  // done already in a whole step's graph
      graphs_.layer(false, l, [&] { layer_forward(l); });
    }
    weights_ready(layers + 1);
    graphs_.heads([&] { heads(mlm_scale, nsp_scale, options, sums); });
  });
}

void Bert::layer_forward(int64_t l) {
  attention_.forward(l);
  mlp_.forward(l);
}

// The heads, loss and (with gradients) the gradient wrt the encoder output (model/heads.h).
void Bert::heads(float mlm_scale, float nsp_scale, const ForwardOptions& options,
                 const Tensor& sums) {
  const trace::Range range("heads");
  backend_.zero(sums);  // the slot's four words (MetricSlots)
  mlm_head_.forward(
      mlm_scale, {MetricSlots::word(sums, 0, DType::f32), MetricSlots::word(sums, 2, DType::i32)},
      options.mlm_logits);
  if (config_.nsp_head)
    nsp_head_.forward(
        nsp_scale, {MetricSlots::word(sums, 1, DType::f32), MetricSlots::word(sums, 3, DType::i32)},
        options.nsp_logits);
}

Tensor Bert::deferred_sums() const { return metrics_.deferred_sums(); }

std::vector<ForwardResult> Bert::take_deferred_results(const void* sums) {
  return metrics_.take_deferred(sums);
}

std::vector<ForwardResult> Bert::deferred_results() {
  const Tensor sums = deferred_sums();
  std::vector<uint8_t> host(sums.defined() ? sums.bytes() : 0);
  if (!host.empty()) backend_.read({{host.data(), sums}});
  return take_deferred_results(host.empty() ? nullptr : host.data());
}

void Bert::begin_backward() {
  PB_REQUIRE(backward_pending_, "model: backward() without a forward() with gradients on");
  backward_pending_ = false;
}

void Bert::backward(const GradientReady& ready) {
  const trace::Range range("backward");
  begin_backward();
  // An empty batch adds nothing: every gradient is already final.
  if (act_->shape.seqs == 0) return announce_all(ready);
  if (graphs_.graphed() != Graphed::whole) return backward_ops(ready, true);
  // The whole backward in one graph (CudaGraphs::full): every tensor is announced after it.
  graphs_.whole(true, [&] { backward_ops(ready, false); });
  announce_all(ready);
}

void Bert::backward_and_reduce(const GradientRound& round) {
  if (!graphs_.full() || !round.in_graph) return backward(round.ready);
  const trace::Range range("backward");
  PB_REQUIRE(round.complete && round.launched && round.all_ranks,
             "model: a gradient round without its complete, launched or all_ranks hook");
  begin_backward();
  const bool empty = act_->shape.seqs == 0;
  auto ops = [&] {
    if (empty) {
      announce_all(round.ready);
    } else {
      backward_ops(round.ready, true);
    }
    round.complete();
  };
  // Every rank records and replays the round's graph together, or none does.
  const bool mine = graphs_.graphed() == Graphed::whole && !empty;
  if (!graphs_.whole_round(round.tag, mine, round.all_ranks, ops, round.launched)) ops();
}

// The layers in reverse, then the embeddings. A group of tensors is final once its ops have run
// (on CUDA: once enqueued; the all-reduce must order itself after them on its stream).
void Bert::backward_ops(const GradientReady& ready, bool announce_inside) {
  const GradientReady& hear = announce_inside ? ready : GradientReady();
  StepActivations& a = *act_;
  const int64_t layers = config_.layers;
  announce(hear, 0);  // the heads, done in forward()
  // dhidden[0] holds dL/d(encoder output) from the heads; the two buffers alternate.
  int cur = 0;
  for (int64_t l = layers - 1; l >= 0; --l) {
    const Tensor &dy = a.scratch.dhidden[cur], &dx = a.scratch.dhidden[1 - cur];
    graphs_.layer(true, l, [&] { layer_backward(l, dy, dx); });
    cur = 1 - cur;
    announce(hear, static_cast<size_t>(layers - l));
  }
  // Pre-norm: the embeddings' output is the stream, whose gradient layer 0 completed.
  const bool pre = config_.norm == NormPlacement::pre;
  embeddings_.backward(pre ? a.scratch.dstream : a.scratch.dhidden[cur]);  // scratch to the op
  announce(hear, weights_.backward_groups().size() - 1);
}

// dy = dL/d(hidden[l + 1]) (overwritten: it carries dL/dh1 midway) -> dx = dL/d(hidden[l]).
// Layer recomputation refills the shared layer buffers first (hidden[l + 1] is rewritten with
// the same values; nothing reads it any more); the last layer's are still its forward's.
void Bert::layer_backward(int64_t l, const Tensor& dy, const Tensor& dx) {
  if (act_->plan.layer_recompute && l + 1 < config_.layers) layer_forward(l);
  mlp_.backward(l, dy);
  attention_.backward(l, dy, dx);
}

// Last tensor first within a group: the order in which the all-reduce's buckets (from the
// buffer's end) fill up.
void Bert::announce(const GradientReady& ready, size_t group) const {
  if (!ready) return;
  const auto& [first, end] = weights_.backward_groups()[group];
  for (int i = end - 1; i >= first; --i) ready(i);
}

void Bert::announce_all(const GradientReady& ready) const {
  for (size_t g = 0; g < weights_.backward_groups().size(); ++g) announce(ready, g);
}

}  // namespace packbert
