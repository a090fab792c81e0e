// The emulated runtime's stream capture and CUDA graphs: the capture rules that its calls check,
// and cudaStreamBeginCapture ... cudaGraphDestroy (runtime.cpp has the rest of the runtime API,
// runtime_internal.h the state both files share).
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
#include "kernels/cuda_emu/runtime_internal.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace packbert::emu {
using namespace detail;
}  // namespace packbert::emu

namespace packbert::emu::detail {

// ---- stream capture: the rules ----------------------------------------------------------------
// CUDA's programming guide ("Prohibited and Unhandled Operations") and runtime API documentation
// state most of them; where they leave a case open, the emulation refuses the call (the stricter
// answer), as marked below. A refused call invalidates the captures concerned, as the guide
// says of any invalid operation during capture.

void invalidate(Capture& c) {
  c.invalidated = true;
  for (CUstream_st* s : c.streams) s->capture_status = cudaStreamCaptureStatusInvalidated;
}

namespace {

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

}  // namespace

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
  complain(call,
           "not permitted while a stream capture (Global mode, or ThreadLocal begun by this "
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
  complain(call,
           "the legacy default stream, while a blocking stream is capturing or a Global "
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
    complain("cudaStreamWaitEvent",
             "the event was recorded in another capture; both captures "
             "are invalidated");
    return cudaErrorStreamCaptureMerge;
  }
  complain("cudaStreamWaitEvent",
           "a capturing stream waits for an event recorded outside its "
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
    complain("cudaStreamWaitEvent",
             "the legacy default stream cannot join a capture; the "
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

}  // namespace packbert::emu::detail

using packbert::emu::detail::state;
using Lock = std::lock_guard<std::recursive_mutex>;
namespace emu = packbert::emu;

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
    emu::complain("cudaStreamBeginCapture",
                  "the stream is already capturing; that capture is "
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
    emu::complain("cudaStreamEndCapture",
                  "the capture began on another stream; it is "
                  "invalidated");
    return emu::sticky_or(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    emu::invalidate(*c);
    emu::complain("cudaStreamEndCapture",
                  "the capture began on another thread; it is "
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
  *status = !s->capture               ? cudaStreamCaptureStatusNone
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
    emu::complain("cudaGraphLaunch",
                  "launching a graph into a capture is not emulated; the "
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
