#include "model/replica.h"

#include "kernels/base/error.h"

namespace packbert {

ModelReplica::ModelReplica(const ReplicaOptions& options) : table_(options.config) {
  BackendOptions backend_options;
  backend_options.cuda_device = options.cuda_device;
  backend_options.validate = false;  // the batch and the table are checked on the host
  backend_ = make_backend(options.device, backend_options);
  backend_->set_planned_bytes(options.planned_bytes);
  const int64_t n = table_.total();
  if (options.shard_masters) {
    PB_REQUIRE(options.gradients && (options.bert.precision == Precision::bf16 ||
                                     options.bert.precision == Precision::fp16),
               "model: sharded fp32 master weights need bf16 or fp16 training, not {}",
               precision_name(options.bert.precision));
    PB_REQUIRE(0 <= options.master_begin && options.master_begin <= options.master_end &&
                   options.master_end <= n,
               "model: master shard [{}, {}) outside the {} parameters", options.master_begin,
               options.master_end, n);
    master_begin_ = options.master_begin;
    params_ = backend_->alloc(DType::f32, {options.master_end - options.master_begin},
                              "fp32 master weights (this rank's shard)");
    fp32_ = backend_->alloc(DType::f32, {fp32_read_elems(table_)},
                            "fp32 weights the ops read (biases, LayerNorm)");
    backend_->zero(params_.tensor());
    backend_->zero(fp32_.tensor());
  } else {
    params_ = backend_->alloc(DType::f32, {n}, "fp32 master weights");
    backend_->zero(params_.tensor());  // defined before the Bert's first low-precision copy
  }
  if (options.gradients) {
    grads_ = backend_->alloc(DType::f32, {n}, "gradients");
    backend_->zero(grads_.tensor());
  }
  bert_ = std::make_unique<Bert>(options.config, *backend_,
                                 masters_sharded() ? Tensor() : params_.tensor(), grads_.tensor(),
                                 options.bert, fp32_.tensor());
  if (options.initialize)
    load_params(
        [&](float* host) { init_parameters(table_, InitOptions{options.init_seed}, host); });
}

ModelReplica::~ModelReplica() = default;

void ModelReplica::load_params(const float* host) {
  if (masters_sharded()) {
    backend_->copy(grads_.tensor(), view(const_cast<float*>(host), {table_.total()}));
    load_sharded_from_grads();
    return;
  }
  backend_->copy(params_.tensor(), view(const_cast<float*>(host), {table_.total()}));
  host_params_stale_ = true;
  bert_->refresh_lowp_params();
}

void ModelReplica::load_params(const std::function<void(float* host)>& fill) {
  const int64_t n = table_.total();
  // The whole table's host array: on the CPU backend the buffer itself (the parameters, or with
  // sharded masters the gradient that stages them), elsewhere a host array freed on return.
  const Tensor& whole = masters_sharded() ? grads_.tensor() : params_.tensor();
  if (whole.device == Device::cpu) {
    fill(static_cast<float*>(whole.data));
  } else {
    std::vector<float> host(static_cast<size_t>(n));
    fill(host.data());
    backend_->copy(whole, view(host.data(), {n}));
  }
  if (masters_sharded()) {
    load_sharded_from_grads();
    return;
  }
  host_params_stale_ = true;
  bert_->refresh_lowp_params();
}

void ModelReplica::load_sharded_from_grads() {
  // The whole table is in the gradient buffer (zero outside a step): the 16-bit copy from it,
  // the fp32 values the ops read, this rank's master shard; then the gradient is zero again.
  const Tensor& g = grads_.tensor();
  bert_->refresh_lowp_params_from(g);
  int64_t at = 0;
  for (const auto& [a, b] : fp32_read_ranges(table_, true)) {
    backend_->copy(slice(fp32_.tensor(), at, b - a), slice(g, a, b - a));
    at += b - a;
  }
  const int64_t len = params_.tensor().numel();
  if (len > 0) backend_->copy(params_.tensor(), slice(g, master_begin_, len));
  backend_->zero(g);
  host_params_stale_ = true;
}

const std::vector<float>& ModelReplica::host_params() const {
  PB_REQUIRE(!masters_sharded(),
             "model: no rank holds every fp32 master weight (they are "
             "sharded): gather them (DistributedLamb::gather_params)");
  if (host_params_stale_) {
    host_params_.resize(static_cast<size_t>(table_.total()));
    backend_->copy(view(host_params_.data(), {table_.total()}), params_.tensor());
    host_params_stale_ = false;
  }
  return host_params_;
}

}  // namespace packbert
