// The optimizer a training step calls: LAMB (optim/lamb.h) over the flat parameter buffer,
// replicated on every rank or sharded over them (optim.sharded), with everything sharding needs
// in this one type: the cut (optim/sharding.h), the weights' all-gathers by layer
// (comm/shard_exchange.h), the checkpoint state's gathers, and the figures a run reports.
// Trainer::step calls step() and never asks which it is. Sharded, every element's update is the
// replicated one's but for the order of double sums, and checkpoints are the replicated run's
// files, resumable sharded or not at any rank count. One step, what overlaps, equivalence:
// docs/sharded_optimizer.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/grad_reducer.h"
#include "comm/shard_exchange.h"
#include "optim/lamb.h"

namespace packbert {

// The buffers the optimizer updates, all on the backend's device and laid out as the gradient.
struct OptimizedBuffers {
  // f32 [n]: the fp32 master weights (the model's weights in an fp32 run); with fp32_weights,
  // this rank's shard of them only, f32 [end - begin] of the sharded optimizer's cut.
  Tensor params;
  Tensor grads;        // f32 [n]: the reduced gradient; zero after a step
  Tensor params_lowp;  // bf16 / f16 [n]: the copy the GEMMs read (mixed precision), or none
  // The parts of params the model reads in fp32 (Bert::fp32_ranges): a sharded mixed-precision
  // step gathers only these of the fp32 weights.
  std::vector<std::pair<int64_t, int64_t>> fp32_ranges;
  // The weights by the part of the forward that reads them, in forward order
  // (Bert::forward_groups); empty: one group, the whole buffer.
  std::vector<std::pair<int64_t, int64_t>> forward_groups;
  // Sharded masters (model/replica.h shard_masters): the fp32 values the model reads, the
  // fp32_ranges laid end to end (f32 [their total]); after each update every rank's pieces of
  // them go round through the gradient buffer (zero there outside a step) into it.
  Tensor fp32_weights;
};

// What an optimizer's figures depend on (state_bytes, bytes_sent below): the same for every
// rank and known before any rank exists (benchmarks compute them for any rank count).
struct OptimizerLayout {
  int64_t num_elems = 0;
  std::vector<LambParam> table;
  size_t lowp_bytes = 0;  // bytes of an element of the 16-bit copy (mixed precision); 0: fp32
  std::vector<std::pair<int64_t, int64_t>> fp32_ranges;  // OptimizedBuffers::fp32_ranges
  // Sharded, each rank keeps only its range of the fp32 master weights, and the fp32_ranges'
  // values apart (OptimizedBuffers::fp32_weights).
  bool masters_sharded = false;
};

// Bytes of optimizer state on rank `rank` of bounds.size() - 1 ranks cut at bounds
// (DistributedLamb::shard_bounds; replicated when !sharded): LAMB's moments, norms and sums
// (Lamb::state_bytes_for), and in mixed precision the fp32 master weights (an fp32 run's
// weights are the model's): whole, or with layout.masters_sharded the rank's range and the
// fp32 values the model reads (the biases and LayerNorm parameters).
size_t optimizer_state_bytes(const OptimizerLayout& layout, const std::vector<int64_t>& bounds,
                             bool sharded, int rank);
// Bytes a step's collectives make that rank send (the gradient's round included), by the ring
// algorithms' count: an all-reduce of S bytes sends 2 (N - 1) / N S; a reduce-scatter or
// all-gather of S bytes of which the rank owns p sends S - p (a ring sends every part but one,
// which is the rank's own to within one part's imbalance).
int64_t optimizer_bytes_sent(const OptimizerLayout& layout, const std::vector<int64_t>& bounds,
                             bool sharded, int rank);

class DistributedLamb {
 public:
  // The cut for `ranks` ranks (plan_shards): the reducer must be built with it
  // (GradReducerOptions::shard_bounds) before the optimizer.
  static std::vector<int64_t> shard_bounds(int64_t num_elems, int ranks);

  // Collective over the reducer's ranks. sharded with one rank is replicated. The reducer (and
  // the buffers) must outlive the optimizer.
  DistributedLamb(Backend& backend, std::vector<LambParam> params, GradReducer& reducer,
                  OptimizedBuffers buffers, const LrSchedule& schedule, const LambOptions& options,
                  bool sharded);
  // A clean end waits for the last step's gathers (a communicator torn down under them would be
  // aborted); while an exception unwinds, nothing waits (a peer may have died).
  ~DistributedLamb();
  DistributedLamb(const DistributedLamb&) = delete;
  DistributedLamb& operator=(const DistributedLamb&) = delete;

  bool sharded() const { return lamb_->sharded(); }
  // How the gradient round before step() must reduce (GradReducer::begin).
  GradCollective collective() const {
    return sharded() ? GradCollective::reduce_scatter : GradCollective::allreduce;
  }
  // After the round: the whole reduced gradient on every rank, for an inspection before step()
  // (sharded, each rank holds only its range's sum until this gathers the others').
  void gather_gradient();
  // One update (Lamb::step's arguments): afterwards every rank holds the weights the model
  // reads (sharded on NCCL: once the forward's hook has waited for each group, or after
  // sync_weights), and grads is zero.
  LambStepInfo step(float grad_scale, bool read_back,
                    const std::vector<Backend::HostRead>& also_read = {});
  // Before forward group g's first op (Bert::set_weights_ready): the backend's stream waits
  // for that group's gather, if one is in flight.
  void wait_weights(int group);
  // The backend's stream waits for every gather in flight: whoever reads or writes the weights
  // from here on sees the step's weights.
  void sync_weights();

  // ---- checkpoint state ----------------------------------------------------------------------
  int64_t steps_done() const { return lamb_->steps_done(); }
  void set_steps_done(int64_t steps) { lamb_->set_steps_done(steps); }
  void set_schedule_tokens(int64_t tokens) { lamb_->set_schedule_tokens(tokens); }
  // Collective: the master weights, m and v (host arrays of n floats) written on rank root
  // (the other ranks' arrays are neither written nor read, and may be null).
  void save_state(float* params, float* m, float* v, int root);
  // m and v of the whole buffer (host, n floats each, the same on every rank): each rank takes
  // its range. The weights are the model's to load (and then whole on every rank).
  void load_moments(const float* m, const float* v) { lamb_->load_moments(m, v); }
  // Collective when master_sharded(): the master weights, whole, into host (n floats) on every
  // rank.
  void gather_params(float* host);
  // No rank holds every current fp32 master weight (a sharded mixed-precision run: each rank
  // keeps only its range and the fp32 parts the model reads current).
  bool master_sharded() const { return sharded() && buffers_.params_lowp.defined(); }

  // ---- reports ----------------------------------------------------------------------------
  // optimizer_state_bytes and optimizer_bytes_sent of rank r of this optimizer's ranks.
  size_t state_bytes(int rank) const;
  size_t largest_state_bytes() const;
  int64_t bytes_sent(int rank) const;
  int64_t largest_bytes_sent() const;
  OptimizerLayout layout() const;

  const Lamb& lamb() const { return *lamb_; }

 private:
  Backend& backend_;
  GradReducer& reducer_;
  OptimizedBuffers buffers_;
  std::vector<LambParam> table_;  // the whole table (state_bytes of every rank)
  std::unique_ptr<ShardExchange> exchange_;
  std::unique_ptr<Lamb> lamb_;
  // The end of a sharded update (LambShard::after_update, inside the update's graph when there
  // is one): the gathers started, the gradient outside the shard zeroed.
  void after_update();
  // This rank's range of the fp32 master weights (the whole params with sharded masters).
  Tensor own_params() const;
  // The gathers of a sharded step, by forward group: (buffer, ranges) pairs.
  std::vector<std::vector<std::pair<Tensor, ShardExchange::Ranges>>> gathers_;
  bool gathers_in_flight_ = false;
  std::vector<float> staging_;  // this rank's range of a host gather
};

}  // namespace packbert
