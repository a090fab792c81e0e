// Collective watchdog: a rank stuck in I/O or a driver call leaves every other rank waiting in a
// collective forever. Each blocking wait on a collective opens a WatchScope; a background thread
// looks at the open scopes, and one that has been open longer than the timeout
// (train.collective_timeout_s) ends the job: one error line naming the rank, the collective and
// the step, then the action (run_train's calls MPI_Abort) (DESIGN.md, Distribution).
//
// Which rank did not arrive is not known here: the rank that fires only knows that it waits.
// Every rank that waits logs the line when its own timeout passes (unless the abort ends it
// first), so the suspects are the ranks without one. Knowing for sure would take a second
// channel on which every peer answers (the silent ones are stuck): more machinery than a log
// line needs.
//
// Lives in core (no MPI) so that the data loader (packbert_data, which does not link
// packbert_comm) and the gradient all-reduce (packbert_comm) can both open scopes; the abort
// action is given by whoever knows MPI.
//
// Scopes may be opened from any thread (the compute thread and the loader thread both do) and
// may nest: each is a node of an intrusive list under one mutex, so a scope allocates nothing.
// With the watchdog off (timeout 0, the default of a fresh object) a scope costs one atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace packbert {

class WatchScope;

class CollectiveWatchdog {
 public:
  // Exit status of the job when the watchdog fires (the default action's, and run_train's
  // MPI_Abort code).
  static constexpr int kExitCode = 3;
  // Called on the watchdog thread with the message, after it was logged (and flushed). The
  // default ends the process with std::_Exit(kExitCode), which needs no MPI; a test's action may
  // return, and then the watchdog keeps watching (each scope fires at most once).
  using Action = std::function<void(const std::string& message)>;

  CollectiveWatchdog() = default;
  ~CollectiveWatchdog();  // stop()
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The process's watchdog, which WatchScope(collective, ...) uses; off until configured. Never
  // destroyed (a loader thread may close a scope during exit); stop() it at the end of a run.
  static CollectiveWatchdog& global();

  // Sets the timeout (seconds; 0 = off) and starts the thread (or stops it for 0). rank names
  // this process in the message. Scopes opened before keep the timeout they see when checked.
  void configure(double timeout_s, int rank, Action action = {});
  // Stops and joins the thread; open scopes are no longer checked. Idempotent.
  void stop();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  double timeout_s() const { return timeout_s_; }

  // The optimizer step the training loop is on (1-based, as the progress lines count; 0 before
  // the first): the step of scopes that do not name one.
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

 private:
  friend class WatchScope;
  void enter(WatchScope* s);
  void leave(WatchScope* s);
  void run();
  std::string message(const WatchScope& s, double waited_s) const;

  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> step_{0};
  double timeout_s_ = 0;
  int rank_ = 0;
  Action action_;

  std::mutex mu_;  // guards the list, stopping_ and the thread's start and end
  std::condition_variable cv_;
  WatchScope* head_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;
};

// Open around a blocking wait on a collective: WatchScope w("MPI_Barrier (checkpoint)");
// collective: a string literal (kept by pointer). step: the optimizer step the collective belongs
// to; kCurrentStep takes the watchdog's set_step().
class WatchScope {
 public:
  static constexpr int64_t kCurrentStep = INT64_MIN;

  explicit WatchScope(const char* collective, int64_t step = kCurrentStep)
      : WatchScope(CollectiveWatchdog::global(), collective, step) {}
  WatchScope(CollectiveWatchdog& watchdog, const char* collective, int64_t step = kCurrentStep);
  ~WatchScope();
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  friend class CollectiveWatchdog;
  CollectiveWatchdog* watchdog_ = nullptr;  // null: the watchdog was off when the scope opened
  const char* collective_;
  int64_t step_;
  std::chrono::steady_clock::time_point start_;
  bool fired_ = false;
  WatchScope* prev_ = nullptr;
  WatchScope* next_ = nullptr;
};

}  // namespace packbert
