#include "train/train_step.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/philox.h"
#include "core/error.h"
#include "train/batching.h"
#ifdef PACKBERT_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "comm/nccl_allreduce.h"
#endif

namespace packbert {

// The device buffers of a CUDA trainer: parameters, gradients and LAMB's state, freed with it.
struct Trainer::DeviceState {
  std::vector<void*> allocations;
  Tensor params, grads;
  LambDeviceBuffers lamb;
#ifdef PACKBERT_HAVE_CUDA
  std::unique_ptr<NcclAllreduce> nccl;  // gpu_allreduce = nccl: the backward drives it
  Tensor take(DType dtype, std::initializer_list<int64_t> dims) {
    Tensor shape(nullptr, dtype, dims, Device::cuda);
    void* p = cuda_alloc(std::max<size_t>(shape.bytes(), 1));
    allocations.push_back(p);
    return Tensor(p, dtype, dims, Device::cuda);
  }
  ~DeviceState() {
    nccl.reset();  // before the gradient buffer it reduces is freed
    for (void* p : allocations) cuda_free(p);
  }
#endif
};

namespace {

std::vector<LambParam> lamb_params(const ParamTable& table) {
  std::vector<LambParam> out;
  out.reserve(table.tensors().size());
  for (const ParamTensor& t : table.tensors())
    out.push_back({t.name, t.offset, t.size, t.no_decay});
  return out;
}

// The all-reduce is told tensors by their index in the table, exactly the index Bert's
// GradientReady hook reports, so the hook can pass it straight through.
std::vector<GradSpan> grad_spans(const ParamTable& table) {
  std::vector<GradSpan> out;
  out.reserve(table.tensors().size());
  for (const ParamTensor& t : table.tensors()) out.push_back({t.offset, t.size});
  return out;
}

}  // namespace

Trainer::Trainer(MPI_Comm comm, const TrainerOptions& options)
    : options_(options),
      table_(options.config),
      params_(static_cast<size_t>(table_.total())),
      grads_(static_cast<size_t>(table_.total()), 0.f) {
  // Every rank initialises from the same seed: the parameters start bitwise identical, and the
  // identical reduced gradients keep them so (no broadcast needed).
  init_parameters(table_, InitOptions{options_.init_seed}, params_.data());
  const int64_t n = table_.total();
  if (options_.bert.precision == Precision::fp16) {
    // Overflow is expected under loss scaling: it skips the step and lowers the scale.
    options_.lamb.check_finite = true;
    options_.lamb.skip_nonfinite = true;
    scaler_ = std::make_unique<LossScaler>(options_.loss_scaler);
  }
  BackendOptions backend_options;
  backend_options.cuda_device = options_.cuda_device;
  backend_options.validate = false;  // the batch and the table were checked on the host
  backend_ = make_backend(options_.device, backend_options);
  if (options_.device == Device::cpu) {
    bert_ = std::make_unique<Bert>(options_.config, *backend_, params_view(), grads_view(),
                                   options_.bert);
    lamb_ = std::make_unique<Lamb>(*backend_, lamb_params(table_), n, LrSchedule(options_.lr),
                                   options_.lamb);
  } else {
#ifdef PACKBERT_HAVE_CUDA
    const auto num_tensors = static_cast<int64_t>(table_.tensors().size());
    dev_ = std::make_unique<DeviceState>();
    dev_->params = dev_->take(DType::f32, {n});
    dev_->grads = dev_->take(DType::f32, {n});
    dev_->lamb.m = dev_->take(DType::f32, {n});
    dev_->lamb.v = dev_->take(DType::f32, {n});
    dev_->lamb.table = dev_->take(DType::i64, {num_tensors, 3});
    dev_->lamb.grad_norm = dev_->take(DType::f32, {1});
    dev_->lamb.tensor_norms = dev_->take(DType::f32, {2 * num_tensors});
    backend_->copy(dev_->params, view(params_.data(), {n}));
    backend_->zero(dev_->grads);
    bert_ = std::make_unique<Bert>(options_.config, *backend_, params_view(), grads_view(),
                                   options_.bert, cuda_alloc, cuda_free);
    lamb_ = std::make_unique<Lamb>(*backend_, lamb_params(table_), n, LrSchedule(options_.lr),
                                   options_.lamb, &dev_->lamb);
#endif
  }
  allreduce_ = std::make_unique<GradAllreduce>(comm, grads_.data(), n, grad_spans(table_),
                                               options_.bucket_bytes);
#ifdef PACKBERT_HAVE_CUDA
  // After GradAllreduce on every rank alike (both constructors are collective over comm).
  if (dev_ && options_.gpu_allreduce == GpuAllreduce::nccl)
    dev_->nccl = std::make_unique<NcclAllreduce>(
        comm, options_.cuda_device, cuda_stream(*backend_), static_cast<float*>(dev_->grads.data),
        n, grad_spans(table_), options_.bucket_bytes);
#endif
}

Tensor Trainer::params_view() const {
  return dev_ ? dev_->params : view(params_.data(), {table_.total()});
}

Tensor Trainer::grads_view() const {
  return dev_ ? dev_->grads : view(const_cast<float*>(grads_.data()), {table_.total()});
}

const std::vector<float>& Trainer::params() const {
  if (dev_ && params_stale_) {
    backend_->copy(view(params_.data(), {table_.total()}), dev_->params);
    params_stale_ = false;
  }
  return params_;
}

Trainer::~Trainer() = default;

StepMetrics Trainer::step(const StepBatch& batch, const ReducedGradHook& inspect_grads) {
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

  // Local sums of this rank's micro-steps, all-reduced after the gradients (a blocking
  // collective must not run inside the all-reduce round).
  // loss, mlm sum, nsp sum, mlm ok, nsp ok, masked, seqs, tokens, rows
  double local[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
  const size_t micro_steps = batch.micro_batches.size();
  PB_REQUIRE(micro_steps > 0, "train step {}: no micro-batches", batch.step);
  GradAllreduce& ar = *allreduce_;
  // The all-reduce the backward drives, bucket by bucket: GradAllreduce over the host buffer on
  // the CPU, NcclAllreduce over the device buffer on CUDA; none when the device gradient is
  // staged through the host after the backward (gpu_allreduce = host).
  GradientReady ready;
  std::function<void()> begin_round;
  if (!dev_) {
    ready = [&ar](int tensor) { ar.ready_tensor(tensor); };
    begin_round = [&ar] { ar.begin(); };
  }
#ifdef PACKBERT_HAVE_CUDA
  if (NcclAllreduce* nccl = dev_ ? dev_->nccl.get() : nullptr) {
    ready = [nccl](int tensor) { nccl->ready_tensor(tensor); };
    begin_round = [nccl] { nccl->begin(); };
  }
#endif

  for (size_t m = 0; m < micro_steps; ++m) {
    const LoaderMicroBatch& mb = batch.micro_batches[m];
    const Batch b = make_batch(mb.samples, options_.layout, options_.max_seq_len, mb.packs);
    const ForwardResult r = bert_->forward(b, batch.global_masked_tokens, batch.global_samples,
                                           dropout_step, options_.dropout_seed, fwd);
    // Only the last micro-step's gradients are final; arming the round there makes its
    // backward start the buckets as the layers finish (earlier micro-steps' ready() calls are
    // ignored outside a round).
    const bool last = m + 1 == micro_steps && ready;
    if (last) begin_round();
    bert_->backward(last ? ready : GradientReady{});
    local[0] += r.loss;
    local[1] += r.mlm_loss_sum;
    local[2] += r.nsp_loss_sum;
    local[3] += static_cast<double>(r.mlm_correct);
    local[4] += static_cast<double>(r.nsp_correct);
    local[5] += static_cast<double>(r.masked_tokens);
    local[6] += static_cast<double>(r.sequences);
    local[7] += static_cast<double>(b.num_tokens());
    local[8] += static_cast<double>(b.rows);
  }

  StepMetrics out;
  out.step = batch.step;
  const Tensor host_grads = view(grads_.data(), {table_.total()});
  if (!dev_) {
    out.allreduce = ar.finish();  // grads now hold the sum over ranks: the global gradient
  } else if (!ready) {
    // Staged through the host: every tensor is final once the backward is done.
    backend_->copy(host_grads, dev_->grads);
    ar.begin();
    for (int t = 0; t < static_cast<int>(table_.tensors().size()); ++t) ar.ready_tensor(t);
    out.allreduce = ar.finish();
    backend_->copy(dev_->grads, host_grads);
  } else {
#ifdef PACKBERT_HAVE_CUDA
    // The compute stream waits for the last bucket; LAMB, issued next on it, sees the sum.
    out.allreduce = dev_->nccl->finish();
    if (inspect_grads) backend_->copy(host_grads, dev_->grads);
#endif
  }
  if (inspect_grads) inspect_grads(grads_.data(), table_.total());

  // Mixed precision: LAMB also rewrites the GEMMs' low-precision weight copy, and divides the
  // loss scale out of the gradients.
  const LambStepInfo info = lamb_->step(params_view(), grads_view(), bert_->lowp_params(),
                                        loss_scale);
  out.loss_scale = loss_scale;
  if (scaler_) scaler_->update(!info.skipped);
  params_stale_ = dev_ != nullptr;
  out.lr = info.lr;
  out.grad_norm = info.grad_norm;
  out.skipped = info.skipped;

  ar.allreduce_sum(local, 9);
  const double masked = local[5], seqs = local[6];
  PB_REQUIRE(static_cast<int64_t>(masked) == batch.global_masked_tokens &&
                 static_cast<int64_t>(seqs) == batch.global_samples,
             "train step {}: the ranks trained {} sequences / {} masked tokens, the plan says "
             "{} / {}",
             batch.step, seqs, masked, batch.global_samples, batch.global_masked_tokens);
  out.loss = local[0];
  out.mlm_loss = masked > 0 ? local[1] / masked : 0.0;
  out.nsp_loss = local[2] / seqs;
  out.mlm_accuracy = masked > 0 ? local[3] / masked : 0.0;
  out.nsp_accuracy = local[4] / seqs;
  out.samples = batch.global_samples;
  out.masked_tokens = batch.global_masked_tokens;
  out.tokens = static_cast<int64_t>(local[7]);
  out.rows = static_cast<int64_t>(local[8]);
  return out;
}

EvalSums& EvalSums::operator+=(const EvalSums& o) {
  mlm_loss_sum += o.mlm_loss_sum;
  nsp_loss_sum += o.nsp_loss_sum;
  mlm_correct += o.mlm_correct;
  nsp_correct += o.nsp_correct;
  masked_tokens += o.masked_tokens;
  samples += o.samples;
  return *this;
}

EvalSums Trainer::evaluate(const Batch& batch) {
  EvalSums out;
  if (batch.empty()) return out;
  ForwardOptions eval;
  eval.dropout = false;
  eval.gradients = false;
  // The normalisers only scale the loss (not returned here) and the unused gradients.
  const ForwardResult r = bert_->forward(batch, std::max<int64_t>(1, batch.num_masked()),
                                         batch.num_seqs(), 0, 0, eval);
  out.mlm_loss_sum = r.mlm_loss_sum;
  out.nsp_loss_sum = r.nsp_loss_sum;
  out.mlm_correct = r.mlm_correct;
  out.nsp_correct = r.nsp_correct;
  out.masked_tokens = r.masked_tokens;
  out.samples = r.sequences;
  return out;
}

void Trainer::load_params(const float* params) {
  std::copy(params, params + table_.total(), params_.begin());
  if (dev_) backend_->copy(dev_->params, view(params_.data(), {table_.total()}));
  params_stale_ = false;
  bert_->refresh_lowp_params();
}

void Trainer::load_state(const float* params, const float* m, const float* v,
                         int64_t lamb_steps_done) {
  load_params(params);
  lamb_->load_moments(m, v);
  lamb_->set_steps_done(lamb_steps_done);
  std::fill(grads_.begin(), grads_.end(), 0.f);
  if (dev_) backend_->zero(dev_->grads);
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
