// Evaluation over the eval shard(s): masked-LM accuracy and loss, exactly counted.
//
// The eval set is the first max_samples samples (all when 0) of the shards under eval_dir in
// sorted-path order; rank r of P holds the contiguous range [r*N/P, (r+1)*N/P) of them, read
// once and kept. evaluate() runs every rank's share through the model without dropout and
// without gradients and sums the counts over the ranks: accuracy = sum(correct) / sum(masked),
// loss = sum(token losses) / sum(masked), the same numbers whatever the rank count, layout or
// batch size (up to fp32 summation order of the loss).
//
// The model is a ModelReplica (model/replica.h): the trainer's between steps, or one of its own
// without gradients for `packbert eval`. Evaluation runs within `limits`, what training reserves
// (plan_bert_memory): a batch whose forward would need more is split in halves (recursively, the
// same way on every call), so an evaluation during training allocates nothing, and the split
// depends only on the data, batch_size and the config.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/shards/sample.h"
#include "model/batch.h"
#include "model/replica.h"

namespace packbert {

struct EvalSet {
  std::vector<Sample> samples;  // this rank's share; Sample::id = index in the whole eval set
  int64_t total = 0;            // samples of the whole eval set, all ranks
};

// Collective only in the sense that every rank reads the shard list itself. Errors (missing
// directory, a bad sample) name the shard and the sample index.
EvalSet load_eval_set(const std::string& eval_dir, const SampleRules& rules, int64_t max_samples,
                      int rank, int world_size);

// Sums of an evaluation forward over one batch (no dropout, no gradients).
struct EvalSums {
  double mlm_loss_sum = 0;
  double nsp_loss_sum = 0;
  int64_t mlm_correct = 0;
  int64_t nsp_correct = 0;
  int64_t masked_tokens = 0;
  int64_t samples = 0;
  EvalSums& operator+=(const EvalSums& o);
};

// Evaluation forward of one batch on this rank (nothing reduced).
EvalSums evaluate_batch(Bert& bert, const Batch& batch);

struct EvalResult {
  double mlm_accuracy = 0;  // correct / masked tokens, all ranks
  double mlm_loss = 0;      // mean masked-token loss
  double nsp_accuracy = 0;
  double nsp_loss = 0;
  int64_t masked_tokens = 0;
  int64_t samples = 0;
  double seconds = 0;
};

// Collective over comm. batch_size: samples per forward on each rank (fewer where a batch of
// them would not fit `limits`; null: no limit).
EvalResult evaluate(MPI_Comm comm, ModelReplica& model, const EvalSet& set, int64_t batch_size,
                    int max_seq_len, const BertMemory* limits);

}  // namespace packbert
