#include "train/evaluate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/watchdog.h"
#include "data/shards/shard.h"
#include "comm/mpi_check.h"
#include "train/batching.h"

namespace packbert {

EvalSet load_eval_set(const std::string& eval_dir, const SampleRules& rules, int64_t max_samples,
                      int rank, int world_size) {
  PB_REQUIRE(max_samples >= 0, "eval: max_samples {} must be >= 0", max_samples);
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

EvalResult evaluate(MPI_Comm comm, Trainer& trainer, const EvalSet& set, int64_t batch_size,
                    int max_seq_len) {
  PB_REQUIRE(batch_size >= 1, "eval: batch_size {} must be >= 1", batch_size);
  const auto t0 = std::chrono::steady_clock::now();
  EvalSums sums;
  std::vector<Sample> chunk;
  for (size_t first = 0; first < set.samples.size(); first += static_cast<size_t>(batch_size)) {
    const size_t last = std::min(set.samples.size(), first + static_cast<size_t>(batch_size));
    chunk.assign(set.samples.begin() + static_cast<std::ptrdiff_t>(first),
                 set.samples.begin() + static_cast<std::ptrdiff_t>(last));
    sums += trainer.evaluate(make_batch(chunk, BatchLayout::unpadded, max_seq_len));
  }
  double v[6] = {sums.mlm_loss_sum, sums.nsp_loss_sum, static_cast<double>(sums.mlm_correct),
                 static_cast<double>(sums.nsp_correct), static_cast<double>(sums.masked_tokens),
                 static_cast<double>(sums.samples)};
  {
    const WatchScope watch("MPI_Allreduce (evaluation)");
    PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_DOUBLE, MPI_SUM, comm));
  }
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
