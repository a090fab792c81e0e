#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>

#include "comm/mpi_check.h"
#include "core/error.h"
#include "kernels/common/philox.h"
#include "train/batching.h"

namespace packbert {

namespace {

std::vector<LambParam> lamb_params(const ParamTable& table) {
  std::vector<LambParam> out;
  out.reserve(table.tensors().size());
  for (const ParamTensor& t : table.tensors())
    out.push_back({t.name, t.offset, t.size, t.no_decay});
  return out;
}

// The reducer is told tensors by their index in the table, exactly the index Bert's
// GradientReady hook reports, so the hook can pass it straight through.
std::vector<GradSpan> grad_spans(const ParamTable& table) {
  std::vector<GradSpan> out;
  out.reserve(table.tensors().size());
  for (const ParamTensor& t : table.tensors()) out.push_back({t.offset, t.size});
  return out;
}

ReplicaOptions replica_options(const TrainerOptions& o) {
  ReplicaOptions r;
  r.config = o.config;
  r.bert = o.bert;
  r.device = o.device;
  r.cuda_device = o.cuda_device;
  r.gradients = true;
  // Every rank initialises from the same seed: the parameters start bitwise identical, and the
  // identical reduced gradients keep them so (no broadcast needed).
  r.init_seed = o.init_seed;
  return r;
}

}  // namespace

Trainer::Trainer(MPI_Comm comm, const TrainerOptions& options)
    : options_(options), replica_(replica_options(options)) {
  const ParamTable& table = replica_.table();
  Backend& backend = replica_.backend();
  const int64_t n = table.total();
  if (options_.bert.precision == Precision::fp16) {
    // Overflow is expected under loss scaling: it skips the step and lowers the scale.
    options_.lamb.check_finite = true;
    options_.lamb.skip_nonfinite = true;
    scaler_ = std::make_unique<LossScaler>(options_.loss_scaler);
  }
  if (options_.reserve.rows > 0) replica_.bert().reserve(options_.reserve);
  GradReducerOptions reduce;
  reduce.bucket_bytes = options_.bucket_bytes;
  reduce.device_transport = options_.gpu_transport;
  reduce.cuda_device = options_.cuda_device;
  int world = 1;
  int initialized = 0;
  PB_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) PB_MPI_CHECK(MPI_Comm_size(comm, &world));
  reduce.shard_bounds = DistributedLamb::shard_bounds(n, world);
  reducer_ = std::make_unique<GradReducer>(comm, backend, replica_.grads(), grad_spans(table),
                                           reduce);
  metric_sums_ = std::make_unique<MetricSums>(comm);
  Bert& bert = replica_.bert();
  OptimizedBuffers buffers{replica_.params(), replica_.grads(), bert.lowp_params(),
                           bert.fp32_ranges(), bert.forward_groups()};
  optimizer_ = std::make_unique<DistributedLamb>(backend, lamb_params(table), *reducer_,
                                                 std::move(buffers), LrSchedule(options_.lr),
                                                 options_.lamb, options_.sharded);
  // A sharded step's weights arrive layer by layer: each layer of the next forward (or of an
  // evaluation) waits for its own.
  DistributedLamb* optimizer = optimizer_.get();
  bert.set_weights_ready([optimizer](int group) { optimizer->wait_weights(group); });
}

void Trainer::save_state(float* params, float* m, float* v, int root) {
  optimizer_->save_state(params, m, v, root);
}

const std::vector<float>& Trainer::params() {
  optimizer_->sync_weights();
  if (!optimizer_->master_sharded()) return replica_.host_params();
  gathered_params_.resize(static_cast<size_t>(replica_.table().total()));
  optimizer_->gather_params(gathered_params_.data());
  return gathered_params_;
}

Trainer::~Trainer() = default;

StepMetrics Trainer::step(const StepBatch& batch, const ReducedGradHook& inspect_grads,
                          bool read_optimizer) {
  PB_REQUIRE(batch.global_samples > 0, "train step {}: the global batch is empty", batch.step);
  // The dropout key holds 24 bits of step (common/philox.h); the loader's step count starts at
  // 0 and grows by 1, and the config refuses max_steps beyond the range before any work.
  PB_REQUIRE(batch.step >= 0 && batch.step < int64_t{kDropoutMaxStep},
             "train step {}: outside the dropout key's step range (< {})", batch.step,
             kDropoutMaxStep);
  const auto dropout_step = static_cast<uint32_t>(batch.step);
  ForwardOptions fwd;
  fwd.dropout = options_.dropout;
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  fwd.loss_scale = loss_scale;
  fwd.defer_metrics = true;  // the losses are read once, after the optimizer step is issued

  // Local sums of this rank's micro-steps, all-reduced after the gradients (a blocking
  // collective must not run inside the all-reduce round): one array, so that one collective
  // sums them all, with a name for every slot.
  enum Sum : size_t { kLoss, kMlmLoss, kNspLoss, kMlmCorrect, kNspCorrect, kMasked, kSequences,
                      kTokens, kRows, kSums };
  std::array<double, kSums> local{};
  const size_t micro_steps = batch.micro_batches.size();
  PB_REQUIRE(micro_steps > 0, "train step {}: no micro-batches", batch.step);
  GradReducer& reducer = *reducer_;
  Bert& bert = replica_.bert();
  Backend& backend = replica_.backend();
  const Tensor& grads = replica_.grads();
  const int64_t n = replica_.table().total();
  const GradientReady ready = [&reducer](int tensor) { reducer.ready_tensor(tensor); };

  for (size_t m = 0; m < micro_steps; ++m) {
    const LoaderMicroBatch& mb = batch.micro_batches[m];
    const Batch b = make_batch(mb.samples, options_.layout, options_.max_seq_len, mb.packs);
    const ForwardResult r = bert.forward(b, batch.global_masked_tokens, batch.global_samples,
                                         dropout_step, options_.dropout_seed, fwd);
    // Only the last micro-step's gradients are final; arming the round there makes its
    // backward start the buckets as the layers finish (earlier micro-steps' ready() calls are
    // ignored outside a round).
    const bool last = m + 1 == micro_steps;
    if (last) reducer.begin(optimizer_->collective());
    bert.backward(last ? ready : GradientReady{});
    local[kMasked] += static_cast<double>(r.masked_tokens);
    local[kSequences] += static_cast<double>(r.sequences);
    local[kTokens] += static_cast<double>(b.num_tokens());
    local[kRows] += static_cast<double>(b.rows);
  }

  StepMetrics out;
  out.step = batch.step;
  out.allreduce = reducer.finish();  // grads now hold the sum over ranks: the global gradient
  if (inspect_grads) {
    optimizer_->gather_gradient();  // sharded: each rank holds the sum of its range only
    host_grads_.resize(static_cast<size_t>(n));
    backend.copy(view(host_grads_.data(), {n}), grads);
    inspect_grads(host_grads_.data(), n);
  }

  // Mixed precision: LAMB also rewrites the GEMMs' low-precision weight copy, and divides the
  // loss scale out of the gradients. Afterwards every rank holds the weights the model reads.
  const bool read = read_optimizer || backend.device() == Device::cpu || scaler_ != nullptr;
  const LambStepInfo info = optimizer_->step(loss_scale, read);
  out.loss_scale = loss_scale;
  if (scaler_) scaler_->update(!info.skipped);
  replica_.mark_params_changed();
  out.lr = info.lr;
  out.optimizer_read = info.read_back;
  out.grad_norm = info.grad_norm;
  out.skipped = info.skipped;
  out.unread_skips = info.unread_skips;
  out.longest_skipped_run = info.longest_skipped_run;

  for (const ForwardResult& r : bert.deferred_results()) {  // one read of the micro-steps'
    local[kLoss] += r.loss;
    local[kMlmLoss] += r.mlm_loss_sum;
    local[kNspLoss] += r.nsp_loss_sum;
    local[kMlmCorrect] += static_cast<double>(r.mlm_correct);
    local[kNspCorrect] += static_cast<double>(r.nsp_correct);
  }
  metric_sums_->sum(local.data(), static_cast<int>(local.size()), "MPI_Allreduce (step metrics)");
  const double masked = local[kMasked], seqs = local[kSequences];
  PB_REQUIRE(static_cast<int64_t>(masked) == batch.global_masked_tokens &&
                 static_cast<int64_t>(seqs) == batch.global_samples,
             "train step {}: the ranks trained {} sequences / {} masked tokens, the plan says "
             "{} / {}",
             batch.step, seqs, masked, batch.global_samples, batch.global_masked_tokens);
  out.loss = local[kLoss];
  out.mlm_loss = masked > 0 ? local[kMlmLoss] / masked : 0.0;
  out.nsp_loss = local[kNspLoss] / seqs;
  out.mlm_accuracy = masked > 0 ? local[kMlmCorrect] / masked : 0.0;
  out.nsp_accuracy = local[kNspCorrect] / seqs;
  out.samples = batch.global_samples;
  out.masked_tokens = batch.global_masked_tokens;
  out.tokens = static_cast<int64_t>(local[kTokens]);
  out.rows = static_cast<int64_t>(local[kRows]);
  return out;
}

void Trainer::load_params(const float* params) {
  optimizer_->sync_weights();  // no gather in flight may write them afterwards
  replica_.load_params(params);
}

void Trainer::load_state(const float* params, const float* m, const float* v,
                         int64_t lamb_steps_done) {
  load_params(params);
  optimizer_->load_moments(m, v);
  optimizer_->set_steps_done(lamb_steps_done);
  replica_.backend().zero(replica_.grads());
}

LossScalerState Trainer::loss_scaler_state() const {
  return scaler_ ? scaler_->state() : LossScalerState{};
}

void Trainer::set_loss_scaler_state(const LossScalerState& state) {
  PB_REQUIRE(scaler_, "trainer: a loss-scaler state given to a {} run (fp16 only)",
             precision_name(options_.bert.precision));
  scaler_->set_state(state);
}

}  // namespace packbert
