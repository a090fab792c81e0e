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
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/watchdog.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "kernels/device.h"
#include "comm/mpi_check.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/mllog.h"
#include "train/resume.h"
#include "train/trainer.h"

namespace packbert {

namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Independent seeds for initialisation and dropout from train.seed (splitmix64 of a salt), so
// the three streams never share a key. The data order uses train.seed itself.
uint64_t derive_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (salt + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The rank's index on its node, from the launcher's environment (OpenMPI, MPICH / Intel MPI,
// Slurm); 0 when none says.
int local_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(name)) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  return 0;
}

TrainerOptions trainer_options(const TrainConfig& c, const BertConfig& model) {
  TrainerOptions o;
  o.config = model;
  o.bert.mlm_chunk_rows = c.model.mlm_chunk_rows;
  o.bert.mst_chunks = c.model.mst_chunks;
  o.bert.activation_budget_bytes = static_cast<size_t>(c.model.activation_budget_mb) << 20;
  o.bert.recompute = c.model.recompute;
  o.layout = c.train.layout;
  o.max_seq_len = c.train.max_seq_len;
  o.init_seed = derive_seed(c.train.seed, 1);
  o.dropout_seed = derive_seed(c.train.seed, 2);
  o.dropout = c.train.dropout;
  o.lr = lr_schedule_config(c);
  o.lamb = lamb_options(c);
  o.sharded = c.optim.sharded;
  o.lamb.check_finite = true;
  o.lamb.skip_nonfinite = true;  // counted here, fatal after train.max_nonfinite_steps in a row
  o.bert.precision = c.train.precision;
  o.loss_scaler.init_scale = static_cast<float>(c.train.loss_scale_init);
  o.loss_scaler.growth_interval = c.train.loss_scale_growth_interval;
  o.device = c.train.device;
  o.gpu_transport =
      c.train.gpu_allreduce == GpuAllreduce::host ? GradTransport::mpi : GradTransport::nccl;
  // One GPU per rank: a launcher that shows each rank only its own GPU (scripts/
  // run_mlperf_8gpu.sh) leaves one device; a plain mpirun on a node shows them all, and local
  // rank r takes GPU r (mod the count).
  if (o.device == Device::cuda) {
    const int gpus = cuda_device_count();
    o.cuda_device = gpus > 1 ? local_rank_from_env() % gpus : 0;
  }
  return o;
}

// The sample rules of the data: the vocabulary file's size and special ids.
SampleRules sample_rules(const TrainConfig& c, const BertConfig& model) {
  SampleRules rules;
  rules.vocab_size = model.real_vocab_size;
  rules.max_seq_len = c.train.max_seq_len;
  if (!c.data.vocab.empty()) {
    const Vocab v = Vocab::load(c.data.vocab);
    PB_REQUIRE(v.size() <= model.real_vocab_size,
               "data.vocab: {} has {} tokens, more than the model's vocabulary ({})",
               c.data.vocab, v.size(), model.real_vocab_size);
    rules.vocab_size = v.size();
    rules.cls_id = v.cls_id();
    rules.sep_id = v.sep_id();
  }
  return rules;
}

void log_effective_config(const TrainConfig& c, int rank) {
  if (rank != 0) return;
  std::istringstream toml(train_config_to_toml(c));
  spdlog::info("effective config:");
  for (std::string line; std::getline(toml, line);)
    if (!line.empty()) spdlog::info("  {}", line);
}

// Where a run starts: fresh, from model weights, or from a whole checkpoint.
struct StartState {
  int64_t step = 0;     // optimizer steps done (loader steps delivered)
  int64_t samples = 0;  // samples trained
  int64_t tokens = 0;
  int64_t skipped_steps = 0;
  std::optional<LoaderPosition> loader;
  std::string from;  // what it was loaded from, for the log
};

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
    nlohmann::json state;
    try {
      state = nlohmann::json::parse(r.trainer_state_json);
      st.step = state.at("step").get<int64_t>();
      st.samples = state.at("samples").get<int64_t>();
      st.tokens = state.at("tokens").get<int64_t>();
      st.skipped_steps = state.at("skipped_steps").get<int64_t>();
      st.loader = loader_position_from_json(state.at("loader").dump());
      // fp16's loss scale is training state; a checkpoint of another precision has none and
      // the scaler starts from train.loss_scale_init.
      if (c.train.precision == Precision::fp16 && state.contains("loss_scale")) {
        LossScalerState ls;
        ls.scale = state.at("loss_scale").at("scale").get<float>();
        ls.clean_steps = state.at("loss_scale").at("clean_steps").get<int64_t>();
        trainer.set_loss_scaler_state(ls);
      }
    } catch (const nlohmann::json::exception& e) {
      PB_THROW("{}/trainer_state.json: {}", resume, e.what());
    }
    PB_REQUIRE(st.step == r.step, "{}: trainer_state.json says step {}, the checkpoint {}",
               resume, st.step, r.step);
    st.from = resume;
  } else if (!c.checkpoint.init_checkpoint.empty()) {
    load_model_weights(c.checkpoint.init_checkpoint, trainer.table(), params.data());
    trainer.load_params(params.data());
    st.from = c.checkpoint.init_checkpoint + " (weights only)";
  }
  return st;
}

std::string trainer_state_json(const TrainConfig& c, int64_t step, int64_t samples,
                               int64_t tokens, int64_t skipped, const LoaderPosition& pos,
                               int world_size, const Trainer& trainer) {
  nlohmann::json j;
  j["step"] = step;
  j["samples"] = samples;
  j["tokens"] = tokens;
  j["skipped_steps"] = skipped;
  if (c.train.precision == Precision::fp16) {
    const LossScalerState ls = trainer.loss_scaler_state();
    j["loss_scale"] = {{"scale", ls.scale}, {"clean_steps", ls.clean_steps}};
  }
  j["loader"] = nlohmann::json::parse(loader_position_to_json(pos));
  // Every random stream is counter-based: these seeds (with the step and the sample ids) are
  // the whole RNG state.
  j["rng"] = {{"train_seed", c.train.seed},
              {"init_seed", derive_seed(c.train.seed, 1)},
              {"dropout_seed", derive_seed(c.train.seed, 2)},
              {"data_seed", c.train.seed}};
  j["world_size"] = world_size;
  j["config"] = train_config_to_toml(c);
  return j.dump(2);
}

// Creates dir if needed and checks a file can be made in it, so that a bad checkpoint.dir
// fails before any training instead of at the first checkpoint.
void require_writable_dir(const char* key, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  PB_REQUIRE(!ec, "{}: cannot create the directory {}: {}", key, dir, ec.message());
  const std::string probe = dir + "/.write_probe." + std::to_string(getpid());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  PB_REQUIRE(f != nullptr, "{}: cannot write into {}: {}", key, dir, std::strerror(errno));
  std::fclose(f);
  std::filesystem::remove(probe, ec);
}

// The collective watchdog's action: every rank ends (mpirun reports the exit code).
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

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int run_train(MPI_Comm comm, const TrainConfig& c) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  validate_train_config(c, world, ConfigPurpose::train);
  install_stop_signal_handlers();
  const bool root = rank == 0;
  CollectiveWatchdog& watchdog = CollectiveWatchdog::global();
  watchdog.set_step(0);
  const WatchdogRun watch_collectives(c, rank);

  if (root && !c.checkpoint.dir.empty()) require_writable_dir("checkpoint.dir", c.checkpoint.dir);

  MlLogger ml(c.log.mllog_file, root);
  ml.event("cache_clear", true);
  ml.start("init_start");
  spdlog::info("packbert train: {} rank(s), pid {}", world, static_cast<long>(getpid()));
  log_effective_config(c, rank);

  const BertConfig model = model_config(c);
  const SampleRules rules = sample_rules(c, model);
  const TrainerOptions trainer_opts = trainer_options(c, model);
  Trainer trainer(comm, trainer_opts);
  StartState st = load_start_state(comm, c, trainer);
  watchdog.set_step(st.step);
  spdlog::info("model {} ({:.1f}M parameters), {}", describe(model), trainer.table().total() / 1e6,
               st.from.empty() ? std::string("initialised from train.seed")
                               : "loaded from " + st.from);

  LoaderOptions lo = loader_options(c);
  lo.rules = rules;
  DataLoader loader(comm, {c.data.train_dir}, lo, st.loader);
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
  int64_t next_eval = every > 0 ? (st.samples / every + 1) * every : INT64_MAX;
  // MLPerf blocks: a block of training between evaluations (first_epoch_num: samples so far).
  bool block_open = false;
  int64_t block_first = 0;
  auto open_block = [&](int64_t samples) {
    block_first = samples;
    block_open = true;
    ml.start("block_start", nullptr,
             {{"first_epoch_num", samples},
              {"epoch_count", every > 0 ? every : c.train.max_steps * c.train.global_batch_size}});
  };
  auto close_block = [&]() {
    if (block_open) ml.end("block_stop", nullptr, {{"first_epoch_num", block_first}});
    block_open = false;
  };
  open_block(st.samples);

  // Evaluation, logged everywhere it must be; returns whether the target is reached.
  double last_accuracy = -1;
  int64_t last_eval_samples = -1;
  auto run_evaluation = [&](int64_t step, int64_t samples) {
    close_block();
    last_eval_samples = samples;
    ml.start("eval_start", nullptr, {{"epoch_num", samples}});
    const EvalResult r = evaluate(comm, trainer, *eval_set, c.eval.batch_size,
                                  c.train.max_seq_len);
    ml.event("eval_accuracy", r.mlm_accuracy, {{"epoch_num", samples}});
    ml.end("eval_stop", nullptr, {{"epoch_num", samples}});
    spdlog::info("eval at step {} ({} samples): mlm accuracy {:.4f}, mlm loss {:.4f}, nsp "
                 "accuracy {:.4f} over {} samples / {} masked tokens in {:.1f} s",
                 step, samples, r.mlm_accuracy, r.mlm_loss, r.nsp_accuracy, r.samples,
                 r.masked_tokens, r.seconds);
    metrics.write({{"event", "eval"}, {"step", step}, {"samples", samples},
                   {"eval_accuracy", r.mlm_accuracy}, {"eval_loss", r.mlm_loss},
                   {"eval_nsp_accuracy", r.nsp_accuracy}, {"eval_samples", r.samples},
                   {"eval_masked_tokens", r.masked_tokens}});
    last_accuracy = r.mlm_accuracy;
    return c.eval.target_accuracy > 0 && r.mlm_accuracy >= c.eval.target_accuracy;
  };
  auto save = [&](int64_t step) {
    if (c.checkpoint.dir.empty()) return;
    // Rank 0 writes the state; a sharded optimizer gathers its moments there (collective).
    std::vector<float> m, v;
    if (root) {
      m.resize(static_cast<size_t>(trainer.table().total()));
      v.resize(m.size());
    }
    if (root || trainer.optimizer_sharded()) trainer.save_optimizer_state(m.data(), v.data(), 0);
    if (root) {
      const auto t0 = Clock::now();
      CheckpointWrite w;
      w.table = &trainer.table();
      w.params = trainer.params().data();
      w.m = m.data();
      w.v = v.data();
      w.step = step;
      w.lamb_steps_done = trainer.lamb_steps_done();
      w.trainer_state_json = trainer_state_json(c, step, st.samples, st.tokens,
                                                st.skipped_steps, loader.position(), world,
                                                trainer);
      const std::string dir = write_checkpoint(c.checkpoint.dir, w, c.checkpoint.keep);
      spdlog::info("checkpoint {} written in {:.2f} s", dir, seconds_since(t0));
    }
    // A rank-0 write error throws there and aborts the job; the others wait for it here so a
    // completed checkpoint is announced before anyone exits.
    const WatchScope watch("MPI_Barrier (checkpoint)");
    PB_MPI_CHECK(MPI_Barrier(comm));
  };

  // Interval accumulators (since the last progress record).
  struct Interval {
    int64_t steps = 0, samples = 0, tokens = 0, rows = 0, masked = 0;
    double loss = 0, mlm_loss = 0, nsp_loss = 0, mlm_ok = 0, nsp_ok = 0, wait = 0;
    double imbalance = 0, excluded_s = 0;
    Clock::time_point start = Clock::now();
  } iv;
  const auto run_t0 = Clock::now();
  int64_t nonfinite_in_row = 0;
  bool target_reached = false, stopped = false;
  StepMetrics last;

  while (st.step < c.train.max_steps) {
    watchdog.set_step(st.step + 1);  // the step the collectives from here to the next belong to
    const StepBatch batch = loader.next();
    // The optimizer's scalars are read back on logged steps only (on the GPU the others never
    // wait for the device); a stop signal can end the run on an unlogged step, whose progress
    // line then has no gradient norm.
    const int64_t next = st.step + 1;
    const StepMetrics m =
        trainer.step(batch, {}, next % c.log.every_steps == 0 || next >= c.train.max_steps);
    last = m;
    st.step = batch.step + 1;
    st.samples += m.samples;
    st.tokens += m.tokens;
    // fp16: a gradient that overflows at a finite loss is the loss scaler probing its range
    // (the step is skipped and the scale halves); it counts as skipped, not as divergence,
    // until the scale has reached its floor.
    const bool scale_overflow = c.train.precision == Precision::fp16 && m.skipped &&
                                std::isfinite(m.loss) &&
                                m.loss_scale > trainer_opts.loss_scaler.min_scale;
    if (m.unread_skips > 0) {
      // Steps between two reads whose updates the device skipped (never fp16, which reads
      // every step).
      st.skipped_steps += m.unread_skips;
      spdlog::warn("steps before {}: {} had a non-finite gradient; the device skipped their "
                   "updates (longest run {}, {} allowed)",
                   st.step, m.unread_skips, m.longest_skipped_run, c.train.max_nonfinite_steps);
      PB_REQUIRE(m.longest_skipped_run <= c.train.max_nonfinite_steps,
                 "train: {} steps in a row had a non-finite gradient (before step {}); the run "
                 "diverged: lower optim.lr or check the data (train.max_nonfinite_steps = {})",
                 m.longest_skipped_run, st.step, c.train.max_nonfinite_steps);
    }
    if (scale_overflow) {
      ++st.skipped_steps;
      spdlog::info("step {}: fp16 gradient overflow at loss scale {}; the update was skipped and "
                   "the scale halved", st.step, m.loss_scale);
    } else if (m.skipped || !std::isfinite(m.loss)) {
      ++st.skipped_steps;
      ++nonfinite_in_row;
      spdlog::warn("step {}: non-finite {} (loss {}, gradient norm {}); the update was skipped "
                   "({} in a row, {} allowed)",
                   st.step, m.skipped ? "gradient" : "loss", m.loss, m.grad_norm,
                   nonfinite_in_row, c.train.max_nonfinite_steps);
      PB_REQUIRE(nonfinite_in_row <= c.train.max_nonfinite_steps,
                 "train: {} steps in a row had a non-finite loss or gradient (last: step {}); "
                 "the run diverged: lower optim.lr or check the data (train.max_nonfinite_steps "
                 "= {})",
                 nonfinite_in_row, st.step, c.train.max_nonfinite_steps);
    } else {
      nonfinite_in_row = 0;
    }
    ++iv.steps;
    iv.samples += m.samples;
    iv.tokens += m.tokens;
    iv.rows += m.rows;
    iv.masked += m.masked_tokens;
    iv.loss += m.loss;
    iv.mlm_loss += m.mlm_loss * static_cast<double>(m.masked_tokens);
    iv.nsp_loss += m.nsp_loss * static_cast<double>(m.samples);
    iv.mlm_ok += m.mlm_accuracy * static_cast<double>(m.masked_tokens);
    iv.nsp_ok += m.nsp_accuracy * static_cast<double>(m.samples);
    iv.wait += batch.wait_seconds;
    iv.imbalance += batch.imbalance;

    // The ranks agree on stopping after the same step.
    int stop = g_stop_signal.load() != 0 ? 1 : 0;
    {
      const WatchScope watch("MPI_Allreduce (stop flag)");
      PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, comm));
    }
    const bool last_step = st.step >= c.train.max_steps;

    if (st.step % c.log.every_steps == 0 || last_step || stop) {
      const double dt = std::max(seconds_since(iv.start) - iv.excluded_s, 1e-9);
      ProgressRecord r;
      r.step = st.step;
      r.epoch = batch.epoch;
      r.samples = st.samples;
      r.tokens = st.tokens;
      r.loss = iv.loss / static_cast<double>(iv.steps);
      r.mlm_loss = iv.masked > 0 ? iv.mlm_loss / static_cast<double>(iv.masked) : 0;
      r.nsp_loss = iv.nsp_loss / static_cast<double>(iv.samples);
      r.mlm_accuracy = iv.masked > 0 ? iv.mlm_ok / static_cast<double>(iv.masked) : 0;
      r.nsp_accuracy = iv.nsp_ok / static_cast<double>(iv.samples);
      r.lr = m.lr;
      r.grad_norm = m.grad_norm;
      r.loss_scale = m.loss_scale;
      r.samples_per_s = static_cast<double>(iv.samples) / dt;
      r.tokens_per_s = static_cast<double>(iv.tokens) / dt;
      r.padding_fraction = iv.rows > 0 ? 1.0 - static_cast<double>(iv.tokens) /
                                                   static_cast<double>(iv.rows)
                                       : 0.0;
      r.imbalance = iv.imbalance / static_cast<double>(iv.steps);
      r.data_wait_s = iv.wait / static_cast<double>(iv.steps);
      r.step_time_s = dt / static_cast<double>(iv.steps);
      r.eta_s = r.step_time_s * static_cast<double>(c.train.max_steps - st.step);
      r.elapsed_s = seconds_since(run_t0);
      r.peak_rss_bytes = peak_rss_bytes();
      const ActivationReport act = trainer.activation_report();
      r.activation_peak_bytes = static_cast<int64_t>(act.peak_bytes);
      r.optimizer_state_bytes = static_cast<int64_t>(trainer.optimizer_state_bytes());
      for (int k = 0; k < kActivationKinds; ++k)
        r.activation_bytes_by_kind.emplace_back(
            activation_kind_name(static_cast<ActivationKind>(k)),
            static_cast<int64_t>(act.peak_by_kind[k]));
      r.mst_chunks = act.mst_chunks;
      r.skipped_steps = st.skipped_steps;
      if (root) spdlog::info("{}", format_progress_line(r, c.train.max_steps));
      metrics.write(to_json(r));
      iv = Interval{};
    }

    const auto side_t0 = Clock::now();  // evaluation and checkpoints do not count as training
    if (eval_set && st.samples >= next_eval) {
      while (next_eval <= st.samples) next_eval += every;
      target_reached = run_evaluation(st.step, st.samples);
      if (!target_reached && !last_step && !stop) open_block(st.samples);
    }
    const bool finishing = last_step || target_reached || stop;
    if (!finishing && c.checkpoint.every_steps > 0 && st.step % c.checkpoint.every_steps == 0)
      save(st.step);
    iv.excluded_s += seconds_since(side_t0);
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
  if (eval_set && c.eval.at_end && !stopped && !target_reached &&
      last_eval_samples != st.samples)
    target_reached = run_evaluation(st.step, st.samples);
  close_block();
  save(st.step);
  ml.event("train_samples", st.samples);
  const bool success = !stopped && (c.eval.target_accuracy <= 0 || target_reached);
  ml.end("run_stop", nullptr, {{"status", success ? "success" : "aborted"}});
  spdlog::info("train: {} after step {}, {} samples, {} skipped step(s), {:.1f} s{}",
               stopped ? "stopped by signal" : (target_reached ? "target reached" : "finished"),
               st.step, st.samples, st.skipped_steps, seconds_since(run_t0),
               last_accuracy >= 0 ? fmt::format(", last eval accuracy {:.4f}", last_accuracy)
                                  : std::string());
  return 0;
}

int run_eval(MPI_Comm comm, const TrainConfig& c, const std::string& checkpoint_dir) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  validate_train_config(c, world, ConfigPurpose::eval);
  PB_REQUIRE(!checkpoint_dir.empty(), "eval: --checkpoint DIR is required");
  CollectiveWatchdog::global().set_step(0);
  const WatchdogRun watch_collectives(c, rank);
  // The model is the checkpoint's (its config.json), whatever the config's [model] says.
  const BertConfig model = read_hf_config(checkpoint_dir + "/config.json");
  TrainerOptions o = trainer_options(c, model);
  o.dropout = false;
  Trainer trainer(comm, o);
  std::vector<float> params(static_cast<size_t>(trainer.table().total()));
  load_model_weights(checkpoint_dir, trainer.table(), params.data());
  trainer.load_params(params.data());
  const EvalSet set = load_eval_set(c.data.eval_dir, sample_rules(c, model), c.eval.max_samples,
                                    rank, world);
  const EvalResult r = evaluate(comm, trainer, set, c.eval.batch_size,
                                static_cast<int>(model.max_position_embeddings));
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
