// The loader's reader thread: this rank's blocks, window by window, ahead of the steps.
#include <algorithm>

#include "kernels/base/error.h"
#include "data/loader/loader_internal.h"

namespace packbert::detail {

BlockPrefetcher::BlockPrefetcher(const std::vector<std::string>& shards, const BlockLayout& layout,
                                 const LoaderOptions& options, int rank, int num_ranks,
                                 LoaderCursor start)
    : shards_(shards),
      layout_(layout),
      opt_(options),
      rank_(rank),
      num_ranks_(num_ranks),
      windows_per_epoch_((layout.num_blocks() + options.shuffle_window_blocks - 1) /
                         options.shuffle_window_blocks) {
  const EpochOrder order(layout_, opt_.seed, opt_.shuffle_window_blocks, start.epoch);
  requested_ = seq(start.epoch, order.window_of_position(start.pos));
  thread_ = std::thread([this, start] { run(start); });
}

BlockPrefetcher::~BlockPrefetcher() { stop(); }

void BlockPrefetcher::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<BlockPrefetcher::Window> BlockPrefetcher::read_window(
    int64_t epoch, const EpochOrder& order, const std::vector<int32_t>& owner, int64_t w) {
  auto win = std::make_unique<Window>();
  MaskScratch scratch;
  for (const int64_t b : order.window_blocks(w)) {
    const BlockLayout::Block blk = layout_.block(b);
    if (owner[blk.shard] != rank_) continue;
    std::unique_ptr<ShardReader>& reader = readers_[blk.shard];
    if (!reader) {
      // The reader's window is one block: a block is one hyperslab read per dataset.
      const int chunk = static_cast<int>(std::min<int64_t>(layout_.block_rows(), 1 << 20));
      reader = std::make_unique<ShardReader>(shards_[blk.shard], opt_.rules, chunk);
      PB_REQUIRE(reader->info().num_samples == layout_.shard_sizes()[blk.shard],
                 "shard {}: holds {} samples now but {} when the data loader started (was it "
                 "rewritten during training?)",
                 shards_[blk.shard], reader->info().num_samples, layout_.shard_sizes()[blk.shard]);
    }
    LoadedBlock& lb = win->blocks[b];
    lb.begin = blk.begin;
    reader->read_range(blk.begin, blk.end, lb.rows);
    for (size_t i = 0; i < lb.rows.size(); ++i) {  // readers number rows; we need global ids
      Sample& s = lb.rows[i];
      s.id = make_sample_id(blk.shard, blk.begin + static_cast<int64_t>(i));
      if (opt_.masking)
        mask_dynamic(opt_.masking->rule, opt_.masking->vocab, opt_.seed,
                     static_cast<uint64_t>(epoch), static_cast<uint64_t>(s.id), s, scratch);
    }
  }
  return win;
}

void BlockPrefetcher::run(LoaderCursor start) {
  int64_t epoch = start.epoch;
  auto order = std::make_unique<EpochOrder>(layout_, opt_.seed, opt_.shuffle_window_blocks, epoch);
  std::vector<int32_t> owner =
      assign_shard_owners(layout_.shard_sizes(), num_ranks_, opt_.seed, epoch);
  int64_t w = order->window_of_position(start.pos);
  // Every window of an epoch, the drop policy's tail too: where a step ends depends on the sizes
  // of the steps before it (a batch warmup, a resume with another batch size), and a tail read
  // for nothing is released with the epoch.
  const int64_t last = order->window_of_position(layout_.num_samples() - 1);
  for (;;) {
    const int64_t s = seq(epoch, w);
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || s <= requested_ + opt_.read_ahead_windows; });
      if (stop_) return;
    }
    std::unique_ptr<Window> win;
    try {
      win = read_window(epoch, *order, owner, w);
    } catch (const std::exception& e) {
      // Reported by the step that needs this window (the same step whatever the timing).
      std::lock_guard<std::mutex> lk(mu_);
      failed_seq_ = s;
      error_ = e.what();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      windows_.emplace(s, std::move(win));
    }
    cv_.notify_all();
    if (++w > last) {  // on to the next epoch: another order, other owners
      ++epoch;
      order = std::make_unique<EpochOrder>(layout_, opt_.seed, opt_.shuffle_window_blocks, epoch);
      owner = assign_shard_owners(layout_.shard_sizes(), num_ranks_, opt_.seed, epoch);
      w = 0;
      for (auto it = readers_.begin(); it != readers_.end();) {
        if (owner[it->first] != rank_)
          it = readers_.erase(it);  // no longer ours
        else
          ++it;
      }
    }
  }
}

std::vector<BlockPrefetcher::Window*> BlockPrefetcher::wait(int64_t epoch, int64_t first,
                                                            int64_t last, std::string& error) {
  const int64_t lo = seq(epoch, first), hi = seq(epoch, last);
  std::unique_lock<std::mutex> lk(mu_);
  if (hi > requested_) {
    requested_ = hi;
    cv_.notify_all();
  }
  // Windows arrive in order, so the last one present means all are.
  cv_.wait(lk, [&] { return failed_seq_ <= hi || windows_.count(hi) > 0; });
  if (failed_seq_ <= hi) {
    error = error_;
    return {};
  }
  std::vector<Window*> out;
  for (int64_t s = lo; s <= hi; ++s) {
    const auto it = windows_.find(s);
    PB_CHECK(it != windows_.end(), "window {} of epoch {} was released too early",
             s - epoch * windows_per_epoch_, epoch);
    out.push_back(it->second.get());
  }
  return out;
}

void BlockPrefetcher::release_before(int64_t epoch, int64_t window) {
  std::lock_guard<std::mutex> lk(mu_);
  windows_.erase(windows_.begin(), windows_.lower_bound(seq(epoch, window)));
  cv_.notify_all();
}

}  // namespace packbert::detail
