// One step of the data loader thread: read -> gather -> plan -> exchange (see loader.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "kernels/base/error.h"
#include "data/loader/loader_internal.h"

namespace packbert::detail {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Candidates travel as raw bytes in the gather.
static_assert(sizeof(Candidate) == 16 && std::is_trivially_copyable_v<Candidate>,
              "Candidate must be 16 plain bytes");

}  // namespace

LoaderCursor normalize_cursor(LoaderCursor c, int64_t num_samples, const LoaderOptions& o) {
  const int64_t left = num_samples - c.pos;
  if (left <= 0 || (o.last_step == LastStepPolicy::drop && left < batch_at(c, o))) {
    ++c.epoch;
    c.pos = 0;
  }
  return c;
}

StepProducer::StepProducer(LoaderComm& comm, const std::vector<std::string>& shards,
                           const BlockLayout& layout, const LoaderOptions& options,
                           LoaderCursor start)
    : comm_(comm),
      layout_(layout),
      opt_(options),
      cursor_(normalize_cursor(start, layout.num_samples(), options)),
      prefetcher_(shards, layout, options, comm.rank(), comm.size(), cursor_) {
  planner_.num_ranks = comm.size();
  planner_.micro_steps = opt_.micro_steps;
  planner_.packing.max_seq_len = opt_.max_seq_len;
  planner_.packing.max_seqs_per_pack = opt_.max_seqs_per_pack;
  planner_.cost = opt_.cost;
  planner_.method = opt_.balance;
  planner_.search_budget = opt_.search_budget;
  planner_.pack_rank = comm.rank();  // packing is per rank: only our own packs are needed
}

Sample& StepProducer::loaded_sample(int64_t id) {
  const int64_t b = layout_.block_of(id);
  const int64_t w = order_->window_of_block(b) - first_window_;
  PB_CHECK(w >= 0 && w < static_cast<int64_t>(windows_.size()),
           "sample {} (shard {}, row {}) is outside the step's windows", id, sample_id_shard(id),
           sample_id_row(id));
  const auto it = windows_[static_cast<size_t>(w)]->blocks.find(b);
  PB_CHECK(it != windows_[static_cast<size_t>(w)]->blocks.end(),
           "sample {} (shard {}, row {}) is not loaded", id, sample_id_shard(id),
           sample_id_row(id));
  return it->second.rows[static_cast<size_t>(sample_id_row(id) - it->second.begin)];
}

std::vector<Candidate> StepProducer::gather_candidates(const std::vector<int64_t>& ids,
                                                       const std::string& read_error, bool stop) {
  const int me = comm_.rank();
  const bool failed = !stop && !read_error.empty();
  std::vector<char> bytes;
  if (failed) {
    bytes.assign(read_error.begin(), read_error.end());
  } else if (!stop) {
    std::vector<Candidate> mine;
    for (const int64_t id : ids) {
      if (owner_[sample_id_shard(id)] != me) continue;
      const Sample& s = loaded_sample(id);
      mine.push_back(Candidate{id, s.length(), s.num_masked()});
    }
    bytes.resize(mine.size() * sizeof(Candidate));
    if (!mine.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  }
  const std::vector<LoaderComm::Contribution> all = comm_.gather_status(bytes, failed, stop);
  if (stop) throw LoaderStopped{me};

  std::string errors;
  for (int r = 0; r < comm_.size(); ++r)
    if (all[r].failed)
      errors += fmt::format("{}rank {}: {}", errors.empty() ? "" : "; ", r,
                            std::string(all[r].bytes.begin(), all[r].bytes.end()));
  if (!errors.empty())
    throw CollectiveError(fmt::format("data loader: step {} (epoch {}) failed: {}", cursor_.step,
                                      cursor_.epoch, errors));
  for (int r = 0; r < comm_.size(); ++r)
    if (all[r].stop) throw LoaderStopped{r};

  // Every rank sent the candidates it owns in order-position order; interleave them back.
  std::vector<Candidate> out(ids.size());
  std::vector<size_t> offset(static_cast<size_t>(comm_.size()), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int o = owner_[sample_id_shard(ids[i])];
    const std::vector<char>& b = all[o].bytes;
    PB_CHECK(offset[o] + sizeof(Candidate) <= b.size(), "rank {} sent too few candidates", o);
    std::memcpy(&out[i], b.data() + offset[o], sizeof(Candidate));
    offset[o] += sizeof(Candidate);
    PB_CHECK(out[i].sample_id == ids[i], "rank {} sent candidate {} where {} was expected", o,
             out[i].sample_id, ids[i]);
  }
  for (int r = 0; r < comm_.size(); ++r)
    PB_CHECK(offset[r] == all[r].bytes.size(), "rank {} sent {} candidate bytes, {} used", r,
             all[r].bytes.size(), offset[r]);
  return out;
}

void StepProducer::exchange(const StepPlan& plan, StepBatch& out) {
  const int me = comm_.rank(), R = comm_.size();
  auto owner_of = [&](const Candidate& c) { return owner_[sample_id_shard(c.sample_id)]; };
  auto bytes_of = [](const Candidate& c) {
    return static_cast<int64_t>(encoded_sample_bytes(c.length, c.masked_count));
  };

  // Outgoing: for each other rank, its samples we own, in its plan order (the receiver
  // decodes in the same order). Encoded samples are freed at once.
  std::vector<int64_t> send_counts(R, 0), recv_counts(R, 0);
  for (int d = 0; d < R; ++d) {
    if (d == me) continue;
    for (const MicroBatch& mb : plan.ranks[d].micro_batches)
      for (const Candidate& c : mb.samples)
        if (owner_of(c) == me) send_counts[d] += bytes_of(c);
  }
  int64_t send_total = 0;
  for (const int64_t n : send_counts) send_total += n;
  // The buffers only grow: resizing down and up again would zero-fill them every step.
  if (send_.size() < static_cast<size_t>(send_total)) send_.resize(static_cast<size_t>(send_total));
  char* put = send_.data();
  for (int d = 0; d < R; ++d) {
    if (d == me) continue;
    for (const MicroBatch& mb : plan.ranks[d].micro_batches)
      for (const Candidate& c : mb.samples) {
        if (owner_of(c) != me) continue;
        Sample& s = loaded_sample(c.sample_id);
        put = encode_sample(s, put);
        s = Sample{};
      }
  }
  const RankPlan& mine = plan.ranks[me];
  for (const MicroBatch& mb : mine.micro_batches)
    for (const Candidate& c : mb.samples)
      if (owner_of(c) != me) recv_counts[owner_of(c)] += bytes_of(c);
  int64_t recv_total = 0;
  std::vector<const char*> from(R), from_end(R);
  for (int r = 0; r < R; ++r) recv_total += recv_counts[r];
  if (recv_.size() < static_cast<size_t>(recv_total)) recv_.resize(static_cast<size_t>(recv_total));
  int64_t at = 0;
  for (int r = 0; r < R; at += recv_counts[r], ++r) {
    from[r] = recv_.data() + at;
    from_end[r] = from[r] + recv_counts[r];
  }

  comm_.alltoallv(send_, send_counts, recv_, recv_counts);

  out.micro_batches.resize(mine.micro_batches.size());
  for (size_t m = 0; m < mine.micro_batches.size(); ++m) {
    const MicroBatch& mb = mine.micro_batches[m];
    LoaderMicroBatch& lm = out.micro_batches[m];
    lm.samples.resize(mb.samples.size());
    for (size_t i = 0; i < mb.samples.size(); ++i) {
      const Candidate& c = mb.samples[i];
      Sample& s = lm.samples[i];
      const int o = owner_of(c);
      if (o == me)
        s = std::move(loaded_sample(c.sample_id));
      else
        from[o] = decode_sample(from[o], from_end[o], s);
      PB_CHECK(s.id == c.sample_id && s.length() == c.length && s.num_masked() == c.masked_count,
               "rank {} delivered sample {} (length {}, {} masked) for {} ({}, {})", o, s.id,
               s.length(), s.num_masked(), c.sample_id, c.length, c.masked_count);
    }
    lm.packs.reserve(mb.packs.size());
    for (const std::vector<int64_t>& pack : mb.packs) {
      std::vector<int32_t> idx;
      idx.reserve(pack.size());
      for (const int64_t id : pack) {
        const auto it =
            std::lower_bound(mb.samples.begin(), mb.samples.end(), id,
                             [](const Candidate& c, int64_t v) { return c.sample_id < v; });
        PB_CHECK(it != mb.samples.end() && it->sample_id == id, "pack sample {} not in batch", id);
        idx.push_back(static_cast<int32_t>(it - mb.samples.begin()));
      }
      lm.packs.push_back(std::move(idx));
    }
    lm.tokens = mb.tokens;
    lm.masked_tokens = mb.masked_tokens;
    lm.cost = mb.cost;
  }
  for (int r = 0; r < R; ++r)
    PB_CHECK(from[r] == from_end[r], "rank {} sent {} payload bytes more than planned", r,
             from_end[r] - from[r]);
}

StepBatch StepProducer::produce(bool stop) {
  comm_.set_step(cursor_.step + 1);  // the watchdog's name for this step's collectives
  if (!order_ || cursor_.epoch != order_->epoch()) {
    order_ =
        std::make_unique<EpochOrder>(layout_, opt_.seed, opt_.shuffle_window_blocks, cursor_.epoch);
    owner_ = assign_shard_owners(layout_.shard_sizes(), comm_.size(), opt_.seed, cursor_.epoch);
  }
  if (stop) gather_candidates({}, "", true);  // throws LoaderStopped

  const int64_t n = layout_.num_samples();
  const int64_t begin = cursor_.pos, end = std::min(begin + batch_at(cursor_, opt_), n);
  StepBatch out;
  out.step = cursor_.step;
  out.epoch = cursor_.epoch;
  out.epoch_begin = begin;
  out.epoch_end = end;

  Clock::time_point t0 = Clock::now();
  first_window_ = order_->window_of_position(begin);
  std::string read_error;
  windows_ = prefetcher_.wait(cursor_.epoch, first_window_, order_->window_of_position(end - 1),
                              read_error);
  out.times.read = seconds_since(t0);
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(end - begin));
  order_->samples(begin, end, ids);

  t0 = Clock::now();
  const std::vector<Candidate> candidates = gather_candidates(ids, read_error, false);
  out.times.gather = seconds_since(t0);

  t0 = Clock::now();
  StepPlan plan;
  try {
    plan = plan_step(candidates, planner_);  // same input, same plan on every rank
  } catch (const Error& e) {
    throw CollectiveError(e.what());  // so it fails every rank alike
  }
  out.times.plan = seconds_since(t0);
  out.global_samples = plan.global_samples;
  out.global_masked_tokens = plan.global_masked_tokens;
  out.global_tokens = plan.global_tokens;
  out.global_lengths.reserve(candidates.size());
  for (const Candidate& c : candidates) out.global_lengths.push_back(c.length);
  out.imbalance = plan.imbalance();

  t0 = Clock::now();
  exchange(plan, out);
  out.times.exchange = seconds_since(t0);
  cursor_ = normalize_cursor(
      {cursor_.epoch, end, cursor_.step + 1, cursor_.tokens + plan.global_tokens}, n, opt_);
  // Windows before the next step's first one are done (their samples were moved out).
  windows_.clear();
  prefetcher_.release_before(cursor_.epoch, cursor_.epoch == order_->epoch()
                                                ? order_->window_of_position(cursor_.pos)
                                                : 0);
  return out;
}

}  // namespace packbert::detail
