// Where a run of `packbert train` starts and what it keeps (run_train_internal.h): the state
// loaded from a checkpoint (checkpoint.resume) or the weights of checkpoint.init_checkpoint,
// what a resume logs of its changes, and the checkpoints written during and at the end of the
// run, with the trainer state and the FP8 scaling state they hold.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "core/mpi_check.h"
#include "core/watchdog.h"
#include "kernels/base/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_dir.h"
#include "train/resume.h"
#include "train/run_train_internal.h"
#include "train/train_options.h"

namespace packbert::train_run {

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
      spdlog::warn(
          "resume: {} holds an FP8 state of {} operands x {} steps of history, this run "
          "has {} x {} (train.fp8_history): the FP8 scales start afresh",
          dir, r.fp8->operands, r.fp8->history, f->operands(), f->history());
    return;
  }
  f->set_state({r.fp8->amax_history, r.fp8->scales, r.fp8->updates});
}

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
    spdlog::info(
        "resume: {} was written by a run started from --init-checkpoint {}, as this "
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
void log_resume_changes(const std::string& resume, const TrainerState& state, const TrainConfig& c,
                        int world) {
  if (state.config.empty()) {
    spdlog::info("resume: {} records no config to compare this run's with", resume);
  } else {
    try {
      const std::vector<ConfigChange> changes =
          config_changes(state.config, train_config_to_toml(c));
      if (!changes.empty())
        spdlog::warn(
            "resume: {} config key(s) differ from those of the run that wrote {}, old "
            "-> new: {}",
            changes.size(), resume, describe(changes));
    } catch (const std::exception& e) {
      spdlog::warn("resume: cannot compare the config with the one {} records: {}", resume,
                   e.what());
    }
  }
  if (state.world_size > 0 && state.world_size != world)
    spdlog::info("resume: {} was written by {} rank(s); this run has {}", resume, state.world_size,
                 world);
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

}  // namespace

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
    trainer.set_tokens_trained(state.tokens);  // a schedule in tokens goes on from there
    st.loader = state.loader;
    // A checkpoint older than the loader's token count: the trainer's is the same count.
    if (st.loader && st.loader->tokens < 0) st.loader->tokens = state.tokens;
    // fp16's loss scale is training state; a checkpoint of another precision has none and
    // the scaler starts from train.loss_scale_init.
    if (c.train.precision == Precision::fp16 && state.loss_scale)
      trainer.set_loss_scaler_state(*state.loss_scale);
    restore_fp8_state(trainer, r, resume);
    PB_REQUIRE(st.run.step == r.step, "{}: trainer_state.json says step {}, the checkpoint {}",
               resume, st.run.step, r.step);
    if (!c.checkpoint.init_checkpoint.empty()) check_init_beside_resume(c, resume, state.config);
    if (trainer.rank() == 0) log_resume_changes(resume, state, c, trainer.world_size());
    st.from = resume;
  } else if (!c.checkpoint.init_checkpoint.empty()) {
    load_model_weights(c.checkpoint.init_checkpoint, trainer.table(), params.data());
    trainer.load_params(params.data());
    st.from = c.checkpoint.init_checkpoint + " (weights only)";
  }
  return st;
}

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
    w.trainer_state_json = trainer_state_to_json(trainer_state(c, st, loader.position(), trainer));
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

}  // namespace packbert::train_run
