// The CUDA runtime API of the emulated device (one device, 0): memory, copies, streams, events,
// launches and errors, with the stream model described in runtime.h.
//
// Checks a GPU would not make at the call, but which catch the bugs that fault or corrupt there:
// every copy and memset must lie inside one device allocation on its device side (the message
// says by how much it does not), a copy's direction must match its pointers, and a kernel's
// pointer arguments must be device memory (launch.h). Fresh device memory and dynamic shared
// memory hold 0xff bytes, a NaN in every float format, as a GPU's hold whatever was there.
//
// Stream capture (CUDA graphs). cudaStreamBeginCapture puts a stream into a Capture. From then on
// what is enqueued on it (kernels, library calls, async copies and memsets, host functions, the
// NCCL emulation's collectives) is appended to the capture's list of nodes, in call order,
// instead of to the stream's queue, and nothing runs. The stream's queue keeps the work issued
// before the capture began, which runs as before: entering capture mode severs the captured work
// from it, as in CUDA. A stream that waits for an event recorded in a capture joins that capture
// (a fork); cudaStreamEndCapture on the stream that began it ends it for all of its streams.
//
// A captured event record or wait is not a node: it orders the capture's streams, and a graph
// replays its nodes one at a time in the order they were captured, an order that already
// respects every such dependency (a wait can only name a record made before it). What the
// capture does check is that every fork is joined back. Each of its streams carries a vector
// clock: for each stream of the capture, how many of that stream's captured operations (work
// and waits) it is ordered after. A stream's own operations advance its entry; an event record
// copies the clock into the event and a wait merges the event's copy in (elementwise maximum).
// cudaStreamEndCapture then requires the origin's clock to cover every operation of every other
// stream of the capture, else cudaErrorStreamCaptureUnjoined.
//
// cudaGraphLaunch enqueues the graph's nodes on the launch stream as ordinary work items, in
// capture order, so a replay runs in stream order like any other work, kernels with the
// arguments copied at their capture and copies and memsets with their captured pointers. An
// asynchronous node (enqueue_async's issue form, runtime.h) makes a fresh run of itself at each
// launch. The items hold copies of the nodes, so an executable graph may be destroyed while a
// launch of it is pending.
//
// Calls that CUDA forbids during a capture return CUDA's error and invalidate the captures
// concerned, after which their streams' work is refused (cudaErrorStreamCaptureInvalidated)
// until cudaStreamEndCapture, which then returns that error and no graph. The rules, and where
// they go beyond what CUDA's documentation states, are at check_unsafe and its neighbours.
#include "kernels/cuda_emu/runtime.h"

#include "kernels/cuda/device_seams.cuh"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
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
  CUstream_st* stream = nullptr;  // of the last record (null: never recorded)
  uint64_t seq = 0;               // that record's position in the stream
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

namespace packbert::emu {
namespace {

constexpr size_t kDeviceBytes = size_t{16} << 30;  // what cudaMemGetInfo calls the total

enum class Memory { device, pinned };
struct Allocation {
  size_t bytes;
  Memory kind;
  int device;  // current when it was allocated
};

// The devices a process sees: PACKBERT_EMU_DEVICES (1 to 64), 8 when unset, as on an 8-GPU
// node. They share one memory and one set of streams: a process drives one of them (one rank,
// one GPU), and what tells them apart is their number and PCI bus id (the NCCL emulation's
// duplicate-GPU check).
int device_count_from_env() {
  const char* v = std::getenv("PACKBERT_EMU_DEVICES");
  if (!v || !*v) return 8;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < 1 || n > 64) {
    std::fprintf(stderr, "cuda emulation: PACKBERT_EMU_DEVICES=%s is not a count from 1 to 64\n",
                 v);
    std::exit(2);
  }
  return static_cast<int>(n);
}

int device_count() {
  static const int n = device_count_from_env();
  return n;
}

thread_local int t_device = 0;  // cudaSetDevice is per host thread, as in CUDA

struct State {
  std::recursive_mutex mutex;
  CUstream_st legacy;
  std::set<CUstream_st*> streams;  // created, not the legacy one
  std::vector<std::unique_ptr<CUstream_st>> destroyed;  // events recorded on them may remain
  std::map<uintptr_t, Allocation> allocations;
  size_t device_bytes = 0;
  bool sticky = false;
  std::vector<std::shared_ptr<Capture>> captures;  // begun and not ended
  State() { legacy.legacy = true; }
};

State& state() {
  static State* s = new State();  // never destroyed: streams may be flushed at exit
  return *s;
}

thread_local cudaError_t t_last_error = cudaSuccess;

struct CounterAtomics {
  std::atomic<int64_t> host_syncs{0}, launches{0}, graph_launches{0}, pageable_copies{0};
};
CounterAtomics& counter_atomics() {
  static CounterAtomics c;
  return c;
}
void bump(std::atomic<int64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }
void count_sync() { bump(counter_atomics().host_syncs); }

// cudaErrorNotReady (a query of unfinished work) is an answer, not an error: CUDA never makes
// it the last error, so a later launch's cudaGetLastError does not report it.
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}

cudaError_t sticky_or(cudaError_t e) {
  return fail(state().sticky ? cudaErrorLaunchFailure : e);
}

void complain(const char* call, const std::string& what) {
  std::fprintf(stderr, "cuda emulation: %s: %s\n", call, what.c_str());
}

CUstream_st* resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &state().legacy;
  return s;
}

// The allocation holding [p, p + bytes) (bytes 0: p may be one past the end), or null.
const std::pair<const uintptr_t, Allocation>* find(const void* p, size_t bytes) {
  auto& m = state().allocations;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  if (a + bytes > it->first + it->second.bytes || (bytes > 0 && a >= it->first + it->second.bytes))
    return nullptr;
  return &*it;
}

std::string describe(const void* p, size_t bytes) {
  auto& m = state().allocations;
  const auto a = reinterpret_cast<uintptr_t>(p);
  char buf[160];
  auto it = m.upper_bound(a);
  if (it != m.begin()) {
    --it;
    if (a < it->first + it->second.bytes + 4096) {
      std::snprintf(buf, sizeof(buf),
                    "%zu bytes at offset %zu of a %zu-byte %s allocation (%zu past its end)",
                    bytes, static_cast<size_t>(a - it->first), it->second.bytes,
                    it->second.kind == Memory::device ? "device" : "pinned host",
                    static_cast<size_t>(a + bytes - it->first - it->second.bytes));
      return buf;
    }
  }
  std::snprintf(buf, sizeof(buf), "%zu bytes at %p, which is not device memory", bytes, p);
  return buf;
}

// Whether the byte at p is device (pinned) memory. Not one past the end: host memory can start
// right there (the sanitizers' allocators pack blocks of one size class with no gap).
bool is_device(const void* p) {
  const auto* a = find(p, 1);
  return a && a->second.kind == Memory::device;
}
bool is_pinned(const void* p) {
  const auto* a = find(p, 1);
  return a && a->second.kind == Memory::pinned;
}

void run(CUstream_st::Work& w) {
  if (state().sticky) return;
  w.fn();
}

bool flush(CUstream_st* s, uint64_t upto, bool wait);

// Moves the item at the front of its stream along; true when it is complete. wait: block until
// it is (a synchronisation), else only start it (a query).
bool advance(CUstream_st::Work& w, bool wait) {
  if (w.wait_on) return flush(w.wait_on, w.wait_seq, wait);
  if (!w.started) {
    w.started = true;
    run(w);
  }
  if (!w.done || state().sticky) return true;
  while (!w.done()) {
    if (!wait) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

// Runs s's work up to item `upto` (1-based). wait = false stops at an asynchronous item that is
// not complete yet and returns false; the legacy-stream, copy and synchronisation calls wait.
bool flush(CUstream_st* s, uint64_t upto, bool wait) {
  while (s->done < upto && !s->queue.empty()) {
    CUstream_st::Work& front = s->queue.front();
    if (front.done || front.wait_on) {
      if (!advance(front, wait)) return false;
      s->queue.pop_front();
      ++s->done;
      continue;
    }
    CUstream_st::Work w = std::move(front);
    s->queue.pop_front();
    ++s->done;
    run(w);
  }
  return true;
}

void flush(CUstream_st* s, uint64_t upto) { flush(s, upto, true); }

void flush_blocking() {
  for (CUstream_st* s : state().streams)
    if (s->blocking) flush(s, s->enqueued);
}

void flush_all() {
  for (CUstream_st* s : state().streams) flush(s, s->enqueued);
}

// The checks of a copy: direction against the pointers, device sides inside an allocation.
cudaError_t check_copy(const char* call, void* dst, const void* src, size_t n,
                       cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDefault)
    kind = is_device(src) ? (is_device(dst) ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                          : (is_device(dst) ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  const bool dev_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool dev_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (n == 0) return cudaSuccess;
  if (dev_dst && !find(dst, n)) {
    complain(call, "destination: " + describe(dst, n));
    return cudaErrorInvalidValue;
  }
  if (dev_src && !find(src, n)) {
    complain(call, "source: " + describe(src, n));
    return cudaErrorInvalidValue;
  }
  if (!dev_dst && is_device(dst)) {
    complain(call, "destination is device memory, but the copy's kind says host");
    return cudaErrorInvalidValue;
  }
  if (!dev_src && is_device(src)) {
    complain(call, "source is device memory, but the copy's kind says host");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

// ---- stream capture: the rules ----------------------------------------------------------------
// CUDA's programming guide ("Prohibited and Unhandled Operations") and runtime API documentation
// state most of them; where they leave a case open, the emulation refuses the call (the stricter
// answer), as marked below. A refused call invalidates the captures concerned, as the guide
// says of any invalid operation during capture.

void invalidate(Capture& c) {
  c.invalidated = true;
  for (CUstream_st* s : c.streams) s->capture_status = cudaStreamCaptureStatusInvalidated;
}

// Ends c: its streams leave capture mode. Events recorded in it keep it (ended).
void end_capture(const std::shared_ptr<Capture>& c) {
  c->ended = true;
  for (CUstream_st* s : c->streams) {
    s->capture.reset();
    s->captured_ops = 0;
    s->clock.clear();
    s->capture_status = cudaStreamCaptureStatusNone;
  }
  auto& v = state().captures;
  v.erase(std::remove(v.begin(), v.end(), c), v.end());
}

// Whether c forbids the calling thread potentially unsafe calls, by
// cudaThreadExchangeStreamCaptureMode's table with the thread's own mode at its default, Global
// (the emulation does not declare that call): a Global capture forbids them to every thread, a
// ThreadLocal one to the thread that began it, a Relaxed one to none.
bool forbids(const Capture& c) {
  return c.mode == cudaStreamCaptureModeGlobal ||
         (c.mode == cudaStreamCaptureModeThreadLocal && c.thread == std::this_thread::get_id());
}

bool has_blocking_stream(const Capture& c) {
  for (const CUstream_st* s : c.streams)
    if (s->blocking) return true;
  return false;
}

// A potentially unsafe call: cudaMalloc, cudaFree, cudaMallocHost, cudaFreeHost (the
// documentation's example), and, beyond what it lists (stricter), a synchronisation or query of
// uncaptured work and an async copy into pageable memory (which waits for the copy). Refused
// with cudaErrorStreamCaptureUnsupported while a capture forbids it to the calling thread.
cudaError_t check_unsafe(const char* call) {
  bool refused = false;
  for (const auto& c : state().captures) {
    if (forbids(*c)) {
      invalidate(*c);
      refused = true;
    }
  }
  if (!refused) return cudaSuccess;
  complain(call, "not permitted while a stream capture (Global mode, or ThreadLocal begun by this "
                 "thread) is under way; the capture is invalidated");
  return cudaErrorStreamCaptureUnsupported;
}

// Any use of the legacy default stream (work on it, a record, a wait, a synchronisation or
// query of it, and the synchronous cudaMemcpy and cudaMemset, which run on it). While a blocking
// stream is capturing, whatever the mode, the legacy stream would depend on the capture: CUDA
// refuses it with cudaErrorStreamCaptureImplicit. Stricter: the same while a capture forbids the
// calling thread unsafe calls, even when its streams are non-blocking.
cudaError_t check_legacy(const char* call) {
  bool refused = false;
  for (const auto& c : state().captures) {
    if (has_blocking_stream(*c) || forbids(*c)) {
      invalidate(*c);
      refused = true;
    }
  }
  if (!refused) return cudaSuccess;
  complain(call, "the legacy default stream, while a blocking stream is capturing or a Global "
                 "(or this thread's ThreadLocal) capture is under way; the capture is "
                 "invalidated");
  return cudaErrorStreamCaptureImplicit;
}

// Synchronising or querying a stream: the legacy one as above; a capturing one has no work to
// wait for (cudaErrorStreamCaptureUnsupported), and once its capture is invalidated every use of
// it is cudaErrorStreamCaptureInvalidated; any other is an unsafe call.
cudaError_t check_stream_wait(CUstream_st* s, const char* call) {
  if (s->legacy) return check_legacy(call);
  if (s->capture) {
    if (s->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    invalidate(*s->capture);
    complain(call, "the stream is capturing; the capture is invalidated");
    return cudaErrorStreamCaptureUnsupported;
  }
  return check_unsafe(call);
}

// Synchronising, querying or timing an event last recorded in a capture: cudaErrorCapturedEvent,
// which invalidates that capture. Stricter: the same after that capture has ended, until the
// event is recorded again outside one.
cudaError_t check_captured_event(CUevent_st* e, const char* call) {
  if (!e->capture) return cudaSuccess;
  if (!e->capture->ended) invalidate(*e->capture);
  complain(call, "the event was last recorded in a capture");
  return cudaErrorCapturedEvent;
}

cudaError_t check_event_wait(CUevent_st* e, const char* call) {
  const cudaError_t r = check_captured_event(e, call);
  return r != cudaSuccess ? r : check_unsafe(call);
}

// An invalid call on a capturing stream (a bad launch configuration or copy) invalidates its
// capture too.
void invalidate_capture_of(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s->capture) invalidate(*s->capture);
}

// Work enqueued on a capturing stream: recorded, not run.
cudaError_t capture_node(CUstream_st* s, GraphNode n) {
  Capture& c = *s->capture;
  if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
  c.nodes.push_back(std::move(n));
  s->clock[s] = ++s->captured_ops;
  return cudaSuccess;
}

// A capturing stream waits for an event: ordered after what the event's record follows in the
// same capture. An event recorded in another capture would merge the two
// (cudaErrorStreamCaptureMerge, both invalidated); one recorded outside any capture, or in one
// that has ended, is a dependency across the capture's boundary
// (cudaErrorStreamCaptureIsolation).
cudaError_t capture_wait(CUstream_st* s, CUevent_st* e) {
  Capture& c = *s->capture;
  if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
  if (!e->stream && !e->capture) return cudaSuccess;  // never recorded: nothing to wait for
  if (e->capture.get() == &c) {
    for (const auto& [stream, ops] : e->clock) s->clock[stream] = std::max(s->clock[stream], ops);
    s->clock[s] = ++s->captured_ops;
    return cudaSuccess;
  }
  invalidate(c);
  if (e->capture && !e->capture->ended) {
    invalidate(*e->capture);
    complain("cudaStreamWaitEvent", "the event was recorded in another capture; both captures "
                                    "are invalidated");
    return cudaErrorStreamCaptureMerge;
  }
  complain("cudaStreamWaitEvent", "a capturing stream waits for an event recorded outside its "
                                  "capture; the capture is invalidated");
  return cudaErrorStreamCaptureIsolation;
}

// A stream that is not capturing waits for an event recorded in a capture: it joins the capture
// (a fork), its clock the event's, the wait its first operation. The legacy stream cannot join
// one (cudaErrorStreamCaptureImplicit). Stricter, where the documentation is silent: an event
// whose capture has ended is cudaErrorCapturedEvent.
cudaError_t join_capture(CUstream_st* s, CUevent_st* e) {
  const std::shared_ptr<Capture> c = e->capture;
  if (c->ended) {
    complain("cudaStreamWaitEvent", "the event was last recorded in a capture that has ended");
    return cudaErrorCapturedEvent;
  }
  if (s->legacy) {
    invalidate(*c);
    complain("cudaStreamWaitEvent", "the legacy default stream cannot join a capture; the "
                                    "capture is invalidated");
    return cudaErrorStreamCaptureImplicit;
  }
  if (c->invalidated) return cudaErrorStreamCaptureInvalidated;
  s->capture = c;
  s->clock = e->clock;
  s->clock[s] = s->captured_ops = 1;
  s->capture_status = cudaStreamCaptureStatusActive;
  c->streams.push_back(s);
  return cudaSuccess;
}

}  // namespace

// ---- runtime.h -------------------------------------------------------------------------------
namespace {
// Puts w on a stream that is not capturing.
cudaError_t enqueue_work(cudaStream_t stream, CUstream_st::Work w) {
  State& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  if (st.sticky) return cudaErrorLaunchFailure;
  CUstream_st* s = resolve(stream);
  if (s->destroyed) return cudaErrorInvalidResourceHandle;
  if (s->legacy) {  // waits for every blocking stream, then runs
    const cudaError_t e = check_legacy(w.what);
    if (e != cudaSuccess) return e;
    flush_blocking();
    advance(w, true);
    return st.sticky ? cudaErrorLaunchFailure : cudaSuccess;
  }
  s->queue.push_back(std::move(w));
  ++s->enqueued;
  return cudaSuccess;
}

// The work item of one run of n (an asynchronous node is issued now).
CUstream_st::Work make_work(const GraphNode& n) {
  CUstream_st::Work w;
  w.what = n.what;
  if (n.issue) {
    AsyncRun r = n.issue();
    w.fn = std::move(r.start);
    w.done = std::move(r.done);
  } else {
    w.fn = n.fn;
  }
  return w;
}

// Captures n on a capturing stream, else runs it in stream order.
cudaError_t submit(cudaStream_t stream, GraphNode n) {
  State& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  if (st.sticky) return cudaErrorLaunchFailure;
  CUstream_st* s = resolve(stream);
  if (s->destroyed) return cudaErrorInvalidResourceHandle;
  if (s->capture) return capture_node(s, std::move(n));
  if (s->legacy) {  // checked before an asynchronous node is issued
    if (const cudaError_t e = check_legacy(n.what)) return e;
  }
  return enqueue_work(stream, make_work(n));
}
}  // namespace

cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
  return submit(stream, GraphNode{what, std::move(work), nullptr});
}

cudaError_t enqueue_async(cudaStream_t stream, const char* what,
                          std::function<AsyncRun()> issue) {
  return submit(stream, GraphNode{what, nullptr, std::move(issue)});
}

cudaError_t enqueue_async(cudaStream_t stream, const char* what, std::function<void()> start,
                          std::function<bool()> done) {
  return enqueue_async(stream, what, [start = std::move(start), done = std::move(done)] {
    return AsyncRun{start, done};
  });
}

int current_device() { return t_device; }

Counters counters() {
  CounterAtomics& a = counter_atomics();
  Counters c;
  c.host_syncs = a.host_syncs.load(std::memory_order_relaxed);
  c.launches = a.launches.load(std::memory_order_relaxed);
  c.graph_launches = a.graph_launches.load(std::memory_order_relaxed);
  c.pageable_copies = a.pageable_copies.load(std::memory_order_relaxed);
  return c;
}

void count_launch() { bump(counter_atomics().launches); }

bool device_range(const void* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return find(p, bytes) != nullptr;
}

bool device_pointer(const void* p) {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return find(p, 0) != nullptr;
}

void fault(const std::string& message) {
  State& st = state();
  std::lock_guard<std::recursive_mutex> lock(st.mutex);
  if (st.sticky) return;
  st.sticky = true;
  std::fprintf(stderr, "cuda emulation: fault: %s\n", message.c_str());
}

bool faulted() {
  std::lock_guard<std::recursive_mutex> lock(state().mutex);
  return state().sticky;
}

void set_last_error(cudaError_t e) { fail(e); }

void launch(cudaStream_t stream, Launch l) {
  const dim3 g = l.grid, b = l.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  std::string bad;
  if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
    bad = "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
          std::to_string(b.z) + ") outside CUDA's limits (1024 threads, z <= 64)";
  else if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535)
    bad = "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," + std::to_string(g.z) +
          ") outside CUDA's limits (x < 2^31, y and z <= 65535)";
  else if (l.shared_bytes > (size_t{48} << 10))
    bad = std::to_string(l.shared_bytes) +
          " bytes of dynamic shared memory: above the 48 KiB a launch gets without opting in";
  if (!bad.empty()) {
    complain("kernel launch", "'" + l.name + "': " + bad);
    std::lock_guard<std::recursive_mutex> lock(state().mutex);
    invalidate_capture_of(stream);
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  auto shared = std::make_shared<Launch>(std::move(l));
  const cudaError_t e = enqueue(stream, "kernel", [shared] { run_kernel(*shared); });
  if (e != cudaSuccess) fail(e);
}

}  // namespace packbert::emu

// ---- the runtime API ---------------------------------------------------------------------------
using packbert::emu::state;
using Lock = std::lock_guard<std::recursive_mutex>;
namespace emu = packbert::emu;

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (the emulation's fault message is on stderr)";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge:
      return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched:
      return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    default: return "unknown error";
  }
}

cudaError_t cudaGetLastError() {
  Lock lock(state().mutex);
  const cudaError_t e = state().sticky ? cudaErrorLaunchFailure : emu::t_last_error;
  emu::t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  Lock lock(state().mutex);
  return state().sticky ? cudaErrorLaunchFailure : emu::t_last_error;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = emu::device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= emu::device_count()) return emu::fail(cudaErrorInvalidDevice);
  emu::t_device = device;
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaGetDevice(int* device) {
  *device = emu::t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device < 0 || device >= emu::device_count()) return emu::fail(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof(p->name), "packbert CUDA emulation (CPU)");
  p->totalGlobalMem = emu::kDeviceBytes;
  p->sharedMemPerBlock = size_t{48} << 10;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = 1;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (device < 0 || device >= emu::device_count() || len < 13)
    return emu::fail(cudaErrorInvalidValue);
  std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}

// Refused while any capture is under way, whatever its mode: the device's work includes the
// capturing streams', which have nothing to wait for.
cudaError_t cudaDeviceSynchronize() {
  emu::count_sync();
  Lock lock(state().mutex);
  if (!state().captures.empty()) {
    for (const auto& c : state().captures) emu::invalidate(*c);
    emu::complain("cudaDeviceSynchronize", "a stream is capturing; the capture is invalidated");
    return emu::sticky_or(cudaErrorStreamCaptureUnsupported);
  }
  emu::flush_all();
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  Lock lock(state().mutex);
  *total = emu::kDeviceBytes;
  *free = emu::kDeviceBytes - std::min(emu::kDeviceBytes, state().device_bytes);
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Lock lock(state().mutex);
  *p = nullptr;
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  if (const cudaError_t e = emu::check_unsafe("cudaMalloc")) return emu::fail(e);
  if (bytes == 0) return cudaSuccess;
  if (bytes > emu::kDeviceBytes - std::min(emu::kDeviceBytes, state().device_bytes) ||
      posix_memalign(p, 256, bytes) != 0) {
    *p = nullptr;
    return emu::fail(cudaErrorMemoryAllocation);
  }
  std::memset(*p, 0xff, bytes);
  state().allocations[reinterpret_cast<uintptr_t>(*p)] = {bytes, emu::Memory::device,
                                                          emu::t_device};
  state().device_bytes += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  Lock lock(state().mutex);
  if (!p) return emu::sticky_or(cudaSuccess);
  emu::count_sync();
  if (const cudaError_t e = emu::check_unsafe("cudaFree")) return emu::sticky_or(e);
  emu::flush_all();  // cudaFree waits for the device
  auto it = state().allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == state().allocations.end() || it->second.kind != emu::Memory::device) {
    emu::complain("cudaFree", emu::describe(p, 0) + ": not the start of a device allocation");
    return emu::fail(cudaErrorInvalidValue);
  }
  state().device_bytes -= it->second.bytes;
  state().allocations.erase(it);
  std::free(p);
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  Lock lock(state().mutex);
  *p = nullptr;
  if (const cudaError_t e = emu::check_unsafe("cudaMallocHost")) return emu::fail(e);
  if (posix_memalign(p, 256, bytes == 0 ? 1 : bytes) != 0)
    return emu::fail(cudaErrorMemoryAllocation);
  state().allocations[reinterpret_cast<uintptr_t>(*p)] = {bytes, emu::Memory::pinned,
                                                          emu::t_device};
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  Lock lock(state().mutex);
  if (!p) return cudaSuccess;
  emu::count_sync();
  if (const cudaError_t e = emu::check_unsafe("cudaFreeHost")) return emu::fail(e);
  emu::flush_all();
  auto it = state().allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == state().allocations.end() || it->second.kind != emu::Memory::pinned)
    return emu::fail(cudaErrorInvalidValue);
  state().allocations.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  Lock lock(state().mutex);
  *a = cudaPointerAttributes{};
  const auto* alloc = emu::find(p, 1);
  a->device = alloc ? alloc->second.device : emu::t_device;
  if (emu::is_device(p)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  } else if (emu::is_pinned(p)) {
    a->type = cudaMemoryTypeHost;
    a->devicePointer = const_cast<void*>(p);
    a->hostPointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
  }
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  Lock lock(state().mutex);
  emu::count_sync();
  if (n > 0 && ((!emu::is_device(src) && !emu::is_pinned(src)) ||
                (!emu::is_device(dst) && !emu::is_pinned(dst))))
    emu::bump(emu::counter_atomics().pageable_copies);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  if (const cudaError_t e = emu::check_legacy("cudaMemcpy")) return emu::fail(e);
  const cudaError_t e = emu::check_copy("cudaMemcpy", dst, src, n, kind);
  if (e != cudaSuccess) return emu::fail(e);
  emu::flush_blocking();  // the legacy default stream
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Lock lock(state().mutex);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  const cudaError_t e = emu::check_copy("cudaMemcpyAsync", dst, src, n, kind);
  if (e != cudaSuccess) {
    emu::invalidate_capture_of(stream);
    return emu::fail(e);
  }
  if (n == 0) return cudaSuccess;
  const bool pageable_src = !emu::is_device(src) && !emu::is_pinned(src);
  const bool pageable_dst = !emu::is_device(dst) && !emu::is_pinned(dst);
  // A pageable host side cannot be captured (a graph's copy needs memory the device reaches);
  // into pageable memory on a stream that is not capturing, the call waits for the copy.
  if (CUstream_st* s = emu::resolve(stream); (pageable_src || pageable_dst) && s->capture) {
    if (s->capture->invalidated) return emu::fail(cudaErrorStreamCaptureInvalidated);
    emu::invalidate(*s->capture);
    emu::complain("cudaMemcpyAsync", "a pageable host buffer on a capturing stream (capture "
                                     "needs pinned memory, cudaMallocHost); the capture is "
                                     "invalidated");
    return emu::fail(cudaErrorStreamCaptureUnsupported);
  }
  if (pageable_dst) {
    if (const cudaError_t u = emu::check_unsafe("cudaMemcpyAsync")) return emu::fail(u);
  }
  if (pageable_src || pageable_dst) emu::bump(emu::counter_atomics().pageable_copies);
  if (pageable_dst) emu::count_sync();  // returns once the copy is complete
  cudaError_t r;
  if (pageable_src) {
    // Staged at the call: the caller may reuse its buffer at once.
    auto copy = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + n);
    r = emu::enqueue(stream, "cudaMemcpyAsync", [dst, copy] {
      std::memcpy(dst, copy->data(), copy->size());
    });
  } else {
    r = emu::enqueue(stream, "cudaMemcpyAsync", [dst, src, n] { std::memmove(dst, src, n); });
  }
  if (r == cudaSuccess && pageable_dst) {  // into pageable memory: returns when copied
    CUstream_st* s = emu::resolve(stream);
    emu::flush(s, s->enqueued);
  }
  return emu::sticky_or(r);
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
  Lock lock(state().mutex);
  emu::count_sync();
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  if (const cudaError_t e = emu::check_legacy("cudaMemset")) return emu::fail(e);
  if (n && !emu::find(p, n)) {
    emu::complain("cudaMemset", emu::describe(p, n));
    return emu::fail(cudaErrorInvalidValue);
  }
  emu::flush_blocking();
  if (n) std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  Lock lock(state().mutex);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  if (n && !emu::find(p, n)) {
    emu::complain("cudaMemsetAsync", emu::describe(p, n));
    emu::invalidate_capture_of(stream);
    return emu::fail(cudaErrorInvalidValue);
  }
  if (n == 0) return cudaSuccess;
  emu::count_launch();
  return emu::sticky_or(
      emu::enqueue(stream, "cudaMemsetAsync", [p, value, n] { std::memset(p, value, n); }));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  Lock lock(state().mutex);
  auto* s = new CUstream_st();
  s->blocking = (flags & cudaStreamNonBlocking) == 0;
  state().streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority) {
  const cudaError_t e = cudaStreamCreateWithFlags(stream, flags);
  if (e == cudaSuccess) (*stream)->priority = priority;
  return e;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Lock lock(state().mutex);
  CUstream_st* s = emu::resolve(stream);
  if (s->legacy || !state().streams.count(s)) return emu::fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {  // the documentation is silent: refused (stricter), the capture invalidated
    emu::invalidate(*s->capture);
    emu::complain("cudaStreamDestroy", "the stream is capturing; the capture is invalidated");
    return emu::sticky_or(cudaErrorStreamCaptureUnsupported);
  }
  emu::flush(s, s->enqueued);  // its work completes, as CUDA lets it
  state().streams.erase(s);
  s->destroyed = true;  // kept: events recorded on it still refer to it
  s->queue = {};
  state().destroyed.emplace_back(s);
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  emu::count_sync();
  Lock lock(state().mutex);
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = emu::check_stream_wait(s, "cudaStreamSynchronize"))
    return emu::sticky_or(e);
  if (s->legacy)
    emu::flush_blocking();
  else
    emu::flush(s, s->enqueued);
  return emu::sticky_or(cudaSuccess);
}

// Runs what can run without waiting; cudaErrorNotReady while an asynchronous item (a collective
// waiting for its peers) is not complete. Never blocks, from any thread: while another thread
// holds the emulation (a synchronisation waiting for a collective), it reports what was reached,
// and of a capture only the stream's own state (it then invalidates nothing).
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::unique_lock<std::recursive_mutex> lock(state().mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    const int status = emu::resolve(stream)->capture_status;
    return status == cudaStreamCaptureStatusActive        ? cudaErrorStreamCaptureUnsupported
           : status == cudaStreamCaptureStatusInvalidated ? cudaErrorStreamCaptureInvalidated
                                                          : cudaErrorNotReady;
  }
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = emu::check_stream_wait(s, "cudaStreamQuery")) return emu::sticky_or(e);
  if (s->legacy) {
    emu::flush_blocking();
    return emu::sticky_or(cudaSuccess);
  }
  return emu::sticky_or(emu::flush(s, s->enqueued, false) ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  Lock lock(state().mutex);
  if (!event) return emu::fail(cudaErrorInvalidResourceHandle);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (s->capture) return emu::sticky_or(emu::capture_wait(s, event));
  if (event->capture) return emu::sticky_or(emu::join_capture(s, event));
  if (!event->stream) return emu::sticky_or(cudaSuccess);  // never recorded: nothing to wait for
  // Planted mistake (device_seams.cuh, Mutant::comm_stream_wait): a high-priority stream (the
  // NCCL transport's communication stream) no longer waits for the events it is told to.
  if (emu::mutant() == static_cast<int>(packbert::cuda::Mutant::comm_stream_wait) &&
      emu::resolve(stream)->priority < 0)
    return emu::sticky_or(cudaSuccess);
  CUstream_st::Work w;
  w.what = "cudaStreamWaitEvent";
  w.wait_on = event->stream;
  w.wait_seq = event->seq;
  return emu::sticky_or(emu::enqueue_work(stream, std::move(w)));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* data) {
  return emu::sticky_or(emu::enqueue(stream, "cudaLaunchHostFunc", [fn, data] { fn(data); }));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  auto* e = new CUevent_st();
  e->flags = flags;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Lock lock(state().mutex);
  if (!event) return emu::fail(cudaErrorInvalidResourceHandle);
  // A pending record still writes it (a captured one is no work: nothing pending).
  if (event->stream) emu::flush(event->stream, event->seq);
  delete event;
  return cudaSuccess;
}

// On a capturing stream the record is no work: the event takes the stream's clock (the top of
// this file), for the streams that wait for it to join or order themselves in the capture.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Lock lock(state().mutex);
  if (!event) return emu::fail(cudaErrorInvalidResourceHandle);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    if (s->capture->invalidated) return emu::fail(cudaErrorStreamCaptureInvalidated);
    event->capture = s->capture;
    event->clock = s->clock;
    event->captured = true;
    event->stream = nullptr;
    event->seq = 0;
    event->reached = false;
    return cudaSuccess;
  }
  if (s->legacy) {
    if (const cudaError_t e = emu::check_legacy("cudaEventRecord")) return emu::fail(e);
  }
  event->capture.reset();
  event->clock.clear();
  event->captured = false;
  event->reached = false;
  event->stream = s;
  event->seq = s->legacy ? 0 : s->enqueued + 1;
  return emu::sticky_or(emu::enqueue(stream, "cudaEventRecord", [event] {
    event->reached = true;
    event->time = std::chrono::steady_clock::now();
  }));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  emu::count_sync();
  Lock lock(state().mutex);
  if (!event) return emu::fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = emu::check_event_wait(event, "cudaEventSynchronize"))
    return emu::sticky_or(e);
  if (event->stream && !event->stream->legacy) emu::flush(event->stream, event->seq);
  return emu::sticky_or(cudaSuccess);
}

// Runs the work up to the event without waiting, then reports whether the event was reached: a
// caller polling for completion makes progress, and only an asynchronous item (a collective
// waiting for its peers) leaves it cudaErrorNotReady. Never blocks, from any thread (as
// cudaStreamQuery, and likewise of a capture only the event's own state).
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return emu::fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::recursive_mutex> lock(state().mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (event->captured) return cudaErrorCapturedEvent;
    return event->reached ? cudaSuccess : cudaErrorNotReady;
  }
  if (const cudaError_t e = emu::check_event_wait(event, "cudaEventQuery"))
    return emu::sticky_or(e);
  if (!event->stream || event->stream->legacy) return emu::sticky_or(cudaSuccess);
  emu::flush(event->stream, event->seq, false);
  return emu::sticky_or(event->reached ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(state().mutex);
  if (!start || !end || (start->flags & cudaEventDisableTiming) ||
      (end->flags & cudaEventDisableTiming))
    return emu::fail(cudaErrorInvalidResourceHandle);
  for (CUevent_st* e : {start, end})
    if (const cudaError_t c = emu::check_captured_event(e, "cudaEventElapsedTime"))
      return emu::sticky_or(c);
  if (!start->reached || !end->reached) return emu::fail(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return emu::sticky_or(cudaSuccess);
}

// ---- stream capture and graphs (the top of this file) ------------------------------------------
// Capture cannot begin on the legacy default stream (cudaStreamPerThread included: the
// emulation's per-thread stream is the legacy one), which CUDA refuses with
// cudaErrorStreamCaptureUnsupported, nor on a stream already capturing (cudaErrorIllegalState;
// stricter, where the documentation is silent: that capture is invalidated).
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  Lock lock(state().mutex);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return emu::fail(cudaErrorInvalidValue);
  CUstream_st* s = emu::resolve(stream);
  if (s->legacy) {
    emu::complain("cudaStreamBeginCapture", "the legacy default stream cannot be captured");
    return emu::fail(cudaErrorStreamCaptureUnsupported);
  }
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    emu::invalidate(*s->capture);
    emu::complain("cudaStreamBeginCapture", "the stream is already capturing; that capture is "
                                            "invalidated");
    return emu::fail(cudaErrorIllegalState);
  }
  auto c = std::make_shared<emu::Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->streams.push_back(s);
  s->capture = c;
  s->captured_ops = 0;
  s->clock.clear();
  s->capture_status = cudaStreamCaptureStatusActive;
  state().captures.push_back(std::move(c));
  return cudaSuccess;
}

// Ends the capture for all of its streams and returns its graph; no graph (null) when the
// capture was invalidated (cudaErrorStreamCaptureInvalidated) or a stream that joined it was not
// joined back (cudaErrorStreamCaptureUnjoined). A stream that is not capturing is
// cudaErrorIllegalState. Only the stream that began the capture ends it
// (cudaErrorStreamCaptureUnmatched), and, but for a Relaxed capture, only from the thread that
// began it (cudaErrorStreamCaptureWrongThread); stricter, where the documentation is silent,
// both invalidate the capture, which the right call then ends.
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Lock lock(state().mutex);
  if (!graph) return emu::fail(cudaErrorInvalidValue);
  *graph = nullptr;
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (!s->capture) return emu::sticky_or(cudaErrorIllegalState);
  const std::shared_ptr<emu::Capture> c = s->capture;
  if (c->origin != s) {
    emu::invalidate(*c);
    emu::complain("cudaStreamEndCapture", "the capture began on another stream; it is "
                                          "invalidated");
    return emu::sticky_or(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    emu::invalidate(*c);
    emu::complain("cudaStreamEndCapture", "the capture began on another thread; it is "
                                          "invalidated");
    return emu::sticky_or(cudaErrorStreamCaptureWrongThread);
  }
  cudaError_t r = cudaSuccess;
  if (c->invalidated) {
    r = cudaErrorStreamCaptureInvalidated;
  } else {
    size_t unjoined = 0;
    for (const CUstream_st* t : c->streams) {
      const auto it = s->clock.find(t);
      if (t != s && (it == s->clock.end() ? 0 : it->second) < t->captured_ops) ++unjoined;
    }
    if (unjoined > 0) {
      emu::complain("cudaStreamEndCapture",
                    std::to_string(unjoined) + " of the streams that joined the capture " +
                        (unjoined == 1 ? "was" : "were") +
                        " not joined back (the capturing stream must wait for an event recorded "
                        "on each after its last captured work)");
      r = cudaErrorStreamCaptureUnjoined;
    }
  }
  emu::end_capture(c);
  if (r != cudaSuccess || state().sticky) {
    c->nodes.clear();  // events recorded in the capture keep it, not its work
    return emu::sticky_or(r);
  }
  *graph = new CUgraph_st{std::move(c->nodes)};
  return cudaSuccess;
}

// The legacy stream never captures; asked while a blocking stream is capturing, CUDA answers
// cudaErrorStreamCaptureImplicit (and, asking being no use of it, invalidates nothing).
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Lock lock(state().mutex);
  if (!status) return emu::fail(cudaErrorInvalidValue);
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (s->legacy) {
    for (const auto& c : state().captures)
      if (emu::has_blocking_stream(*c)) return emu::sticky_or(cudaErrorStreamCaptureImplicit);
  }
  *status = !s->capture                ? cudaStreamCaptureStatusNone
            : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  return emu::sticky_or(cudaSuccess);
}

// The flags change nothing here (no allocation nodes, no priorities); a graph for device-side
// launch is not emulated.
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  Lock lock(state().mutex);
  if (!exec || !graph) return emu::fail(cudaErrorInvalidValue);
  *exec = nullptr;
  constexpr unsigned long long known =
      cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
      cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
  if (flags & ~known) return emu::fail(cudaErrorInvalidValue);
  if (flags & cudaGraphInstantiateFlagDeviceLaunch) {
    emu::complain("cudaGraphInstantiate", "device-side graph launch is not emulated");
    return emu::fail(cudaErrorNotSupported);
  }
  *exec = new CUgraphExec_st{graph->nodes};
  return emu::sticky_or(cudaSuccess);
}

// Enqueues the graph's nodes on the stream, in capture order, behind the previous launch of the
// same executable graph (as CUDA orders them) when that was on another stream. Launching into a
// capture (a child graph) is not emulated: refused with cudaErrorStreamCaptureUnsupported, the
// capture invalidated.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Lock lock(state().mutex);
  if (!exec) return emu::fail(cudaErrorInvalidValue);
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  CUstream_st* s = emu::resolve(stream);
  if (s->destroyed) return emu::fail(cudaErrorInvalidResourceHandle);
  if (s->capture) {
    if (s->capture->invalidated) return emu::fail(cudaErrorStreamCaptureInvalidated);
    emu::invalidate(*s->capture);
    emu::complain("cudaGraphLaunch", "launching a graph into a capture is not emulated; the "
                                     "capture is invalidated");
    return emu::fail(cudaErrorStreamCaptureUnsupported);
  }
  if (s->legacy) {
    if (const cudaError_t e = emu::check_legacy("cudaGraphLaunch")) return emu::fail(e);
  }
  emu::bump(emu::counter_atomics().graph_launches);
  if (exec->last_stream && exec->last_stream != s && !exec->last_stream->legacy) {
    CUstream_st::Work w;
    w.what = "cudaGraphLaunch";
    w.wait_on = exec->last_stream;
    w.wait_seq = exec->last_seq;
    if (const cudaError_t e = emu::enqueue_work(s, std::move(w))) return emu::sticky_or(e);
  }
  for (const emu::GraphNode& n : exec->nodes) {
    if (const cudaError_t e = emu::enqueue_work(s, emu::make_work(n))) return emu::sticky_or(e);
  }
  exec->last_stream = s;
  exec->last_seq = s->legacy ? 0 : s->enqueued;
  return emu::sticky_or(cudaSuccess);
}

// The queued items of a pending launch hold copies of the nodes: destroying the executable
// graph does not wait for them.
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Lock lock(state().mutex);
  if (!exec) return emu::fail(cudaErrorInvalidValue);
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Lock lock(state().mutex);
  if (!graph) return emu::fail(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}
