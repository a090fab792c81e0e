// The evaluations of `packbert train`: every eval.every_samples samples (and at the end), each
// logged to the MLPerf log, the log and the metrics file, with the MLPerf log's blocks of
// training between them; and the activation memory an evaluation forward may take, the same in
// `packbert eval`.
#pragma once

#include <optional>

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "config/train_config.h"
#include "model/replica.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/mllog.h"
#include "train/trainer.h"

namespace packbert {

// The MLPerf log's blocks: the training between two evaluations (first_epoch_num: the samples
// trained before it).
class MlperfBlocks {
 public:
  MlperfBlocks(MlLogger& ml, int64_t epoch_count) : ml_(ml), epoch_count_(epoch_count) {}
  void open(int64_t samples);
  void close();  // nothing when none is open

 private:
  MlLogger& ml_;
  int64_t epoch_count_;
  int64_t first_ = 0;
  bool open_ = false;
};

// What an evaluation forward may use: what training reserves (plan_bert_memory for
// TrainerOptions::reserve), so that `packbert eval` and the run split the evaluation batches
// alike (train/evaluate.h) and agree to the bit. None without a reserve.
std::optional<BertMemory> eval_limits(const ModelReplica& model, const TrainerOptions& o);

class Evaluations {
 public:
  // set: null when the run does not evaluate. samples: trained before the run started.
  Evaluations(MPI_Comm comm, const TrainConfig& c, Trainer& trainer, const EvalSet* set,
              MlLogger& ml, MetricsWriter& metrics, int64_t samples);

  bool enabled() const { return set_ != nullptr; }
  // Whether one is due after `samples`; the next is then scheduled past them.
  bool due(int64_t samples);
  bool ran_at(int64_t samples) const { return last_samples_ == samples; }
  double last_accuracy() const { return last_accuracy_; }  // < 0: none ran
  // Collective: evaluates the model after `step` (`samples` trained). Returns whether it
  // reached the target accuracy.
  bool run(int64_t step, int64_t samples);

 private:
  MPI_Comm comm_;
  const TrainConfig& c_;
  Trainer& trainer_;
  const EvalSet* set_;
  MlLogger& ml_;
  MetricsWriter& metrics_;
  std::optional<BertMemory> limits_;  // eval_limits of the trainer's model
  int64_t next_ = INT64_MAX;
  int64_t last_samples_ = -1;
  double last_accuracy_ = -1;
};

}  // namespace packbert
