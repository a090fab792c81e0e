// A small task pool for `packbert prepare`: whole input files run as background tasks, and the
// short pieces they split into (tokenizing a chunk of lines, materializing a block of samples)
// as foreground tasks that any thread waiting for them helps to run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace packbert {

class TaskPool {
 public:
  // Tasks awaited together. Only the pool touches the fields, under its lock.
  struct Group {
    int pending = 0;
    std::exception_ptr error;  // the first exception a task of the group threw
  };
  // Thrown by waits once the pool is cancelled (after another task failed).
  struct Cancelled : std::exception {
    const char* what() const noexcept override { return "cancelled after another error"; }
  };

  explicit TaskPool(int threads);
  ~TaskPool();  // cancels what is queued, waits for running tasks, joins
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Foreground tasks must not wait on other tasks; background ones may (they only start on an
  // idle worker, never inside a wait, so a wait never nests a long task).
  void submit(Group& g, std::function<void()> fn, bool background = false);
  // Waits until every task of g has finished (also after a cancel, so nothing still running
  // refers to the caller's data), running foreground tasks meanwhile when help is set. Then
  // rethrows g's first exception, or throws Cancelled if the pool was cancelled.
  void wait(Group& g, bool help);
  // Like wait, but never throws: for unwinding after an error.
  void drain(Group& g, bool help) noexcept;
  // Waits until pred() holds (evaluated under the pool lock); throws Cancelled on cancel.
  void wait_for(const std::function<bool()>& pred, bool help);
  // Call after changing state that a wait_for predicate reads.
  void notify();
  // Drops the queued tasks and makes waits throw Cancelled. Any task that throws (other than
  // Cancelled) cancels the pool and its exception becomes first_error().
  void cancel();
  std::exception_ptr first_error();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  struct Task {
    Group* group;
    std::function<void()> fn;
  };
  void run(Task& t, std::unique_lock<std::mutex>& lock);
  void cancel_locked();
  void worker();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> foreground_, background_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  std::atomic<bool> cancelled_{false};
  std::exception_ptr first_error_;
};

// Drains every group in a queue of in-flight work items (each with a `group` member) when it
// goes out of scope, so an exception never frees data that a running task still uses.
template <typename Queue>
class DrainOnExit {
 public:
  DrainOnExit(TaskPool& pool, Queue& queue) : pool_(pool), queue_(queue) {}
  ~DrainOnExit() {
    for (auto& item : queue_) pool_.drain(item->group, true);
  }
  DrainOnExit(const DrainOnExit&) = delete;
  DrainOnExit& operator=(const DrainOnExit&) = delete;

 private:
  TaskPool& pool_;
  Queue& queue_;
};

}  // namespace packbert
