#include "train/evaluate.h"

#include <algorithm>
#include <chrono>

#include "kernels/base/error.h"
#include "data/shards/shard.h"
#include "comm/metric_sums.h"
#include "train/batching.h"

namespace packbert {

EvalSet load_eval_set(const std::string& eval_dir, const SampleRules& given, int64_t max_samples,
                      int rank, int world_size) {
  PB_REQUIRE(max_samples >= 0, "eval: max_samples {} must be >= 0", max_samples);
  SampleRules rules = given;
  rules.needs_masks = true;  // evaluation reads the shards' masks, whatever training does
  const std::vector<std::string> shards = list_shards(eval_dir);
  // Count first (cheap: shard headers), to know the whole set and this rank's range.
  std::vector<int64_t> counts;
  int64_t available = 0;
  for (const std::string& path : shards) {
    ShardReader reader(path, rules);
    counts.push_back(reader.info().num_samples);
    available += counts.back();
  }
  EvalSet set;
  set.total = max_samples > 0 ? std::min(max_samples, available) : available;
  PB_REQUIRE(set.total > 0, "eval: {} holds no samples", eval_dir);
  const int64_t begin = set.total * rank / world_size, end = set.total * (rank + 1) / world_size;
  int64_t first = 0;  // global index of the current shard's row 0
  for (size_t i = 0; i < shards.size() && first < end; ++i) {
    const int64_t lo = std::max(begin, first), hi = std::min(end, first + counts[i]);
    if (lo < hi) {
      ShardReader reader(shards[i], rules);
      const size_t before = set.samples.size();
      reader.read_range(lo - first, hi - first, set.samples);
      for (size_t k = before; k < set.samples.size(); ++k)
        set.samples[k].id = lo + static_cast<int64_t>(k - before);
    }
    first += counts[i];
  }
  return set;
}

EvalSums& EvalSums::operator+=(const EvalSums& o) {
  mlm_loss_sum += o.mlm_loss_sum;
  nsp_loss_sum += o.nsp_loss_sum;
  mlm_correct += o.mlm_correct;
  nsp_correct += o.nsp_correct;
  masked_tokens += o.masked_tokens;
  samples += o.samples;
  return *this;
}

EvalSums evaluate_batch(Bert& bert, const Batch& batch) {
  EvalSums out;
  if (batch.empty()) return out;
  ForwardOptions eval;
  eval.dropout = false;
  eval.gradients = false;
  // The normalisers only scale the loss (not returned here) and the unused gradients.
  const ForwardResult r =
      bert.forward(batch, std::max<int64_t>(1, batch.num_masked()), batch.num_seqs(), 0, 0, eval);
  out.mlm_loss_sum = r.mlm_loss_sum;
  out.nsp_loss_sum = r.nsp_loss_sum;
  out.mlm_correct = r.mlm_correct;
  out.nsp_correct = r.nsp_correct;
  out.masked_tokens = r.masked_tokens;
  out.samples = r.sequences;
  return out;
}

namespace {

// samples[first, last) in as few forwards as fit `limits`: the whole range, or its two halves,
// each split the same way.
void evaluate_range(Bert& bert, const std::vector<Sample>& samples, size_t first, size_t last,
                    int max_seq_len, const BertMemory* limits, EvalSums& sums) {
  const std::vector<Sample> chunk(samples.begin() + static_cast<std::ptrdiff_t>(first),
                                  samples.begin() + static_cast<std::ptrdiff_t>(last));
  const Batch batch = make_batch(chunk, BatchLayout::unpadded, max_seq_len);
  if (limits && last - first > 1 &&
      !bert.fits(*limits, batch.shape(), BatchLayout::unpadded, /*gradients=*/false)) {
    const size_t mid = first + (last - first) / 2;
    evaluate_range(bert, samples, first, mid, max_seq_len, limits, sums);
    evaluate_range(bert, samples, mid, last, max_seq_len, limits, sums);
    return;
  }
  sums += evaluate_batch(bert, batch);
}

}  // namespace

EvalResult evaluate(MPI_Comm comm, ModelReplica& model, const EvalSet& set, int64_t batch_size,
                    int max_seq_len, const BertMemory* limits) {
  PB_REQUIRE(batch_size >= 1, "eval: batch_size {} must be >= 1", batch_size);
  const auto t0 = std::chrono::steady_clock::now();
  EvalSums sums;
  for (size_t first = 0; first < set.samples.size(); first += static_cast<size_t>(batch_size)) {
    const size_t last = std::min(set.samples.size(), first + static_cast<size_t>(batch_size));
    evaluate_range(model.bert(), set.samples, first, last, max_seq_len, limits, sums);
  }
  double v[6] = {sums.mlm_loss_sum,
                 sums.nsp_loss_sum,
                 static_cast<double>(sums.mlm_correct),
                 static_cast<double>(sums.nsp_correct),
                 static_cast<double>(sums.masked_tokens),
                 static_cast<double>(sums.samples)};
  MetricSums(comm).sum(v, 6, "MPI_Allreduce (evaluation)");
  EvalResult r;
  r.masked_tokens = static_cast<int64_t>(v[4]);
  r.samples = static_cast<int64_t>(v[5]);
  PB_REQUIRE(r.samples == set.total, "eval: the ranks evaluated {} samples of {}", r.samples,
             set.total);
  r.mlm_accuracy = r.masked_tokens > 0 ? v[2] / v[4] : 0.0;
  r.mlm_loss = r.masked_tokens > 0 ? v[0] / v[4] : 0.0;
  r.nsp_accuracy = v[3] / v[5];
  r.nsp_loss = v[1] / v[5];
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace packbert
