// Training metrics: one ProgressRecord per logged step, as a JSON line in the metrics file
// (scripts/plot_metrics.py reads it) and as one compact human line on stdout.
//
// Metrics file (JSONL, one object per line, flushed after each):
//   {"event": "train", "step": 100, "samples": 25600, ...every ProgressRecord field...}
//   {"event": "eval", "step": 150, "samples": 38400, "eval_accuracy": 0.41, "eval_loss": 3.2}
// (the trainer writes the eval objects itself; any other object may be written too).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace packbert {

struct ActivationReport;  // model/bert.h
struct StepBatch;         // data/loader/loader.h
struct StepMetrics;       // train/trainer.h
struct StepLosses;        // train/trainer.h
class TensorBoardWriter;  // train/tensorboard.h

// What the host asked of the device, cumulative (the backend's counts: kernels/backend.h,
// BackendCounters; zero on the CPU backend).
struct HostWorkCounts {
  int64_t host_syncs = 0;
  int64_t launches = 0;
  int64_t pageable_copies = 0;
  int64_t graph_launches = 0;  // CUDA graphs replayed (train.cuda_graphs), not in launches
};

struct ProgressRecord {
  int64_t step = 0;           // optimizer steps done (1-based index of the last one)
  int64_t epoch = 0;          // data epoch of the last step
  int64_t samples = 0;        // samples trained since the run started (all ranks)
  int64_t tokens = 0;         // real (non-padding) tokens trained since the run started
  int64_t batch_samples = 0;  // the last step's global batch: samples (train.batch_warmup_*)
  int64_t batch_tokens = 0;   //   and real tokens
  // Of the last step, or the mean over the interval since the previous record
  // (ProgressAccumulator says which).
  double loss = 0;
  double mlm_loss = 0;
  double nsp_loss = 0;
  double mlm_accuracy = 0;
  double nsp_accuracy = 0;
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 1;  // fp16: the loss scale of the last step (1 for fp32 / bf16)
  // Over the interval since the previous record.
  double samples_per_s = 0;
  double tokens_per_s = 0;
  // Model FLOPs utilisation (train/model_flops.h): the steps' model FLOPs per second over the
  // devices' peak (ProgressContext::peak_flops); NaN where no peak is known (the CPU).
  double mfu = std::numeric_limits<double>::quiet_NaN();
  double padding_fraction = 0;  // padding / (tokens + padding) of the layout; 0 for unpadded
  // The padding rows CUDA graphs add (their capacities, model/batch.h GraphCapacity) over the
  // batches' own rows, this rank's training forwards since the run started; 0 without graphs.
  double graph_padding = 0;
  double imbalance = 1;                   // planner: max rank cost / mean rank cost
  double data_wait_s = 0;                 // exposed data-loader wait per step, mean
  double step_time_s = 0;                 // wall time per step, mean
  double eta_s = 0;                       // to max_steps at the current rate; < 0 = unknown
  double elapsed_s = 0;                   // since training started
  int64_t peak_rss_bytes = 0;             // this process (rank 0), peak_rss_bytes()
  int64_t activation_peak_bytes = 0;      // activation arena high-water mark; 0 = not measured
  int64_t activation_capacity_bytes = 0;  // the arena allocated (TrainerOptions::reserve)
  int64_t arena_allocations = 0;          // times it was allocated: 1 = reserved once, never grown
  // The optimizer state of the rank that holds most (moments, norms, mixed precision's fp32
  // master weights: optim/distributed_lamb.h), and the bytes one step's gradient and optimizer
  // collectives make the rank that sends most send (0 on one rank).
  int64_t optimizer_state_bytes = 0;
  int64_t bytes_sent_per_step = 0;
  // What rank 0's backend buffers hold (Backend::allocated_bytes: parameters, gradients, weight
  // copies, optimizer state, the arena, batch buffers, FP8 state), and its device's free memory
  // (Backend::memory_info); 0 = not measured.
  int64_t device_allocated_bytes = 0;
  int64_t device_free_bytes = 0;
  // What the backend holds for itself outside those buffers (Backend::workspace_bytes: the
  // CUDA backend's cuBLASLt workspace and op scratch); 0 on the CPU.
  int64_t device_workspace_bytes = 0;
  // The backend's host synchronisations, launches, pageable copies and graph launches over the
  // interval divided by its steps (HostWorkCounts; evaluation and checkpoints taken out); 0 on
  // the CPU backend.
  double host_syncs_per_step = 0;
  double launches_per_step = 0;
  double pageable_copies_per_step = 0;
  double graph_launches_per_step = 0;
  // Its split by kind of buffer (model/arena.h ActivationKind names, in that order; sums to
  // activation_peak_bytes); empty = not measured.
  std::vector<std::pair<std::string, int64_t>> activation_bytes_by_kind;
  int64_t mst_chunks = 0;     // mini-sequence chunks M of the last step; 0 = not known
  int64_t skipped_steps = 0;  // non-finite steps skipped since the run started
};

// {"event": "train", every field above by its name}.
nlohmann::json to_json(const ProgressRecord& r);

// One line, e.g.
// "step 120/1000 | 30720 samples | loss 6.8123 | mlm acc 0.1523 | lr 3.50e-04 | 812.3 samples/s
//  | 103.9k tok/s | pad 0.0% | imb 1.02 | wait 0.001s | rss 1.23 GiB | eta 18m05s"
// (one line in reality; skipped steps and grad norm appear when relevant / known). Without an
// NSP head (nsp_head false) the NSP loss is left out.
std::string format_progress_line(const ProgressRecord& r, int64_t max_steps, bool nsp_head = true);

// ", nsp accuracy 0.5512" for an eval line of a model with an NSP head, else "".
std::string format_nsp_accuracy(double accuracy, bool nsp_head);

// What a progress record says beyond the steps of its interval: where the run stands.
struct ProgressContext {
  int64_t samples = 0;  // trained since the run started (all ranks)
  int64_t tokens = 0;
  int64_t skipped_steps = 0;
  int64_t max_steps = 0;                         // for the ETA
  double elapsed_s = 0;                          // since training started
  const ActivationReport* activation = nullptr;  // null: not measured
  int64_t optimizer_state_bytes = 0;
  int64_t bytes_sent_per_step = 0;
  int64_t device_allocated_bytes = 0;
  int64_t device_free_bytes = 0;
  int64_t device_workspace_bytes = 0;
  HostWorkCounts host_work;  // the counts now
  double peak_flops = 0;     // all ranks' devices together, FLOP/s; 0: unknown (no mfu)
};

// The steps since the previous progress record. Loss is the mean over the steps; MLM loss and
// accuracy are weighted by masked tokens, NSP's by samples; rates and the step time count the
// interval's wall time less what exclude() took out.
class ProgressAccumulator {
 public:
  using Clock = std::chrono::steady_clock;

  // The interval starts at `start`, when the host work counts were `work`.
  explicit ProgressAccumulator(Clock::time_point start = Clock::now(),
                               const HostWorkCounts& work = {});

  // One optimizer step and this rank's batch of it (data wait and imbalance). Its losses count
  // where they were read: a step that reads brings those of the unread steps before it
  // (StepMetrics::earlier_losses).
  void add(const StepMetrics& m, const StepBatch& batch);
  // Losses read after their step was added (Trainer::read_losses: a stop on an unread step).
  void add_losses(const StepLosses& losses);
  // A step's model FLOPs (train/model_flops.h step_flops, the whole global batch).
  void add_model_flops(double flops) { model_flops_ += flops; }
  // Seconds within the interval that were not training (evaluation, checkpoints), and the host
  // work they did.
  void exclude(double seconds, const HostWorkCounts& work = {});
  int64_t steps() const { return steps_; }

  // The record of the interval so far (at least one step); its step, epoch, lr, gradient norm
  // and loss scale are the last step's. The next interval starts at `now`, with the context's
  // host work counts.
  ProgressRecord close(const ProgressContext& context, Clock::time_point now = Clock::now());

 private:
  Clock::time_point start_;
  HostWorkCounts work_start_, work_excluded_;
  int64_t steps_ = 0, samples_ = 0, tokens_ = 0, rows_ = 0;
  double model_flops_ = 0;
  // Of the steps whose losses were read: how many, their masked tokens and samples.
  int64_t loss_steps_ = 0, masked_ = 0, loss_samples_ = 0;
  double loss_ = 0, mlm_loss_ = 0, nsp_loss_ = 0, mlm_ok_ = 0, nsp_ok_ = 0, wait_ = 0;
  double imbalance_ = 0, excluded_s_ = 0;
  // Of the last step.
  int64_t step_ = 0, epoch_ = 0, batch_ = 0, batch_tokens_ = 0;
  double lr_ = 0;
  float grad_norm_ = -1.f, loss_scale_ = 1.f;
};

// "512 B", "1.50 KiB", "1.23 GiB".
std::string format_bytes(int64_t bytes);
// "59s", "18m05s", "3h07m", "2d04h"; "?" for negative or non-finite.
std::string format_duration(double seconds);

// Appends JSON objects to a JSONL file, one per line, flushed after each. path "" = off
// (write() does nothing). Creates parent directories. Open/write errors are Errors naming the
// path. Not thread-safe: one writer thread (rank 0's trainer). With a TensorBoard writer, each
// record goes there first (so a reader that sees a step in the JSONL finds it there too).
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);
  MetricsWriter(const std::string& path, std::unique_ptr<TensorBoardWriter> tensorboard);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// How a run ended, for log.end_file: rank 0 writes it last, after the final checkpoint is
// complete on every rank, so a launcher can tell a clean stop on a signal from a failure
// (mpirun exits 1 after it passed a signal on, however the ranks ended; scripts/run_job.sh).
// One JSON line: {"checkpoint": "/abs/step_00000120" or null, "reason": "signal",
// "samples": 3840, "signal": 15, "step": 120}.
struct RunEnd {
  std::string reason;  // "finished" (train.max_steps), "target_reached" or "signal"
  int signal = 0;      // the stop signal when reason is "signal", else 0
  int64_t step = 0;    // optimizer steps done
  int64_t samples = 0;
  std::string checkpoint;  // the checkpoint written at the end; "" = none (no checkpoint.dir)
};
nlohmann::json to_json(const RunEnd& e);
// Replaces `path` with to_json(e) (core/files.h replace_file); "" = nothing.
void write_end_file(const std::string& path, const RunEnd& e);
// Removes an end file left by an earlier run (absent is fine): a run that fails must not leave
// one that reads as its own.
void remove_end_file(const std::string& path);

// Peak resident set size of this process (getrusage ru_maxrss), bytes.
int64_t peak_rss_bytes();

}  // namespace packbert
