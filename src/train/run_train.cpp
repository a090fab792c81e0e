#include "train/run_train.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "kernels/base/error.h"
#include "core/log.h"
#include "core/watchdog.h"
#include "data/loader/loader.h"
#include "data/prepare/tokenizer.h"
#include "kernels/device.h"
#include "core/mpi_check.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/evaluate.h"
#include "train/memory_plan.h"
#include "train/evaluations.h"
#include "train/metrics.h"
#include "train/mllog.h"
#include "train/batching.h"
#include "train/resume.h"
#include "train/train_options.h"
#include "train/trainer.h"

namespace packbert {

namespace {

// Precision fp8's scaling state to and from a checkpoint (Fp8Checkpoint): it is training state,
// so a resume continues with the scales and histories it stopped with. Every rank holds the same
// state (the amaxes are reduced over the ranks). A checkpoint of another precision, or one whose
// history length differs from train.fp8_history, leaves the state cold (step 0's bf16 GEMMs).
std::optional<Fp8Checkpoint> fp8_state(Trainer& trainer) {
  const Fp8State* f = trainer.replica().bert().fp8();
  if (!f) return std::nullopt;
  const Fp8State::Saved s = f->state();
  Fp8Checkpoint c;
  c.operands = f->operands();
  c.history = f->history();
  c.updates = s.updates;
  c.amax_history = s.history;
  c.scales = s.scales;
  return c;
}

void restore_fp8_state(Trainer& trainer, const CheckpointRead& r, const std::string& dir) {
  Fp8State* f = trainer.replica().bert().fp8();
  if (!f || !r.fp8) return;
  if (r.fp8->operands != f->operands() || r.fp8->history != f->history()) {
    if (trainer.rank() == 0)
      spdlog::warn("resume: {} holds an FP8 state of {} operands x {} steps of history, this run "
                   "has {} x {} (train.fp8_history): the FP8 scales start afresh",
                   dir, r.fp8->operands, r.fp8->history, f->operands(), f->history());
    return;
  }
  f->set_state({r.fp8->amax_history, r.fp8->scales, r.fp8->updates});
}


std::atomic<int> g_stop_signal{0};

// A stop signal: the run stops after the step in flight (stop_requested), and until the ranks
// agree to, the collective watchdog bounds every wait of the step (core/watchdog.h): a rank that
// waits for a dead peer then ends the job in seconds instead of at the launcher's SIGKILL.
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  CollectiveWatchdog::global().note_stop_signal(sig);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void log_effective_config(const TrainConfig& c, int rank) {
  if (rank != 0) return;
  std::istringstream toml(train_config_to_toml(c));
  spdlog::info("effective config:");
  for (std::string line; std::getline(toml, line);)
    if (!line.empty()) spdlog::info("  {}", line);
}

// Where training stands: the counters trainer_state.json records.
struct RunState {
  int64_t step = 0;     // optimizer steps done (loader steps delivered)
  int64_t samples = 0;  // samples trained
  int64_t tokens = 0;
  int64_t skipped_steps = 0;
};

// Where a run starts: fresh, from model weights, or from a whole checkpoint.
struct StartState {
  RunState run;
  std::optional<LoaderPosition> loader;
  std::string from;  // what it was loaded from, for the log
};

// The path a checkpoint names, made comparable: absolute, with links and dots resolved as far as
// it exists.
std::string comparable_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? std::filesystem::absolute(path).lexically_normal().string() : p.string();
}

// checkpoint.init_checkpoint of the run that wrote a checkpoint (its trainer_state.json records
// the effective config as TOML); "" when it started from train.seed or the config is unreadable.
std::string recorded_init_checkpoint(const std::string& config_toml) {
  try {
    const toml::table t = toml::parse(config_toml, std::string_view{});
    return t["checkpoint"]["init_checkpoint"].value_or(std::string());
  } catch (const toml::parse_error&) {
    return {};
  }
}

// --init-checkpoint beside a checkpoint to resume (a resubmitted or requeued job gives both):
// the checkpoint is this run's own, and is resumed, when the run that wrote it started from the
// same init checkpoint; any other is an error before any training, naming both and how to
// choose (docs/training.md, Checkpoints), so that weights given on the command line are never
// ignored silently.
void check_init_beside_resume(const TrainConfig& c, const std::string& resume,
                              const std::string& recorded_config) {
  const std::string& init = c.checkpoint.init_checkpoint;
  const std::string recorded = recorded_init_checkpoint(recorded_config);
  if (!recorded.empty() && comparable_path(recorded) == comparable_path(init)) {
    spdlog::info("resume: {} was written by a run started from --init-checkpoint {}, as this "
                 "one is: resuming it (the init checkpoint is not read again)",
                 resume, init);
    return;
  }
  PB_THROW(
      "--init-checkpoint {} and a checkpoint to resume, {} (checkpoint.resume = \"{}\", "
      "checkpoint.dir = \"{}\"), were both given, and that checkpoint was written by a run "
      "that started from {}: resuming it would ignore {}. To continue that run, drop "
      "--init-checkpoint; to start from {}, give a checkpoint.dir that holds no checkpoints "
      "(CKPT_DIR for scripts/slurm_bert_large.sbatch) or drop --resume",
      init, resume, c.checkpoint.resume, c.checkpoint.dir,
      recorded.empty() ? std::string("train.seed (no --init-checkpoint)") : recorded, init, init);
}

// A resume says what it changes (rank 0): every config key whose value differs from the config
// recorded in the checkpoint's trainer_state.json, old -> new, in one warning; and the ranks.
// What cannot be resumed (the model's shape, the data) is an error elsewhere.
void log_resume_changes(const std::string& resume, const TrainerState& state,
                        const TrainConfig& c, int world) {
  if (state.config.empty()) {
    spdlog::info("resume: {} records no config to compare this run's with", resume);
  } else {
    try {
      const std::vector<ConfigChange> changes =
          config_changes(state.config, train_config_to_toml(c));
      if (!changes.empty())
        spdlog::warn("resume: {} config key(s) differ from those of the run that wrote {}, old "
                     "-> new: {}",
                     changes.size(), resume, describe(changes));
    } catch (const std::exception& e) {
      spdlog::warn("resume: cannot compare the config with the one {} records: {}", resume,
                   e.what());
    }
  }
  if (state.world_size > 0 && state.world_size != world)
    spdlog::info("resume: {} was written by {} rank(s); this run has {}", resume,
                 state.world_size, world);
}

StartState load_start_state(MPI_Comm comm, const TrainConfig& c, Trainer& trainer) {
  StartState st;
  const int64_t n = trainer.table().total();
  std::vector<float> params, m, v;
  // --resume auto: the newest checkpoint that reads back whole (damaged ones are moved aside,
  // src/train/resume.h); --resume DIR: that one, any damage an error.
  std::string resume = c.checkpoint.resume;
  std::optional<CheckpointRead> read;
  if (!resume.empty() || !c.checkpoint.init_checkpoint.empty())
    params.resize(static_cast<size_t>(n));
  if (!resume.empty()) {
    m.resize(params.size());
    v.resize(params.size());
  }
  if (resume == "auto") {
    std::optional<ResumedCheckpoint> newest = read_newest_valid_checkpoint(
        comm, c.checkpoint.dir, trainer.table(), params.data(), m.data(), v.data());
    if (!newest) {
      spdlog::info("resume auto: no checkpoint under {}, starting fresh", c.checkpoint.dir);
      resume.clear();
    } else {
      resume = newest->dir;
      read = std::move(newest->read);
    }
  } else if (!resume.empty()) {
    read = read_checkpoint(resume, trainer.table(), params.data(), m.data(), v.data());
  }
  if (read) {
    const CheckpointRead& r = *read;
    trainer.load_state(params.data(), m.data(), v.data(), r.lamb_steps_done);
    const TrainerState state =
        trainer_state_from_json(r.trainer_state_json, resume + "/trainer_state.json");
    st.run = {state.step, state.samples, state.tokens, state.skipped_steps};
    st.loader = state.loader;
    // fp16's loss scale is training state; a checkpoint of another precision has none and
    // the scaler starts from train.loss_scale_init.
    if (c.train.precision == Precision::fp16 && state.loss_scale)
      trainer.set_loss_scaler_state(*state.loss_scale);
    restore_fp8_state(trainer, r, resume);
    PB_REQUIRE(st.run.step == r.step, "{}: trainer_state.json says step {}, the checkpoint {}",
               resume, st.run.step, r.step);
    if (!c.checkpoint.init_checkpoint.empty())
      check_init_beside_resume(c, resume, state.config);
    if (trainer.rank() == 0) log_resume_changes(resume, state, c, trainer.world_size());
    st.from = resume;
  } else if (!c.checkpoint.init_checkpoint.empty()) {
    load_model_weights(c.checkpoint.init_checkpoint, trainer.table(), params.data());
    trainer.load_params(params.data());
    st.from = c.checkpoint.init_checkpoint + " (weights only)";
  }
  return st;
}

// What trainer_state.json records of the run at `st`.
TrainerState trainer_state(const TrainConfig& c, const RunState& st, const LoaderPosition& pos,
                           const Trainer& trainer) {
  TrainerState s;
  s.step = st.step;
  s.samples = st.samples;
  s.tokens = st.tokens;
  s.skipped_steps = st.skipped_steps;
  s.loader = pos;
  if (c.train.precision == Precision::fp16) s.loss_scale = trainer.loss_scaler_state();
  s.rng.train_seed = c.train.seed;
  s.rng.init_seed = derive_seed(c.train.seed, 1);
  s.rng.dropout_seed = derive_seed(c.train.seed, 2);
  s.rng.data_seed = c.train.seed;
  s.world_size = trainer.world_size();
  s.config = train_config_to_toml(c);
  return s;
}

// The collective watchdog's action: every rank ends (mpirun reports the exit code). Its MPI
// calls are unchecked: this is the error path, on the watchdog's thread, with nothing above it
// to throw to; _Exit follows whatever they return.
void abort_job(const std::string&) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, CollectiveWatchdog::kExitCode);
  std::_Exit(CollectiveWatchdog::kExitCode);
}

// Watches the run's collectives (core/watchdog.h) from construction to the end of the scope.
struct WatchdogRun {
  WatchdogRun(const TrainConfig& c, int rank) {
    CollectiveWatchdog::global().configure(c.train.collective_timeout_s, rank, abort_job);
  }
  ~WatchdogRun() { CollectiveWatchdog::global().stop(); }
  WatchdogRun(const WatchdogRun&) = delete;
  WatchdogRun& operator=(const WatchdogRun&) = delete;
};

// Whether any rank has received a stop signal: collective, so that all stop after the same step.
bool stop_requested(MPI_Comm comm) {
  int stop = g_stop_signal.load() != 0 ? 1 : 0;
  const WatchScope watch("MPI_Allreduce (stop flag)");
  PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, comm));
  if (stop != 0) CollectiveWatchdog::global().stop_agreed();  // every rank is alive and stops
  return stop != 0;
}

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
      spdlog::warn("steps before {}: {} had a non-finite gradient; the device skipped their "
                   "updates (longest run {}, {} allowed)",
                   step, m.unread_skips, m.longest_skipped_run, c_.train.max_nonfinite_steps);
      PB_REQUIRE(m.longest_skipped_run <= c_.train.max_nonfinite_steps,
                 "train: {} in a row had a non-finite gradient (before step {}); the run "
                 "diverged: lower optim.lr or check the data (train.max_nonfinite_steps = {})",
                 steps(m.longest_skipped_run), step, c_.train.max_nonfinite_steps);
    }
    if (scale_overflow) {
      ++skipped;
      spdlog::info("step {}: fp16 gradient overflow at loss scale {}; the update was skipped and "
                   "the scale halved", step, m.loss_scale);
    } else if (m.skipped || (m.read.losses && !std::isfinite(m.loss))) {
      ++skipped;
      ++nonfinite_in_row_;
      spdlog::warn("step {}: non-finite {} (loss {}, gradient norm {}); the update was skipped "
                   "({} in a row, {} allowed)",
                   step, m.skipped ? "gradient" : "loss", m.loss, m.grad_norm,
                   nonfinite_in_row_, c_.train.max_nonfinite_steps);
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
                  const TrainConfig& c, const Trainer& trainer, MetricsWriter& metrics) {
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
  const ProgressRecord r = progress.close(at);
  if (trainer.rank() == 0) spdlog::info("{}", format_progress_line(r, c.train.max_steps));
  metrics.write(to_json(r));
}

// A checkpoint of the run at `st` under checkpoint.dir (none when that is unset). Collective:
// rank 0 writes it, after a sharded optimizer has gathered its state there. Returns its
// directory on rank 0 ("" elsewhere and when none is written).
std::string save_checkpoint(MPI_Comm comm, const TrainConfig& c, Trainer& trainer,
                            const RunState& st, const DataLoader& loader) {
  if (c.checkpoint.dir.empty()) return {};
  std::string dir;
  const bool root = trainer.rank() == 0;
  std::vector<float> params, m, v;
  if (root) {
    params.resize(static_cast<size_t>(trainer.table().total()));
    m.resize(params.size());
    v.resize(params.size());
  }
  trainer.save_state(params.data(), m.data(), v.data(), 0);
  if (root) {
    const auto t0 = Clock::now();
    CheckpointWrite w;
    w.table = &trainer.table();
    w.params = params.data();
    w.m = m.data();
    w.v = v.data();
    w.step = st.step;
    w.lamb_steps_done = trainer.lamb_steps_done();
    w.trainer_state_json =
        trainer_state_to_json(trainer_state(c, st, loader.position(), trainer));
    const std::optional<Fp8Checkpoint> fp8 = fp8_state(trainer);
    if (fp8) w.fp8 = &*fp8;
    dir = write_checkpoint(c.checkpoint.dir, w, c.checkpoint.keep);
    spdlog::info("checkpoint {} written in {:.2f} s", dir, seconds_since(t0));
  }
  // A rank-0 write error throws there and aborts the job; the others wait for it here so a
  // completed checkpoint is announced before anyone exits.
  const WatchScope watch("MPI_Barrier (checkpoint)", WatchScope::kCurrentStep, StopBound::kNone);
  PB_MPI_CHECK(MPI_Barrier(comm));
  return dir;
}

// The memory plan (train/memory_plan.h) against this rank's device, before anything is
// allocated or loaded. On CUDA a shortfall on any rank stops every rank with the plan's table
// and its knobs; on the CPU it is a warning. Returns the plan's figure for this rank's buffers.
size_t check_memory_plan(MPI_Comm comm, const TrainConfig& c, const TrainerOptions& o, int rank,
                         int world) {
  const bool cuda = o.device == Device::cuda;
  size_t free = 0, total = 0;
  bool known = false;
  if (cuda) {
    known = cuda_device_memory(o.cuda_device, free, total);  // makes this rank's context
  } else {
    const Backend::MemoryInfo m = make_cpu_backend()->memory_info();
    free = m.free;
    total = m.total;
    known = total > 0;
  }
  const std::string where = cuda ? fmt::format("cuda:{}", o.cuda_device) : "this host's RAM";
  const MemoryPlan plan = plan_memory(c, world, {DeviceMemory{where, free, "free now"}},
                                      /*knobs=*/false, rank);
  // The CUDA context already holds its part of what was free.
  size_t need = plan.total();
  for (const MemoryItem& it : plan.items)
    if (it.key == "cuda_context") need -= it.bytes;
  const int short_here = known && need > free ? 1 : 0;
  int short_any = short_here;
  PB_MPI_CHECK(MPI_Allreduce(&short_here, &short_any, 1, MPI_INT, MPI_MAX, comm));
  if (short_any == 0) return plan.buffers;
  constexpr double kMiB = 1 << 20;
  if (rank == 0) {
    const MemoryPlan full = plan_memory(c, world, {DeviceMemory{where, free, "free now"}});
    const std::string table = format_memory_plan(full);
    if (cuda)
      spdlog::error("memory plan (packbert plan --config FILE --ranks {}):\n{}", world, table);
    else
      spdlog::warn("memory plan (packbert plan --config FILE --ranks {}):\n{}", world, table);
  }
  if (!cuda) {
    if (short_here)
      spdlog::warn("memory: rank {} needs {:.1f} MiB, {:.1f} MiB of RAM are available: the run may "
                   "swap or be killed", rank, need / kMiB, free / kMiB);
    return plan.buffers;
  }
  // Each rank says what it found before any exits: the first to fail aborts the job.
  if (short_here)
    spdlog::error("memory: this config needs {:.1f} MiB on {} (rank {} of {}), {:.1f} MiB are "
                  "free: {:.1f} MiB short. Nothing was loaded; the plan and what each knob saves "
                  "are above",
                  need / kMiB, where, rank, world, free / kMiB, (need - free) / kMiB);
  PB_MPI_CHECK(MPI_Barrier(comm));
  PB_THROW("memory: the config does not fit {} rank's device (the memory plan above){}",
           short_here ? "this" : "another", short_here ? "" : "; nothing was loaded");
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // mpirun passes SIGUSR1 on to every rank and lets them finish; on SIGTERM it gives them a
  // second before SIGKILL (odls_base_sigkill_timeout), too short for a large checkpoint.
  sigaction(SIGUSR1, &sa, nullptr);
}

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
  const SampleRules rules = sample_rules(c, model);
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
  lo.rules = rules;
  DataLoader loader(comm, {c.data.train_dir}, lo, start.loader);
  spdlog::info("data: {} training samples in {} shard(s), {} steps per epoch",
               loader.num_samples(), loader.shards().size(), loader.steps_per_epoch());

  std::optional<EvalSet> eval_set;
  if (c.eval_enabled()) {
    eval_set = load_eval_set(c.data.eval_dir, rules, c.eval.max_samples, rank, world);
    spdlog::info("eval: {} samples from {}", eval_set->total, c.data.eval_dir);
  }
  log_bert_constants(ml, c, world, eval_set ? eval_set->total : 0);
  ml.end("init_stop");
  MetricsWriter metrics(root ? c.log.metrics_file : std::string());

  ml.start("run_start");
  const int64_t every = c.eval.every_samples;
  MlperfBlocks blocks(ml, every > 0 ? every : c.train.max_steps * c.train.global_batch_size);
  blocks.open(st.samples);
  Evaluations evals(comm, c, trainer, eval_set ? &*eval_set : nullptr, ml, metrics, st.samples);
  const auto run_t0 = Clock::now();
  ProgressAccumulator progress(run_t0, host_work(trainer));
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

    const bool stop = stop_requested(comm);
    const bool last_step = st.step >= c.train.max_steps;
    if (st.step % c.log.every_steps == 0 || last_step || stop) {
      // A stop after an unread step: its losses, and those of the unread ones before it.
      for (const StepLosses& l : trainer.read_losses()) progress.add_losses(l);
      log_progress(progress, st, seconds_since(run_t0), c, trainer, metrics);
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
      spdlog::warn("signal {} received: stopping after step {}", g_stop_signal.load(), st.step);
      break;
    }
    if (target_reached) {
      spdlog::info("target mlm accuracy {} reached at step {} ({} samples)",
                   c.eval.target_accuracy, st.step, st.samples);
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
                    stopped ? g_stop_signal.load() : 0, st.step, st.samples, last_checkpoint});
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
  const EvalSet set = load_eval_set(c.data.eval_dir, sample_rules(c, model), c.eval.max_samples,
                                    rank, world);
  const std::optional<BertMemory> limits = eval_limits(replica, o);
  const EvalResult r = evaluate(comm, replica, set, c.eval.batch_size,
                                static_cast<int>(model.max_position_embeddings),
                                limits ? &*limits : nullptr);
  if (rank == 0) {
    nlohmann::json j = {{"checkpoint", checkpoint_dir}, {"eval_accuracy", r.mlm_accuracy},
                        {"eval_loss", r.mlm_loss}, {"nsp_accuracy", r.nsp_accuracy},
                        {"nsp_loss", r.nsp_loss}, {"samples", r.samples},
                        {"masked_tokens", r.masked_tokens}, {"seconds", r.seconds}};
    std::cout << j.dump() << std::endl;
    spdlog::info("eval {}: mlm accuracy {:.4f}, mlm loss {:.4f}, nsp accuracy {:.4f} over {} "
                 "samples / {} masked tokens",
                 checkpoint_dir, r.mlm_accuracy, r.mlm_loss, r.nsp_accuracy, r.samples,
                 r.masked_tokens);
  }
  return 0;
}

}  // namespace packbert
