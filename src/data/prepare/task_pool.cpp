#include "data/prepare/task_pool.h"

#include <algorithm>

namespace packbert {

TaskPool::TaskPool(int threads) {
  const int n = std::max(1, threads);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { worker(); });
}

TaskPool::~TaskPool() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cancel_locked();
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void TaskPool::submit(Group& g, std::function<void()> fn, bool background) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (cancelled_) return;  // the waiter throws Cancelled instead
    ++g.pending;
    (background ? background_ : foreground_).push_back(Task{&g, std::move(fn)});
  }
  cv_.notify_all();
}

void TaskPool::run(Task& t, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  std::exception_ptr err;
  bool is_cancel = false;
  try {
    t.fn();
  } catch (const Cancelled&) {
    err = std::current_exception();
    is_cancel = true;
  } catch (...) {
    err = std::current_exception();
  }
  t.fn = nullptr;  // release captured state before waking the waiter
  lock.lock();
  if (err) {
    if (!t.group->error) t.group->error = err;
    if (!is_cancel && !first_error_) first_error_ = err;
    if (!is_cancel) cancel_locked();
  }
  --t.group->pending;
  cv_.notify_all();
}

void TaskPool::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !foreground_.empty() || !background_.empty(); });
    if (stop_) return;
    std::deque<Task>& q = !foreground_.empty() ? foreground_ : background_;
    Task t = std::move(q.front());
    q.pop_front();
    run(t, lock);
  }
}

void TaskPool::drain(Group& g, bool help) noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  while (g.pending > 0) {
    if (help && !foreground_.empty()) {
      Task t = std::move(foreground_.front());
      foreground_.pop_front();
      run(t, lock);
    } else {
      cv_.wait(lock);
    }
  }
}

void TaskPool::wait(Group& g, bool help) {
  drain(g, help);
  std::unique_lock<std::mutex> lock(mu_);
  if (g.error) std::rethrow_exception(g.error);
  if (cancelled_) throw Cancelled();
}

void TaskPool::wait_for(const std::function<bool()>& pred, bool help) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!pred()) {
    if (cancelled_) throw Cancelled();
    if (help && !foreground_.empty()) {
      Task t = std::move(foreground_.front());
      foreground_.pop_front();
      run(t, lock);
    } else {
      cv_.wait(lock);
    }
  }
}

void TaskPool::notify() {
  { std::unique_lock<std::mutex> lock(mu_); }
  cv_.notify_all();
}

void TaskPool::cancel() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cancel_locked();
  }
  cv_.notify_all();
}

void TaskPool::cancel_locked() {
  cancelled_ = true;
  for (auto* q : {&foreground_, &background_}) {
    for (Task& t : *q) --t.group->pending;
    q->clear();
  }
}

std::exception_ptr TaskPool::first_error() {
  std::unique_lock<std::mutex> lock(mu_);
  return first_error_;
}

}  // namespace packbert
