// `packbert train` from start to end, and `packbert eval` (train/run_train.h): the setup and
// the run's state (resume, checkpoints) are the parts of run_train_internal.h; the step loop,
// what a step's metrics count and log, and the end of the run are here.
#include "train/run_train.h"

#include <unistd.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/mpi_check.h"
#include "core/watchdog.h"
#include "data/loader/loader.h"
#include "kernels/base/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/evaluate.h"
#include "train/evaluations.h"
#include "train/metrics.h"
#include "train/model_flops.h"
#include "train/mllog.h"
#include "train/run_train_internal.h"
#include "train/tensorboard.h"
#include "train/train_options.h"
#include "train/trainer.h"

namespace packbert {

// The parts this loop puts together: run_train_internal.h.
using namespace train_run;

namespace {

// The steps whose update was skipped, each logged: fp16 gradient overflows, and non-finite
// losses or gradients, of which more than train.max_nonfinite_steps in a row end the run (0:
// the first one). The one place that decides: the optimizer always skips (lamb_options).
class SkippedSteps {
 public:
  SkippedSteps(const TrainConfig& c, float min_loss_scale)
      : c_(c), min_loss_scale_(min_loss_scale) {}

  // How many updates the step just done (`step`, metrics m) accounts as skipped: its own, and
  // on the GPU those of the unread steps before it. Error when the run diverged.
  int64_t count(const StepMetrics& m, int64_t step) {
    int64_t skipped = 0;
    // fp16: a gradient that overflows at a finite loss is the loss scaler probing its range
    // (the step is skipped and the scale halves); it counts as skipped, not as divergence,
    // until the scale has reached its floor.
    const bool scale_overflow = c_.train.precision == Precision::fp16 && m.skipped &&
                                std::isfinite(m.loss) && m.loss_scale > min_loss_scale_;
    if (m.unread_skips > 0) {
      // Steps between two reads whose updates the device skipped (never fp16, which reads
      // every step).
      skipped += m.unread_skips;
      spdlog::warn(
          "steps before {}: {} had a non-finite gradient; the device skipped their "
          "updates (longest run {}, {} allowed)",
          step, m.unread_skips, m.longest_skipped_run, c_.train.max_nonfinite_steps);
      PB_REQUIRE(m.longest_skipped_run <= c_.train.max_nonfinite_steps,
                 "train: {} in a row had a non-finite gradient (before step {}); the run "
                 "diverged: lower optim.lr or check the data (train.max_nonfinite_steps = {})",
                 steps(m.longest_skipped_run), step, c_.train.max_nonfinite_steps);
    }
    if (scale_overflow) {
      ++skipped;
      spdlog::info(
          "step {}: fp16 gradient overflow at loss scale {}; the update was skipped and "
          "the scale halved",
          step, m.loss_scale);
    } else if (m.skipped || (m.read.losses && !std::isfinite(m.loss))) {
      ++skipped;
      ++nonfinite_in_row_;
      spdlog::warn(
          "step {}: non-finite {} (loss {}, gradient norm {}); the update was skipped "
          "({} in a row, {} allowed)",
          step, m.skipped ? "gradient" : "loss", m.loss, m.grad_norm, nonfinite_in_row_,
          c_.train.max_nonfinite_steps);
      PB_REQUIRE(nonfinite_in_row_ <= c_.train.max_nonfinite_steps,
                 "train: {} in a row had a non-finite loss or gradient (last: step {}); "
                 "the run diverged: lower optim.lr or check the data (train.max_nonfinite_steps "
                 "= {})",
                 steps(nonfinite_in_row_), step, c_.train.max_nonfinite_steps);
    } else {
      nonfinite_in_row_ = 0;
    }
    return skipped;
  }

 private:
  static std::string steps(int64_t n) { return fmt::format("{} step{}", n, n == 1 ? "" : "s"); }

  const TrainConfig& c_;
  float min_loss_scale_;
  int64_t nonfinite_in_row_ = 0;
};

HostWorkCounts host_work(const Trainer& trainer) {
  const BackendCounters c = trainer.host_work();
  HostWorkCounts w;
  w.host_syncs = c.host_syncs;
  w.launches = c.launches;
  w.pageable_copies = c.pageable_copies;
  w.graph_launches = c.graph_launches;
  return w;
}

HostWorkCounts operator-(const HostWorkCounts& a, const HostWorkCounts& b) {
  HostWorkCounts d;
  d.host_syncs = a.host_syncs - b.host_syncs;
  d.launches = a.launches - b.launches;
  d.pageable_copies = a.pageable_copies - b.pageable_copies;
  d.graph_launches = a.graph_launches - b.graph_launches;
  return d;
}

// Ends the progress interval at `st`: the progress line (rank 0) and the metrics record.
void log_progress(ProgressAccumulator& progress, const RunState& st, double elapsed_s,
                  const TrainConfig& c, const Trainer& trainer, MetricsWriter& metrics,
                  double peak_flops) {
  const ActivationReport act = trainer.activation_report();
  ProgressContext at;
  at.samples = st.samples;
  at.tokens = st.tokens;
  at.skipped_steps = st.skipped_steps;
  at.max_steps = c.train.max_steps;
  at.elapsed_s = elapsed_s;
  at.activation = &act;
  at.optimizer_state_bytes = static_cast<int64_t>(trainer.optimizer_state_bytes());
  at.bytes_sent_per_step = trainer.bytes_sent_per_step();
  at.device_allocated_bytes = static_cast<int64_t>(trainer.device_allocated_bytes());
  at.device_workspace_bytes = static_cast<int64_t>(trainer.device_workspace_bytes());
  at.device_free_bytes = static_cast<int64_t>(trainer.device_memory().free);
  at.host_work = host_work(trainer);
  at.peak_flops = peak_flops;
  const ProgressRecord r = progress.close(at);
  if (trainer.rank() == 0)
    spdlog::info("{}", format_progress_line(r, c.train.max_steps, c.model.nsp_head));
  metrics.write(to_json(r));
}

}  // namespace

int run_train(MPI_Comm comm, const TrainConfig& c) {
  int rank = 0, world = 1;
  PB_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  PB_MPI_CHECK(MPI_Comm_size(comm, &world));
  validate_train_config(c, world, ConfigPurpose::train);
  CollectiveWatchdog& watchdog = CollectiveWatchdog::global();  // made before the handler uses it
  install_stop_signal_handlers();
  const bool root = rank == 0;
  watchdog.set_step(0);
  const WatchdogRun watch_collectives(c, rank);

  // One run per checkpoint directory, and never a fresh one over another run's checkpoints
  // (train/checkpoint_dir.h); the lock is held until the run ends.
  const std::unique_ptr<CheckpointDirLock> checkpoint_lock =
      claim_checkpoint_dir(comm, c.checkpoint);
  if (root) remove_end_file(c.log.end_file);

  MlLogger ml(c.log.mllog_file, root);
  ml.event("cache_clear", true);
  ml.start("init_start");
  spdlog::info("packbert train: {} rank(s), pid {}", world, static_cast<long>(getpid()));
  log_effective_config(c, rank);

  const BertConfig model = model_config(c);
  const std::optional<CorpusTokenizer> tokenizer = data_tokenizer(c);
  const SampleRules rules = sample_rules(c, model, tokenizer ? &*tokenizer : nullptr);
  TrainerOptions trainer_opts = trainer_options(c, model, world);
  trainer_opts.planned_bytes = check_memory_plan(comm, c, trainer_opts, rank, world);
  Trainer trainer(comm, trainer_opts);
  const StartState start = load_start_state(comm, c, trainer);
  RunState st = start.run;
  watchdog.set_step(st.step);
  spdlog::info("model {} ({:.1f}M parameters), {}", describe(model), trainer.table().total() / 1e6,
               start.from.empty() ? std::string("initialised from train.seed")
                                  : "loaded from " + start.from);

  LoaderOptions lo = loader_options(c);
  lo.warmup = batch_warmup_config(c, world);
  lo.rules = rules;
  lo.masking = dynamic_masking(c, tokenizer ? &*tokenizer : nullptr);
  DataLoader loader(comm, {c.data.train_dir}, lo, start.loader);
  spdlog::info("data: {} training samples in {} shard(s), {} steps per epoch", loader.num_samples(),
               loader.shards().size(), loader.steps_per_epoch());

  std::optional<EvalSet> eval_set;
  if (c.eval_enabled()) {
    eval_set = load_eval_set(c.data.eval_dir, rules, c.eval.max_samples, rank, world);
    spdlog::info("eval: {} samples from {}", eval_set->total, c.data.eval_dir);
  }
  log_bert_constants(ml, c, world, eval_set ? eval_set->total : 0);
  ml.end("init_stop");
  MetricsWriter metrics(root ? c.log.metrics_file : std::string(),
                        root && !c.log.tensorboard_dir.empty()
                            ? std::make_unique<TensorBoardWriter>(c.log.tensorboard_dir, st.step,
                                                                  train_config_to_toml(c))
                            : nullptr);

  ml.start("run_start");
  const int64_t every = c.eval.every_samples;
  MlperfBlocks blocks(ml, every > 0 ? every : c.train.max_steps * c.train.global_batch_size);
  blocks.open(st.samples);
  Evaluations evals(comm, c, trainer, eval_set ? &*eval_set : nullptr, ml, metrics, st.samples);
  const auto run_t0 = Clock::now();
  ProgressAccumulator progress(run_t0, host_work(trainer));
  const double peak_flops = world * device_peak(c, trainer_opts.cuda_device);
  SkippedSteps skipped(c, trainer_opts.loss_scaler.min_scale);
  bool target_reached = false, stopped = false;

  while (st.step < c.train.max_steps) {
    watchdog.set_step(st.step + 1);  // the step the collectives from here to the next belong to
    const StepBatch batch = loader.next();
    // The optimizer's scalars are read back on logged steps only (on the GPU the others never
    // wait for the device); a stop signal can end the run on an unlogged step, whose progress
    // line then has no gradient norm.
    const int64_t next = st.step + 1;
    const StepMetrics m =
        trainer.step(batch, {}, next % c.log.every_steps == 0 || next >= c.train.max_steps);
    st.step = batch.step + 1;
    st.samples += m.samples;
    st.tokens += m.tokens;
    st.skipped_steps += skipped.count(m, st.step);
    progress.add(m, batch);
    progress.add_model_flops(
        step_flops(model, {{batch.global_lengths.begin(), batch.global_lengths.end()},
                           batch.global_masked_tokens})
            .total());

    const bool stop = stop_requested(comm);
    const bool last_step = st.step >= c.train.max_steps;
    if (st.step % c.log.every_steps == 0 || last_step || stop) {
      // A stop after an unread step: its losses, and those of the unread ones before it.
      for (const StepLosses& l : trainer.read_losses()) progress.add_losses(l);
      log_progress(progress, st, seconds_since(run_t0), c, trainer, metrics, peak_flops);
    }

    // Evaluation and checkpoints do not count as training (time and host work).
    const auto side_t0 = Clock::now();
    const HostWorkCounts side_work0 = host_work(trainer);
    if (evals.due(st.samples)) {
      blocks.close();
      target_reached = evals.run(st.step, st.samples);
      if (!target_reached && !last_step && !stop) blocks.open(st.samples);
    }
    const bool finishing = last_step || target_reached || stop;
    if (!finishing && c.checkpoint.every_steps > 0 && st.step % c.checkpoint.every_steps == 0)
      save_checkpoint(comm, c, trainer, st, loader);
    progress.exclude(seconds_since(side_t0), host_work(trainer) - side_work0);
    if (stop) {
      stopped = true;
      spdlog::warn("signal {} received: stopping after step {}", stop_signal(), st.step);
      break;
    }
    if (target_reached) {
      spdlog::info("target mlm accuracy {} reached at step {} ({} samples)", c.eval.target_accuracy,
                   st.step, st.samples);
      break;
    }
  }

  // The end: a last evaluation unless one just ran, a checkpoint, the MLPerf end of run.
  blocks.close();
  if (evals.enabled() && c.eval.at_end && !stopped && !target_reached && !evals.ran_at(st.samples))
    target_reached = evals.run(st.step, st.samples);
  const std::string last_checkpoint = save_checkpoint(comm, c, trainer, st, loader);
  ml.event("train_samples", st.samples);
  const bool success = !stopped && (c.eval.target_accuracy <= 0 || target_reached);
  ml.end("run_stop", nullptr, {{"status", success ? "success" : "aborted"}});
  spdlog::info("train: {} after step {}, {} samples, {} skipped step(s), {:.1f} s{}",
               stopped ? "stopped by signal" : (target_reached ? "target reached" : "finished"),
               st.step, st.samples, st.skipped_steps, seconds_since(run_t0),
               evals.last_accuracy() >= 0
                   ? fmt::format(", last eval accuracy {:.4f}", evals.last_accuracy())
                   : std::string());
  if (root)
    write_end_file(c.log.end_file,
                   {stopped ? "signal" : (target_reached ? "target_reached" : "finished"),
                    stopped ? stop_signal() : 0, st.step, st.samples, last_checkpoint});
  return 0;
}

int run_eval(MPI_Comm comm, const TrainConfig& c, const std::string& checkpoint_dir) {
  int rank = 0, world = 1;
  PB_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  PB_MPI_CHECK(MPI_Comm_size(comm, &world));
  validate_train_config(c, world, ConfigPurpose::eval);
  PB_REQUIRE(!checkpoint_dir.empty(), "eval: --checkpoint DIR is required");
  CollectiveWatchdog::global().set_step(0);
  const WatchdogRun watch_collectives(c, rank);
  // The model is the checkpoint's (its config.json), whatever the config's [model] says.
  const BertConfig model = read_hf_config(checkpoint_dir + "/config.json");
  // Forward only: the weights (and their low-precision copy) and one evaluation batch's
  // activations, in no more arena than a training step of this config reserves.
  const TrainerOptions o = trainer_options(c, model, world);
  ReplicaOptions ro;
  ro.config = model;
  ro.bert = o.bert;
  ro.device = o.device;
  ro.cuda_device = o.cuda_device;
  ro.gradients = false;
  ro.initialize = false;  // the checkpoint's weights, loaded next
  ModelReplica replica(ro);
  replica.load_params(
      [&](float* host) { load_model_weights(checkpoint_dir, replica.table(), host); });
  const std::optional<CorpusTokenizer> tokenizer = data_tokenizer(c);
  const EvalSet set =
      load_eval_set(c.data.eval_dir, sample_rules(c, model, tokenizer ? &*tokenizer : nullptr),
                    c.eval.max_samples, rank, world);
  const std::optional<BertMemory> limits = eval_limits(replica, o);
  const EvalResult r =
      evaluate(comm, replica, set, c.eval.batch_size,
               static_cast<int>(model.max_position_embeddings), limits ? &*limits : nullptr);
  if (rank == 0) {
    nlohmann::json j = {{"checkpoint", checkpoint_dir},     {"eval_accuracy", r.mlm_accuracy},
                        {"eval_loss", r.mlm_loss},          {"nsp_accuracy", r.nsp_accuracy},
                        {"nsp_loss", r.nsp_loss},           {"samples", r.samples},
                        {"masked_tokens", r.masked_tokens}, {"seconds", r.seconds}};
    std::cout << j.dump() << std::endl;
    spdlog::info(
        "eval {}: mlm accuracy {:.4f}, mlm loss {:.4f}{} over {} samples / {} masked tokens",
        checkpoint_dir, r.mlm_accuracy, r.mlm_loss,
        format_nsp_accuracy(r.nsp_accuracy, c.model.nsp_head), r.samples, r.masked_tokens);
  }
  return 0;
}

}  // namespace packbert
