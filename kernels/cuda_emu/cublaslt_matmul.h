// What the emulated cuBLASLt's API (cublaslt.cpp: descriptors, checks, the heuristic, the
// matmul's call) and its arithmetic (cublaslt_matmul.cpp) share: a matrix layout, a matmul as
// checked, and the stream work that computes it.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>

// cublasLtMatrixLayout_t's object (opaque in cublasLt.h, as in cuBLASLt).
struct cublasLtMatrixLayoutOpaque_st {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

namespace packbert::emu::cublaslt {

inline bool is_fp8_type(int t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// Bytes of an element of a float type the emulation takes (fp32, bf16, f16, the two FP8).
inline size_t type_bytes(int t) { return t == CUDA_R_32F ? 4 : is_fp8_type(t) ? 1 : 2; }

// Epilogues that read the bias vector (BGRADB writes it instead).
inline bool has_bias_input(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

// The GEMM as checked: the descriptor's and layouts' values with the transposes resolved.
struct Problem {
  bool transa, transb;
  uint64_t m, n, k;
  cublasLtMatrixLayoutOpaque_st a, b, c, d;
  uint32_t epilogue;
  int32_t bias_type;  // resolved: D's type when the descriptor says -1
  int64_t aux_ld;
  // FP8: the fp32 factors A, B and D are multiplied by (device pointers, read when the work
  // runs; null: 1), where the amax of D goes (null: none), and the accumulation mode.
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  const void* d_scale = nullptr;
  void* amax_d = nullptr;
  bool fast_accum = false;
};

// Runs the GEMM and its epilogue (stream work), with the arithmetic cublaslt.cpp's header
// describes. Everything is read before anything is written, so that C == D and the aux matrix
// may overlap the inputs.
void run_matmul(const Problem& p, double alpha, double beta, const void* A, const void* B,
                const void* C, void* D, void* bias, void* aux);

}  // namespace packbert::emu::cublaslt
