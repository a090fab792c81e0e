// One data-parallel optimizer step, top to bottom (DESIGN.md, "Data flow of one step"):
//
//   for each micro-batch of this rank's StepBatch:
//     make_batch(samples, layout, packs)     host arrays in the chosen layout (train/batching.h)
//     Bert::forward(global counts, step)     loss already scaled by the step's global counts
//     Bert::backward                         gradients += into the flat buffer; on the last
//       (last: backward_and_reduce)          micro-step each finished tensor starts its bucket's
//                                            reduction (comm/grad_reducer.h: MPI or NCCL)
//   GradReducer::finish()                    every rank now holds the global batch's gradient
//                                            (sharded: the sum of its own range of it)
//   (optional inspection of that gradient)   tests dump it here: the optimizer zeroes it
//   DistributedLamb::step                    global norm, clipping, trust ratio; grads := 0;
//                                            every rank then holds the weights the model reads
//                                            (optim/distributed_lamb.h: replicated or sharded);
//                                            its one wait reads back what StepReads says
//   MetricSums::sum                          loss and accuracies of the whole global batch
//
// Because the loss is normalised by global counts and dropout is keyed by sample ids, the
// gradient after finish() is the same (to fp32 rounding) whatever the rank count, the
// assignment of samples to ranks and the layout: tests/mpi/mpi_train_driver proves it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "data/loader/loader.h"
#include "comm/grad_reducer.h"
#include "comm/metric_sums.h"
#include "model/batch.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/params.h"
#include "model/replica.h"
#include "optim/distributed_lamb.h"
#include "optim/lamb.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"

namespace packbert {

struct TrainerOptions {
  BertConfig config;
  BertOptions bert;
  BatchLayout layout = BatchLayout::unpadded;
  int max_seq_len = 512;      // slot / pack length of the packed and padded layouts
  uint64_t init_seed = 0;     // parameter initialisation: the same on every rank
  uint64_t dropout_seed = 0;  // with the step and the sample ids, keys every dropout mask
  bool dropout = true;
  LrScheduleConfig lr;
  LambOptions lamb;
  // fp16 only (bert.precision): dynamic loss scaling. fp16 steps always run with LAMB's
  // check_finite and skip_nonfinite on: an overflow skips the step and halves the scale.
  LossScalerOptions loss_scaler;
  size_t bucket_bytes = size_t{25} << 20;  // the reducer's bucket target (comm/grad_reducer.h)
  // Where the step runs: Device::cpu (the reference) or Device::cuda (builds with the CUDA
  // backend; any train.precision). The parameters, gradients, moments and activations are the
  // backend's memory. On CUDA the rank uses GPU cuda_device (ranks of one host need different
  // ones for NCCL: the local rank), and its gradient travels by gpu_transport.
  Device device = Device::cpu;
  int cuda_device = 0;
  GradTransport gpu_transport = GradTransport::nccl;
  // optim.sharded: each rank keeps the LAMB state of, and updates, only its range of the flat
  // buffer (optim/distributed_lamb.h); the gradient is reduce-scattered and the weights the
  // model reads all-gathered. A world of one is unsharded.
  bool sharded = false;
  // The largest micro-batch the run expects (train/train_options.h largest_micro_batch): the
  // model's buffers are sized for it once, at construction (Bert::reserve, with the layout
  // above), so that the step loop never allocates. Empty (rows 0): they grow with the batches
  // instead.
  BatchShape reserve;
  // Forwards whose metrics may wait on the device to be read (micro-steps x steps between
  // reads: train.gradient_accumulation_steps x log.every_steps), reserved with it.
  int64_t deferred_forwards = 0;
  // The memory plan's figure for this rank's buffers (ReplicaOptions::planned_bytes); 0: none.
  size_t planned_bytes = 0;
};

// LAMB's table of a parameter table: each tensor by name, offset, size and no_decay.
std::vector<LambParam> lamb_params(const ParamTable& table);

// The losses of one optimizer step, over the whole global batch.
struct StepLosses {
  int64_t step = 0;     // StepBatch::step
  double loss = 0;      // MLM mean + NSP mean
  double mlm_loss = 0;  // mean MLM token loss
  double nsp_loss = 0;
  double mlm_accuracy = 0;
  double nsp_accuracy = 0;
  int64_t masked_tokens = 0;  // what the means are over
  int64_t samples = 0;
};

// What a step reads back from the device, in its one wait after the optimizer's update is
// issued (on CUDA the other steps never wait for the device).
struct StepReads {
  bool losses = false;     // this step's losses, and those of the unread steps before it
  bool optimizer = false;  // the gradient norm and LAMB's skip record (LambStepInfo)
};

// What one optimizer step did, over the whole global batch (all ranks, all micro-steps).
struct StepMetrics {
  int64_t step = 0;                                      // StepBatch::step
  StepReads read{/*losses=*/true, /*optimizer=*/false};  // what it read back (Trainer::step)
  // The losses, when read.losses (NaN otherwise): this step's; earlier_losses those of the
  // unread steps since the previous read, in step order.
  double loss = 0;          // the step loss: MLM mean + NSP mean over the global batch
  double mlm_loss = 0;      // mean MLM token loss
  double nsp_loss = 0;      // mean NSP loss
  double mlm_accuracy = 0;  // masked tokens whose argmax is the label, fraction
  double nsp_accuracy = 0;
  std::vector<StepLosses> earlier_losses;
  int64_t samples = 0;  // sequences trained
  int64_t masked_tokens = 0;
  double lr = 0;  // the rate of this update
  // The optimizer's scalars, when read.optimizer: LambStepInfo.
  float grad_norm = -1.f;    // global gradient norm before clipping; -1 when not read
  bool skipped = false;      // non-finite gradient: no update (LambOptions::skip_nonfinite)
  int64_t unread_skips = 0;  // steps the device skipped since the previous read
  int64_t longest_skipped_run = 0;
  float loss_scale = 1.f;     // fp16: the scale this step ran with (1 for fp32 / bf16)
  int64_t tokens = 0;         // real tokens of the global batch
  int64_t rows = 0;           // rows the model computed over, padding included (all ranks)
  GradReduceStats allreduce;  // the gradient reduction's round
};

// Called between GradReducer::finish() and Lamb::step with the reduced gradient (a host copy,
// f32 [table.total()]); read-only by contract.
using ReducedGradHook = std::function<void(const float* grads, int64_t n)>;

// Owns everything one rank needs for data-parallel training on either backend: the model replica
// (the backend, the flat parameter and gradient buffers in its memory, the model), LAMB and the
// gradient reducer. Collective over comm (the reducer duplicates it): construct and call step()
// on every rank.
class Trainer {
 public:
  Trainer(MPI_Comm comm, const TrainerOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step from this rank's part of a global batch (micro-batches may be empty).
  // read_back: read the losses and the optimizer's scalars back (StepReads); without it the
  // step reads nothing, except what must be: in fp16 everything (the loss scaler decides on
  // the host), on the CPU backend the optimizer's scalars (there is no device to wait for).
  StepMetrics step(const StepBatch& batch, const ReducedGradHook& inspect_grads = {},
                   bool read_back = true);

  // The losses of the steps since the last read (StepMetrics::earlier_losses), read now: for a
  // run that stops after an unread step. Collective.
  std::vector<StepLosses> read_losses();

  // The model the steps train: evaluation runs on it between steps (train/evaluate.h), forward
  // only, inside the arena the constructor reserved.
  ModelReplica& replica() { return replica_; }

  // ---- state, for checkpoints ----------------------------------------------------------------
  // Every rank must load the same state (the replicas stay bitwise identical).
  // params, m, v: host arrays of table().total() floats. save_state writes the weights and the
  // moments into them on rank root. Collective: every rank calls it (a sharded optimizer sends
  // its range; only root's arrays are written, the others may pass null).
  void save_state(float* params, float* m, float* v, int root = 0);
  bool optimizer_sharded() const { return optimizer_->sharded(); }
  // Bytes of optimizer state (moments, norms; mixed precision's fp32 master weights) of the
  // rank that holds most (optim/distributed_lamb.h).
  size_t optimizer_state_bytes() const { return optimizer_->largest_state_bytes(); }
  // What this rank's backend buffers hold (Backend::allocated_bytes), and its device's memory.
  size_t device_allocated_bytes() const { return replica_.backend().allocated_bytes(); }
  size_t device_workspace_bytes() const { return replica_.backend().workspace_bytes(); }
  Backend::MemoryInfo device_memory() const { return replica_.backend().memory_info(); }
  // Bytes one step's gradient and optimizer collectives make the rank that sends most send.
  int64_t bytes_sent_per_step() const { return optimizer_->largest_bytes_sent(); }
  void load_state(const float* params, const float* m, const float* v, int64_t lamb_steps_done);
  void load_params(const float* params);  // weights only (--init-checkpoint)
  int64_t lamb_steps_done() const { return optimizer_->steps_done(); }
  // Real tokens trained so far (all ranks), the position of a learning-rate schedule in tokens:
  // each step adds its global batch's; a resumed run sets the checkpoint's.
  int64_t tokens_trained() const { return tokens_trained_; }
  void set_tokens_trained(int64_t tokens) { tokens_trained_ = tokens; }
  // Steps whose optimizer update ran as a CUDA graph (train.cuda_graphs = full).
  int64_t lamb_graph_steps() const { return optimizer_->lamb().graph_steps(); }
  // fp16's loss scale and clean-step count (optim/loss_scaler.h): part of the state an exact
  // resume restores (the default state for fp32 / bf16, where setting it is an error).
  LossScalerState loss_scaler_state() const;
  void set_loss_scaler_state(const LossScalerState& state);
  // What the host asked of the device so far (kernels/backend.h): the metrics' per-step
  // host synchronisations, launches and pageable copies.
  BackendCounters host_work() const { return replica_.backend().counters(); }
  // The training steps' activation memory (evaluation's forwards are not counted).
  ActivationReport activation_report() const { return replica_.bert().activation_report(); }

  const ParamTable& table() const { return replica_.table(); }
  // Host copy of the parameters (copied from the backend's buffer when it changed). Collective
  // when no rank holds them whole (a sharded mixed-precision optimizer gathers them: every rank
  // must call it).
  const std::vector<float>& params();
  int rank() const { return reducer_->rank(); }
  int world_size() const { return reducer_->size(); }
  const TrainerOptions& options() const { return options_; }

 private:
  TrainerOptions options_;
  // The backend, the fp32 master weights, the gradient (accumulated over micro-steps, zeroed by
  // Lamb::step) and the model.
  ModelReplica replica_;
  std::vector<float> host_grads_;               // for ReducedGradHook only
  std::vector<float> gathered_params_;          // params() of a sharded mixed-precision run
  std::unique_ptr<LossScaler> scaler_;          // fp16 only
  std::unique_ptr<GradReducer> reducer_;        // the gradient's rounds
  std::unique_ptr<DistributedLamb> optimizer_;  // LAMB, replicated or sharded
  int64_t tokens_trained_ = 0;
  std::unique_ptr<MetricSums> metric_sums_;  // the step's loss sums and counts
  GradientRound round_;  // the gradient round the last micro-step's backward holds
  // The steps whose losses are still on the device (Bert::deferred_results holds their
  // micro-steps' sums, in order): each one's micro-step count and global counts.
  struct UnreadStep {
    int64_t step = 0;
    size_t micro_steps = 0;
    int64_t masked_tokens = 0;
    int64_t samples = 0;
  };
  std::vector<UnreadStep> unread_;
  // The parts of step(): one micro-batch's forward and backward (the counts it adds to
  // `local`), the optimizer's update with the step's one wait (the unread losses' sums read in
  // it into `loss_bytes`), and what follows an update.
  void micro_step(const StepBatch& batch, size_t m, float loss_scale, std::vector<double>& local);
  StepReads reads_for(bool read_back) const;
  LambStepInfo update(float loss_scale, const StepReads& read, std::vector<uint8_t>& loss_bytes);
  void after_update(const LambStepInfo& info);
  void inspect(const ReducedGradHook& hook);  // the reduced gradient, gathered, to the hook
  static void set_losses(StepMetrics& out, std::vector<StepLosses> losses);
  // Sums counts over the ranks in place and, given the unread steps' micro-step results (read
  // from the device), their loss sums too, in one collective; returns those steps' losses and
  // forgets them, or nothing.
  std::vector<StepLosses> sum_metrics(std::vector<double>& counts,
                                      const std::vector<ForwardResult>* results_read);
};

}  // namespace packbert
