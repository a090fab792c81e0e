// What the host asks of the device, counted where it asks: host synchronisations, launches,
// graph launches and copies from or to pageable memory. The backend reports them
// (Backend::counters, kernels/backend.h) and the trainer turns them into per-step figures
// (train/metrics.h). They are the process's counts (every CUDA backend and transport of the
// process), the same on a GPU and in the emulated build, where the emulated runtime's own counts
// (kernels/cuda_emu/runtime.h, emu::counters) check that no call escapes them
// (tests/gpu/test_cuda_counters.cpp).
//
// Every runtime call of kernels/cuda that waits for the device, launches work or copies to or
// from host memory goes through a function here, and each kernel launch through PB_LAUNCH
// (device_seams.cuh), which counts it. What counts:
//   host_syncs       the calls that return only once the device has reached them:
//                    cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
//                    cudaMemcpy, cudaFree, cudaFreeHost, and cudaMemcpyAsync into pageable memory
//   launches         work items enqueued one by one: kernels, cuBLASLt matmuls, cub calls
//                    (each one item, though on a GPU some are several kernels) and memsets
//                    (NCCL's collectives are not counted)
//   graph_launches   cudaGraphLaunch
//   pageable_copies  copies with a host side that is not pinned (cudaMallocHost); such a copy
//                    cannot overlap anything and is illegal during a graph capture
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace packbert::cuda {

struct HostWork {
  int64_t host_syncs = 0;
  int64_t launches = 0;
  int64_t graph_launches = 0;
  int64_t pageable_copies = 0;
};

// The counts since the process started.
HostWork host_work();

// A recorded graph reads the buffers it was recorded with. A backend's grow-only buffers (scratch,
// workspaces) give their outgrown memory back through retire(): at once while no graph of the
// process lives, else when the last one goes (graph_made / graph_gone count them), so that no
// replay reads freed memory. The buffers are per-op scratch, so a graph and the ops after the
// growth never share one.
cudaError_t retire(void* device_memory);
void graph_made();
void graph_gone();  // the last graph: frees what was retired meanwhile

// Counts one launch and returns s (PB_LAUNCH's stream argument).
cudaStream_t counted_launch(cudaStream_t s);
// Counts one launch of a library call (cuBLASLt, cub) that enqueued work.
void count_launch();

// The runtime calls above, counted.
cudaError_t stream_synchronize(cudaStream_t s);
cudaError_t event_synchronize(cudaEvent_t e);
cudaError_t device_free(void* p);
cudaError_t host_free(void* p);
cudaError_t memcpy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                         cudaStream_t s);
cudaError_t memset_async(void* p, int value, size_t bytes, cudaStream_t s);
cudaError_t graph_launch(cudaGraphExec_t exec, cudaStream_t s);

}  // namespace packbert::cuda
