// The counts of kernels/cuda/counters.h.
#include "kernels/cuda/counters.h"

#include <atomic>
#include <mutex>
#include <vector>

namespace packbert::cuda {
namespace {

struct Atomics {
  std::atomic<int64_t> host_syncs{0}, launches{0}, graph_launches{0}, pageable_copies{0};
};
Atomics& atomics() {
  static Atomics a;
  return a;
}

void add(std::atomic<int64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

// Host memory that is not pinned (nor device memory): cudaPointerGetAttributes calls it
// unregistered.
bool pageable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes answer an error for unregistered memory
    return true;
  }
  return a.type == cudaMemoryTypeUnregistered;
}

}  // namespace

HostWork host_work() {
  Atomics& a = atomics();
  HostWork w;
  w.host_syncs = a.host_syncs.load(std::memory_order_relaxed);
  w.launches = a.launches.load(std::memory_order_relaxed);
  w.graph_launches = a.graph_launches.load(std::memory_order_relaxed);
  w.pageable_copies = a.pageable_copies.load(std::memory_order_relaxed);
  return w;
}

struct Retired {
  std::mutex mutex;
  int64_t graphs = 0;
  std::vector<void*> memory;
};
Retired& retired() {
  static Retired r;
  return r;
}

cudaError_t retire(void* p) {
  if (!p) return cudaSuccess;
  Retired& r = retired();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.graphs > 0) {
      r.memory.push_back(p);
      return cudaSuccess;
    }
  }
  return device_free(p);
}

void graph_made() {
  std::lock_guard<std::mutex> lock(retired().mutex);
  ++retired().graphs;
}

void graph_gone() {
  std::vector<void*> free_now;
  {
    Retired& r = retired();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (--r.graphs > 0) return;
    free_now.swap(r.memory);
  }
  for (void* p : free_now) (void)device_free(p);  // cudaFree waits for the work using it
}

cudaStream_t counted_launch(cudaStream_t s) {
  add(atomics().launches);
  return s;
}

void count_launch() { add(atomics().launches); }

cudaError_t stream_synchronize(cudaStream_t s) {
  add(atomics().host_syncs);
  return cudaStreamSynchronize(s);
}

cudaError_t event_synchronize(cudaEvent_t e) {
  add(atomics().host_syncs);
  return cudaEventSynchronize(e);
}

cudaError_t device_free(void* p) {
  if (!p) return cudaSuccess;
  add(atomics().host_syncs);
  return cudaFree(p);
}

cudaError_t host_free(void* p) {
  if (!p) return cudaSuccess;
  add(atomics().host_syncs);
  return cudaFreeHost(p);
}

cudaError_t memcpy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  add(atomics().host_syncs);
  if (bytes > 0 && kind != cudaMemcpyDeviceToDevice && (pageable(dst) || pageable(src)))
    add(atomics().pageable_copies);
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                         cudaStream_t s) {
  if (bytes > 0 && kind != cudaMemcpyDeviceToDevice) {
    const bool dst_pageable = pageable(dst), src_pageable = pageable(src);
    if (dst_pageable || src_pageable) add(atomics().pageable_copies);
    if (dst_pageable) add(atomics().host_syncs);  // returns once the copy is complete
  }
  return cudaMemcpyAsync(dst, src, bytes, kind, s);
}

cudaError_t memset_async(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes > 0) add(atomics().launches);
  return cudaMemsetAsync(p, value, bytes, s);
}

cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t s) {
  add(atomics().graph_launches);
  return cudaGraphLaunch(exec, s);
}

}  // namespace packbert::cuda
