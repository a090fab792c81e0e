// The CUDA runtime API of the emulated device (one device, 0): memory, copies, streams, events,
// launches and errors, with the stream model described in runtime.h.
//
// Checks a GPU would not make at the call, but which catch the bugs that fault or corrupt there:
// every copy and memset must lie inside one device allocation on its device side (the message
// says by how much it does not), a copy's direction must match its pointers, and a kernel's
// pointer arguments must be device memory (launch.h). Fresh device memory and dynamic shared
// memory hold 0xff bytes, a NaN in every float format, as a GPU's hold whatever was there.
//
// Stream capture and graphs (cudaStreamBeginCapture ... cudaGraphDestroy, and the capture rules
// the calls here check) are in capture.cpp; the state both files share is in runtime_internal.h.
#include "kernels/cuda_emu/runtime.h"
#include "kernels/cuda_emu/runtime_internal.h"

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
using namespace detail;

namespace {

// The device memory: PACKBERT_EMU_DEVICE_BYTES (a test gives the emulated GPU a small memory,
// so that an allocation fails where it would on a real one), 16 GiB when unset. cudaMemGetInfo
// calls it the total, and cudaMalloc fails past it.
size_t device_bytes_from_env() {
  const char* v = std::getenv("PACKBERT_EMU_DEVICE_BYTES");
  if (!v || !*v) return size_t{16} << 30;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || n < 1) {
    std::fprintf(stderr, "cuda emulation: PACKBERT_EMU_DEVICE_BYTES=%s is not a byte count\n", v);
    std::exit(2);
  }
  return static_cast<size_t>(n);
}

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

// Read at every call, so that a test can set it around the allocations it makes.
size_t device_memory_bytes() { return device_bytes_from_env(); }

// PACKBERT_EMU_FAIL_PAST_BYTES: cudaMalloc fails once the process's device allocations would
// pass this many bytes, while cudaMemGetInfo still reports the whole device: an allocation that
// fails although the memory looked free (fragmentation, another process). Unset: never.
size_t fail_past_bytes() {
  const char* v = std::getenv("PACKBERT_EMU_FAIL_PAST_BYTES");
  if (!v || !*v) return SIZE_MAX;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    std::fprintf(stderr, "cuda emulation: PACKBERT_EMU_FAIL_PAST_BYTES=%s is not a byte count\n",
                 v);
    std::exit(2);
  }
  return static_cast<size_t>(n);
}

int compute_capability_from_env() {
  const char* v = std::getenv("PACKBERT_EMU_COMPUTE_CAPABILITY");
  if (!v || !*v) return 90;
  int major = 0, minor = 0;
  char tail = 0;
  if (std::sscanf(v, "%d.%d%c", &major, &minor, &tail) != 2 || major < 1 || major > 20 ||
      minor < 0 || minor > 9) {
    std::fprintf(stderr,
                 "cuda emulation: PACKBERT_EMU_COMPUTE_CAPABILITY=%s is not MAJOR.MINOR "
                 "(e.g. 8.0, 9.0)\n",
                 v);
    std::exit(2);
  }
  return major * 10 + minor;
}

thread_local int t_device = 0;  // cudaSetDevice is per host thread, as in CUDA

thread_local cudaError_t t_last_error = cudaSuccess;

}  // namespace

namespace detail {

State& state() {
  static State* s = new State();  // never destroyed: streams may be flushed at exit
  return *s;
}

CounterAtomics& counter_atomics() {
  static CounterAtomics c;
  return c;
}
void bump(std::atomic<int64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

// cudaErrorNotReady (a query of unfinished work) is an answer, not an error: CUDA never makes
// it the last error, so a later launch's cudaGetLastError does not report it.
cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}

cudaError_t sticky_or(cudaError_t e) { return fail(state().sticky ? cudaErrorLaunchFailure : e); }

void complain(const char* call, const std::string& what) {
  std::fprintf(stderr, "cuda emulation: %s: %s\n", call, what.c_str());
}

CUstream_st* resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return &state().legacy;
  return s;
}

}  // namespace detail

namespace {

void count_sync() { bump(counter_atomics().host_syncs); }

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
                    "%zu bytes at offset %zu of a %zu-byte %s allocation (%zu past its end)", bytes,
                    static_cast<size_t>(a - it->first), it->second.bytes,
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

}  // namespace

// ---- runtime.h -------------------------------------------------------------------------------
namespace detail {
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
}  // namespace detail

namespace {
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

cudaError_t enqueue_async(cudaStream_t stream, const char* what, std::function<AsyncRun()> issue) {
  return submit(stream, GraphNode{what, nullptr, std::move(issue)});
}

cudaError_t enqueue_async(cudaStream_t stream, const char* what, std::function<void()> start,
                          std::function<bool()> done) {
  return enqueue_async(stream, what, [start = std::move(start), done = std::move(done)] {
    return AsyncRun{start, done};
  });
}

int current_device() { return t_device; }

// Read at every call, so that a test can set it around the calls it makes.
int compute_capability() { return compute_capability_from_env(); }

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
    bad = "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
          ") outside CUDA's limits (1024 threads, z <= 64)";
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
using packbert::emu::detail::state;
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
  p->totalGlobalMem = emu::device_memory_bytes();
  p->sharedMemPerBlock = size_t{48} << 10;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->multiProcessorCount = 1;
  p->major = emu::compute_capability() / 10;
  p->minor = emu::compute_capability() % 10;
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
  *total = emu::device_memory_bytes();
  *free = *total - std::min(*total, state().device_bytes);
  return emu::sticky_or(cudaSuccess);
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Lock lock(state().mutex);
  *p = nullptr;
  if (state().sticky) return emu::sticky_or(cudaSuccess);
  if (const cudaError_t e = emu::check_unsafe("cudaMalloc")) return emu::fail(e);
  if (bytes == 0) return cudaSuccess;
  const size_t capacity = std::min(emu::device_memory_bytes(), emu::fail_past_bytes());
  if (bytes > capacity - std::min(capacity, state().device_bytes) ||
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
    emu::complain("cudaMemcpyAsync",
                  "a pageable host buffer on a capturing stream (capture "
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
    r = emu::enqueue(stream, "cudaMemcpyAsync",
                     [dst, copy] { std::memcpy(dst, copy->data(), copy->size()); });
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
// capture.cpp), for the streams that wait for it to join or order themselves in the capture.
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
