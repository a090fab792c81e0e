// The emulated cuBLASLt's checks (cublaslt_checks.cpp), which its heuristic and its matmul
// (cublaslt.cpp) share: a matmul descriptor's state, the problem it describes checked into a
// Problem, and each buffer the matmul touches checked against the device's allocations. What
// they refuse, and with which status, is cublaslt.cpp's header's "Checks".
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>

#include "kernels/cuda_emu/cublaslt_matmul.h"

// cublasLtMatmulDesc_t's object (opaque in cublasLt.h, as in cuBLASLt).
struct cublasLtMatmulDescOpaque_st {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
  void* aux = nullptr;
  int64_t aux_ld = 0;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  const void* d_scale = nullptr;
  void* amax_d = nullptr;
  int8_t fast_accum = 0;
};

namespace packbert::emu::cublaslt {

// Epilogues that read or write the aux matrix (GELU_AUX_BIAS writes it, DGELU reads it).
bool has_aux(uint32_t e);

// The checks the heuristic and the matmul share: INVALID_VALUE for what is inconsistent,
// NOT_SUPPORTED for a consistent problem the emulation has no algorithm for. On success p holds
// the problem; otherwise why says what was refused.
cublasStatus_t check_problem(const cublasLtMatmulDescOpaque_st* op,
                             const cublasLtMatrixLayoutOpaque_st* a,
                             const cublasLtMatrixLayoutOpaque_st* b,
                             const cublasLtMatrixLayoutOpaque_st* c,
                             const cublasLtMatrixLayoutOpaque_st* d, Problem* p, std::string* why);

// One buffer the matmul touches: inside one device allocation for its whole extent, aligned to
// its element. Records the fault and returns false otherwise.
bool check_buffer(const char* name, const void* ptr, int type, uint64_t rows, uint64_t cols,
                  uint64_t ld);

}  // namespace packbert::emu::cublaslt
