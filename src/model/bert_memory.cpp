// The memory plan of a Bert (bert_memory.h) and the model's methods that size, grow and carve
// its buffers (bert.h: reserve_training, grow_for, fits, lay_out).
#include "model/bert_memory.h"

#include <algorithm>
#include <numeric>

#include "kernels/base/error.h"
#include "model/bert.h"
#include "model/fp8.h"

namespace packbert {

namespace {
constexpr int64_t kMaxAutoChunks = 64;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t buffer_bytes(size_t bytes) { return std::max<size_t>(bytes, 1); }  // Backend::alloc's

// The arena bytes that hold every training batch whose laid shape is within `laid`: the
// bound's own, and under mst_chunks = 0 (auto) also any smaller batch's, which may take fewer
// chunks: at most the budget, and at most the bound's bytes at M = 1 (bytes grow with the shape
// and shrink with M).
size_t training_arena_bytes(const BertConfig& config, const BertOptions& o,
                            const BatchShape& laid) {
  const int64_t m = mst_chunks_for(config, o, laid, true);
  size_t bytes = activation_carve_bytes(config, laid, activation_plan(o, laid, true, m));
  if (o.mst_chunks == 0)
    bytes = std::max(
        bytes, std::min(o.activation_budget_bytes,
                        activation_carve_bytes(config, laid, activation_plan(o, laid, true, 1))));
  return (bytes + Carver::kAlign - 1) / Carver::kAlign * Carver::kAlign;
}
}  // namespace

ActivationPlan activation_plan(const BertOptions& o, const BatchShape& shape, bool gradients,
                               int64_t m) {
  ActivationPlan p;
  p.gradients = gradients;
  p.layer_recompute = o.recompute == Recompute::layer;
  p.act = precision_dtype(o.precision);
  if (m > 1 || o.recompute == Recompute::mlp)
    p.mlp_chunk_rows = std::max<int64_t>(1, ceil_div(shape.rows, m));
  if (o.precision == Precision::fp8 && p.mlp_chunk_rows > 0)  // FP8 GEMMs take rows of 16
    p.mlp_chunk_rows = ceil_div(p.mlp_chunk_rows, kFp8Rows) * kFp8Rows;
  p.mlm_chunk_rows = o.mlm_chunk_rows > 0 ? o.mlm_chunk_rows
                     : m > 1              ? std::max<int64_t>(1, ceil_div(shape.masked, m))
                                          : 0;
  return p;
}

size_t activation_carve_bytes(const BertConfig& config, const BatchShape& shape,
                              const ActivationPlan& plan) {
  Carver measure(nullptr, Device::cpu);
  StepActivations scratch;
  carve_activations(measure, config, shape, plan, scratch);
  return measure.used();
}

int64_t mst_chunks_for(const BertConfig& config, const BertOptions& o, const BatchShape& shape,
                       bool gradients) {
  if (o.mst_chunks > 0) return o.mst_chunks;
  for (int64_t m = 1; m < kMaxAutoChunks; m *= 2)
    if (activation_carve_bytes(config, shape, activation_plan(o, shape, gradients, m)) <=
        o.activation_budget_bytes)
      return m;
  return kMaxAutoChunks;
}

int64_t row_quantum(BatchLayout layout, int64_t slot_len, bool fp8) {
  const int64_t q = layout == BatchLayout::unpadded ? 8 : slot_len;
  return fp8 ? std::lcm<int64_t>(q, kFp8Rows) : q;
}

BatchShape laid_shape(const BatchShape& shape, const GraphCapacity* capacity, bool fp8) {
  if (shape.seqs == 0) return shape;
  if (capacity) {
    GraphCapacity c = *capacity;
    c.cover(shape);
    return c.of(shape);
  }
  BatchShape laid = shape;
  if (fp8) laid.rows = ceil_div(laid.rows, kFp8Rows) * kFp8Rows;
  return laid;
}

BertMemory plan_bert_memory(const BertConfig& config, const BertOptions& options, bool graphs,
                            int ranks, const BertReserve& r) {
  const bool fp8 = options.precision == Precision::fp8;
  BertMemory m;
  GraphCapacity capacity;
  capacity.row_quantum = row_quantum(r.layout, r.shape.max_len, fp8);
  const BatchShape laid = laid_shape(r.shape, graphs ? &capacity : nullptr, fp8);
  m.laid = laid;
  m.mst_chunks = mst_chunks_for(config, options, laid, true);
  {
    Carver measure(nullptr, Device::cpu);
    StepActivations scratch;
    carve_activations(measure, config, laid, activation_plan(options, laid, true, m.mst_chunks),
                      scratch);
    m.arena_by_kind = measure.used_by_kind();
  }
  const int64_t n = ParamTable(config).total();
  if (options.precision != Precision::fp32)
    m.lowp_weights =
        buffer_bytes(static_cast<size_t>(n) * dtype_size(precision_dtype(options.precision)));
  if (fp8) {
    m.fp8_state = Fp8State::state_bytes(config, options.fp8, ranks);
    m.fp8_workspace =
        buffer_bytes(static_cast<size_t>(Fp8State::workspace_bytes_for(config, laid.rows)));
  }
  m.arena = buffer_bytes(training_arena_bytes(config, options, laid));
  m.batch_buffers = 2 * buffer_bytes(batch_bytes(laid));
  m.metric_slots = MetricSlots::bytes_for(r.deferred_forwards);
  return m;
}

// ---- Bert's buffers --------------------------------------------------------------------------

void Bert::reserve_training(const BertReserve& r) {
  Fp8State* fp8 = linears_.fp8();
  const BertMemory m = plan_bert_memory(config_, options_, graphs_.on(), fp8 ? fp8->ranks() : 1, r);
  if (graphs_.on() && r.shape.seqs > 0) {
    graphs_.cover(r.shape, true, row_quantum(r.layout, r.shape.max_len, fp8 != nullptr));
    const BatchShape c = laid_shape(r.shape, graph_bound(true), fp8 != nullptr);
    PB_CHECK(c.rows == m.laid.rows && c.seqs == m.laid.seqs && c.masked == m.laid.masked,
             "Bert::reserve_training: graphs' capacity {} rows / {} seqs / {} masked, the "
             "plan's {} / {} / {}",
             c.rows, c.seqs, c.masked, m.laid.rows, m.laid.seqs, m.laid.masked);
  }
  arena_.reserve_exact(m.arena);
  for (BackendBuffer& b : batch_buffers_)
    if (b.bytes() < m.batch_buffers / 2) {
      b.reset();
      b = backend_.alloc(m.batch_buffers / 2, "batch buffer");
    }
  if (fp8) fp8->reserve_workspace(static_cast<int64_t>(m.fp8_workspace));
  metrics_.reserve(r.deferred_forwards);
}

void Bert::grow_for(const BatchShape& shape, bool gradients) {
  graphs_.cover(shape, gradients);
  arena_.reserve(activation_bytes(shape, gradients));
  const size_t bytes =
      batch_bytes(laid_shape(shape, graph_bound(gradients), linears_.fp8() != nullptr));
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

bool Bert::fits(const BertMemory& limits, const BatchShape& shape, BatchLayout layout,
                bool gradients) const {
  if (shape.seqs == 0) return true;
  Fp8State* fp8 = linears_.fp8();
  GraphCapacity capacity;
  if (graphs_.on()) {
    capacity = *graph_bound(gradients);
    capacity.row_quantum = row_quantum(layout, limits.laid.max_len, fp8 != nullptr);
  }
  const BatchShape c = laid_shape(shape, graphs_.on() ? &capacity : nullptr, fp8 != nullptr);
  if (activation_carve_bytes(
          config_, c, activation_plan(options_, c, gradients, mst_chunks_for(c, gradients))) >
      limits.arena)
    return false;
  if (batch_bytes(c) > limits.batch_buffers / 2) return false;
  return !fp8 || static_cast<size_t>(Fp8State::workspace_bytes_for(config_, c.rows)) <=
                     limits.fp8_workspace;
}

size_t Bert::activation_bytes(const BatchShape& shape, bool gradients) const {
  const BatchShape c = laid_shape(shape, graph_bound(gradients), linears_.fp8() != nullptr);
  return activation_carve_bytes(
      config_, c, activation_plan(options_, c, gradients, mst_chunks_for(c, gradients)));
}

int64_t Bert::mst_chunks_for(const BatchShape& shape, bool gradients) const {
  return packbert::mst_chunks_for(config_, options_, shape, gradients);
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

// The batch on the device and the arena carved for it: with graphs (any part), laid into its
// capacity (padding rows, empty sequence slots, unused masked slots) so that a part recorded for
// one batch replays for the next, and attention launched from the slots and the length bound
// (SeqLayout::fixed_launch). Returns the plan the arena was carved by.
ActivationPlan Bert::lay_out(const Batch& batch, const ForwardOptions& options, Graphed graphed,
                             const std::vector<float>& grad_scales) {
  const bool graphs = graphed != Graphed::none, fp8 = linears_.fp8() != nullptr;
  const bool graph_heads = graphed == Graphed::layers_and_heads || graphed == Graphed::whole;
  if (graphs)
    graphs_.cover(batch.shape(), options.gradients,
                  row_quantum(batch.layout, batch.max_seq_len, fp8));
  BatchShape c = laid_shape(batch.shape(), graphs ? graph_bound(options.gradients) : nullptr, fp8);
  if (!graph_heads) c.masked = batch.num_masked();  // a logits hook is shown no padded slot
  const bool padded =
      c.rows != batch.rows || c.seqs != batch.num_seqs() || c.masked != batch.num_masked();
  const Batch fixed = padded ? with_capacity(batch, c.rows, c.seqs, c.masked) : Batch();
  const Batch& laid = padded ? fixed : batch;
  if (options.gradients) {
    rows_ += batch.rows;
    laid_rows_ += laid.rows;
  }

  // The batch buffer: without graphs the two used in turn, the upload overlapping the previous
  // micro-step's compute (Backend::prefetch); with graphs the one the recorded parts read (one
  // for forwards with gradients, one without), uploaded in op order. The arena: measure, grow if
  // this batch is the largest yet, carve.
  const BatchShape shape = laid.shape();
  StepActivations& a = *act_;
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
  upload_batch(backend_, laid, a.keys.step, grad_scales, a, /*ahead=*/!graphs);
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
  const ActivationPlan p = activation_plan(options_, shape, options.gradients, last_mst_chunks_);
  arena_.reserve(activation_carve_bytes(config_, shape, p));
  Carver carver(arena_.data(), backend_.device());
  carve_activations(carver, config_, shape, p, a);
  if (fp8) linears_.fp8()->workspace(Fp8State::workspace_bytes_for(config_, shape.rows));
  // The report describes the arena's purpose: a model with gradients reports its training
  // forwards (an evaluation between steps neither moves its peak nor its last step), a
  // forward-only model its evaluation forwards.
  if (options.gradients || !weights_.has_grads())
    arena_.note_use(carver.used(), carver.used_by_kind());
  return p;
}

}  // namespace packbert
