// `packbert train` and `packbert eval`: the trainer as people run it.
//
// run_train, on every rank (DESIGN.md, "Data flow of one step" for what a step does):
//   validate the config (errors name the key) -> log the effective config
//   init: the model from train.seed (identical on every rank), or the weights of
//         checkpoint.init_checkpoint, or the whole state of checkpoint.resume
//   the data loader (resumed at the checkpoint's loader position), the eval set
//   loop until train.max_steps, the eval target, or SIGTERM/SIGINT:
//     one optimizer step (train/trainer.h); a non-finite gradient skips the update and is
//     counted, too many in a row abort
//     every log.every_steps: the progress line, a metrics record
//     every eval.every_samples samples: evaluate (train/evaluate.h); stop at the target
//     every checkpoint.every_steps: a checkpoint (rank 0 writes; train/checkpoint.h)
//   at the end: evaluation (eval.at_end), a checkpoint, MLPerf run_stop
//
// Exact resume: a checkpoint holds everything the run's future depends on. Dropout masks are a
// function of (train.seed, step, sample id), the data order of (train.seed, epoch), LAMB's of
// its moments and step count, so a run stopped at any step and resumed computes bitwise the
// same losses as one that never stopped (on the CPU backend, with the same rank count).
//
// Signals: SIGTERM, SIGINT and SIGUSR1 set a flag; at the end of the step in flight the ranks
// agree (one all-reduce per step) to stop, write a checkpoint when checkpoint.dir is set, and
// return 0. Whatever ended the run, rank 0 then writes log.end_file (train/metrics.h RunEnd).
#pragma once

#include <mpi.h>

#include <string>

#include "config/train_config.h"

namespace packbert {

// Returns the process exit code (0: finished, target reached, or stopped by a signal after
// checkpointing). Errors throw (the top-level handler aborts every rank).
int run_train(MPI_Comm comm, const TrainConfig& config);

// Evaluates the model weights of a checkpoint directory (its config.json gives the model) on
// data.eval_dir, eval.max_samples samples; prints the result (rank 0) and returns 0.
int run_eval(MPI_Comm comm, const TrainConfig& config, const std::string& checkpoint_dir);

// Installs the SIGTERM / SIGINT / SIGUSR1 handlers (run_train does it; exposed for tests).
void install_stop_signal_handlers();

}  // namespace packbert
