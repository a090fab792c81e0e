#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>

#include "core/mpi_check.h"
#include "comm/shard_exchange.h"
#include "kernels/base/error.h"
#include "kernels/common/philox.h"
#include "train/batching.h"

namespace packbert {

namespace {

// A step's counts, summed over the ranks every step (Trainer::sum_metrics).
enum Count : size_t { kMasked, kSequences, kTokens, kRows, kCounts };

// The losses of a step that did not read them back.
StepLosses unread_losses() {
  StepLosses l;
  l.loss = l.mlm_loss = l.nsp_loss = l.mlm_accuracy = l.nsp_accuracy =
      std::numeric_limits<double>::quiet_NaN();
  return l;
}

// The reducer is told tensors by their index in the table, exactly the index Bert's
// GradientReady hook reports, so the hook can pass it straight through.
std::vector<GradSpan> grad_spans(const ParamTable& table) {
  std::vector<GradSpan> out;
  out.reserve(table.tensors().size());
  for (const ParamTensor& t : table.tensors()) out.push_back({t.offset, t.size});
  return out;
}

// The data-parallel world of comm: (ranks, this rank); (1, 0) without MPI.
std::pair<int, int> world_of(MPI_Comm comm) {
  int initialized = 0, world = 1, rank = 0;
  PB_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) {
    PB_MPI_CHECK(MPI_Comm_size(comm, &world));
    PB_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  }
  return {world, rank};
}

ReplicaOptions replica_options(const TrainerOptions& o, MPI_Comm comm) {
  ReplicaOptions r;
  r.config = o.config;
  r.bert = o.bert;
  r.device = o.device;
  r.cuda_device = o.cuda_device;
  r.gradients = true;
  // Every rank initialises from the same seed: the parameters start bitwise identical, and the
  // identical reduced gradients keep them so (no broadcast needed).
  r.init_seed = o.init_seed;
  r.planned_bytes = o.planned_bytes;
  // A sharded mixed-precision run keeps each rank's shard of the fp32 masters only
  // (DistributedLamb's cut); FP8 casts its weight copies from whole masters.
  const auto [world, rank] = world_of(comm);
  if (o.sharded && world > 1 &&
      (o.bert.precision == Precision::bf16 || o.bert.precision == Precision::fp16)) {
    const std::vector<int64_t> bounds =
        DistributedLamb::shard_bounds(ParamTable(o.config).total(), world);
    r.shard_masters = true;
    r.master_begin = bounds[static_cast<size_t>(rank)];
    r.master_end = bounds[static_cast<size_t>(rank) + 1];
  }
  return r;
}

}  // namespace

std::vector<LambParam> lamb_params(const ParamTable& table) {
  std::vector<LambParam> out;
  out.reserve(table.tensors().size());
  for (const ParamTensor& t : table.tensors())
    out.push_back({t.name, t.offset, t.size, t.no_decay});
  return out;
}

Trainer::Trainer(MPI_Comm comm, const TrainerOptions& options)
    : options_(options), replica_(replica_options(options, comm)) {
  const ParamTable& table = replica_.table();
  Backend& backend = replica_.backend();
  const int64_t n = table.total();
  if (options_.bert.precision == Precision::fp16) {
    // Overflow is expected under loss scaling: it skips the step and lowers the scale.
    options_.lamb.check_finite = true;
    options_.lamb.skip_nonfinite = true;
    scaler_ = std::make_unique<LossScaler>(options_.loss_scaler);
  }
  // Full graphs take the optimizer's update in too (unsharded: LambOptions::graph).
  options_.lamb.graph = options_.bert.cuda_graphs == CudaGraphs::full;
  GradReducerOptions reduce;
  reduce.bucket_bytes = options_.bucket_bytes;
  reduce.device_transport = options_.gpu_transport;
  reduce.cuda_device = options_.cuda_device;
  const auto [world, rank] = world_of(comm);
  reduce.shard_bounds = DistributedLamb::shard_bounds(n, world);
  reducer_ =
      std::make_unique<GradReducer>(comm, backend, replica_.grads(), grad_spans(table), reduce);
  metric_sums_ = std::make_unique<MetricSums>(comm);
  Bert& bert = replica_.bert();
  bert.set_data_parallel(world, rank);  // FP8: the amaxes' maximum is over every rank
  if (options_.reserve.rows > 0)        // after the FP8 state is made for the world
    bert.reserve_training(
        BertReserve{options_.reserve, options_.layout, options_.deferred_forwards});
  OptimizedBuffers buffers{replica_.params(),
                           replica_.grads(),
                           bert.weights().lowp(),
                           bert.weights().fp32_ranges(),
                           bert.weights().forward_groups(),
                           replica_.fp32_weights()};
  optimizer_ =
      std::make_unique<DistributedLamb>(backend, lamb_params(table), *reducer_, std::move(buffers),
                                        LrSchedule(options_.lr), options_.lamb, options_.sharded);
  // A sharded step's weights arrive layer by layer: each layer of the next forward (or of an
  // evaluation) waits for its own.
  DistributedLamb* optimizer = optimizer_.get();
  bert.set_weights_ready([optimizer](int group) { optimizer->wait_weights(group); });
  // The gradient round: the reducer's collectives as the backward finishes each tensor. Full
  // graphs take it into the last backward's graph where the reducer can be captured (NCCL, or
  // one rank): docs/communication.md#graphs.
  GradReducer* reducer = reducer_.get();
  round_.ready = [reducer](int tensor) { reducer->ready_tensor(tensor); };
  round_.complete = [reducer] { reducer->complete(); };
  round_.launched = [reducer] { reducer->graph_launched(); };
  round_.all_ranks = [reducer](const std::vector<int64_t>& v) { return reducer->all_ranks(v); };
  round_.tag = static_cast<int64_t>(optimizer_->collective());
  round_.in_graph = reducer->capturable();
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
                          bool read_back) {
  PB_REQUIRE(batch.global_samples > 0, "train step {}: the global batch is empty", batch.step);
  // The dropout key holds 24 bits of step (common/philox.h); the loader's step count starts at
  // 0 and grows by 1, and the config refuses max_steps beyond the range before any work.
  PB_REQUIRE(batch.step >= 0 && batch.step < int64_t{kDropoutMaxStep},
             "train step {}: outside the dropout key's step range (< {})", batch.step,
             kDropoutMaxStep);
  PB_REQUIRE(!batch.micro_batches.empty(), "train step {}: no micro-batches", batch.step);
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  // This rank's counts (the host knows them), summed over the ranks after the gradients with
  // the losses read (sum_metrics): a blocking collective must not run inside the round.
  std::vector<double> local(kCounts, 0.0);
  for (size_t m = 0; m < batch.micro_batches.size(); ++m) micro_step(batch, m, loss_scale, local);

  StepMetrics out;
  out.step = batch.step;
  out.allreduce = reducer_->finish();  // grads now hold the sum over ranks: the global gradient
  if (inspect_grads) inspect(inspect_grads);
  out.read = reads_for(read_back);
  unread_.push_back(
      {batch.step, batch.micro_batches.size(), batch.global_masked_tokens, batch.global_samples});
  std::vector<uint8_t> loss_bytes;
  tokens_trained_ += batch.global_tokens;
  optimizer_->set_schedule_tokens(tokens_trained_);
  const LambStepInfo info = update(loss_scale, out.read, loss_bytes);
  out.lr = info.lr;
  out.loss_scale = loss_scale;
  out.grad_norm = info.grad_norm;
  out.skipped = info.skipped;
  out.unread_skips = info.unread_skips;
  out.longest_skipped_run = info.longest_skipped_run;

  // The metrics of the global batch: the counts every step, the losses when read.
  std::vector<ForwardResult> results;
  if (out.read.losses)
    results =
        replica_.bert().take_deferred_results(loss_bytes.empty() ? nullptr : loss_bytes.data());
  set_losses(out, sum_metrics(local, out.read.losses ? &results : nullptr));
  // (The tokens are also the schedule's position in tokens, which was taken from the plan.)
  PB_REQUIRE(static_cast<int64_t>(local[kMasked]) == batch.global_masked_tokens &&
                 static_cast<int64_t>(local[kSequences]) == batch.global_samples &&
                 static_cast<int64_t>(local[kTokens]) == batch.global_tokens,
             "train step {}: the ranks trained {} sequences / {} masked tokens / {} tokens, the "
             "plan says {} / {} / {}",
             batch.step, local[kSequences], local[kMasked], local[kTokens], batch.global_samples,
             batch.global_masked_tokens, batch.global_tokens);
  out.samples = batch.global_samples;
  out.masked_tokens = batch.global_masked_tokens;
  out.tokens = static_cast<int64_t>(local[kTokens]);
  out.rows = static_cast<int64_t>(local[kRows]);
  return out;
}

void Trainer::inspect(const ReducedGradHook& hook) {
  optimizer_->gather_gradient();  // sharded: each rank holds the sum of its range only
  const int64_t n = replica_.table().total();
  host_grads_.resize(static_cast<size_t>(n));
  replica_.backend().copy(view(host_grads_.data(), {n}), replica_.grads());
  hook(host_grads_.data(), n);
}

// The step's own losses (the last read, NaN when none was) and those of the unread steps before.
void Trainer::set_losses(StepMetrics& out, std::vector<StepLosses> losses) {
  StepLosses mine = unread_losses();
  if (out.read.losses) {
    mine = losses.back();
    losses.pop_back();
  }
  out.loss = mine.loss;
  out.mlm_loss = mine.mlm_loss;
  out.nsp_loss = mine.nsp_loss;
  out.mlm_accuracy = mine.mlm_accuracy;
  out.nsp_accuracy = mine.nsp_accuracy;
  out.earlier_losses = std::move(losses);
}

// One micro-batch: forward, then backward. Only the last micro-step's gradients are final, so
// its backward holds the gradient round (the buckets start as the layers finish).
void Trainer::micro_step(const StepBatch& batch, size_t m, float loss_scale,
                         std::vector<double>& local) {
  const LoaderMicroBatch& mb = batch.micro_batches[m];
  const Batch b = make_batch(mb.samples, options_.layout, options_.max_seq_len, mb.packs);
  ForwardOptions fwd;
  fwd.dropout = options_.dropout;
  fwd.loss_scale = loss_scale;
  fwd.defer_metrics = true;  // read in the optimizer's wait (update), when the step reads
  Bert& bert = replica_.bert();
  const ForwardResult r =
      bert.forward(b, batch.global_masked_tokens, batch.global_samples,
                   static_cast<uint32_t>(batch.step), options_.dropout_seed, fwd);
  if (m + 1 == batch.micro_batches.size()) {
    reducer_->begin(optimizer_->collective());
    bert.backward_and_reduce(round_);
  } else {
    bert.backward();
  }
  local[kMasked] += static_cast<double>(r.masked_tokens);
  local[kSequences] += static_cast<double>(r.sequences);
  local[kTokens] += static_cast<double>(b.num_tokens());
  local[kRows] += static_cast<double>(b.rows);
}

StepReads Trainer::reads_for(bool read_back) const {
  StepReads r;
  r.losses = read_back || scaler_ != nullptr;
  r.optimizer = r.losses || replica_.backend().device() == Device::cpu;
  return r;
}

// LAMB's update (mixed precision: it also rewrites the GEMMs' 16-bit copy and divides the loss
// scale out of the gradients); afterwards every rank holds the weights the model reads. Its one
// wait reads the optimizer's scalars and the unread steps' loss sums, as `read` asks.
LambStepInfo Trainer::update(float loss_scale, const StepReads& read,
                             std::vector<uint8_t>& loss_bytes) {
  const Tensor loss_sums = read.losses ? replica_.bert().deferred_sums() : Tensor();
  loss_bytes.assign(loss_sums.defined() ? loss_sums.bytes() : 0, 0);
  std::vector<Backend::HostRead> with;
  if (!loss_bytes.empty()) with.push_back({loss_bytes.data(), loss_sums});
  const LambStepInfo info = optimizer_->step(loss_scale, read.optimizer, with);
  after_update(info);
  return info;
}

void Trainer::after_update(const LambStepInfo& info) {
  if (scaler_) scaler_->update(!info.skipped);
  replica_.mark_params_changed();
  // FP8: the step's amaxes, maximum over the ranks (one small sum of one-hot rows through the
  // reducer's transport), into the histories and the next step's scales.
  Bert& bert = replica_.bert();
  if (bert.fp8()) {
    ShardExchange exchange(*reducer_);
    bert.fp8_end_step([&exchange](const Tensor& shared) { exchange.sum(shared); });
  }
}

std::vector<StepLosses> Trainer::sum_metrics(std::vector<double>& counts,
                                             const std::vector<ForwardResult>* results_read) {
  enum LossSum : size_t { kLoss, kMlmLoss, kNspLoss, kMlmCorrect, kNspCorrect, kLossSums };
  std::vector<double> sums = counts;
  const bool read = results_read != nullptr;
  if (read) {  // every unread micro-step's results, in order
    const std::vector<ForwardResult>& results = *results_read;
    size_t at = 0;
    for (const UnreadStep& u : unread_) {
      std::array<double, kLossSums> s{};
      for (size_t i = 0; i < u.micro_steps; ++i, ++at) {
        PB_CHECK(at < results.size(), "train: {} deferred results for the unread steps",
                 results.size());
        const ForwardResult& r = results[at];
        s[kLoss] += r.loss;
        s[kMlmLoss] += r.mlm_loss_sum;
        s[kNspLoss] += r.nsp_loss_sum;
        s[kMlmCorrect] += static_cast<double>(r.mlm_correct);
        s[kNspCorrect] += static_cast<double>(r.nsp_correct);
      }
      sums.insert(sums.end(), s.begin(), s.end());
    }
    PB_CHECK(at == results.size(), "train: {} deferred results, the unread steps had {}",
             results.size(), at);
  }
  if (!sums.empty())
    metric_sums_->sum(sums.data(), static_cast<int>(sums.size()), "MPI_Allreduce (step metrics)");
  std::copy(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(counts.size()),
            counts.begin());
  std::vector<StepLosses> out;
  if (!read) return out;
  for (size_t k = 0; k < unread_.size(); ++k) {
    const UnreadStep& u = unread_[k];
    const double* s = sums.data() + counts.size() + k * kLossSums;
    const auto masked = static_cast<double>(u.masked_tokens);
    const auto samples = static_cast<double>(u.samples);
    StepLosses l;
    l.step = u.step;
    l.loss = s[kLoss];
    l.mlm_loss = masked > 0 ? s[kMlmLoss] / masked : 0.0;
    l.nsp_loss = s[kNspLoss] / samples;
    l.mlm_accuracy = masked > 0 ? s[kMlmCorrect] / masked : 0.0;
    l.nsp_accuracy = s[kNspCorrect] / samples;
    l.masked_tokens = u.masked_tokens;
    l.samples = u.samples;
    out.push_back(l);
  }
  unread_.clear();
  return out;
}

std::vector<StepLosses> Trainer::read_losses() {
  if (unread_.empty()) return {};
  std::vector<double> none;
  const std::vector<ForwardResult> results = replica_.bert().deferred_results();
  return sum_metrics(none, &results);
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
