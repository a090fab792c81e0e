// One rank's copy of the model: the backend it runs on, the flat parameters (and, for training,
// the flat gradient) in that backend's memory, and the Bert that computes over them. The
// trainer holds one with a gradient buffer; evaluation (`packbert eval`) holds one without, so
// it needs only the weights (and their low-precision copy) and one evaluation batch's
// activations: no gradient, no optimizer moments, no reducer.
//
// The replica owns its backend (model code never sees a device allocator: the buffers are the
// backend's, Backend::alloc). The host copy of the parameters is made on demand and cached
// until the weights change (mark_params_changed after an update on the device).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/params.h"

namespace packbert {

struct ReplicaOptions {
  BertConfig config;
  BertOptions bert;
  // Where it runs: Device::cpu (the reference) or Device::cuda (GPU cuda_device).
  Device device = Device::cpu;
  int cuda_device = 0;
  bool gradients = true;   // a gradient buffer (training); false: forward only (evaluation)
  uint64_t init_seed = 0;  // the parameters' initialisation (init_parameters): the same on every
                           // rank, so replicas start bitwise identical
  // A sharded optimizer's rank (optim.sharded in bf16 / fp16 on more than one rank): the replica
  // keeps only its shard [master_begin, master_end) of the fp32 master weights, and the fp32
  // values the ops read (biases, LayerNorm: model/params.h bind_fp32_weights) in a compact
  // buffer of their own; params() is then the shard. Needs gradients (its loads stage through
  // them).
  bool shard_masters = false;
  int64_t master_begin = 0, master_end = 0;
  // What the memory plan says this rank's buffers hold (train/memory_plan.h): an allocation
  // that fails names it (Backend::set_planned_bytes). 0: no plan.
  size_t planned_bytes = 0;
  bool initialize = true;  // false: the weights come from load_params (no initialisation pass,
                           // no host copy of the whole table made for it)
};

class ModelReplica {
 public:
  explicit ModelReplica(const ReplicaOptions& options);
  ~ModelReplica();
  ModelReplica(const ModelReplica&) = delete;
  ModelReplica& operator=(const ModelReplica&) = delete;

  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  const ParamTable& table() const { return table_; }
  Bert& bert() { return *bert_; }
  const Bert& bert() const { return *bert_; }
  bool has_gradients() const { return grads_.tensor().defined(); }

  // f32 [table.total()] on the backend's device: the fp32 master weights (with shard_masters
  // only this rank's shard, f32 [master_end - master_begin]), and the gradient (none without
  // gradients).
  const Tensor& params() const { return params_.tensor(); }
  bool masters_sharded() const { return fp32_.tensor().defined(); }
  // With shard_masters: the fp32 values the ops read, f32 [fp32_read_elems(table())]; else none.
  const Tensor& fp32_weights() const { return fp32_.tensor(); }
  const Tensor& grads() const { return grads_.tensor(); }

  // Weights from host memory (table().total() floats), the low-precision copy refreshed.
  void load_params(const float* host);
  // Weights written by fill into a host array of table().total() floats: on the CPU backend
  // straight into the parameter buffer (no second copy of the weights), elsewhere through a
  // host array that is freed before returning.
  void load_params(const std::function<void(float* host)>& fill);
  // Host copy of the parameters, copied from the device when they changed (an Error with
  // shard_masters: no rank holds them all; DistributedLamb::gather_params does).
  const std::vector<float>& host_params() const;
  // Whoever changed params() on the device (the optimizer) says so here.
  void mark_params_changed() { host_params_stale_ = true; }

 private:
  // Sharded masters: the gradient buffer holds the whole table; everything else from it.
  void load_sharded_from_grads();
  std::unique_ptr<Backend> backend_;
  ParamTable table_;
  BackendBuffer params_, grads_, fp32_;
  int64_t master_begin_ = 0;
  std::unique_ptr<Bert> bert_;
  mutable std::vector<float> host_params_;
  mutable bool host_params_stale_ = true;
};

}  // namespace packbert
