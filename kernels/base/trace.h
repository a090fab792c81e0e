// Named ranges on a profiler's timeline: the phases of a training step (forward, backward, the
// gradient buckets, LAMB, the data wait) and every op of the CUDA backend, which Nsight Systems
// shows as NVTX ranges. The code that opens them (src/model, src/optim, src/comm, src/data)
// names no profiler and includes no CUDA: it opens a trace::Range, and a backend that knows a
// profiler installs the push / pop pair -- the CUDA backend installs NVTX's when the
// environment sets PACKBERT_NVTX=1 (docs/performance.md, Profiling). With nothing installed, the
// default, a range costs one load and one predictable branch.
//
// Ranges belong to the thread that opens them and nest: push on construction, pop on
// destruction. The hooks are process-wide and stay once installed (a profiler attached to the
// process does not come and go); install them before the threads that open ranges start.
#pragma once

#include <atomic>

namespace packbert::trace {

struct Hooks {
  void (*push)(const char* name) = nullptr;  // name: a string literal
  void (*pop)() = nullptr;
};

namespace detail {
inline std::atomic<const Hooks*> installed{nullptr};
}  // namespace detail

// Installs the hooks (an object that lives as long as the program); nullptr removes them.
inline void install(const Hooks* hooks) {
  detail::installed.store(hooks, std::memory_order_release);
}
inline bool enabled() { return detail::installed.load(std::memory_order_acquire) != nullptr; }

// One range, from here to the end of the scope.
class Range {
 public:
  explicit Range(const char* name) : hooks_(detail::installed.load(std::memory_order_acquire)) {
    if (hooks_) hooks_->push(name);
  }
  ~Range() {
    if (hooks_) hooks_->pop();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  const Hooks* hooks_;  // those that pushed, so that the pop matches even across an install
};

}  // namespace packbert::trace
