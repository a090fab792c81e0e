// DataLoader: construction (shard list, sample counts), the loader thread and its queue,
// positions. The per-step pipeline is in loader_step.cpp.
#include "data/loader/loader.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "kernels/base/trace.h"
#include "data/loader/loader_internal.h"

namespace packbert {

using detail::LoaderCursor;
using detail::LoaderStopped;
using detail::StepProducer;

namespace {

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Over file names only, so a dataset moved to another directory still matches its positions.
uint64_t shards_hash(const std::vector<std::string>& shards, const std::vector<int64_t>* sizes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = std::filesystem::path(shards[i]).filename().string();
    h = fnv1a(h, name.data(), name.size() + 1);  // with the terminating 0: names stay apart
    if (sizes) h = fnv1a(h, &(*sizes)[i], sizeof(int64_t));
  }
  return h;
}

void check_options(const LoaderOptions& o) {
  PB_REQUIRE(o.global_batch_size >= 1, "data loader: global_batch_size must be >= 1, got {}",
             o.global_batch_size);
  PB_REQUIRE(o.micro_steps >= 1, "data loader: micro_steps must be >= 1, got {}", o.micro_steps);
  PB_REQUIRE(o.max_seq_len >= 2, "data loader: max_seq_len must be >= 2, got {}", o.max_seq_len);
  PB_REQUIRE(o.prefetch_steps >= 1, "data loader: prefetch_steps must be >= 1, got {}",
             o.prefetch_steps);
  PB_REQUIRE(o.read_ahead_windows >= 0, "data loader: read_ahead_windows must be >= 0, got {}",
             o.read_ahead_windows);
  check_batch_warmup(o.warmup, o.global_batch_size, "train.batch_warmup");
}

}  // namespace

const char* last_step_policy_name(LastStepPolicy p) {
  return p == LastStepPolicy::drop ? "drop" : "partial";
}

LastStepPolicy parse_last_step_policy(const std::string& name) {
  if (name == "partial") return LastStepPolicy::partial;
  if (name == "drop") return LastStepPolicy::drop;
  PB_THROW("unknown last step policy '{}' (expected partial or drop)", name);
}

bool LoaderPosition::operator==(const LoaderPosition& o) const {
  return epoch == o.epoch && epoch_cursor == o.epoch_cursor && step == o.step &&
         tokens == o.tokens && seed == o.seed && shuffle_block_rows == o.shuffle_block_rows &&
         shuffle_window_blocks == o.shuffle_window_blocks && num_shards == o.num_shards &&
         num_samples == o.num_samples && shards_hash == o.shards_hash;
}

std::string loader_position_to_json(const LoaderPosition& p) {
  nlohmann::ordered_json j;
  j["epoch"] = p.epoch;
  j["epoch_cursor"] = p.epoch_cursor;
  j["step"] = p.step;
  j["tokens"] = p.tokens;
  j["seed"] = p.seed;
  j["shuffle_block_rows"] = p.shuffle_block_rows;
  j["shuffle_window_blocks"] = p.shuffle_window_blocks;
  j["num_shards"] = p.num_shards;
  j["num_samples"] = p.num_samples;
  j["shards_hash"] = fmt::format("{:016x}", p.shards_hash);  // a string: JSON readers lose 64 bits
  return j.dump();
}

LoaderPosition loader_position_from_json(const std::string& json) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    LoaderPosition p;
    p.epoch = j.at("epoch").get<int64_t>();
    p.epoch_cursor = j.at("epoch_cursor").get<int64_t>();
    p.step = j.at("step").get<int64_t>();
    p.tokens = j.value("tokens", int64_t{-1});  // absent before batch warmups
    p.seed = j.at("seed").get<uint64_t>();
    p.shuffle_block_rows = j.at("shuffle_block_rows").get<int64_t>();
    p.shuffle_window_blocks = j.at("shuffle_window_blocks").get<int64_t>();
    p.num_shards = j.at("num_shards").get<int64_t>();
    p.num_samples = j.at("num_samples").get<int64_t>();
    p.shards_hash = std::stoull(j.at("shards_hash").get<std::string>(), nullptr, 16);
    return p;
  } catch (const std::exception& e) {
    PB_THROW("data loader position: cannot parse '{}': {}", json, e.what());
  }
}

int64_t StepBatch::num_samples() const {
  int64_t n = 0;
  for (const LoaderMicroBatch& mb : micro_batches) n += static_cast<int64_t>(mb.samples.size());
  return n;
}

struct DataLoader::Impl {
  LoaderOptions opt;
  std::vector<std::string> shards;
  std::unique_ptr<BlockLayout> layout;
  uint64_t hash = 0;
  std::atomic<bool> abandon{false};
  std::unique_ptr<LoaderComm> comm;
  std::unique_ptr<StepProducer> producer;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<StepBatch, LoaderPosition>> queue;  // batch, position after it
  bool stop_requested = false;
  bool finished = false;        // the thread has ended
  bool error_is_local = false;  // the thread failed on this rank alone (peers do not know)
  std::exception_ptr error;
  LoaderPosition delivered;  // after the last batch next() returned
  std::thread thread;

  LoaderPosition make_position(const LoaderCursor& c) const {
    LoaderPosition p;
    p.epoch = c.epoch;
    p.epoch_cursor = c.pos;
    p.step = c.step;
    p.tokens = c.tokens;
    p.seed = opt.seed;
    p.shuffle_block_rows = opt.shuffle_block_rows;
    p.shuffle_window_blocks = opt.shuffle_window_blocks;
    p.num_shards = layout->num_shards();
    p.num_samples = layout->num_samples();
    p.shards_hash = hash;
    return p;
  }

  void count_samples(const std::vector<std::string>& paths);
  void check_resume(const LoaderPosition& p) const;
  void run();
};

// Every rank lists the shards; shard i is opened (and its structure checked) by rank i % R,
// and the counts are allgathered with any failure, so a missing or damaged shard fails every
// rank here with its message.
void DataLoader::Impl::count_samples(const std::vector<std::string>& paths) {
  std::string failure;
  try {
    for (const std::string& p : paths) {
      const std::vector<std::string> found = list_shards(p);
      shards.insert(shards.end(), found.begin(), found.end());
    }
    std::sort(shards.begin(), shards.end());
    const auto dup = std::adjacent_find(shards.begin(), shards.end());
    PB_REQUIRE(dup == shards.end(), "data loader: shard {} is listed twice", *dup);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const int R = comm->size(), me = comm->rank();
  std::vector<int64_t> mine = {static_cast<int64_t>(shards_hash(shards, nullptr)),
                               static_cast<int64_t>(shards.size())};
  if (failure.empty()) {
    try {
      for (size_t i = static_cast<size_t>(me); i < shards.size(); i += static_cast<size_t>(R))
        mine.push_back(ShardReader(shards[i], opt.rules, 1).info().num_samples);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  std::vector<char> bytes(failure.begin(), failure.end());
  if (failure.empty()) {
    bytes.resize(mine.size() * sizeof(int64_t));
    std::memcpy(bytes.data(), mine.data(), bytes.size());
  }
  const std::vector<LoaderComm::Contribution> all =
      comm->gather_status(bytes, !failure.empty(), false);
  std::string errors;
  for (int r = 0; r < R; ++r)
    if (all[r].failed)
      errors += fmt::format("{}rank {}: {}", errors.empty() ? "" : "; ", r,
                            std::string(all[r].bytes.begin(), all[r].bytes.end()));
  if (!errors.empty()) PB_THROW("data loader: cannot open the shards: {}", errors);

  std::vector<int64_t> sizes(shards.size(), 0);
  for (int r = 0; r < R; ++r) {
    std::vector<int64_t> theirs(all[r].bytes.size() / sizeof(int64_t));
    std::memcpy(theirs.data(), all[r].bytes.data(), theirs.size() * sizeof(int64_t));
    PB_REQUIRE(theirs.size() >= 2 && theirs[0] == mine[0] && theirs[1] == mine[1],
               "data loader: rank {} sees other shards than rank {} ({} vs {} files): every "
               "rank must see the same shard list",
               r, me, theirs.size() >= 2 ? theirs[1] : -1, shards.size());
    for (size_t k = 2, i = static_cast<size_t>(r); k < theirs.size(); ++k, i += R)
      sizes[i] = theirs[k];
  }
  hash = shards_hash(shards, &sizes);
  layout = std::make_unique<BlockLayout>(std::move(sizes), opt.shuffle_block_rows);
  PB_REQUIRE(layout->num_samples() > 0, "data loader: the {} shards hold no sample", shards.size());
  PB_REQUIRE(
      opt.last_step != LastStepPolicy::drop || layout->num_samples() >= opt.global_batch_size,
      "data loader: the dataset has {} samples, fewer than one global batch of {} (with "
      "the drop policy no step would remain)",
      layout->num_samples(), opt.global_batch_size);
}

void DataLoader::Impl::check_resume(const LoaderPosition& p) const {
  const LoaderPosition here = make_position({});
  auto same = [](const char* what, auto saved, auto now) {
    PB_REQUIRE(saved == now,
               "data loader: cannot resume: the saved position has {} = {}, this "
               "run has {}",
               what, saved, now);
  };
  same("seed", p.seed, here.seed);
  same("shuffle_block_rows", p.shuffle_block_rows, here.shuffle_block_rows);
  same("shuffle_window_blocks", p.shuffle_window_blocks, here.shuffle_window_blocks);
  same("num_shards", p.num_shards, here.num_shards);
  same("num_samples", p.num_samples, here.num_samples);
  same("shards_hash (shard names and sizes)", p.shards_hash, here.shards_hash);
  PB_REQUIRE(p.epoch >= 0 && p.step >= 0 && p.epoch_cursor >= 0 && p.epoch_cursor <= p.num_samples,
             "data loader: cannot resume from epoch {}, cursor {}, step {} (the epoch has {} "
             "samples)",
             p.epoch, p.epoch_cursor, p.step, p.num_samples);
}

void DataLoader::Impl::run() {
  try {
    for (;;) {
      bool stop = false;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] {
          return abandon.load() || stop_requested ||
                 queue.size() < static_cast<size_t>(opt.prefetch_steps);
        });
        if (abandon.load()) break;
        stop = stop_requested;
      }
      StepBatch batch = producer->produce(stop);
      LoaderPosition after = make_position(producer->cursor());
      {
        std::lock_guard<std::mutex> lk(mu);
        queue.emplace_back(std::move(batch), after);
      }
      cv.notify_all();
    }
  } catch (const LoaderAbandoned&) {
  } catch (const LoaderStopped& s) {
    std::lock_guard<std::mutex> lk(mu);
    if (!stop_requested)
      error = std::make_exception_ptr(Error(fmt::format(
          "data loader: rank {} stopped its loader, so no more steps come (it is exiting)",
          s.rank)));
  } catch (const detail::CollectiveError&) {
    std::lock_guard<std::mutex> lk(mu);
    error = std::current_exception();
  } catch (...) {
    // Anything else (a broken invariant) is this rank's alone.
    std::lock_guard<std::mutex> lk(mu);
    error = std::current_exception();
    error_is_local = true;
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    finished = true;
  }
  cv.notify_all();
}

DataLoader::DataLoader(MPI_Comm comm, const std::vector<std::string>& shard_paths,
                       const LoaderOptions& options, const std::optional<LoaderPosition>& resume)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  check_options(options);
  PB_REQUIRE(!shard_paths.empty(), "data loader: no shard path given");
  m.opt = options;
  if (m.opt.rules.max_seq_len <= 0 || m.opt.rules.max_seq_len > m.opt.max_seq_len)
    m.opt.rules.max_seq_len = m.opt.max_seq_len;
  m.comm = std::make_unique<LoaderComm>(comm, &m.abandon);
  m.count_samples(shard_paths);
  LoaderCursor start;
  if (resume) {
    m.check_resume(*resume);
    PB_REQUIRE(resume->tokens >= 0 || m.opt.warmup.tokens == 0,
               "data loader: cannot resume a batch warmup in tokens from a position that does "
               "not record the tokens trained (a checkpoint older than the warmup)");
    start = {resume->epoch, resume->epoch_cursor, resume->step,
             std::max<int64_t>(0, resume->tokens)};
  }
  start = detail::normalize_cursor(start, m.layout->num_samples(), m.opt);
  m.delivered = m.make_position(start);
  m.producer = std::make_unique<StepProducer>(*m.comm, m.shards, *m.layout, m.opt, start);
  m.thread = std::thread([&m] { m.run(); });
}

DataLoader::~DataLoader() {
  Impl& m = *impl_;
  if (!m.thread.joinable()) return;
  if (std::uncaught_exceptions() > 0 && m.comm->size() > 1) {
    // Unwinding towards the top-level handler: do not wait for peers (they may wait for us in
    // a collective we will never reach); the handler's MPI_Abort ends everyone. (Alone, the
    // orderly stop below cannot block.)
    m.abandon.store(true);
    m.cv.notify_all();
    m.thread.join();
    // A collective may be left pending with MPI still holding pointers into the producer's
    // and the communicator's buffers: leak them rather than free memory MPI may still touch.
    m.producer->stop_reading();
    (void)m.producer.release();
    (void)m.comm.release();
    return;
  }
  {
    std::lock_guard<std::mutex> lk(m.mu);
    m.stop_requested = true;
  }
  m.cv.notify_all();
  m.thread.join();
  if (m.error && m.error_is_local && m.comm->size() > 1) {
    // The peers are (or will be) waiting for this rank in the loader's next collective and
    // nobody told them why; a normal return would leave them hanging.
    try {
      std::rethrow_exception(m.error);
    } catch (const std::exception& e) {
      std::cerr << "data loader: rank " << m.comm->rank() << " failed alone: " << e.what()
                << "; aborting all ranks" << std::endl;
    } catch (...) {
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

StepBatch DataLoader::next() {
  const trace::Range range("data_wait");
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(m.mu);
  m.cv.wait(lk, [&] { return !m.queue.empty() || m.finished; });
  if (m.queue.empty()) {
    if (m.error) std::rethrow_exception(m.error);
    PB_THROW("data loader: the loader has stopped");
  }
  StepBatch batch = std::move(m.queue.front().first);
  m.delivered = m.queue.front().second;
  m.queue.pop_front();
  lk.unlock();
  m.cv.notify_all();
  batch.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return batch;
}

LoaderPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->delivered;
}

const std::vector<std::string>& DataLoader::shards() const { return impl_->shards; }

int64_t DataLoader::num_samples() const { return impl_->layout->num_samples(); }

// At the full batch (a batch warmup's smaller steps come on top).
int64_t DataLoader::steps_per_epoch() const {
  const int64_t n = impl_->layout->num_samples(), b = impl_->opt.global_batch_size;
  return impl_->opt.last_step == LastStepPolicy::drop ? n / b : (n + b - 1) / b;
}

}  // namespace packbert
