// One run per checkpoint directory (docs/training.md, Checkpoints):
//   - the run holds an advisory lock on <dir>/.packbert.lock (flock) for its life; another run
//     that finds it held refuses, naming the holder (host, pid, start time, Slurm job). The
//     kernel drops the lock with the process, so a killed run never blocks the next one;
//   - a run that does not continue a checkpoint of <dir> refuses a <dir> that holds checkpoints
//     (damaged ones set aside included), unless checkpoint.overwrite, which deletes them first;
//   - a resume lists, in one warning, every config key that differs from the checkpoint's.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace packbert {

// The flock on <dir>/.packbert.lock, released when destroyed (or when the process ends).
class CheckpointDirLock {
 public:
  // Takes the lock without waiting (dir must exist) and records this process in the file (host,
  // pid, start time, Slurm job). Error naming the lock file and the holder when another process
  // holds it. When the file system cannot lock (NFS without a lock daemon, Lustre mounted
  // without flock: ENOLCK, ENOSYS, EOPNOTSUPP), a warning naming the reason, and held() is
  // false: the run goes on without the lock.
  explicit CheckpointDirLock(const std::string& dir);
  // The same on a lock file that exists, writing nothing: null when dir has no lock file. A run
  // takes this before it decides whether it may use dir, and records itself (record()) only
  // once it may, so that a refused run leaves the file naming the run it names.
  static std::unique_ptr<CheckpointDirLock> existing(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  // Writes this process's line into the lock file (when the lock is held).
  void record();
  bool held() const { return fd_ >= 0 && held_; }
  static std::string path(const std::string& dir);  // dir/.packbert.lock

 private:
  CheckpointDirLock(const std::string& dir, bool create);

  int fd_ = -1;
  bool held_ = false;
};

// Names (not paths) of the checkpoints under dir a fresh run must not write beside, oldest step
// first: every step_NNNNNNNN directory, complete or not, and every one set aside as damaged
// (step_NNNNNNNN.corrupt*). Empty when dir does not exist.
std::vector<std::string> checkpoints_in(const std::string& dir);

// Whether the run continues a checkpoint of checkpoint.dir: checkpoint.resume is "auto", or a
// checkpoint directly under checkpoint.dir.
bool continues_checkpoint_dir(const TrainConfig::Checkpoint& k);

// Collective over comm, before any data is loaded; nothing when checkpoint.dir is "". Rank 0
// creates checkpoint.dir, takes its lock, and, when the run does not continue one of its
// checkpoints, refuses one that holds checkpoints (naming the newest and the three ways on) or,
// with checkpoint.overwrite, deletes them. A refused run writes nothing in checkpoint.dir: the
// refusal comes before the lock file is made or records this run. Every rank throws the same
// Error when rank 0 refuses. Returns the lock on rank 0 (null elsewhere): keep it for the run's
// life.
std::unique_ptr<CheckpointDirLock> claim_checkpoint_dir(MPI_Comm comm,
                                                        const TrainConfig::Checkpoint& k);

// A config key whose value differs between two effective configs (TOML).
struct ConfigChange {
  std::string key;     // "optim.lr"
  std::string before;  // the TOML value, or "(absent)"
  std::string after;
};
// Every key of `before` or `after` (each a config as train_config_to_toml writes it) whose value
// differs, in `after`'s order then `before`'s, leaving out the keys that say how a run starts
// rather than what it trains (checkpoint.resume, checkpoint.overwrite). Error when either text is
// not TOML.
std::vector<ConfigChange> config_changes(const std::string& before, const std::string& after);
// "optim.lr 0.002 -> 0.001; train.precision "fp32" -> "bf16"".
std::string describe(const std::vector<ConfigChange>& changes);

}  // namespace packbert
