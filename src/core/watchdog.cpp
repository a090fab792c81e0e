#include "core/watchdog.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace packbert {

namespace {

using Clock = std::chrono::steady_clock;

// One error line through the project's logger, flushed: the process is about to end, and
// nothing after the action runs. Without a logger that prints errors, straight to stderr.
void report(int rank, const std::string& message) {
  const std::shared_ptr<spdlog::logger> logger = spdlog::default_logger();
  if (logger && logger->should_log(spdlog::level::err)) {
    logger->error("{}", message);
    logger->flush();
  } else {
    std::cerr << "[rank " << rank << "] error: " << message << std::endl;
  }
}

}  // namespace

CollectiveWatchdog::~CollectiveWatchdog() { stop(); }

CollectiveWatchdog& CollectiveWatchdog::global() {
  static CollectiveWatchdog* const watchdog = new CollectiveWatchdog();
  return *watchdog;
}

void CollectiveWatchdog::configure(double timeout_s, int rank, Action action) {
  PB_REQUIRE(std::isfinite(timeout_s) && timeout_s >= 0,
             "collective watchdog: timeout {} s must be finite and >= 0 (0 = off)", timeout_s);
  stop();
  timeout_s_ = timeout_s;
  rank_ = rank;
  action_ = action ? std::move(action)
                   : Action([](const std::string&) { std::_Exit(kExitCode); });
  if (timeout_s == 0) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { run(); });
  enabled_.store(true, std::memory_order_relaxed);
}

void CollectiveWatchdog::stop() {
  enabled_.store(false, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::enter(WatchScope* s) {
  std::lock_guard<std::mutex> lk(mu_);
  s->next_ = head_;
  if (head_) head_->prev_ = s;
  head_ = s;
}

void CollectiveWatchdog::leave(WatchScope* s) {
  std::lock_guard<std::mutex> lk(mu_);
  if (s->prev_) {
    s->prev_->next_ = s->next_;
  } else {
    head_ = s->next_;
  }
  if (s->next_) s->next_->prev_ = s->prev_;
}

std::string CollectiveWatchdog::message(const WatchScope& s, double waited_s) const {
  return fmt::format(
      "collective watchdog: rank {} has waited {:.1f} s in {} at step {}{}, past "
      "train.collective_timeout_s = {}; another rank never joined it (stuck or dead; this rank "
      "cannot tell which: the ranks that waited log this line too, unless the abort ends them "
      "first); aborting the job",
      rank_, waited_s, s.collective_, s.step_, s.step_ == 0 ? " (before the first step)" : "",
      timeout_s_);
}

void CollectiveWatchdog::run() {
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  // Checked ten times per timeout, at most once a second: a hang is seen within 10% (or 1 s) of
  // the timeout, and an idle check of a short list costs nothing.
  const auto period = std::clamp(std::chrono::duration_cast<Clock::duration>(timeout / 10),
                                 Clock::duration(std::chrono::milliseconds(1)),
                                 Clock::duration(std::chrono::seconds(1)));
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, period);
    if (stopping_) break;
    check_async(lk);
    if (stopping_) break;
    const Clock::time_point now = Clock::now();
    for (WatchScope* s = head_; s; s = s->next_) {
      if (s->fired_ || now - s->start_ < timeout) continue;
      s->fired_ = true;
      const std::string text =
          message(*s, std::chrono::duration<double>(now - s->start_).count());
      // Not under the lock: the action may take long (MPI_Abort) or return (tests), and the
      // scope may close meanwhile; s is not touched again (the next tick rescans).
      lk.unlock();
      report(rank_, text);
      action_(text);
      lk.lock();
      break;
    }
  }
}

// Under the lock: drops what completed, then fires for the first collective past the timeout.
void CollectiveWatchdog::check_async(std::unique_lock<std::mutex>& lk) {
  for (AsyncWatch* w = async_head_; w; w = w->next_) {
    auto& e = w->entries_;
    if (e.empty() || w->fired_) continue;
    // The newest complete one: every earlier one is complete too.
    size_t done = e.size();
    while (done > 0 && !e[done - 1].poll()) --done;
    e.erase(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(done));
    if (e.empty()) continue;
    if (e.front().started) {  // not yet known to have reached the device
      if (!e.front().started()) continue;
      e.front().started = nullptr;
      e.front().start = Clock::now();
    }
    const double waited = std::chrono::duration<double>(Clock::now() - e.front().start).count();
    if (waited < timeout_s_) continue;
    w->fired_ = true;
    const AsyncWatch::Entry& oldest = e.front();
    const std::string text = fmt::format(
        "collective watchdog: rank {}: {} at step {}{} has not completed after {:.1f} s, past "
        "train.collective_timeout_s = {}; another rank never joined it (stuck or dead; the ranks "
        "that waited log this line too, unless the abort ends them first); aborting the NCCL "
        "communicator and the job",
        rank_, oldest.collective, oldest.step, oldest.step == 0 ? " (before the first step)" : "",
        waited, timeout_s_);
    // Not under the lock (as for a scope): the abort and the action may take long or return.
    const std::function<void()> abort = w->abort_;
    lk.unlock();
    if (abort) abort();
    report(rank_, text);
    action_(text);
    lk.lock();
    return;  // the list may have changed meanwhile: the next tick rescans
  }
}

AsyncWatch::AsyncWatch(CollectiveWatchdog& watchdog, std::function<void()> abort)
    : watchdog_(&watchdog), abort_(std::move(abort)) {
  std::lock_guard<std::mutex> lk(watchdog.mu_);
  next_ = watchdog.async_head_;
  if (next_) next_->prev_ = this;
  watchdog.async_head_ = this;
}

AsyncWatch::~AsyncWatch() {
  std::lock_guard<std::mutex> lk(watchdog_->mu_);
  if (prev_) {
    prev_->next_ = next_;
  } else {
    watchdog_->async_head_ = next_;
  }
  if (next_) next_->prev_ = prev_;
}

void AsyncWatch::arm(const char* collective, Poll started, Poll poll, int64_t step) {
  if (!watchdog_->enabled()) return;
  std::lock_guard<std::mutex> lk(watchdog_->mu_);
  // Bounded: a host that issues rounds without ever waiting keeps the oldest (it decides the
  // timeout) and the newest (complete, it clears them all).
  if (entries_.size() >= 64) entries_.erase(entries_.begin() + 1);
  entries_.push_back({collective, step == WatchScope::kCurrentStep ? watchdog_->step() : step,
                      std::move(started), std::chrono::steady_clock::now(), std::move(poll)});
}

size_t AsyncWatch::pending() const {
  std::lock_guard<std::mutex> lk(watchdog_->mu_);
  return entries_.size();
}

WatchScope::WatchScope(CollectiveWatchdog& watchdog, const char* collective, int64_t step)
    : collective_(collective), step_(step == kCurrentStep ? watchdog.step() : step) {
  if (!watchdog.enabled()) return;
  watchdog_ = &watchdog;
  start_ = std::chrono::steady_clock::now();
  watchdog.enter(this);
}

WatchScope::~WatchScope() {
  if (watchdog_) watchdog_->leave(this);
}

}  // namespace packbert
