// One micro-batch through BertForPreTraining, forward then backward, top to bottom. Every
// computation is a backend op (kernels/backend.h); this file only decides what runs on which
// buffer. The layer code follows the sketch in backend.h's header comment.
#include "model/bert.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/trace.h"
#include "model/activations.h"

namespace packbert {

namespace {

// The same memory with another row-major shape (the backward's shared scratch).
Tensor reshape(const Tensor& t, std::initializer_list<int64_t> dims) {
  Tensor r(t.data, t.dtype, dims, t.device);
  PB_CHECK(r.numel() <= t.numel(), "reshape of {} to {} elements", t.str(), r.numel());
  return r;
}

// Word i of a metric slot (Bert::metric_slots_), as a one-element tensor of that dtype.
Tensor metric_word(const Tensor& slot, int64_t i, DType dtype) {
  return Tensor(static_cast<char*>(slot.data) + 4 * i, dtype, {1}, slot.device);
}

// A slot's words read back (f32 loss sums, i32 correct counts) into a result, and the loss.
void set_metrics(ForwardResult& r, const uint8_t* words, int64_t global_masked,
                 int64_t global_samples) {
  float mlm_sum = 0.f, nsp_sum = 0.f;
  int32_t mlm_correct = 0, nsp_correct = 0;
  std::memcpy(&mlm_sum, words, 4);
  std::memcpy(&nsp_sum, words + 4, 4);
  std::memcpy(&mlm_correct, words + 8, 4);
  std::memcpy(&nsp_correct, words + 12, 4);
  r.mlm_loss_sum = mlm_sum;
  r.nsp_loss_sum = nsp_sum;
  r.mlm_correct = mlm_correct;
  r.nsp_correct = nsp_correct;
  r.loss = (global_masked > 0 ? r.mlm_loss_sum / global_masked : 0.0) +
           r.nsp_loss_sum / global_samples;
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
           const BertOptions& options)
    : config_(config),
      backend_(backend),
      options_(options),
      table_(config),
      arena_(backend),
      act_(std::make_unique<Activations>()) {
  PB_REQUIRE(options.mlm_chunk_rows >= 0, "model: mlm_chunk_rows {} must be >= 0",
             options.mlm_chunk_rows);
  PB_REQUIRE(options.mst_chunks >= 0, "model: mst_chunks {} must be >= 1 (0 = auto)",
             options.mst_chunks);
  PB_REQUIRE(options.mst_chunks > 0 || options.activation_budget_bytes > 0,
             "model: mst_chunks = 0 (auto) needs an activation budget (activation_budget_bytes)");
  check_device("Bert", "params", params, backend.device());
  weights_ = bind_weights(table_, params);
  gemm_weights_ = weights_;
  params_ = params;
  if (options.precision != Precision::fp32) {
    // The GEMMs' weight copy: the whole table in the low-precision type (one conversion pass
    // and one LAMB pass over a flat buffer; the fp32 views of it are simply never read).
    const DType t = precision_dtype(options.precision);
    const int64_t n = table_.total();
    lowp_memory_ = backend.alloc(t, {n});
    params_lowp_ = lowp_memory_.tensor();
    const BertWeights low = bind_weights(table_, params_lowp_);
    for (size_t l = 0; l < low.layers.size(); ++l) {
      LayerWeights& g = gemm_weights_.layers[l];
      g.qkv_w = low.layers[l].qkv_w;
      g.attn_out_w = low.layers[l].attn_out_w;
      g.ffn_in_w = low.layers[l].ffn_in_w;
      g.ffn_out_w = low.layers[l].ffn_out_w;
    }
    // The embedding tables: the lookup and the tied decoder (mlm_loss) read the 16-bit copy, as
    // the GEMMs do, so that a sharded optimizer gathers them in 16 bits (DistributedLamb).
    gemm_weights_.embeddings.word = low.embeddings.word;
    gemm_weights_.embeddings.position = low.embeddings.position;
    gemm_weights_.embeddings.token_type = low.embeddings.token_type;
    gemm_weights_.mlm_dense_w = low.mlm_dense_w;
    gemm_weights_.pooler_nsp.dense_w = low.pooler_nsp.dense_w;
    gemm_weights_.pooler_nsp.cls_w = low.pooler_nsp.cls_w;
    refresh_lowp_params();
  }
  // What the ops read in fp32 (fp32_read_ranges' rule): exactly the tensors not replaced above
  // by their 16-bit copy, which a sharded optimizer relies on to gather the rest in 16 bits.
  fp32_ranges_ = fp32_read_ranges(table_, options.precision != Precision::fp32);
  if (options.precision != Precision::fp32) {
    std::vector<const Tensor*> low16;
    for (const LayerWeights& g : gemm_weights_.layers)
      for (const Tensor* w : {&g.qkv_w, &g.attn_out_w, &g.ffn_in_w, &g.ffn_out_w})
        low16.push_back(w);
    for (const Tensor* w : {&gemm_weights_.mlm_dense_w, &gemm_weights_.pooler_nsp.dense_w,
                            &gemm_weights_.pooler_nsp.cls_w, &gemm_weights_.embeddings.word,
                            &gemm_weights_.embeddings.position,
                            &gemm_weights_.embeddings.token_type})
      low16.push_back(w);
    int64_t low_elems = 0;
    for (const Tensor* w : low16) low_elems += w->numel();
    int64_t fp32_elems = 0;
    for (const auto& [a, b] : fp32_ranges_) fp32_elems += b - a;
    int64_t all = 0;
    for (const ParamTensor& t : table_.tensors()) all += t.size;
    PB_REQUIRE(low_elems + fp32_elems == all,
               "model: {} elements read in 16 bits and {} in fp32 of {} (fp32_read_ranges)",
               low_elems, fp32_elems, all);
  }
  if (grads.defined()) {
    check_device("Bert", "grads", grads, backend.device());
    grads_ = bind_weights(table_, grads);
    has_grads_ = true;
  }
  // The table is embeddings | layer 0 | ... | layer L-1 | pooler and heads (params.h).
  auto index = [&](const std::string& name) {
    return static_cast<int>(&table_.at(name) - table_.tensors().data());
  };
  auto layer_first = [&](int64_t l) {
    return index("bert.encoder.layer." + std::to_string(l) + ".attention.self.query.weight");
  };
  const int heads_first = index("bert.pooler.dense.weight");
  ready_groups_.emplace_back(heads_first, static_cast<int>(table_.tensors().size()));
  for (int64_t l = config.layers - 1; l >= 0; --l)
    ready_groups_.emplace_back(layer_first(l),
                               l + 1 < config.layers ? layer_first(l + 1) : heads_first);
  ready_groups_.emplace_back(0, layer_first(0));
  // The same groups in forward order, as ranges of the flat buffer.
  const auto& rows = table_.tensors();
  auto span = [&](int first, int last) {  // tensors [first, last)
    int64_t lo = table_.total(), hi = 0;
    for (int i = first; i < last; ++i) {
      lo = std::min(lo, rows[static_cast<size_t>(i)].offset);
      hi = std::max(hi, rows[static_cast<size_t>(i)].offset + rows[static_cast<size_t>(i)].size);
    }
    return std::pair<int64_t, int64_t>(lo, std::max(lo, hi));
  };
  for (auto g = ready_groups_.rbegin(); g != ready_groups_.rend(); ++g)
    forward_groups_.push_back(span(g->first, g->second));
}

Bert::~Bert() = default;

void Bert::refresh_lowp_params() {
  if (params_lowp_.defined()) backend_.convert(params_lowp_, params_);
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (s == precision_name(p)) return p;
  PB_THROW("model: precision '{}' is not one of fp32, bf16, fp16", s);
}

DType precision_dtype(Precision p) {
  return p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
}

const char* cuda_graphs_name(CudaGraphs g) {
  switch (g) {
    case CudaGraphs::off: return "off";
    case CudaGraphs::segmented: return "segmented";
    case CudaGraphs::full: return "full";
  }
  return "?";
}

CudaGraphs parse_cuda_graphs(const std::string& s) {
  for (CudaGraphs g : {CudaGraphs::off, CudaGraphs::segmented, CudaGraphs::full})
    if (s == cuda_graphs_name(g)) return g;
  PB_THROW("model: cuda_graphs '{}' is not one of off, segmented, full", s);
}

bool Bert::LayerGraphKey::operator==(const LayerGraphKey& o) const {
  return backward == o.backward && layer == o.layer && batch == o.batch && arena == o.arena &&
         shape.rows == o.shape.rows && shape.seqs == o.shape.seqs &&
         shape.masked == o.shape.masked && shape.max_len == o.shape.max_len &&
         mlp_chunk_rows == o.mlp_chunk_rows && mlm_chunk_rows == o.mlm_chunk_rows &&
         sums == o.sums && mlm_scale_exponent == o.mlm_scale_exponent &&
         layer_recompute == o.layer_recompute && gradients == o.gradients &&
         dropout == o.dropout && seed == o.seed;
}

// Everything the recorded ops' host arguments depend on: for a layer, the batch's rows, slots
// and attention bound, the plan, the dropout keys; for the whole micro-step or the heads
// (kWholeGraph, kHeadsGraph) also the masked capacity, the heads' plan and metric slot, and
// f16's decoder scaling.
Bert::LayerGraphKey Bert::graph_key(bool backward, int64_t layer) const {
  const Activations& a = *act_;
  LayerGraphKey key;
  key.backward = backward;
  key.layer = layer;
  key.batch = a.input_ids.data;
  key.arena = arena_.data();
  key.shape = a.shape;
  key.shape.max_len = a.layout.max_len;  // the bound the attention launches from
  key.mlp_chunk_rows = a.plan.mlp_chunk_rows;
  key.layer_recompute = a.plan.layer_recompute;
  key.gradients = a.gradients;
  key.dropout = dropout_on_;
  key.seed = seed_;
  if (layer >= 0) {
    key.shape.masked = 0;
  } else {
    key.mlm_chunk_rows = a.plan.mlm_chunk_rows;
    key.sums = whole_sums_;
    key.mlm_scale_exponent = whole_scale_exponent_;
  }
  return key;
}

// The layer's ops: run, recorded (then replayed), or replayed (BertOptions::cuda_graphs).
void Bert::run_layer(bool backward, int64_t l, const std::function<void()>& ops) {
  if (!graphs_on() || whole_step_) return ops();
  run_graph(graph_key(backward, l), ops);
}

// The ops of `key`: run at its first use, recorded at its second, replayed from then on.
void Bert::run_graph(const LayerGraphKey& key, const std::function<void()>& ops) {
  for (LayerGraph& g : layer_graphs_) {
    if (!(g.key == key)) continue;
    if (!g.graph.defined())  // the second use: record
      g.graph = backend_.record_and_replay(ops);
    else
      backend_.replay(g.graph);
    return;
  }
  // The table's size in layers' worth of ops: a whole micro-step's graph counts as all layers.
  const auto layers = static_cast<size_t>(config_.layers);
  const size_t capacity = kGraphShapes * 2 * layers;
  auto weight = [&](const LayerGraph& g) {
    return g.key.layer == kWholeGraph ? layers : size_t{1};
  };
  auto total = [&] {
    size_t n = 0;
    for (const LayerGraph& g : layer_graphs_) n += weight(g);
    return n;
  };
  if (total() + (key.layer == kWholeGraph ? layers : 1) > capacity) {
    layer_graphs_.erase(std::remove_if(layer_graphs_.begin(), layer_graphs_.end(),
                                       [](const LayerGraph& g) { return !g.graph.defined(); }),
                        layer_graphs_.end());
    while (!layer_graphs_.empty() && total() > capacity / 2)
      layer_graphs_.erase(layer_graphs_.begin());
  }
  layer_graphs_.push_back({key, BackendGraph()});
  ops();
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::mlp: return "mlp";
    case Recompute::layer: return "layer";
  }
  return "?";
}

namespace {
constexpr int64_t kMaxAutoChunks = 64;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}
}  // namespace

bool Bert::graphs_on() const {
  return options_.cuda_graphs != CudaGraphs::off && backend_.supports_graphs();
}

bool Bert::full_graphs() const {
  return options_.cuda_graphs == CudaGraphs::full && backend_.supports_graphs();
}

BatchShape Bert::capacity(const BatchShape& shape, bool gradients) const {
  if (!graphs_on() || shape.seqs == 0) return shape;
  BatchShape c = shape;
  c.rows = row_capacity(shape.rows);
  c.seqs = std::max(seq_capacity_[gradients ? 1 : 0], next_pow2(shape.seqs));
  // The heads' graph (either mode) reads the masked tokens: masked slots by the rows' rule, and
  // never fewer than the most a forward has needed so far, so that they stop changing too.
  c.masked = std::max(masked_capacity_[gradients ? 1 : 0], row_capacity(shape.masked));
  return c;
}

void Bert::grow_seq_capacity(int64_t seqs, bool gradients) {
  if (!graphs_on()) return;
  int64_t& cap = seq_capacity_[gradients ? 1 : 0];
  cap = std::max(cap, next_pow2(seqs));
}

ActivationPlan Bert::plan(const BatchShape& shape, bool gradients, int64_t m) const {
  ActivationPlan p;
  p.gradients = gradients;
  p.layer_recompute = options_.recompute == Recompute::layer;
  p.act = precision_dtype(options_.precision);
  if (m > 1 || options_.recompute == Recompute::mlp)
    p.mlp_chunk_rows = std::max<int64_t>(1, ceil_div(shape.rows, m));
  p.mlm_chunk_rows = options_.mlm_chunk_rows > 0 ? options_.mlm_chunk_rows
                     : m > 1                     ? std::max<int64_t>(1, ceil_div(shape.masked, m))
                                                 : 0;
  return p;
}

size_t Bert::plan_bytes(const BatchShape& shape, const ActivationPlan& p) const {
  Carver measure(nullptr, backend_.device());
  Activations scratch;
  carve_activations(measure, config_, shape, p, scratch);
  return measure.used();
}

int64_t Bert::mst_chunks_for(const BatchShape& shape, bool gradients) const {
  if (options_.mst_chunks > 0) return options_.mst_chunks;
  for (int64_t m = 1; m < kMaxAutoChunks; m *= 2)
    if (plan_bytes(shape, plan(shape, gradients, m)) <= options_.activation_budget_bytes)
      return m;
  return kMaxAutoChunks;
}

size_t Bert::activation_bytes(const BatchShape& shape, bool gradients) const {
  const BatchShape c = capacity(shape, gradients);
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
  return r;
}

void Bert::reserve(const BatchShape& shape, bool gradients) {
  grow_seq_capacity(shape.seqs, gradients);
  arena_.reserve(activation_bytes(shape, gradients));
  for (BackendBuffer& b : batch_buffers_)
    grow_batch_buffer(b, batch_bytes(capacity(shape, gradients)));
}

void Bert::grow_batch_buffer(BackendBuffer& buffer, size_t bytes) {
  if (bytes <= buffer.bytes()) return;
  buffer.reset();  // first: the old one's memory is given back before the new one is taken
  // Headroom as the arena's: a batch a few tokens longer does not reallocate.
  buffer = backend_.alloc(bytes + bytes / 16);
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

void Bert::check_batch(const Batch& b, int64_t global_masked, int64_t global_samples) const {
  const auto rows = static_cast<size_t>(b.rows);
  const size_t seqs = b.seq_len.size(), masked = b.masked_rows.size();
  PB_REQUIRE(b.input_ids.size() == rows && b.segment_ids.size() == rows &&
                 b.token_seq.size() == rows && b.token_pos.size() == rows &&
                 b.seq_start.size() == seqs && b.sample_id.size() == seqs &&
                 b.nsp_labels.size() == seqs && b.masked_labels.size() == masked,
             "model: inconsistent batch ({} rows, {} sequences, {} masked tokens)", b.rows, seqs,
             masked);
  PB_REQUIRE(b.max_len <= config_.max_position_embeddings,
             "model: a sequence of {} tokens exceeds max_position_embeddings {}", b.max_len,
             config_.max_position_embeddings);
  // The model's own rules (make_batch checked the structure): ids of the real vocabulary, the
  // padded rows of the embedding exist only for the GEMM's shape.
  for (size_t r = 0; r < rows; ++r)
    PB_REQUIRE(b.input_ids[r] >= 0 && b.input_ids[r] < config_.real_vocab_size &&
                   b.segment_ids[r] >= 0 && b.segment_ids[r] < config_.type_vocab_size,
               "model: row {} (sample id {}) has token id {} (vocab {}) / segment {} (types {})",
               r, b.token_seq[r] >= 0 ? b.sample_id[b.token_seq[r]] : -1, b.input_ids[r],
               config_.real_vocab_size, b.segment_ids[r], config_.type_vocab_size);
  for (size_t i = 0; i < masked; ++i)
    PB_REQUIRE(b.masked_labels[i] >= 0 && b.masked_labels[i] < config_.real_vocab_size &&
                   b.masked_rows[i] >= 0 && b.masked_rows[i] < b.rows &&
                   b.token_seq[b.masked_rows[i]] >= 0,
               "model: masked token {} has label {} (vocab {}) at row {} of {} (padding?)", i,
               b.masked_labels[i], config_.real_vocab_size, b.masked_rows[i], b.rows);
  PB_REQUIRE(global_masked >= static_cast<int64_t>(masked) &&
                 global_samples >= static_cast<int64_t>(seqs),
             "model: global counts ({} masked tokens, {} samples) below this batch's own ({}, "
             "{}): pass the whole step's counts",
             global_masked, global_samples, masked, seqs);
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
  check_batch(batch, global_masked, global_samples);
  ForwardResult result;
  if (batch.empty()) {  // a rank or micro-step without samples contributes nothing
    backward_pending_ = options.gradients;
    whole_step_ = false;
    act_->shape = BatchShape{};
    if (options.defer_metrics) deferred_.push_back({result, global_masked, global_samples, false});
    return result;
  }
  step_ = step;
  seed_ = seed;
  dropout_on_ = options.dropout;

  // With graphs, a layer recorded for one batch is replayed for the next of the same shape:
  // the batch is laid into a capacity many batches share (padding rows up to row_capacity,
  // empty sequence slots up to a power of two that only grows), and attention launches from
  // the slot / pack length as its bound (SeqLayout::fixed_launch).
  const bool graphs = graphs_on();
  // The heads in a graph (either mode) unless the logits go to the host; with full, the whole
  // micro-step in one.
  const bool graph_heads = graphs && !options.mlm_logits && !options.nsp_logits;
  Batch fixed;
  if (graphs) {
    grow_seq_capacity(batch.num_seqs(), options.gradients);
    int64_t& masked = masked_capacity_[options.gradients ? 1 : 0];
    if (graph_heads) masked = std::max(masked, row_capacity(batch.num_masked()));
    BatchShape c = capacity(batch.shape(), options.gradients);
    // Heads run op by op (their logits go to the host) see the batch's masked tokens only: a
    // hook is shown no padded slot. The layers' graphs do not read the masked tokens.
    if (!graph_heads) c.masked = batch.num_masked();
    fixed = with_capacity(batch, c.rows, c.seqs, c.masked);
  }
  const Batch& laid = graphs ? fixed : batch;

  // The batch into the next of the two batch buffers (its upload may overlap the previous
  // micro-step's compute, which reads the other one). The arena: measure, grow if this batch is
  // the largest yet, carve.
  const BatchShape shape = laid.shape();
  Activations& a = *act_;
  BackendBuffer& batch_buffer = batch_buffers_[next_batch_buffer_];
  next_batch_buffer_ = 1 - next_batch_buffer_;
  grow_batch_buffer(batch_buffer, batch_bytes(shape));
  Carver batch_carver(batch_buffer.data(), backend_.device());
  carve_batch(batch_carver, shape, a);
  if (graphs) {
    a.layout.fixed_launch = true;
    a.layout.max_len = std::max(batch.max_len, batch.max_seq_len);
  }
  // The heads' gradient factors, read from the batch buffer when the ops run (GradScale).
  const auto mlm_scale = static_cast<float>(
      global_masked > 0 ? options.loss_scale / static_cast<double>(global_masked) : 0.0);
  const auto nsp_scale =
      static_cast<float>(options.loss_scale / static_cast<double>(global_samples));
  upload_batch(backend_, laid, step_, {mlm_scale, nsp_scale}, a);
  whole_step_ = full_graphs() && graph_heads;
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
  // The report describes the arena's purpose: a model with gradients reports its training
  // forwards (an evaluation between steps neither moves its peak nor its last step), a
  // forward-only model its evaluation forwards.
  if (options.gradients || !has_grads_) arena_.note_use(carver.used(), carver.used_by_kind());

  // The metric slot this forward's sums go to; the heads' graph writes slot 0 (one graph for
  // every slot), copied to the slot after it.
  const int64_t slot = options.defer_metrics ? 1 + static_cast<int64_t>(deferred_.size()) : 0;
  const Tensor out_sums = metric_slot(slot);  // first: it may move the slots
  const Tensor sums = graph_heads ? metric_slot(0) : out_sums;
  if (graph_heads) {
    whole_sums_ = sums.data;
    whole_scale_exponent_ = options_.precision == Precision::fp16 && mlm_scale > 0.f
                                ? std::ilogb(mlm_scale)
                                : 0;
  }
  // weights_ready: before the part that reads the group's weights, or all before the graph.
  auto weights_ready = [&](int64_t group) {
    if (weights_ready_ && !whole_step_) weights_ready_(static_cast<int>(group));
  };
  auto ops = [&] {
    // Embeddings: LayerNorm(word + position + token type), dropout.
    weights_ready(0);
    backend_.embedding_forward(a.layout, a.input_ids, a.segment_ids, gemm_weights_.embeddings,
                               dropout(DropoutSite::embedding, 0), a.hidden[0], a.emb_ln_mean,
                               a.emb_ln_rstd);
    // Encoder.
    for (int64_t l = 0; l < config_.layers; ++l) {
      weights_ready(l + 1);
      run_layer(false, l, [&] { encoder_layer_forward(l); });
    }
    // Heads, loss and (with gradients) the gradient wrt the encoder output.
    weights_ready(config_.layers + 1);
    auto head_ops = [&] { heads(mlm_scale, nsp_scale, options, sums); };
    if (graph_heads && !whole_step_) {
      run_graph(graph_key(false, kHeadsGraph), head_ops);
    } else {
      head_ops();
    }
  };
  if (whole_step_) {
    if (weights_ready_)
      for (int64_t g = 0; g < config_.layers + 2; ++g) weights_ready_(static_cast<int>(g));
    run_graph(graph_key(false, kWholeGraph), ops);
  } else {
    ops();
  }
  if (graph_heads && slot != 0) backend_.copy(out_sums, sums);

  result.masked_tokens = batch.num_masked();
  result.sequences = batch.num_seqs();
  if (options.defer_metrics) {
    deferred_.push_back({result, global_masked, global_samples, true});
  } else {
    uint8_t words[4 * kMetricWords];
    backend_.copy(view(words, {4 * kMetricWords}),
                  Tensor(sums.data, DType::u8, {4 * kMetricWords}, sums.device));
    set_metrics(result, words, global_masked, global_samples);
  }
  backward_pending_ = options.gradients;
  return result;
}

Tensor Bert::metric_slot(int64_t slot) {
  constexpr int64_t slot_bytes = 4 * kMetricWords;
  const auto have = static_cast<int64_t>(metric_slots_.bytes()) / slot_bytes;
  if (slot >= have) {  // the first forward() (or more micro-steps than ever before)
    BackendBuffer grown = backend_.alloc(static_cast<size_t>(
        std::max<int64_t>({slot + 1, 2 * have, 16}) * slot_bytes));
    if (have > 1)  // deferred slots in use
      backend_.copy(Tensor(grown.data(), DType::u8, {have * slot_bytes}, backend_.device()),
                    metric_slots_.tensor());
    metric_slots_ = std::move(grown);
  }
  return Tensor(static_cast<char*>(metric_slots_.data()) + slot * slot_bytes, DType::f32,
                {kMetricWords}, backend_.device());
}

Tensor Bert::deferred_sums() const {
  constexpr int64_t slot_bytes = 4 * kMetricWords;
  // Slots 1 .. n, n the last deferred call that computed on the device (an empty batch's slot
  // holds nothing and may lie beyond the buffer).
  int64_t n = 0;
  for (size_t i = 0; i < deferred_.size(); ++i)
    if (deferred_[i].on_device) n = static_cast<int64_t>(i) + 1;
  if (n == 0) return Tensor();
  return Tensor(static_cast<char*>(metric_slots_.data()) + slot_bytes, DType::u8,
                {n * slot_bytes}, backend_.device());
}

std::vector<ForwardResult> Bert::take_deferred_results(const void* sums) {
  constexpr int64_t slot_bytes = 4 * kMetricWords;
  std::vector<ForwardResult> out;
  const auto* host = static_cast<const uint8_t*>(sums);
  for (size_t i = 0; i < deferred_.size(); ++i) {
    const Deferred& d = deferred_[i];
    out.push_back(d.result);
    if (d.on_device) {
      PB_CHECK(host != nullptr, "model: deferred results without their sums");
      set_metrics(out.back(), host + static_cast<int64_t>(i) * slot_bytes, d.global_masked,
                  d.global_samples);
    }
  }
  deferred_.clear();
  return out;
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
  backend_.linear_forward(x, w.qkv_w, w.qkv_b, Epilogue::bias, s.qkv, Tensor());
  backend_.attention_forward(a.layout, s.qkv, static_cast<int>(config_.heads),
                             dropout(DropoutSite::attention_probs, layer), s.ctx, s.lse);
  // The output projection's bias is added by the LayerNorm op (before its dropout).
  backend_.linear_forward(s.ctx, w.attn_out_w, Tensor(), Epilogue::none, s.attn_ln_in, Tensor());
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
    backend_.linear_forward(s.h1, w.ffn_in_w, w.ffn_in_b, bias_gelu_epilogue(config_.hidden_act), s.ffn_act,
                            s.ffn_pre);
    backend_.linear_forward(s.ffn_act, w.ffn_out_w, Tensor(), Epilogue::none, s.ffn_ln_in,
                            Tensor());
    return;
  }
  for (int64_t first = 0; first < a.shape.rows; first += chunk) {
    const int64_t n = std::min(chunk, a.shape.rows - first);
    const Tensor pre = rows_of(a.mlp_pre, 0, n), act = rows_of(a.mlp_act, 0, n);
    backend_.linear_forward(rows_of(s.h1, first, n), w.ffn_in_w, w.ffn_in_b,
                            bias_gelu_epilogue(config_.hidden_act), act, pre);
    backend_.linear_forward(act, w.ffn_out_w, Tensor(), Epilogue::none,
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
    backend_.linear_backward(s.ffn_act, w.ffn_out_w, dout, dffn_pre, g.ffn_out_w, Tensor(),
                             through_gelu);
    backend_.linear_backward(s.h1, w.ffn_in_w, dffn_pre, dh1, g.ffn_in_w, g.ffn_in_b,
                             accumulate);
    return;
  }
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    const Tensor pre = rows_of(a.mlp_pre, 0, n), act = rows_of(a.mlp_act, 0, n);
    const Tensor dpre = rows_of(a.mlp_dpre, 0, n), h1 = rows_of(s.h1, first, n);
    backend_.linear_forward(h1, w.ffn_in_w, w.ffn_in_b, bias_gelu_epilogue(config_.hidden_act), act, pre);
    LinearBackwardOptions through_gelu;
    through_gelu.gelu = config_.hidden_act;
    through_gelu.x_gelu_pre = pre;
    backend_.linear_backward(act, w.ffn_out_w, rows_of(dout, first, n), dpre, g.ffn_out_w,
                             Tensor(), through_gelu);
    backend_.linear_backward(h1, w.ffn_in_w, dpre, rows_of(dh1, first, n), g.ffn_in_w,
                             g.ffn_in_b, accumulate);
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
  backend_.zero(sums);  // the slot's four words (metric_slots_)
  const Tensor mlm_loss_sum = metric_word(sums, 0, DType::f32);
  const Tensor nsp_loss_sum = metric_word(sums, 1, DType::f32);
  const Tensor mlm_correct = metric_word(sums, 2, DType::i32);
  const Tensor nsp_correct = metric_word(sums, 3, DType::i32);

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
    run_layer(true, l, [&] { encoder_layer_backward(l, a.dhidden[cur], a.dhidden[1 - cur]); });
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
  if (!whole_step_) return backward_ops(ready, true);
  // The whole backward in one graph (CudaGraphs::full): every tensor is announced after it.
  run_graph(graph_key(true, kWholeGraph), [&] { backward_ops(ready, false); });
  announce_all(ready);
}

std::vector<int64_t> Bert::key_words(const LayerGraphKey& k) const {
  const auto word = [](const void* p) {
    return static_cast<int64_t>(reinterpret_cast<intptr_t>(p));
  };
  return {k.backward, k.layer, word(k.batch), word(k.arena), k.shape.rows, k.shape.seqs,
          k.shape.masked, k.shape.max_len, k.mlp_chunk_rows, k.mlm_chunk_rows, word(k.sums),
          k.mlm_scale_exponent, k.layer_recompute, k.gradients, k.dropout,
          static_cast<int64_t>(k.seed)};
}

void Bert::backward(const GradientRound& round) {
  if (!full_graphs()) return backward(round.ready);
  const trace::Range range("backward");
  PB_REQUIRE(backward_pending_, "model: backward() without a forward() with gradients on");
  PB_REQUIRE(round.complete && round.launched && round.all_ranks,
             "model: a gradient round without its complete, launched or all_ranks hook");
  backward_pending_ = false;
  // This rank's words: whether it can graph the backward (a whole step's forward of a
  // non-empty batch), the round's tag and the graph's key; every rank's, in rank order.
  const bool mine = whole_step_ && act_->shape.seqs > 0;
  std::vector<int64_t> local = {mine, round.tag};
  const std::vector<int64_t> words = key_words(graph_key(true, kWholeGraph));
  if (mine) {
    local.insert(local.end(), words.begin(), words.end());
  } else {
    local.resize(local.size() + words.size(), 0);
  }
  const std::vector<int64_t> key = round.all_ranks(local);
  bool every = true;
  for (size_t at = 0; at < key.size(); at += local.size()) every = every && key[at] == 1;
  auto ops = [&] {
    backward_ops(round.ready, true);
    round.complete();
  };
  if (!every) {  // some rank cannot: every rank runs its ops (none captures a collective)
    if (act_->shape.seqs == 0) {
      announce_all(round.ready);
      round.complete();
    } else {
      ops();
    }
    return;
  }
  for (RoundGraph& g : round_graphs_) {
    if (g.key != key) continue;
    if (!g.graph.defined())  // the second use: record (and launch)
      g.graph = backend_.record_and_replay(ops);
    else
      backend_.replay(g.graph);
    round.launched();
    return;
  }
  // The first use: run. Every rank holds the same table, so the same entries go.
  if (round_graphs_.size() >= kGraphShapes) {
    round_graphs_.erase(std::remove_if(round_graphs_.begin(), round_graphs_.end(),
                                       [](const RoundGraph& g) { return !g.graph.defined(); }),
                        round_graphs_.end());
    while (round_graphs_.size() > kGraphShapes / 2) round_graphs_.erase(round_graphs_.begin());
  }
  round_graphs_.push_back({key, BackendGraph()});
  ops();
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
  backend_.linear_backward(s.ctx, w.attn_out_w, a.dtmp, a.dctx, g.attn_out_w, Tensor(), {});
  backend_.attention_backward(a.layout, s.qkv, s.ctx, s.lse, a.dctx,
                              static_cast<int>(config_.heads),
                              dropout(DropoutSite::attention_probs, layer), dqkv);
  backend_.linear_backward(a.hidden[l], w.qkv_w, dqkv, dx, g.qkv_w, g.qkv_b, accumulate);
}

}  // namespace packbert
