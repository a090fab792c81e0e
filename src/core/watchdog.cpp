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
