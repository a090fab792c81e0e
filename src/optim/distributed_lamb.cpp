#include "optim/distributed_lamb.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "kernels/base/error.h"
#include "optim/sharding.h"

namespace packbert {

namespace {

// An all-reduce of `bytes` over `ranks` ranks, as a ring sends it from each rank.
int64_t allreduce_sent(int64_t bytes, int ranks) {
  return ranks > 1 ? 2 * (ranks - 1) * bytes / ranks : 0;
}

// Elements of [lo, hi) inside the ranges.
int64_t overlap(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t lo, int64_t hi) {
  int64_t n = 0;
  for (const auto& [a, b] : ranges) n += std::max<int64_t>(0, std::min(b, hi) - std::max(a, lo));
  return n;
}

}  // namespace

size_t optimizer_state_bytes(const OptimizerLayout& layout, const std::vector<int64_t>& bounds,
                             bool sharded, int rank) {
  const int64_t n = layout.num_elems;
  int64_t begin = 0, end = n;
  if (sharded && bounds.size() > 2) {
    begin = bounds.at(static_cast<size_t>(rank));
    end = bounds.at(static_cast<size_t>(rank) + 1);
  }
  int64_t tensors = 0, all = 0;
  for (const LambParam& p : layout.table) {
    if (p.size == 0) continue;
    ++all;
    if (std::max(p.offset, begin) < std::min(p.offset + p.size, end)) ++tensors;
  }
  size_t bytes = Lamb::state_bytes_for(end - begin, tensors, all, sharded && bounds.size() > 2);
  if (layout.lowp_bytes > 0 && layout.masters_sharded && sharded && bounds.size() > 2) {
    int64_t fp32 = 0;
    for (const auto& [a, b] : layout.fp32_ranges) fp32 += b - a;
    // As Backend::alloc gives them: at least one byte each.
    bytes += std::max<size_t>(static_cast<size_t>(end - begin) * sizeof(float), 1) +
             std::max<size_t>(static_cast<size_t>(fp32) * sizeof(float), 1);
  } else if (layout.lowp_bytes > 0) {
    bytes += static_cast<size_t>(n) * sizeof(float);
  }
  return bytes;
}

int64_t optimizer_bytes_sent(const OptimizerLayout& layout, const std::vector<int64_t>& bounds,
                             bool sharded, int rank) {
  const auto ranks = static_cast<int>(bounds.size()) - 1;
  const int64_t n = layout.num_elems;
  if (ranks <= 1) return 0;
  if (!sharded) return allreduce_sent(n * 4, ranks);  // the gradient's all-reduce
  const int64_t begin = bounds.at(static_cast<size_t>(rank));
  const int64_t end = bounds.at(static_cast<size_t>(rank) + 1);
  const int64_t own = end - begin;
  int64_t all = 0;
  for (const LambParam& p : layout.table) all += p.size > 0;
  int64_t sent = (n - own) * 4;             // the gradient's reduce-scatter
  sent += allreduce_sent(8, ranks);         // the global norm's sum of squares
  sent += allreduce_sent(16 * all, ranks);  // the per-tensor sums
  if (layout.lowp_bytes > 0) {
    sent += (n - own) * static_cast<int64_t>(layout.lowp_bytes);  // the 16-bit copy
    int64_t fp32 = 0;
    for (const auto& [a, b] : layout.fp32_ranges) fp32 += b - a;
    sent += (fp32 - overlap(layout.fp32_ranges, begin, end)) * 4;  // what is read in fp32
  } else {
    sent += (n - own) * 4;  // the fp32 weights
  }
  return sent;
}

std::vector<int64_t> DistributedLamb::shard_bounds(int64_t num_elems, int ranks) {
  return plan_shards(num_elems, ranks);
}

DistributedLamb::DistributedLamb(Backend& backend, std::vector<LambParam> params,
                                 GradReducer& reducer, OptimizedBuffers buffers,
                                 const LrSchedule& schedule, const LambOptions& options,
                                 bool sharded)
    : backend_(backend), reducer_(reducer), buffers_(std::move(buffers)), table_(params) {
  PB_REQUIRE(buffers_.grads.defined(), "optimizer: no gradient buffer");
  const int64_t n = buffers_.grads.numel();
  const bool local = buffers_.fp32_weights.defined();
  PB_REQUIRE(local || (buffers_.params.defined() && buffers_.params.numel() == n),
             "optimizer: gradient {} for weights {}", buffers_.grads.str(), buffers_.params.str());
  exchange_ = std::make_unique<ShardExchange>(reducer_);
  LambShard shard;
  const bool shard_it = sharded && reducer_.size() > 1;  // a world of one: nothing to shard
  if (shard_it) {
    const std::vector<int64_t>& bounds = reducer_.shard_bounds();
    const auto me = static_cast<size_t>(reducer_.rank());
    shard.begin = bounds[me];
    shard.end = bounds[me + 1];
    shard.sum_over_ranks = [this](const Tensor& values) { exchange_->sum(values); };
    shard.capturable = reducer_.capturable();
    shard.graph_launched = [this] { exchange_->graph_launched(); };
    shard.after_update = [this] { after_update(); };
  }
  PB_REQUIRE(!local || (shard_it && buffers_.params_lowp.defined() &&
                        buffers_.params.numel() == shard.end - shard.begin),
             "optimizer: sharded master weights {} need a sharded mixed-precision run whose "
             "shard holds {} elements",
             buffers_.params.str(), shard.end - shard.begin);
  lamb_ = std::make_unique<Lamb>(backend_, std::move(params), n, schedule, options,
                                 shard_it ? &shard : nullptr);
  if (!shard_it) return;
  // The step's gathers by forward group: what the model reads of each group's range.
  std::vector<std::pair<int64_t, int64_t>> groups = buffers_.forward_groups;
  if (groups.empty()) groups.emplace_back(0, n);
  for (const LambParam& p : table_) {
    const bool covered = p.size == 0 || std::any_of(groups.begin(), groups.end(), [&](auto g) {
                           return g.first <= p.offset && p.offset + p.size <= g.second;
                         });
    PB_REQUIRE(covered, "optimizer: tensor '{}' (offset {}, size {}) lies in no forward group",
               p.name, p.offset, p.size);
  }
  for (const auto& [a, b] : groups) {
    std::vector<std::pair<Tensor, ShardExchange::Ranges>> group;
    if (buffers_.params_lowp.defined()) {
      group.push_back({buffers_.params_lowp, {{a, b}}});
      ShardExchange::Ranges fp32;
      for (const auto& [lo, hi] : buffers_.fp32_ranges)
        if (std::max(lo, a) < std::min(hi, b)) fp32.emplace_back(std::max(lo, a), std::min(hi, b));
      // Sharded masters: the fp32 values go round apart (after_update).
      if (!fp32.empty() && !local) group.push_back({buffers_.params, std::move(fp32)});
    } else {
      group.push_back({buffers_.params, {{a, b}}});
    }
    gathers_.push_back(std::move(group));
  }
}

DistributedLamb::~DistributedLamb() {
  if (!gathers_in_flight_ || std::uncaught_exceptions() > 0) return;
  try {
    sync_weights();
    backend_.synchronize();  // a dead peer: the watchdog aborts the communicator, which frees it
  } catch (...) {
    // The communicator's failure was reported where it happened; nothing to add at teardown.
  }
}

void DistributedLamb::wait_weights(int group) {
  if (gathers_in_flight_) exchange_->wait_gather(group);
}

void DistributedLamb::sync_weights() {
  if (!gathers_in_flight_) return;
  for (size_t g = 0; g < gathers_.size(); ++g) exchange_->wait_gather(static_cast<int>(g));
  gathers_in_flight_ = false;
}

void DistributedLamb::gather_gradient() {
  if (sharded()) exchange_->all_gather(buffers_.grads);
}

LambStepInfo DistributedLamb::step(float grad_scale, bool read_back,
                                   const std::vector<Backend::HostRead>& also_read) {
  const Tensor& params = buffers_.params;
  const Tensor& grads = buffers_.grads;
  sync_weights();  // the previous step's gathers read and write what LAMB writes now
  const LambStepInfo info =
      lamb_->step(params, grads, buffers_.params_lowp, grad_scale, read_back, also_read);
  // A graph's gathers ended inside it: what follows it on the stream sees the weights.
  if (info.graph) gathers_in_flight_ = false;
  return info;
}

void DistributedLamb::after_update() {
  const Tensor& grads = buffers_.grads;
  const int64_t n = grads.numel(), begin = lamb_->shard_begin(), end = lamb_->shard_end();
  if (buffers_.fp32_weights.defined()) {
    // Sharded masters: the fp32 values the model reads travel through the gradient buffer,
    // which is zero outside a step: this rank's pieces of them written at their flat offsets
    // (the rest of its own range is zero: LAMB zeroed it), the others' zeroed, gathered,
    // copied into the compact buffer, and zeroed again for the next accumulation.
    if (begin > 0) backend_.zero(slice(grads, 0, begin));
    if (end < n) backend_.zero(slice(grads, end, n - end));
    for (const auto& [a, b] : buffers_.fp32_ranges) {
      const int64_t lo = std::max(a, begin), hi = std::min(b, end);
      if (lo < hi)
        backend_.copy(slice(grads, lo, hi - lo), slice(buffers_.params, lo - begin, hi - lo));
    }
    exchange_->all_gather(grads, buffers_.fp32_ranges);
    int64_t at = 0;
    for (const auto& [a, b] : buffers_.fp32_ranges) {
      backend_.copy(slice(buffers_.fp32_weights, at, b - a), slice(grads, a, b - a));
      backend_.zero(slice(grads, a, b - a));
      at += b - a;
    }
    exchange_->start_gathers(gathers_);
    gathers_in_flight_ = true;
    return;
  }
  // Every rank updated its own range: what the model reads goes round, group by group.
  exchange_->start_gathers(gathers_);
  gathers_in_flight_ = true;
  // LAMB zeroed the gradient it owns; the rest holds this rank's unreduced sums.
  if (begin > 0) backend_.zero(slice(grads, 0, begin));
  if (end < n) backend_.zero(slice(grads, end, n - end));
}

void DistributedLamb::save_state(float* params, float* m, float* v, int root) {
  sync_weights();
  const bool at_root = reducer_.rank() == root;
  const int64_t n = buffers_.grads.numel();
  if (!sharded()) {
    if (!at_root) return;
    backend_.copy(view(params, {n}), buffers_.params);
    lamb_->save_moments(m, v);
    return;
  }
  // Each rank's range through the host to root (a checkpoint is rare: no device gather, and no
  // rank but root holds the whole state). An fp32 run's weights are whole on every rank.
  const int64_t begin = lamb_->shard_begin(), len = lamb_->shard_end() - begin;
  staging_.resize(static_cast<size_t>(len));
  for (const auto& [what, all] : {std::pair{&lamb_->m(), m}, std::pair{&lamb_->v(), v}}) {
    if (len > 0) backend_.copy(view(staging_.data(), {len}), *what);
    exchange_->gather_to_root(staging_.data(), at_root ? all : nullptr, root);
  }
  if (master_sharded()) {
    if (len > 0) backend_.copy(view(staging_.data(), {len}), own_params());
    exchange_->gather_to_root(staging_.data(), at_root ? params : nullptr, root);
  } else if (at_root) {
    backend_.copy(view(params, {n}), buffers_.params);
  }
}

Tensor DistributedLamb::own_params() const {
  const int64_t begin = lamb_->shard_begin(), len = lamb_->shard_end() - begin;
  return buffers_.fp32_weights.defined() ? buffers_.params : slice(buffers_.params, begin, len);
}

void DistributedLamb::gather_params(float* host) {
  sync_weights();
  const int64_t n = buffers_.grads.numel();
  if (!master_sharded()) {
    backend_.copy(view(host, {n}), buffers_.params);
    return;
  }
  const int64_t begin = lamb_->shard_begin(), len = lamb_->shard_end() - begin;
  staging_.resize(static_cast<size_t>(len));
  if (len > 0) backend_.copy(view(staging_.data(), {len}), own_params());
  exchange_->gather_to_all(staging_.data(), host);
}

OptimizerLayout DistributedLamb::layout() const {
  OptimizerLayout l;
  l.num_elems = buffers_.grads.numel();
  l.masters_sharded = buffers_.fp32_weights.defined();
  l.table = table_;
  l.lowp_bytes = buffers_.params_lowp.defined() ? dtype_size(buffers_.params_lowp.dtype) : 0;
  l.fp32_ranges = buffers_.fp32_ranges;
  return l;
}

size_t DistributedLamb::state_bytes(int rank) const {
  return optimizer_state_bytes(layout(), reducer_.shard_bounds(), sharded(), rank);
}

size_t DistributedLamb::largest_state_bytes() const {
  size_t most = 0;
  for (int r = 0; r < reducer_.size(); ++r) most = std::max(most, state_bytes(r));
  return most;
}

int64_t DistributedLamb::bytes_sent(int rank) const {
  return optimizer_bytes_sent(layout(), reducer_.shard_bounds(), sharded(), rank);
}

int64_t DistributedLamb::largest_bytes_sent() const {
  int64_t most = 0;
  for (int r = 0; r < reducer_.size(); ++r) most = std::max(most, bytes_sent(r));
  return most;
}

}  // namespace packbert
