// The emulated runtime's shared state: runtime.cpp and capture.cpp only (the rest of the
// emulation goes through runtime.h and cuda_runtime.h). runtime.cpp owns the state, the errors
// and the stream queues; capture.cpp stream capture and graphs, and the capture rules that
// runtime.cpp's calls check (check_unsafe and its neighbours). Whatever reads or changes the
// state holds state().mutex (recursive: enqueue_work takes it again), but for the atomics
// mirrored for a query that finds it held.
#pragma once

#include "kernels/cuda_emu/runtime.h"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace packbert::emu {

// An item as a capture records it and a graph keeps it: run to completion (fn), or asynchronous
// (issue: makes one run of it, at each launch of the graph).
struct GraphNode {
  const char* what;
  std::function<void()> fn;
  std::function<AsyncRun()> issue;
};

// For each stream of a capture, how many of its captured operations come before.
using Clock = std::map<const CUstream_st*, uint64_t>;

struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // that began it
  CUstream_st* origin = nullptr;
  bool invalidated = false;
  bool ended = false;
  std::vector<CUstream_st*> streams;  // the origin, then the streams that joined
  std::vector<GraphNode> nodes;       // in capture order
};

}  // namespace packbert::emu

struct CUstream_st {
  // A work item. Most run to completion when the stream reaches them (fn). An asynchronous one
  // (packbert::emu::enqueue_async) is started by fn and complete once done() says so; a wait for
  // another stream's event (wait_on) is complete once that stream has run up to the event. The
  // stream's later work runs after an item is complete.
  struct Work {
    const char* what;
    std::function<void()> fn;
    std::function<bool()> done;  // asynchronous: completion
    bool started = false;
    CUstream_st* wait_on = nullptr;  // cudaStreamWaitEvent: the event's stream and position
    uint64_t wait_seq = 0;
  };
  bool blocking = true;
  bool legacy = false;
  int priority = 0;  // cudaStreamCreateWithPriority's (lower is higher)
  bool destroyed = false;
  std::deque<Work> queue;
  uint64_t enqueued = 0;  // work item k (1-based) is the k-th enqueued
  uint64_t done = 0;      // items run (or dropped after a fault)
  // The capture the stream belongs to (null: none), its captured operations (work and waits)
  // and its clock; the status is mirrored for a query that finds the emulation busy.
  std::shared_ptr<packbert::emu::Capture> capture;
  uint64_t captured_ops = 0;
  packbert::emu::Clock clock;
  std::atomic<int> capture_status{cudaStreamCaptureStatusNone};
};

struct CUevent_st {
  unsigned flags = 0;
  CUstream_st* stream = nullptr;     // of the last record (null: never recorded)
  uint64_t seq = 0;                  // that record's position in the stream
  std::atomic<bool> reached{false};  // the record has run (read without the lock by a query)
  std::chrono::steady_clock::time_point time{};
  // Last recorded in a capture (then stream is null): that capture and the recording stream's
  // clock; `captured` mirrors it for a query that finds the emulation busy.
  std::shared_ptr<packbert::emu::Capture> capture;
  packbert::emu::Clock clock;
  std::atomic<bool> captured{false};
};

struct CUgraph_st {
  std::vector<packbert::emu::GraphNode> nodes;
};

struct CUgraphExec_st {
  std::vector<packbert::emu::GraphNode> nodes;
  CUstream_st* last_stream = nullptr;  // of the last launch (null: none), and its last item
  uint64_t last_seq = 0;
};

namespace packbert::emu::detail {

enum class Memory { device, pinned };
struct Allocation {
  size_t bytes;
  Memory kind;
  int device;  // current when it was allocated
};

struct State {
  std::recursive_mutex mutex;
  CUstream_st legacy;
  std::set<CUstream_st*> streams;                       // created, not the legacy one
  std::vector<std::unique_ptr<CUstream_st>> destroyed;  // events recorded on them may remain
  std::map<uintptr_t, Allocation> allocations;
  size_t device_bytes = 0;
  bool sticky = false;
  std::vector<std::shared_ptr<Capture>> captures;  // begun and not ended
  State() { legacy.legacy = true; }
};
State& state();

struct CounterAtomics {
  std::atomic<int64_t> host_syncs{0}, launches{0}, graph_launches{0}, pageable_copies{0};
};
CounterAtomics& counter_atomics();
void bump(std::atomic<int64_t>& c);

// Errors: fail makes e the calling thread's last error (cudaGetLastError) and returns it;
// sticky_or does the same with the sticky fault's error, if any, instead of e; complain prints
// why a call was refused.
cudaError_t fail(cudaError_t e);
cudaError_t sticky_or(cudaError_t e);
void complain(const char* call, const std::string& what);

// The stream a handle names (the default stream's handles: the legacy one).
CUstream_st* resolve(cudaStream_t s);

// The stream queues (runtime.cpp).
cudaError_t enqueue_work(cudaStream_t stream, CUstream_st::Work w);
CUstream_st::Work make_work(const GraphNode& n);

// The capture rules (capture.cpp), which the calls of both files check.
void invalidate(Capture& c);
cudaError_t check_unsafe(const char* call);
cudaError_t check_legacy(const char* call);
cudaError_t check_stream_wait(CUstream_st* s, const char* call);
cudaError_t check_captured_event(CUevent_st* e, const char* call);
cudaError_t check_event_wait(CUevent_st* e, const char* call);
void invalidate_capture_of(cudaStream_t stream);
cudaError_t capture_node(CUstream_st* s, GraphNode n);
cudaError_t capture_wait(CUstream_st* s, CUevent_st* e);
cudaError_t join_capture(CUstream_st* s, CUevent_st* e);

}  // namespace packbert::emu::detail
