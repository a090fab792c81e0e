// The CUDA backend: every op of kernels/backend.h with the CPU backend's semantics, in fp32 and
// bf16 / fp16 storage: GEMMs through cuBLASLt (fp32 compute, no TF32) with fused epilogues,
// tensor-core attention (fmha_mma_*.cu), the rest in deterministic kernels. Built with
// PACKBERT_HAVE_CUDA (a GPU build, or the emulated one: kernels/cuda_emu).
#pragma once

#include <string>

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "kernels/backend.h"

namespace packbert {

struct CudaBackendOptions {
  // Copy each op's index arrays (layout, token ids, labels, gather indices, the LAMB table) to
  // the host and check them with kernels/common/op_checks.h, as the CPU backend does. This
  // synchronises the stream once per op, so the trainer turns it off (it checks the batch and
  // the table on the host before they are uploaded).
  bool validate_indices = true;
  // Check with cudaPointerGetAttributes that every Device::cuda tensor really is device memory.
  bool validate_pointers = true;
  // Wait for the stream after every op and check it, so that a fault names the op that caused
  // it (a debugging mode for the first runs on a new GPU). Also on when the environment sets
  // PACKBERT_CUDA_SYNC=1.
  bool sync_each_op = false;
  // Use cuBLASLt's BIAS / BGRADB epilogues where they apply; false runs every GEMM with the
  // DEFAULT epilogue plus the equivalent kernel (a bisection switch for a new GPU or cuBLASLt
  // version). Also false when the environment sets PACKBERT_CUDA_NO_EPILOGUES=1.
  bool use_epilogues = true;
};

// Throws packbert::Error when there is no such device (or no driver).
std::unique_ptr<Backend> make_cuda_backend(int device = 0, const CudaBackendOptions& options = {});

// The backend's allocator (Backend::allocate_memory makes its GPU current first), and for tests:
// cudaMalloc on the current device (256-byte aligned), throwing packbert::Error naming the size
// when it fails; cuda_alloc(0) returns nullptr; cuda_free(nullptr) does nothing.
void* cuda_alloc(size_t bytes);
// cudaMalloc of `bytes` for `what` (op's buffer outside Backend::alloc); out of memory is an
// Error "out of cuda memory: WHAT asked N bytes, F MiB free of T MiB" + note (the plan's figure).
void* cuda_alloc_named(const char* op, const char* what, size_t bytes, const std::string& note);
void cuda_free(void* p);

// Waits for all work of this backend (a CUDA backend's stream); no-op for other backends (tests;
// elsewhere Backend::synchronize).
void cuda_synchronize(Backend& backend);

}  // namespace packbert
