#include "train/evaluations.h"

#include <spdlog/spdlog.h>

namespace packbert {

void MlperfBlocks::open(int64_t samples) {
  first_ = samples;
  open_ = true;
  ml_.start("block_start", nullptr, {{"first_epoch_num", samples}, {"epoch_count", epoch_count_}});
}

void MlperfBlocks::close() {
  if (open_) ml_.end("block_stop", nullptr, {{"first_epoch_num", first_}});
  open_ = false;
}

std::optional<BertMemory> eval_limits(const ModelReplica& model, const TrainerOptions& o) {
  if (o.reserve.rows <= 0) return std::nullopt;
  return plan_bert_memory(model.bert().config(), o.bert, model.bert().graphs_on(), 1,
                          BertReserve{o.reserve, o.layout, o.deferred_forwards});
}

Evaluations::Evaluations(MPI_Comm comm, const TrainConfig& c, Trainer& trainer, const EvalSet* set,
                         MlLogger& ml, MetricsWriter& metrics, int64_t samples)
    : comm_(comm),
      c_(c),
      trainer_(trainer),
      set_(set),
      ml_(ml),
      metrics_(metrics),
      limits_(eval_limits(trainer.replica(), trainer.options())) {
  const int64_t every = c.eval.every_samples;
  if (every > 0) next_ = (samples / every + 1) * every;
}

bool Evaluations::due(int64_t samples) {
  if (!set_ || samples < next_) return false;
  while (next_ <= samples) next_ += c_.eval.every_samples;
  return true;
}

bool Evaluations::run(int64_t step, int64_t samples) {
  last_samples_ = samples;
  ml_.start("eval_start", nullptr, {{"epoch_num", samples}});
  const EvalResult r = evaluate(comm_, trainer_.replica(), *set_, c_.eval.batch_size,
                                c_.train.max_seq_len, limits_ ? &*limits_ : nullptr);
  ml_.event("eval_accuracy", r.mlm_accuracy, {{"epoch_num", samples}});
  ml_.end("eval_stop", nullptr, {{"epoch_num", samples}});
  spdlog::info(
      "eval at step {} ({} samples): mlm accuracy {:.4f}, mlm loss {:.4f}{} over {} samples / {} "
      "masked tokens in {:.1f} s",
      step, samples, r.mlm_accuracy, r.mlm_loss,
      format_nsp_accuracy(r.nsp_accuracy, c_.model.nsp_head), r.samples, r.masked_tokens,
      r.seconds);
  metrics_.write({{"event", "eval"},
                  {"step", step},
                  {"samples", samples},
                  {"eval_accuracy", r.mlm_accuracy},
                  {"eval_loss", r.mlm_loss},
                  {"eval_nsp_accuracy", r.nsp_accuracy},
                  {"eval_samples", r.samples},
                  {"eval_masked_tokens", r.masked_tokens}});
  last_accuracy_ = r.mlm_accuracy;
  return c_.eval.target_accuracy > 0 && r.mlm_accuracy >= c_.eval.target_accuracy;
}

}  // namespace packbert
