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
//
// A stop signal (SIGTERM, SIGINT, SIGUSR1: run_train stops after the step in flight and
// checkpoints) also bounds the waits: from the signal until the ranks agree to stop (the stop-flag
// all-reduce after each step), a collective that waits longer than stop_bound_s (5 s by default)
// after the later of its start and the signal fires as a timeout does, with a message that names
// the collective and the signal. A healthy rank reaches that all-reduce within the step in flight,
// and the ranks of a step wait in its collectives only for each other's imbalance, so such a wait
// means a peer is dead or stuck: the rank could neither finish the step nor checkpoint, and under
// Slurm it would wait for the SIGKILL that follows the SIGTERM after KillWait (srun
// --kill-on-bad-exit sends that SIGTERM to every other task when one dies). A wait whose length
// is one rank's I/O (the checkpoint barrier while rank 0 writes) opts out (StopBound::kNone).
//
// A collective the host does not wait for (an NCCL round: the device's stream waits, and the
// host only blocks later, in whatever synchronisation comes next) is watched by an AsyncWatch:
// its owner arms it with a poll that says, without blocking, whether the collective completed
// (cudaEventQuery of its done event), and the watchdog thread polls it, as PyTorch's NCCL
// watchdog does. One still incomplete after the timeout gets the owner's abort (ncclCommAbort,
// which frees whatever waits on it), then the same kind of line and the same action as a scope.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace packbert {

class WatchScope;
class AsyncWatch;

// Whether a stop signal bounds a wait (see the top): kBounded for the collectives of a step,
// kNone for a wait on one rank's I/O.
enum class StopBound { kBounded, kNone };

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

  // Seconds a wait may last after a stop signal (see the top); the default's reason: a step's
  // imbalance is well under it, and it ends a job with a dead rank well within Slurm's
  // default KillWait of 30 s.
  static constexpr double kStopBoundSeconds = 5.0;
  void set_stop_bound_s(double s) { stop_bound_s_ = s; }
  double stop_bound_s() const { return stop_bound_s_; }
  // A stop signal arrived: from now until stop_agreed() waits are also bounded by
  // stop_bound_s(). Async-signal-safe (call it from the handler); the first call counts.
  void note_stop_signal(int signal);
  // The ranks agreed to stop: the checkpoint and the end that follow wait as usual.
  void stop_agreed() { stop_agreed_.store(true, std::memory_order_relaxed); }

  // The optimizer step the training loop is on (1-based, as the progress lines count; 0 before
  // the first): the step of scopes that do not name one.
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

 private:
  friend class WatchScope;
  friend class AsyncWatch;
  void enter(WatchScope* s);
  void leave(WatchScope* s);
  void check_async(std::unique_lock<std::mutex>& lk);
  void run();
  std::string message(const WatchScope& s, double waited_s) const;
  // Nanoseconds (steady clock) of the stop signal when one bounds the waits now, else 0.
  int64_t stop_bound_since_ns() const;
  std::string stop_message(const char* collective, int64_t step, double waited_s,
                           double since_signal_s) const;

  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> step_{0};
  double timeout_s_ = 0;
  double stop_bound_s_ = kStopBoundSeconds;
  std::atomic<int64_t> stop_signal_ns_{0};  // steady clock of the first stop signal; 0: none
  std::atomic<int> stop_signal_{0};
  std::atomic<bool> stop_agreed_{false};
  static_assert(std::atomic<int64_t>::is_always_lock_free, "note_stop_signal runs in a handler");
  int rank_ = 0;
  Action action_;

  std::mutex mu_;  // guards the list, stopping_ and the thread's start and end
  std::condition_variable cv_;
  WatchScope* head_ = nullptr;
  AsyncWatch* async_head_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;
};

// Open around a blocking wait on a collective: WatchScope w("MPI_Barrier (checkpoint)");
// collective: a string literal (kept by pointer). step: the optimizer step the collective belongs
// to; kCurrentStep takes the watchdog's set_step(). bound: whether a stop signal bounds it.
class WatchScope {
 public:
  static constexpr int64_t kCurrentStep = INT64_MIN;

  explicit WatchScope(const char* collective, int64_t step = kCurrentStep,
                      StopBound bound = StopBound::kBounded)
      : WatchScope(CollectiveWatchdog::global(), collective, step, bound) {}
  WatchScope(CollectiveWatchdog& watchdog, const char* collective, int64_t step = kCurrentStep,
             StopBound bound = StopBound::kBounded);
  ~WatchScope();
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  friend class CollectiveWatchdog;
  CollectiveWatchdog* watchdog_ = nullptr;  // null: the watchdog was off when the scope opened
  const char* collective_;
  int64_t step_;
  StopBound bound_;
  std::chrono::steady_clock::time_point start_;
  bool fired_ = false;
  WatchScope* prev_ = nullptr;
  WatchScope* next_ = nullptr;
};

// Watches the collectives one owner issues without waiting for them (see the top). They complete
// in the order they were armed (one communication stream), so a later one complete means every
// earlier one is. Arm and destroy on one thread; the poll and the abort run on the watchdog
// thread and must not block.
class AsyncWatch {
 public:
  using Poll = std::function<bool()>;  // true once the collective completed
  // abort: called once, on the watchdog thread, when an armed collective is past the timeout,
  // before the message and the watchdog's action.
  explicit AsyncWatch(std::function<void()> abort)
      : AsyncWatch(CollectiveWatchdog::global(), std::move(abort)) {}
  AsyncWatch(CollectiveWatchdog& watchdog, std::function<void()> abort);
  ~AsyncWatch();
  AsyncWatch(const AsyncWatch&) = delete;
  AsyncWatch& operator=(const AsyncWatch&) = delete;

  // A collective was issued (collective: a string literal). Its wait is timed from when
  // `started` first says true (the device reached it: the event its stream waits for before
  // the collective), or from now without one: a host that runs ahead of its device must not
  // count the device's queued compute as waiting. Nothing happens with the watchdog off.
  void arm(const char* collective, Poll started, Poll done,
           int64_t step = WatchScope::kCurrentStep);
  void arm(const char* collective, Poll done, int64_t step = WatchScope::kCurrentStep) {
    arm(collective, nullptr, std::move(done), step);
  }
  // Armed collectives not yet seen complete.
  size_t pending() const;

 private:
  friend class CollectiveWatchdog;
  struct Entry {
    const char* collective;
    int64_t step;
    Poll started;  // null once it has (start is then set)
    std::chrono::steady_clock::time_point start;
    Poll poll;
  };
  CollectiveWatchdog* watchdog_;
  std::function<void()> abort_;
  std::vector<Entry> entries_;  // oldest first; guarded by the watchdog's mutex
  bool fired_ = false;
  AsyncWatch* prev_ = nullptr;
  AsyncWatch* next_ = nullptr;
};

}  // namespace packbert
