// The parts of `packbert train` that run_train (run_train.cpp: the step loop, start to end)
// puts together, each file a job: the run's setup (run_setup.cpp: stop signals, the collective
// watchdog, the memory plan, the effective config) and the run's state (run_state.cpp: where a
// run starts, fresh, from weights or from a checkpoint, and the checkpoints it writes). Only
// those three files include it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "config/train_config.h"
#include "core/watchdog.h"
#include "data/loader/loader.h"
#include "train/trainer.h"

namespace packbert::train_run {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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

// run_setup.cpp

// The signal that asked the run to stop (SIGTERM, SIGINT, SIGUSR1), 0 while none has.
int stop_signal();

// Whether any rank has received a stop signal: collective, so that all stop after the same step.
bool stop_requested(MPI_Comm comm);

// The collective watchdog's action: every rank ends (mpirun reports the exit code). Its MPI
// calls are unchecked: this is the error path, on the watchdog's thread, with nothing above it
// to throw to; _Exit follows whatever they return.
void abort_job(const std::string&);

// Watches the run's collectives (core/watchdog.h) from construction to the end of the scope.
struct WatchdogRun {
  WatchdogRun(const TrainConfig& c, int rank) {
    CollectiveWatchdog::global().configure(c.train.collective_timeout_s, rank, abort_job);
  }
  ~WatchdogRun() { CollectiveWatchdog::global().stop(); }
  WatchdogRun(const WatchdogRun&) = delete;
  WatchdogRun& operator=(const WatchdogRun&) = delete;
};

// Rank 0 logs the config the run uses, every key, as TOML.
void log_effective_config(const TrainConfig& c, int rank);

// The memory plan (train/memory_plan.h) against this rank's device, before anything is
// allocated or loaded. On CUDA a shortfall on any rank stops every rank with the plan's table
// and its knobs; on the CPU it is a warning. Returns the plan's figure for this rank's buffers.
size_t check_memory_plan(MPI_Comm comm, const TrainConfig& c, const TrainerOptions& o, int rank,
                         int world);

// run_state.cpp

// The state the run starts from (collective): a whole checkpoint (checkpoint.resume, "auto" the
// newest that reads back whole), the model weights of checkpoint.init_checkpoint, or nothing
// (train.seed's initialisation, already in the trainer). What it loads is in the trainer.
StartState load_start_state(MPI_Comm comm, const TrainConfig& c, Trainer& trainer);

// A checkpoint of the run at `st` under checkpoint.dir (none when that is unset). Collective:
// rank 0 writes it, after a sharded optimizer has gathered its state there. Returns its
// directory on rank 0 ("" elsewhere and when none is written).
std::string save_checkpoint(MPI_Comm comm, const TrainConfig& c, Trainer& trainer,
                            const RunState& st, const DataLoader& loader);

}  // namespace packbert::train_run
