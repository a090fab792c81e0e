// One micro-batch through BertForPreTraining, forward then backward, top to bottom. Every
// computation is a backend op (kernels/backend.h); this file only decides what runs on which
// buffer. The layer code follows the sketch in backend.h's header comment.
#include "model/bert.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "kernels/base/error.h"
#include "kernels/base/trace.h"
#include "model/activations.h"

namespace packbert {

namespace {

// The same memory with another row-major shape (the backward's shared scratch).
Tensor reshape(const Tensor& t, std::initializer_list<int64_t> dims) {
  Tensor r(t.data, t.dtype, dims, t.device);
  PB_CHECK(r.numel() <= t.numel(), "reshape of {} to {} elements", t.str(), r.numel());
  return r;
}

// Rows [first, first + n) of a row-major tensor.
Tensor rows_of(const Tensor& t, int64_t first, int64_t n) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + first * (t.bytes() / t.dim(0));
  r.shape[0] = n;
  return r;
}

}  // namespace

Bert::Bert(const BertConfig& config, Backend& backend, const Tensor& params, const Tensor& grads,
           const BertOptions& options, const Tensor& fp32_weights)
    : config_(config),
      backend_(backend),
      options_(options),
      table_(config),
      arena_(backend),
      act_(std::make_unique<Activations>()),
      graphs_(backend, options.cuda_graphs, config.layers),
      metrics_(backend) {
  PB_REQUIRE(options.mlm_chunk_rows >= 0, "model: mlm_chunk_rows {} must be >= 0",
             options.mlm_chunk_rows);
  PB_REQUIRE(options.mst_chunks >= 0, "model: mst_chunks {} must be >= 1 (0 = auto)",
             options.mst_chunks);
  PB_REQUIRE(options.mst_chunks > 0 || options.activation_budget_bytes > 0,
             "model: mst_chunks = 0 (auto) needs an activation budget (activation_budget_bytes)");
  if (fp32_weights.defined()) {
    PB_REQUIRE(options.precision == Precision::bf16 || options.precision == Precision::fp16,
               "model: precision {} reads every weight in fp32 from the masters: they cannot be "
               "sharded (bf16 / fp16 only)",
               precision_name(options.precision));
    check_device("Bert", "fp32_weights", fp32_weights, backend.device());
    weights_ = bind_fp32_weights(table_, fp32_weights);
  } else {
    check_device("Bert", "params", params, backend.device());
    weights_ = bind_weights(table_, params);
    params_ = params;
  }
  gemm_weights_ = weights_;
  if (options.precision != Precision::fp32) {
    // The GEMMs' weight copy: the whole table in the low-precision type (one conversion pass
    // and one LAMB pass over a flat buffer; the fp32 views of it are simply never read).
    lowp_memory_ = backend.alloc(precision_dtype(options.precision), {table_.total()},
                                 "16-bit weight copy");
    params_lowp_ = lowp_memory_.tensor();
    gemm_weights_ = mixed_weights(table_, weights_, params_lowp_);
    if (!params_.defined()) backend.zero(params_lowp_);  // until the replica loads it
    refresh_lowp_params();
  }
  fp32_ranges_ = fp32_read_ranges(table_, options.precision != Precision::fp32);
  if (options.precision == Precision::fp8) {
    const std::string unsupported = backend.fp8_unsupported();
    PB_REQUIRE(unsupported.empty(), "model: precision fp8: {}", unsupported);
    fp8_ = std::make_unique<Fp8State>(backend, config, options.fp8, 1, 0);
    fp8_stale_.assign(static_cast<size_t>(config.layers), 1);
  }
  if (grads.defined()) {
    check_device("Bert", "grads", grads, backend.device());
    grads_ = bind_weights(table_, grads);
    has_grads_ = true;
  }
  ready_groups_ = backward_groups(table_);
  forward_groups_ = forward_ranges(table_, ready_groups_);
}

Bert::~Bert() = default;

void Bert::refresh_lowp_params() {
  if (params_lowp_.defined() && params_.defined()) backend_.convert(params_lowp_, params_);
  weights_changed();
}

void Bert::refresh_lowp_params_from(const Tensor& whole) {
  PB_REQUIRE(params_lowp_.defined(), "model: no 16-bit copy to refresh (precision fp32)");
  backend_.convert(params_lowp_, whole);
  weights_changed();
}

void Bert::weights_changed() { std::fill(fp8_stale_.begin(), fp8_stale_.end(), 1); }

void Bert::set_data_parallel(int ranks, int rank) {
  if (fp8_) fp8_ = std::make_unique<Fp8State>(backend_, config_, options_.fp8, ranks, rank);
  weights_changed();
}

void Bert::fp8_end_step(const std::function<void(const Tensor&)>& sum_over_ranks) {
  if (!fp8_) return;
  fp8_->update(sum_over_ranks);
  weights_changed();
}



namespace {
constexpr int64_t kMaxAutoChunks = 64;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The model's sizing, as functions of its config and options only: the model's methods and
// Bert::memory (the plan, without a model) both call these.
ActivationPlan activation_plan(const BertOptions& o, const BatchShape& shape, bool gradients,
                               int64_t m) {
  ActivationPlan p;
  p.gradients = gradients;
  p.layer_recompute = o.recompute == Recompute::layer;
  p.act = precision_dtype(o.precision);
  if (m > 1 || o.recompute == Recompute::mlp)
    p.mlp_chunk_rows = std::max<int64_t>(1, ceil_div(shape.rows, m));
  if (o.precision == Precision::fp8 && p.mlp_chunk_rows > 0)  // FP8 GEMMs take rows of 16
    p.mlp_chunk_rows = ceil_div(p.mlp_chunk_rows, 16) * 16;
  p.mlm_chunk_rows = o.mlm_chunk_rows > 0 ? o.mlm_chunk_rows
                     : m > 1              ? std::max<int64_t>(1, ceil_div(shape.masked, m))
                                          : 0;
  return p;
}

size_t carve_bytes(const BertConfig& config, const BatchShape& shape, const ActivationPlan& p) {
  Carver measure(nullptr, Device::cpu);
  Bert::Activations scratch;
  carve_activations(measure, config, shape, p, scratch);
  return measure.used();
}

int64_t chunks_for(const BertConfig& config, const BertOptions& o, const BatchShape& shape,
                   bool gradients) {
  if (o.mst_chunks > 0) return o.mst_chunks;
  for (int64_t m = 1; m < kMaxAutoChunks; m *= 2)
    if (carve_bytes(config, shape, activation_plan(o, shape, gradients, m)) <=
        o.activation_budget_bytes)
      return m;
  return kMaxAutoChunks;
}

// The rows CUDA graphs lay a batch's capacity out in: 8 unpadded, the slot length padded or
// packed; FP8's GEMMs want multiples of 16 as well.
int64_t row_quantum(BatchLayout layout, int64_t max_seq_len, bool fp8) {
  const int64_t q = layout == BatchLayout::unpadded ? 8 : max_seq_len;
  return fp8 ? std::lcm<int64_t>(q, 16) : q;
}

// The arena bytes that hold every training batch whose laid shape is within `laid`: the
// bound's own, and under mst_chunks = 0 (auto) also any smaller batch's, which may take fewer
// chunks: at most the budget, and at most the bound's bytes at M = 1 (bytes grow with the shape
// and shrink with M).
size_t training_arena_bytes(const BertConfig& config, const BertOptions& o,
                            const BatchShape& laid) {
  size_t bytes = carve_bytes(config, laid,
                             activation_plan(o, laid, true, chunks_for(config, o, laid, true)));
  if (o.mst_chunks == 0)
    bytes = std::max(bytes, std::min(o.activation_budget_bytes,
                                     carve_bytes(config, laid, activation_plan(o, laid, true, 1))));
  return (bytes + Carver::kAlign - 1) / Carver::kAlign * Carver::kAlign;
}
}  // namespace

ActivationPlan Bert::plan(const BatchShape& shape, bool gradients, int64_t m) const {
  return activation_plan(options_, shape, gradients, m);
}

size_t Bert::plan_bytes(const BatchShape& shape, const ActivationPlan& p) const {
  return carve_bytes(config_, shape, p);
}

int64_t Bert::mst_chunks_for(const BatchShape& shape, bool gradients) const {
  return chunks_for(config_, options_, shape, gradients);
}

BertMemory Bert::memory(const BertConfig& config, const BertOptions& options, bool graphs,
                        int ranks, const BertReserve& r) {
  const bool fp8 = options.precision == Precision::fp8;
  auto buffer = [](size_t bytes) { return std::max<size_t>(bytes, 1); };  // Backend::alloc
  BertMemory m;
  BatchShape laid = r.shape;
  if (graphs && laid.seqs > 0) {
    GraphCapacity c;
    c.row_quantum = row_quantum(r.layout, r.shape.max_len, fp8);
    c.cover(laid);
    laid = c.of(laid);
  } else if (fp8) {
    laid.rows = ceil_div(laid.rows, 16) * 16;
  }
  m.laid = laid;
  m.mst_chunks = chunks_for(config, options, laid, true);
  {
    Carver measure(nullptr, Device::cpu);
    Bert::Activations scratch;
    carve_activations(measure, config, laid, activation_plan(options, laid, true, m.mst_chunks),
                      scratch);
    m.arena_by_kind = measure.used_by_kind();
  }
  const int64_t n = ParamTable(config).total();
  if (options.precision != Precision::fp32)
    m.lowp_weights = buffer(static_cast<size_t>(n) * dtype_size(precision_dtype(options.precision)));
  if (fp8) {
    m.fp8_state = Fp8State::state_bytes(config, options.fp8, ranks);
    m.fp8_workspace = buffer(static_cast<size_t>(Fp8State::workspace_bytes_for(config, laid.rows)));
  }
  m.arena = buffer(training_arena_bytes(config, options, laid));
  m.batch_buffers = 2 * buffer(batch_bytes(laid));
  m.metric_slots = MetricSlots::bytes_for(r.deferred_forwards);
  return m;
}

void Bert::reserve(const BertReserve& r) {
  const bool fp8 = options_.precision == Precision::fp8;
  const BertMemory m = memory(config_, options_, graphs_.on(), fp8_ ? fp8_->ranks() : 1, r);
  if (graphs_.on() && r.shape.seqs > 0) {
    graphs_.cover(r.shape, true, row_quantum(r.layout, r.shape.max_len, fp8));
    const BatchShape c = graphs_.capacity(r.shape, true);
    PB_CHECK(c.rows == m.laid.rows && c.seqs == m.laid.seqs && c.masked == m.laid.masked,
             "Bert::reserve: graphs' capacity {} rows / {} seqs / {} masked, the plan's {} / {} / "
             "{}", c.rows, c.seqs, c.masked, m.laid.rows, m.laid.seqs, m.laid.masked);
  }
  arena_.reserve_exact(m.arena);
  for (BackendBuffer& b : batch_buffers_)
    if (b.bytes() < m.batch_buffers / 2) {
      b.reset();
      b = backend_.alloc(m.batch_buffers / 2, "batch buffer");
    }
  if (fp8_) fp8_->reserve_workspace(static_cast<int64_t>(m.fp8_workspace));
  metrics_.reserve(r.deferred_forwards);
}

bool Bert::fits(const BertMemory& limits, const BatchShape& shape, BatchLayout layout,
                bool gradients) const {
  if (shape.seqs == 0) return true;
  BatchShape c = shape;
  if (graphs_.on())
    c = graphs_.capacity(shape, gradients,
                         row_quantum(layout, limits.laid.max_len, fp8_ != nullptr));
  else if (fp8_)
    c.rows = ceil_div(c.rows, 16) * 16;
  if (plan_bytes(c, plan(c, gradients, mst_chunks_for(c, gradients))) > limits.arena) return false;
  if (batch_bytes(c) > limits.batch_buffers / 2) return false;
  return !fp8_ || static_cast<size_t>(Fp8State::workspace_bytes_for(config_, c.rows)) <=
                      limits.fp8_workspace;
}

size_t Bert::activation_bytes(const BatchShape& shape, bool gradients) const {
  const BatchShape c = graphs_.capacity(shape, gradients);
  return plan_bytes(c, plan(c, gradients, mst_chunks_for(c, gradients)));
}

ActivationReport Bert::activation_report() const {
  ActivationReport r;
  r.peak_bytes = arena_.high_water();
  r.peak_by_kind = arena_.high_water_by_kind();
  r.step_bytes = arena_.last_use();
  r.step_by_kind = arena_.last_use_by_kind();
  r.capacity = arena_.capacity();
  r.allocations = arena_.allocations();
  r.mst_chunks = last_mst_chunks_;
  r.mlp_chunk_rows = act_->plan.mlp_chunk_rows;
  r.mlm_chunk_rows = act_->plan.mlm_chunk_rows;
  r.batch_buffer_bytes = batch_buffers_[0].bytes() + batch_buffers_[1].bytes();
  r.rows = rows_;
  r.laid_rows = laid_rows_;
  return r;
}

void Bert::reserve(const BatchShape& shape, bool gradients) {
  graphs_.cover(shape, gradients);
  arena_.reserve(activation_bytes(shape, gradients));
  const size_t bytes = batch_bytes(graphs_.capacity(shape, gradients));
  if (graphs_.on()) {  // forwards with and without gradients have a buffer each
    grow_batch_buffer(batch_buffers_[gradients ? 0 : 1], bytes);
  } else {
    for (BackendBuffer& b : batch_buffers_) grow_batch_buffer(b, bytes);
  }
}

void Bert::grow_batch_buffer(BackendBuffer& buffer, size_t bytes) {
  if (bytes <= buffer.bytes()) return;
  buffer.reset();  // first: the old one's memory is given back before the new one is taken
  // Headroom as the arena's: a batch a few tokens longer does not reallocate.
  buffer = backend_.alloc(bytes + bytes / 16, "batch buffer");
}

Dropout Bert::dropout(DropoutSite site, uint32_t layer) const {
  Dropout d;
  if (dropout_on_)
    d.p = site == DropoutSite::attention_probs ? config_.attention_dropout : config_.hidden_dropout;
  d.seed = seed_;
  d.step = step_;
  d.device_step = act_->step;  // the same step, uploaded with the batch
  d.layer = layer;
  d.site = site;
  return d;
}

// The batch on the device and the arena carved for it: with graphs (any part), laid into its
// capacity (padding rows, empty sequence slots, unused masked slots) so that a part recorded for
// one batch replays for the next, and attention launched from the slots and the length bound
// (SeqLayout::fixed_launch). Returns the plan the arena was carved by.
ActivationPlan Bert::lay_out(const Batch& batch, const ForwardOptions& options, Graphed graphed,
                             const std::vector<float>& grad_scales) {
  const bool graph_heads = graphed == Graphed::layers_and_heads || graphed == Graphed::whole;
  Batch fixed;
  if (graphed != Graphed::none) {
    graphs_.cover(batch.shape(), options.gradients,
                  row_quantum(batch.layout, batch.max_seq_len, fp8_ != nullptr));
    BatchShape c = graphs_.capacity(batch.shape(), options.gradients);
    if (!graph_heads) c.masked = batch.num_masked();  // a logits hook is shown no padded slot
    fixed = with_capacity(batch, c.rows, c.seqs, c.masked);
  }
  if (graphed == Graphed::none && fp8_ && batch.rows % 16 != 0)  // FP8 GEMMs: rows of 16
    fixed = with_capacity(batch, ceil_div(batch.rows, 16) * 16, batch.num_seqs());
  const Batch& laid = graphed != Graphed::none || (fp8_ && batch.rows % 16 != 0) ? fixed : batch;
  if (options.gradients) {
    rows_ += batch.rows;
    laid_rows_ += laid.rows;
  }

  // The batch buffer: without graphs the two used in turn, the upload overlapping the previous
  // micro-step's compute (Backend::prefetch); with graphs the one the recorded parts read (one
  // for forwards with gradients, one without), uploaded in op order. The arena: measure, grow if
  // this batch is the largest yet, carve.
  const BatchShape shape = laid.shape();
  Activations& a = *act_;
  const bool graphs = graphed != Graphed::none;
  BackendBuffer& batch_buffer =
      batch_buffers_[graphs ? (options.gradients ? 0 : 1) : next_batch_buffer_];
  if (!graphs) next_batch_buffer_ = 1 - next_batch_buffer_;
  grow_batch_buffer(batch_buffer, batch_bytes(shape));
  Carver batch_carver(batch_buffer.data(), backend_.device());
  carve_batch(batch_carver, shape, a);
  if (graphs) {
    a.layout.fixed_launch = true;
    a.layout.max_len = std::max(batch.max_len, batch.max_seq_len);
  }
  upload_batch(backend_, laid, step_, grad_scales, a, /*ahead=*/!graphs);
  // NSP reads each sequence's [CLS]: with the heads graphed, over every slot (it leaves the
  // empty ones out, so the graph serves any count); else the batch's own sequences.
  const int64_t seqs = batch.num_seqs();
  a.nsp_layout = a.layout;
  if (!graph_heads) {
    a.nsp_layout.num_seqs = static_cast<int32_t>(seqs);
    a.nsp_layout.seq_start = rows_of(a.seq_start, 0, seqs);
    a.nsp_layout.seq_len = rows_of(a.seq_len, 0, seqs);
    a.nsp_layout.sample_id = rows_of(a.sample_id, 0, seqs);
    a.nsp_layout.fixed_launch = false;  // NSP launches nothing by the lengths
  }
  last_mst_chunks_ = mst_chunks_for(shape, options.gradients);
  const ActivationPlan p = plan(shape, options.gradients, last_mst_chunks_);
  arena_.reserve(plan_bytes(shape, p));
  Carver carver(arena_.data(), backend_.device());
  carve_activations(carver, config_, shape, p, a);
  if (fp8_) fp8_->workspace(Fp8State::workspace_bytes_for(config_, shape.rows));
  // The report describes the arena's purpose: a model with gradients reports its training
  // forwards (an evaluation between steps neither moves its peak nor its last step), a
  // forward-only model its evaluation forwards.
  if (options.gradients || !has_grads_) arena_.note_use(carver.used(), carver.used_by_kind());

  return p;
}

ForwardResult Bert::forward(const Batch& batch, int64_t global_masked, int64_t global_samples,
                            uint32_t step, uint64_t seed, const ForwardOptions& options) {
  const trace::Range range("forward");
  PB_REQUIRE(!options.gradients || has_grads_,
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
  step_ = step;
  seed_ = seed;
  dropout_on_ = options.dropout;

  // The one graph decision (model/bert_graphs.h): which parts run as graphs.
  const Graphed graphed = graphs_.plan(options.mlm_logits || options.nsp_logits);
  const bool graph_heads = graphed == Graphed::layers_and_heads || graphed == Graphed::whole;
  // The heads' gradient factors, read from the batch buffer when the ops run (GradScale).
  const auto mlm_scale = static_cast<float>(
      global_masked > 0 ? options.loss_scale / static_cast<double>(global_masked) : 0.0);
  const auto nsp_scale =
      static_cast<float>(options.loss_scale / static_cast<double>(global_samples));
  const ActivationPlan p = lay_out(batch, options, graphed, {mlm_scale, nsp_scale});
  Activations& a = *act_;

  // The metric slot this forward's sums go to; graphed heads write slot 0 (one graph for every
  // slot), copied to the slot after it.
  const Tensor out_sums = metrics_.next(options.defer_metrics);  // first: it may move them
  const Tensor sums = graph_heads ? metrics_.slot(0) : out_sums;

  // Everything the recorded parts' host arguments depend on.
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
  key.fp8_workspace = fp8_ ? fp8_->workspace(0).data : nullptr;
  key.fp8_warm = fp8_ && fp8_->warm();
  key.gradients = options.gradients;
  key.dropout = dropout_on_;
  key.seed = seed_;
  graphs_.begin(key, graphed);

  // The step, top to bottom. weights_ready: before the part that reads a group's weights; all
  // before a whole step's graph.
  const bool whole = graphed == Graphed::whole;
  if (whole && weights_ready_)
    for (int64_t g = 0; g < config_.layers + 2; ++g) weights_ready_(static_cast<int>(g));
  // FP8: a layer's weight copies cast again after an optimizer step, once its weights are there
  // and outside any recorded part (a graph replays without them).
  auto cast_fp8_weights = [&](int64_t l) {
    if (!fp8_ || !fp8_->warm() || !fp8_stale_[static_cast<size_t>(l)]) return;
    fp8_->cast_weights(l, weights_.layers[l]);
    fp8_stale_[static_cast<size_t>(l)] = 0;
  };
  if (whole)
    for (int64_t l = 0; l < config_.layers; ++l) cast_fp8_weights(l);
  auto weights_ready = [&](int64_t group) {
    if (weights_ready_ && !whole) weights_ready_(static_cast<int>(group));
  };
  graphs_.whole(false, [&] {
    // Embeddings: LayerNorm(word + position + token type), dropout.
    weights_ready(0);
    backend_.embedding_forward(a.layout, a.input_ids, a.segment_ids, gemm_weights_.embeddings,
                               dropout(DropoutSite::embedding, 0), a.hidden[0], a.emb_ln_mean,
                               a.emb_ln_rstd);
    // Encoder.
    for (int64_t l = 0; l < config_.layers; ++l) {
      weights_ready(l + 1);
      cast_fp8_weights(l);
      graphs_.layer(false, l, [&] { encoder_layer_forward(l); });
    }
    // Heads, loss and (with gradients) the gradient wrt the encoder output.
    weights_ready(config_.layers + 1);
    graphs_.heads([&] { heads(mlm_scale, nsp_scale, options, sums); });
  });
  if (out_sums.data != sums.data) backend_.copy(out_sums, sums);

  result.masked_tokens = batch.num_masked();
  result.sequences = batch.num_seqs();
  backward_pending_ = options.gradients;
  if (!options.defer_metrics) return metrics_.read(sums, result, global_masked, global_samples);
  metrics_.defer(result, global_masked, global_samples, true);
  return result;
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

// x = hidden[l] -> hidden[l + 1], post-LN:
//   h1 = LN(x + dropout(attention(x) Wo^T + bo))
//   y  = LN(h1 + dropout(gelu(h1 W1^T + b1) W2^T + b2))
void Bert::encoder_layer_forward(int64_t l) {
  Activations& a = *act_;
  const LayerWeights& w = gemm_weights_.layers[l];
  LayerActivations& s = a.layers[l];
  const Tensor& x = a.hidden[l];
  const auto layer = static_cast<uint32_t>(l);
  linear_fwd(l, Fp8State::qkv, 0, x, w.qkv_w, w.qkv_b, Epilogue::bias, s.qkv, Tensor());
  backend_.attention_forward(a.layout, s.qkv, static_cast<int>(config_.heads),
                             dropout(DropoutSite::attention_probs, layer), s.ctx, s.lse);
  // The output projection's bias is added by the LayerNorm op (before its dropout).
  linear_fwd(l, Fp8State::attn_out, 0, s.ctx, w.attn_out_w, Tensor(), Epilogue::none,
             s.attn_ln_in, Tensor());
  backend_.residual_layernorm_forward(a.layout, s.attn_ln_in, w.attn_out_b, x, w.attn_ln,
                                      dropout(DropoutSite::attention_output, layer), s.h1,
                                      s.attn_ln_in, s.attn_ln_mean, s.attn_ln_rstd);
  mlp_forward(l);
  backend_.residual_layernorm_forward(a.layout, s.ffn_ln_in, w.ffn_out_b, s.h1, w.ffn_ln,
                                      dropout(DropoutSite::ffn_output, layer), a.hidden[l + 1],
                                      s.ffn_ln_in, s.ffn_ln_mean, s.ffn_ln_rstd);
}

// ffn_ln_in = gelu(h1 W1^T + b1) W2^T: at once through the saved ffn_pre / ffn_act, or (MST)
// chunk by chunk of rows through the one chunk buffer, whose contents are then dropped.
void Bert::mlp_forward(int64_t l) {
  Activations& a = *act_;
  const LayerWeights& w = gemm_weights_.layers[l];
  const LayerActivations& s = a.layers[l];
  const int64_t chunk = a.plan.mlp_chunk_rows;
  if (chunk == 0) {
    linear_fwd(l, Fp8State::ffn_in, 0, s.h1, w.ffn_in_w, w.ffn_in_b,
               bias_gelu_epilogue(config_.hidden_act), s.ffn_act, s.ffn_pre);
    linear_fwd(l, Fp8State::ffn_out, 0, s.ffn_act, w.ffn_out_w, Tensor(), Epilogue::none,
               s.ffn_ln_in, Tensor());
    return;
  }
  for (int64_t first = 0; first < a.shape.rows; first += chunk) {
    const int64_t n = std::min(chunk, a.shape.rows - first);
    const Tensor pre = rows_of(a.mlp_pre, 0, n), act = rows_of(a.mlp_act, 0, n);
    linear_fwd(l, Fp8State::ffn_in, first, rows_of(s.h1, first, n), w.ffn_in_w, w.ffn_in_b,
               bias_gelu_epilogue(config_.hidden_act), act, pre);
    linear_fwd(l, Fp8State::ffn_out, first, act, w.ffn_out_w, Tensor(), Epilogue::none,
               rows_of(s.ffn_ln_in, first, n), Tensor());
  }
}

// dout = d(FFN out) [rows, H] -> dh1 += its share through the MLP; dW1, db1, dW2 +=. With MST,
// chunk by chunk: the chunk's intermediate is recomputed from h1 (the same ops on the same
// rows as the forward, so the same values), its gradient taken in mlp_dpre, then dropped.
void Bert::mlp_backward(int64_t l, const Tensor& dout, const Tensor& dh1) {
  Activations& a = *act_;
  const LayerWeights& w = gemm_weights_.layers[l];
  LayerWeights& g = grads_.layers[l];
  const LayerActivations& s = a.layers[l];
  const int64_t rows = a.shape.rows, chunk = a.plan.mlp_chunk_rows;
  LinearBackwardOptions accumulate;
  accumulate.dx_accumulate = true;  // dL/dh1 = residual share + FFN share
  if (chunk == 0) {
    const Tensor dffn_pre = reshape(a.dwide, {rows, config_.intermediate});
    LinearBackwardOptions through_gelu;
    through_gelu.gelu = config_.hidden_act;
    through_gelu.x_gelu_pre = s.ffn_pre;  // dx of W2 is written as d(FFN pre)
    linear_bwd(l, Fp8State::ffn_out, 0, s.ffn_act, w.ffn_out_w, dout, dffn_pre, g.ffn_out_w,
               Tensor(), through_gelu);
    linear_bwd(l, Fp8State::ffn_in, 0, s.h1, w.ffn_in_w, dffn_pre, dh1, g.ffn_in_w, g.ffn_in_b,
               accumulate);
    return;
  }
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    const Tensor pre = rows_of(a.mlp_pre, 0, n), act = rows_of(a.mlp_act, 0, n);
    const Tensor dpre = rows_of(a.mlp_dpre, 0, n), h1 = rows_of(s.h1, first, n);
    linear_fwd(l, Fp8State::ffn_in, first, h1, w.ffn_in_w, w.ffn_in_b,
               bias_gelu_epilogue(config_.hidden_act), act, pre);
    LinearBackwardOptions through_gelu;
    through_gelu.gelu = config_.hidden_act;
    through_gelu.x_gelu_pre = pre;
    linear_bwd(l, Fp8State::ffn_out, first, act, w.ffn_out_w, rows_of(dout, first, n), dpre,
               g.ffn_out_w, Tensor(), through_gelu);
    linear_bwd(l, Fp8State::ffn_in, first, h1, w.ffn_in_w, dpre, rows_of(dh1, first, n),
               g.ffn_in_w, g.ffn_in_b, accumulate);
  }
}

// The MLM head on the masked rows only and the NSP head on each [CLS]. With gradients, each
// head's backward follows its forward at once and dhidden[0] receives the gradient wrt the
// encoder output: the masked rows from MLM, the [CLS] rows from NSP, zero elsewhere.
void Bert::heads(float mlm_scale, float nsp_scale, const ForwardOptions& options,
                 const Tensor& sums) {
  const trace::Range range("heads");
  Activations& a = *act_;
  const bool grad = a.gradients;
  const Tensor& y = a.hidden[config_.layers];
  backend_.zero(sums);  // the slot's four words (MetricSlots)
  const Tensor mlm_loss_sum = MetricSlots::word(sums, 0, DType::f32);
  const Tensor nsp_loss_sum = MetricSlots::word(sums, 1, DType::f32);
  const Tensor mlm_correct = MetricSlots::word(sums, 2, DType::i32);
  const Tensor nsp_correct = MetricSlots::word(sums, 3, DType::i32);

  const int64_t m = a.shape.masked;
  if (m > 0) {
    // transform: LayerNorm(gelu(x Wt^T + bt)), then the decoder (tied word embeddings).
    backend_.gather_rows(y, a.masked_rows, a.mlm_x);
    backend_.linear_forward(a.mlm_x, gemm_weights_.mlm_dense_w, weights_.mlm_dense_b,
                            bias_gelu_epilogue(config_.hidden_act), a.mlm_act, a.mlm_pre);
    backend_.residual_layernorm_forward(SeqLayout{}, a.mlm_act, Tensor(), Tensor(),
                                        weights_.mlm_ln, Dropout{}, a.mlm_out, a.mlm_act,
                                        a.mlm_ln_mean, a.mlm_ln_rstd);
    const GradScale scale(mlm_scale, rows_of(a.grad_scales, 0, 1));
    const int64_t chunk = a.logits.dim(0);
    for (int64_t first = 0; first < m; first += chunk) {
      const int64_t n = std::min(chunk, m - first);
      backend_.mlm_loss(rows_of(a.mlm_out, first, n), gemm_weights_.embeddings.word,
                        weights_.mlm_bias, rows_of(a.masked_labels, first, n), scale,
                        rows_of(a.logits, 0, n), mlm_loss_sum, mlm_correct,
                        grad ? rows_of(a.mlm_dout, first, n) : Tensor(),
                        grad ? grads_.embeddings.word : Tensor(),
                        grad ? grads_.mlm_bias : Tensor());
      if (options.mlm_logits) {
        std::vector<float> host(static_cast<size_t>(n * config_.vocab_size));
        backend_.copy(view(host.data(), {n, config_.vocab_size}), rows_of(a.logits, 0, n));
        options.mlm_logits(first, host, n);
      }
    }
    if (grad) {
      backend_.residual_layernorm_backward(SeqLayout{}, a.mlm_dout, a.mlm_act, a.mlm_ln_mean,
                                           a.mlm_ln_rstd, weights_.mlm_ln, Dropout{}, a.mlm_dact,
                                           Tensor(), Tensor(), grads_.mlm_ln);
      LinearBackwardOptions gelu;
      gelu.gelu = config_.hidden_act;
      gelu.out_gelu_pre = a.mlm_pre;  // mlm_dact becomes d(pre) in place
      backend_.linear_backward(a.mlm_x, gemm_weights_.mlm_dense_w, a.mlm_dact, a.mlm_dx,
                               grads_.mlm_dense_w, grads_.mlm_dense_b, gelu);
      backend_.gather_rows_backward(a.mlm_dx, a.masked_rows, a.dhidden[0]);
    }
  } else if (grad) {
    backend_.zero(a.dhidden[0]);
  }

  const int64_t seqs = a.nsp_layout.num_seqs, h = config_.hidden;
  backend_.nsp_loss(a.nsp_layout, y, gemm_weights_.pooler_nsp, rows_of(a.nsp_labels, 0, seqs),
                    GradScale(nsp_scale, rows_of(a.grad_scales, 1, 1)),
                    rows_of(a.nsp_ws, 0, nsp_workspace_elems(seqs, h)),
                    nsp_loss_sum, nsp_correct, grad ? a.dhidden[0] : Tensor(),
                    grad ? grads_.pooler_nsp : PoolerParams{});
  if (options.nsp_logits) {
    // nsp_loss leaves the logits in its workspace (backend.h nsp_loss).
    const int64_t s = seqs;
    std::vector<float> host(static_cast<size_t>(s * 2));
    const Tensor logits(a.nsp_ws.ptr<float>() + 4 * s * h, DType::f32, {s, 2},
                        a.nsp_ws.device);
    backend_.copy(view(host.data(), {s, 2}), logits);
    options.nsp_logits(host, s);
  }
}

// Last tensor first within a group: the order in which the all-reduce's buckets (from the
// buffer's end) fill up.
void Bert::announce_all(const GradientReady& ready) const {
  if (!ready) return;
  for (const auto& [first, end] : ready_groups_)
    for (int i = end - 1; i >= first; --i) ready(i);
}

void Bert::backward_ops(const GradientReady& ready, bool announce_inside) {
  // ready_groups_[g] is final once group g's ops have run (on CUDA: once enqueued; the
  // all-reduce must order itself after them on its stream).
  auto announce = [&](size_t group) {
    if (!ready || !announce_inside) return;
    for (int i = ready_groups_[group].second - 1; i >= ready_groups_[group].first; --i) ready(i);
  };
  Activations& a = *act_;
  announce(0);  // the heads, done in forward()
  // dhidden[0] holds dL/d(encoder output) from the heads; the two buffers alternate.
  int cur = 0;
  for (int64_t l = config_.layers - 1; l >= 0; --l) {
    graphs_.layer(true, l,
                  [&] { encoder_layer_backward(l, a.dhidden[cur], a.dhidden[1 - cur]); });
    cur = 1 - cur;
    announce(static_cast<size_t>(config_.layers - l));
  }
  // dhidden[cur] is scratch to the op from here on.
  backend_.embedding_backward(a.layout, a.input_ids, a.segment_ids, gemm_weights_.embeddings,
                              dropout(DropoutSite::embedding, 0), a.emb_ln_mean, a.emb_ln_rstd,
                              a.dhidden[cur], grads_.embeddings);
  announce(ready_groups_.size() - 1);
}

void Bert::backward(const GradientReady& ready) {
  const trace::Range range("backward");
  PB_REQUIRE(backward_pending_, "model: backward() without a forward() with gradients on");
  backward_pending_ = false;
  // An empty batch adds nothing: every gradient is already final.
  if (act_->shape.seqs == 0) return announce_all(ready);
  if (graphs_.graphed() != Graphed::whole) return backward_ops(ready, true);
  // The whole backward in one graph (CudaGraphs::full): every tensor is announced after it.
  graphs_.whole(true, [&] { backward_ops(ready, false); });
  announce_all(ready);
}

void Bert::backward(const GradientRound& round) {
  if (!graphs_.full()) return backward(round.ready);
  const trace::Range range("backward");
  PB_REQUIRE(backward_pending_, "model: backward() without a forward() with gradients on");
  PB_REQUIRE(round.complete && round.launched && round.all_ranks,
             "model: a gradient round without its complete, launched or all_ranks hook");
  backward_pending_ = false;
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

// dy = dL/d(hidden[l + 1]) (overwritten: it carries dL/dh1 midway) -> dx = dL/d(hidden[l]).
void Bert::encoder_layer_backward(int64_t l, const Tensor& dy, const Tensor& dx) {
  Activations& a = *act_;
  const LayerWeights& w = gemm_weights_.layers[l];
  LayerWeights& g = grads_.layers[l];
  const LayerActivations& s = a.layers[l];
  const auto layer = static_cast<uint32_t>(l);
  const int64_t rows = a.shape.rows, h = config_.hidden;
  const Tensor dqkv = reshape(a.dwide, {rows, 3 * h});
  // Layer recomputation: refill the shared layer buffers (hidden[l + 1] is rewritten with the
  // same values; nothing reads it any more). The last layer's are still those of its forward.
  if (a.plan.layer_recompute && l + 1 < config_.layers) encoder_layer_forward(l);

  // FFN block: dy -> d(FFN out) in dtmp, and dL/dh1 (the residual branch) into dy itself.
  backend_.residual_layernorm_backward(a.layout, dy, s.ffn_ln_in, s.ffn_ln_mean, s.ffn_ln_rstd,
                                       w.ffn_ln, dropout(DropoutSite::ffn_output, layer), a.dtmp,
                                       dy, g.ffn_out_b, g.ffn_ln);
  mlp_backward(l, a.dtmp, dy);
  LinearBackwardOptions accumulate;
  accumulate.dx_accumulate = true;

  // Attention block: dL/dh1 -> d(attention out) in dtmp, residual share into dx.
  backend_.residual_layernorm_backward(a.layout, dy, s.attn_ln_in, s.attn_ln_mean,
                                       s.attn_ln_rstd, w.attn_ln,
                                       dropout(DropoutSite::attention_output, layer), a.dtmp, dx,
                                       g.attn_out_b, g.attn_ln);
  linear_bwd(l, Fp8State::attn_out, 0, s.ctx, w.attn_out_w, a.dtmp, a.dctx, g.attn_out_w,
             Tensor(), {});
  backend_.attention_backward(a.layout, s.qkv, s.ctx, s.lse, a.dctx,
                              static_cast<int>(config_.heads),
                              dropout(DropoutSite::attention_probs, layer), dqkv);
  linear_bwd(l, Fp8State::qkv, 0, a.hidden[l], w.qkv_w, dqkv, dx, g.qkv_w, g.qkv_b, accumulate);
}

// ---- the encoder's linear layers, in FP8 under precision fp8 --------------------------------
// Forward: x cast to E4M3 (its amax recorded, padding rows zero and left out) and the FP8 GEMM
// with the weight's E4M3 copy. Backward: dout cast to E5M2 and its transpose; dx from dout and
// the weight's transposed copy; dW from dout^T and x^T, x cast again with the forward's scale
// (the same bytes: the scale changes only between steps), so no FP8 activation is kept; db
// from dout in bf16 (as the bf16 path). Before the first scale update (cold) the bf16 ops run
// and only the amaxes are recorded.
void Bert::linear_fwd(int64_t l, int j, int64_t first, const Tensor& x, const Tensor& w,
                      const Tensor& bias, Epilogue epilogue, const Tensor& out,
                      const Tensor& pre) {
  if (!fp8_) return backend_.linear_forward(x, w, bias, epilogue, out, pre);
  const auto lj = static_cast<Fp8State::Linear>(j);
  const Fp8State::Operand in = fp8_->input(l, lj);
  const int64_t n = x.dim(0), k = x.dim(1);
  const Tensor mask = rows_of(act_->token_seq, first, n);
  if (!fp8_->warm()) {
    backend_.fp8_cast(x, mask, Tensor(), in.amax, Tensor(), Tensor());
    return backend_.linear_forward(x, w, bias, epilogue, out, pre);
  }
  const Tensor x8(fp8_->workspace(0).data, DType::e4m3, {n, k}, x.device);
  backend_.fp8_cast(x, mask, in.scale, in.amax, x8, Tensor());
  Fp8GemmOptions o;
  o.epilogue = epilogue;
  o.bias = bias;
  o.pre = pre;
  o.fast_accum = true;  // the forward only, as Transformer Engine (docs/fp8.md)
  backend_.fp8_gemm(x8, in.scale, fp8_->w8(l, lj), fp8_->weight(l, lj).scale, out, o);
}

void Bert::linear_bwd(int64_t l, int j, int64_t first, const Tensor& x, const Tensor& w,
                      const Tensor& dout, const Tensor& dx, const Tensor& dw, const Tensor& db,
                      const LinearBackwardOptions& opt) {
  if (!fp8_) return backend_.linear_backward(x, w, dout, dx, dw, db, opt);
  const auto lj = static_cast<Fp8State::Linear>(j);
  const Fp8State::Operand g = fp8_->grad(l, lj), in = fp8_->input(l, lj);
  const int64_t n = dout.dim(0), m = dout.dim(1), k = w.dim(1);
  const Tensor mask = rows_of(act_->token_seq, first, n);
  if (!fp8_->warm()) {
    backend_.fp8_cast(dout, mask, Tensor(), g.amax, Tensor(), Tensor());
    return backend_.linear_backward(x, w, dout, dx, dw, db, opt);
  }
  // The workspace: dout [n, m] | dout^T [m, n] | x^T [k, n], each 256-byte aligned.
  auto* base = static_cast<char*>(fp8_->workspace(0).data);
  const int64_t aligned = (n * m + 255) / 256 * 256;
  const Tensor dy8(base, DType::e5m2, {n, m}, dout.device);
  const Tensor dy8t(base + aligned, DType::e5m2, {m, n}, dout.device);
  const Tensor x8t(base + 2 * aligned, DType::e4m3, {k, n}, dout.device);
  backend_.fp8_cast(dout, mask, g.scale, g.amax, dy8, dy8t);
  if (db.defined())  // the bias gradient alone, from the bf16 dout
    backend_.linear_backward(Tensor(), w, dout, Tensor(), Tensor(), db, {});
  if (dx.defined()) {
    Fp8GemmOptions o;
    o.accumulate = opt.dx_accumulate;
    o.dgelu_pre = opt.x_gelu_pre;
    o.gelu = opt.gelu;
    backend_.fp8_gemm(dy8, g.scale, fp8_->w8t(l, lj), fp8_->weight(l, lj).scale, dx, o);
  }
  if (dw.defined()) {
    backend_.fp8_cast(x, mask, in.scale, Tensor(), Tensor(), x8t);
    Fp8GemmOptions o;
    o.accumulate = true;
    backend_.fp8_gemm(dy8t, g.scale, x8t, in.scale, dw, o);
  }
}

}  // namespace packbert
