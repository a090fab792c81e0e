#include "core/watchdog.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <spdlog/spdlog.h>

#include "kernels/base/error.h"

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
  action_ = action ? std::move(action) : Action([](const std::string&) { std::_Exit(kExitCode); });
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

void CollectiveWatchdog::note_stop_signal(int signal) {
  if (stop_agreed_.load(std::memory_order_relaxed)) return;
  int64_t none = 0;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  if (stop_signal_ns_.compare_exchange_strong(none, now == 0 ? 1 : now))
    stop_signal_.store(signal, std::memory_order_relaxed);
}

int64_t CollectiveWatchdog::stop_bound_since_ns() const {
  if (stop_agreed_.load(std::memory_order_relaxed)) return 0;
  return stop_signal_ns_.load(std::memory_order_relaxed);
}

std::string CollectiveWatchdog::stop_message(const char* collective, int64_t step, double waited_s,
                                             double since_signal_s) const {
  return fmt::format(
      "collective watchdog: rank {} received signal {} {:.1f} s ago, while it waits in {} at "
      "step {}{} (for {:.1f} s): a rank that can stop reaches the stop within {} s of the signal "
      "(the step in flight), so another rank is dead or stuck, and this one can neither finish "
      "the step nor write a checkpoint; aborting the job without one",
      rank_, stop_signal_.load(std::memory_order_relaxed), since_signal_s, collective, step,
      step == 0 ? " (before the first step)" : "", waited_s, stop_bound_s_);
}

void CollectiveWatchdog::run() {
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  const auto stop_bound = std::chrono::duration<double>(stop_bound_s_);
  // Checked ten times per timeout (or stop bound), at most once a second: a hang is seen within
  // 10% (or 1 s) of it, and an idle check of a short list costs nothing.
  const auto period = std::clamp(
      std::chrono::duration_cast<Clock::duration>(std::min(timeout, stop_bound) / 10),
      Clock::duration(std::chrono::milliseconds(1)), Clock::duration(std::chrono::seconds(1)));
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, period);
    if (stopping_) break;
    check_async(lk);
    if (stopping_) break;
    const Clock::time_point now = Clock::now();
    const int64_t signal_ns = stop_bound_since_ns();
    const Clock::time_point signal_at{
        std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(signal_ns))};
    for (WatchScope* s = head_; s; s = s->next_) {
      if (s->fired_) continue;
      const double waited = std::chrono::duration<double>(now - s->start_).count();
      std::string text;
      if (now - s->start_ >= timeout) {
        text = message(*s, waited);
      } else if (signal_ns != 0 && s->bound_ == StopBound::kBounded &&
                 now - std::max(s->start_, signal_at) >= stop_bound) {
        text = stop_message(s->collective_, s->step_, waited,
                            std::chrono::duration<double>(now - signal_at).count());
      } else {
        continue;
      }
      s->fired_ = true;
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
    const Clock::time_point now = Clock::now();
    const double waited = std::chrono::duration<double>(now - e.front().start).count();
    const int64_t signal_ns = stop_bound_since_ns();
    const Clock::time_point signal_at{
        std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(signal_ns))};
    const bool past_stop_bound =
        signal_ns != 0 &&
        std::chrono::duration<double>(now - std::max(e.front().start, signal_at)).count() >=
            stop_bound_s_;
    if (waited < timeout_s_ && !past_stop_bound) continue;
    w->fired_ = true;
    const AsyncWatch::Entry& oldest = e.front();
    const std::string text =
        waited < timeout_s_
            ? stop_message(oldest.collective, oldest.step, waited,
                           std::chrono::duration<double>(now - signal_at).count()) +
                  "; the NCCL communicator is aborted first"
            : fmt::format(
                  "collective watchdog: rank {}: {} at step {}{} has not completed after {:.1f} s, "
                  "past "
                  "train.collective_timeout_s = {}; another rank never joined it (stuck or dead; "
                  "the ranks "
                  "that waited log this line too, unless the abort ends them first); aborting the "
                  "NCCL "
                  "communicator and the job",
                  rank_, oldest.collective, oldest.step,
                  oldest.step == 0 ? " (before the first step)" : "", waited, timeout_s_);
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

WatchScope::WatchScope(CollectiveWatchdog& watchdog, const char* collective, int64_t step,
                       StopBound bound)
    : collective_(collective), step_(step == kCurrentStep ? watchdog.step() : step), bound_(bound) {
  if (!watchdog.enabled()) return;
  watchdog_ = &watchdog;
  start_ = std::chrono::steady_clock::now();
  watchdog.enter(this);
}

WatchScope::~WatchScope() {
  if (watchdog_) watchdog_->leave(this);
}

}  // namespace packbert
