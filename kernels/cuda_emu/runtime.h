// The emulated device's host side, shared by the runtime API (runtime.cpp), the kernel
// scheduler (scheduler.cpp) and the emulated libraries (cublaslt.cpp, the cub headers).
//
// Streams are queues of work run lazily, as late as CUDA allows: when the host waits for them
// (a stream, event or device synchronisation, a synchronous copy, cudaFree), when another
// stream's work waits for one of their events, or when the legacy default stream runs (it waits
// for every blocking stream). Work on the legacy stream runs at once. So streams run in issue
// order and events are honoured, and host code that reads a result before waiting for it, or a
// stream that does not wait for another's event, sees the data as it was.
//
// A query (cudaEventQuery, cudaStreamQuery) runs what it can without waiting. Work is
// synchronous except an asynchronous item (enqueue_async: the NCCL emulation's collectives,
// which wait for their peers): a query stops at one that is not complete and answers
// cudaErrorNotReady; a synchronisation waits for it. A query never blocks, from any thread: while
// another thread holds the emulation it answers from what has been reached (a watchdog thread
// polls events while the host thread waits for a collective).
//
// Devices: PACKBERT_EMU_DEVICES of them (default 8), each with its own number and PCI bus id
// and PACKBERT_EMU_COMPUTE_CAPABILITY (compute_capability()), PACKBERT_EMU_DEVICE_BYTES of
// memory (default 16 GiB: cudaMemGetInfo's total, past which cudaMalloc fails; read at each
// call, as the capability),
// sharing one memory and one set of streams. cudaSetDevice is per host thread; an allocation
// remembers the device current when it was made (cudaPointerGetAttributes).
//
// Stream capture (CUDA graphs: cudaStreamBeginCapture ... cudaGraphLaunch; capture.cpp describes
// the model): work enqueued on a capturing stream, through enqueue and enqueue_async as through
// the runtime API, is recorded into the capture's graph instead of run, and a graph launch
// enqueues the recorded work again, in capture order, on the launch stream. The calls CUDA
// forbids during a capture return its errors and invalidate the capture.
//
// A fault (a kernel's deadlock or disagreeing warp, a library call on memory that is not the
// device's, ...) is sticky, as on a GPU: it is printed once to stderr with what failed, every
// later call returns cudaErrorLaunchFailure, and queued work no longer runs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace packbert::emu {

// Runs `work` on `stream` in stream order (at once on the legacy default stream). `what` names
// it in error messages. Returns the sticky error, if any, else cudaSuccess. On a capturing
// stream `work` is recorded, and runs at each launch of the graph (so it must be callable more
// than once, and read what it uses when it runs).
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work);

// One run of work that completes asynchronously: `start` runs when the stream reaches it, and
// the stream's later work waits until `done` returns true (polled; called from any thread, so it
// must only read state the work's own thread publishes, e.g. an atomic).
struct AsyncRun {
  std::function<void()> start;
  std::function<bool()> done;
};

// Asynchronous work whose runs `issue` makes: called at once, or, on a capturing stream, at
// each cudaGraphLaunch of the graph (in the host's call order, at the launch call), so that each
// run has its own completion state (the NCCL emulation's collectives take their index on the
// communicator there).
cudaError_t enqueue_async(cudaStream_t stream, const char* what, std::function<AsyncRun()> issue);

// The same with one start and done for every run: a graph's replay calls `start` again and polls
// the same `done`.
cudaError_t enqueue_async(cudaStream_t stream, const char* what, std::function<void()> start,
                          std::function<bool()> done);

// The calling host thread's device (cudaSetDevice).
int current_device();

// The devices' compute capability, major * 10 + minor: PACKBERT_EMU_COMPUTE_CAPABILITY ("8.0",
// "8.9", "9.0", ...; read at each call, so a test may set it to see what an older GPU refuses),
// 9.0 (Hopper) when unset.
// cudaGetDeviceProperties reports it, and the cuBLASLt emulation refuses FP8 below 8.9.
int compute_capability();

// True when [p, p + bytes) lies inside one live device allocation (cudaMalloc), or inside
// pinned host memory (cudaMallocHost: device-accessible, as with unified addressing).
bool device_range(const void* p, size_t bytes);
bool device_pointer(const void* p);  // p inside (or one past the end of) a device allocation

// Records a fault (see above). Safe to call from stream work and from kernel threads.
void fault(const std::string& message);
bool faulted();

// Sets the calling host thread's last error (cudaGetLastError).
void set_last_error(cudaError_t e);

// A kernel launch: the scheduler runs `run` once per CUDA thread of every block.
struct KernelCall {
  virtual ~KernelCall() = default;
  virtual void run() const = 0;
};
struct Launch {
  std::string name;
  dim3 grid, block;
  size_t shared_bytes = 0;
  std::shared_ptr<const KernelCall> call;
};

// Checks the configuration (CUDA's limits; dynamic shared memory up to 48 KiB, the default
// without an opt-in) and enqueues the launch; a bad configuration is the launch's error
// (cudaGetLastError), not a fault.
void launch(cudaStream_t stream, Launch l);

// Runs every block of a launch (scheduler.cpp). Called by stream work, one launch at a time.
void run_kernel(const Launch& l);

// The emulated NVTX's record (include/nvtx3/nvToolsExt.h, nvtx.cpp): every range push (with
// its name) and pop of the process in call order, with the calling thread and the range's
// depth on it (0: outermost). Returns the record so far and starts a new one.
struct NvtxEvent {
  bool push;
  std::string name;  // empty for a pop
  int depth;
  std::thread::id thread;
};
std::vector<NvtxEvent> take_nvtx_events();

// What the host asked of the device since the process started, counted by the runtime itself
// (the exact figures the backend's own counts, kernels/cuda/counters.h, are checked against):
//   host_syncs       cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
//                    cudaMemcpy, cudaMemset, cudaFree and cudaFreeHost (of memory), and
//                    cudaMemcpyAsync into pageable memory
//   launches         kernels, cuBLASLt matmuls and cub calls (count_launch), cudaMemsetAsync
//   graph_launches   cudaGraphLaunch
//   pageable_copies  cudaMemcpy and cudaMemcpyAsync with a host side that is not pinned
// Captured work is counted once, when captured (its launches); a graph launch adds 1 to
// graph_launches and nothing else, however many launches its replay runs again.
struct Counters {
  int64_t host_syncs = 0;
  int64_t launches = 0;
  int64_t graph_launches = 0;
  int64_t pageable_copies = 0;
};
Counters counters();
// The emulated libraries count their calls that enqueue work.
void count_launch();

}  // namespace packbert::emu
