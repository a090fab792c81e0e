#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>

#include "comm/mpi_check.h"
#include "comm/shard_exchange.h"
#include "kernels/base/error.h"
#include "kernels/common/philox.h"
#include "train/batching.h"

namespace packbert {

namespace {

// A step's counts, summed over the ranks every step (Trainer::sum_metrics).
enum Count : size_t { kMasked, kSequences, kTokens, kRows, kCounts };

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
  reducer_ = std::make_unique<GradReducer>(comm, backend, replica_.grads(), grad_spans(table),
                                           reduce);
  metric_sums_ = std::make_unique<MetricSums>(comm);
  Bert& bert = replica_.bert();
  bert.set_data_parallel(world, rank);  // FP8: the amaxes' maximum is over every rank
  if (options_.reserve.rows > 0)  // after the FP8 state is made for the world
    bert.reserve_training(BertReserve{options_.reserve, options_.layout, options_.deferred_forwards});
  OptimizedBuffers buffers{replica_.params(), replica_.grads(), bert.weights().lowp(),
                           bert.weights().fp32_ranges(), bert.weights().forward_groups(), replica_.fp32_weights()};
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
  // The losses stay on the device: read after the optimizer step is issued, on a step that
  // reads (read_losses below), together with those of the unread steps before it.
  fwd.defer_metrics = true;

  // This rank's counts of its micro-steps (the host knows them), all-reduced after the
  // gradients (a blocking collective must not run inside the all-reduce round) in the one
  // collective that also sums the losses read (sum_metrics).
  std::vector<double> local(kCounts, 0.0);
  const size_t micro_steps = batch.micro_batches.size();
  PB_REQUIRE(micro_steps > 0, "train step {}: no micro-batches", batch.step);
  GradReducer& reducer = *reducer_;
  Bert& bert = replica_.bert();
  Backend& backend = replica_.backend();
  const Tensor& grads = replica_.grads();
  const int64_t n = replica_.table().total();
  const GradientReady ready = [&reducer](int tensor) { reducer.ready_tensor(tensor); };
  // Full graphs take the round into the last backward's graph when its collectives can be
  // captured (NCCL, or one rank): docs/communication.md#graphs.
  GradientRound round;
  round.ready = ready;
  round.complete = [&reducer] { reducer.complete(); };
  round.launched = [&reducer] { reducer.graph_launched(); };
  round.all_ranks = [&reducer](const std::vector<int64_t>& v) { return reducer.all_ranks(v); };
  round.tag = static_cast<int64_t>(optimizer_->collective());
  round.in_graph = reducer.capturable();

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
    if (last) {
      bert.backward_and_reduce(round);
    } else {
      bert.backward();
    }
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
  // The losses of this step and the unread ones before it come back in the optimizer's wait.
  unread_.push_back({batch.step, micro_steps, batch.global_masked_tokens, batch.global_samples});
  const bool read_losses = read_optimizer || scaler_ != nullptr;
  const Tensor loss_sums = read_losses ? bert.deferred_sums() : Tensor();
  std::vector<uint8_t> loss_bytes(loss_sums.defined() ? loss_sums.bytes() : 0);
  std::vector<Backend::HostRead> also_read;
  if (!loss_bytes.empty()) also_read.push_back({loss_bytes.data(), loss_sums});
  const LambStepInfo info = optimizer_->step(loss_scale, read, also_read);
  out.loss_scale = loss_scale;
  if (scaler_) scaler_->update(!info.skipped);
  replica_.mark_params_changed();
  // FP8: the step's amaxes, maximum over the ranks (one small sum of one-hot rows through the
  // reducer's transport), into the histories and the next step's scales.
  if (bert.fp8()) {
    ShardExchange exchange(reducer);
    bert.fp8_end_step([&exchange](const Tensor& shared) { exchange.sum(shared); });
  }
  out.lr = info.lr;
  out.optimizer_read = info.read_back;
  out.grad_norm = info.grad_norm;
  out.skipped = info.skipped;
  out.unread_skips = info.unread_skips;
  out.longest_skipped_run = info.longest_skipped_run;

  std::vector<ForwardResult> results;
  if (read_losses)
    results = bert.take_deferred_results(loss_bytes.empty() ? nullptr : loss_bytes.data());
  std::vector<StepLosses> losses = sum_metrics(local, read_losses ? &results : nullptr);
  const double masked = local[kMasked], seqs = local[kSequences];
  PB_REQUIRE(static_cast<int64_t>(masked) == batch.global_masked_tokens &&
                 static_cast<int64_t>(seqs) == batch.global_samples,
             "train step {}: the ranks trained {} sequences / {} masked tokens, the plan says "
             "{} / {}",
             batch.step, seqs, masked, batch.global_samples, batch.global_masked_tokens);
  out.losses_read = read_losses;
  if (read_losses) {
    const StepLosses& l = losses.back();
    out.loss = l.loss;
    out.mlm_loss = l.mlm_loss;
    out.nsp_loss = l.nsp_loss;
    out.mlm_accuracy = l.mlm_accuracy;
    out.nsp_accuracy = l.nsp_accuracy;
    losses.pop_back();
    out.earlier_losses = std::move(losses);
  } else {
    out.loss = out.mlm_loss = out.nsp_loss = out.mlm_accuracy = out.nsp_accuracy =
        std::numeric_limits<double>::quiet_NaN();
  }
  out.samples = batch.global_samples;
  out.masked_tokens = batch.global_masked_tokens;
  out.tokens = static_cast<int64_t>(local[kTokens]);
  out.rows = static_cast<int64_t>(local[kRows]);
  return out;
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
