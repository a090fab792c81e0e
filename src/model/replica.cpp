#include "model/replica.h"

namespace packbert {

ModelReplica::ModelReplica(const ReplicaOptions& options) : table_(options.config) {
  BackendOptions backend_options;
  backend_options.cuda_device = options.cuda_device;
  backend_options.validate = false;  // the batch and the table are checked on the host
  backend_ = make_backend(options.device, backend_options);
  backend_->set_planned_bytes(options.planned_bytes);
  const int64_t n = table_.total();
  params_ = backend_->alloc(DType::f32, {n}, "fp32 master weights");
  backend_->zero(params_.tensor());  // defined before the Bert's first low-precision copy
  if (options.gradients) {
    grads_ = backend_->alloc(DType::f32, {n}, "gradients");
    backend_->zero(grads_.tensor());
  }
  bert_ = std::make_unique<Bert>(options.config, *backend_, params_.tensor(), grads_.tensor(),
                                 options.bert);
  if (options.initialize)
    load_params(
        [&](float* host) { init_parameters(table_, InitOptions{options.init_seed}, host); });
}

ModelReplica::~ModelReplica() = default;

void ModelReplica::load_params(const float* host) {
  backend_->copy(params_.tensor(), view(const_cast<float*>(host), {table_.total()}));
  host_params_stale_ = true;
  bert_->refresh_lowp_params();
}

void ModelReplica::load_params(const std::function<void(float* host)>& fill) {
  const int64_t n = table_.total();
  if (params_.tensor().device == Device::cpu) {
    fill(static_cast<float*>(params_.tensor().data));
  } else {
    std::vector<float> host(static_cast<size_t>(n));
    fill(host.data());
    backend_->copy(params_.tensor(), view(host.data(), {n}));
  }
  host_params_stale_ = true;
  bert_->refresh_lowp_params();
}

const std::vector<float>& ModelReplica::host_params() const {
  if (host_params_stale_) {
    host_params_.resize(static_cast<size_t>(table_.total()));
    backend_->copy(view(host_params_.data(), {table_.total()}), params_.tensor());
    host_params_stale_ = false;
  }
  return host_params_;
}

}  // namespace packbert
