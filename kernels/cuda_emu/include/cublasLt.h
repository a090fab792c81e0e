// cuBLASLt as the emulated build sees it (PACKBERT_CUDA=EMULATED): the types, enums and calls
// packbert uses (kernels/cuda/cuda_gemm.cpp, cuda_backend.cpp), with cuBLASLt's names and
// numeric values (cublasLt.h, cublas_api.h) so that cached plans and logged statuses read the
// same as on a GPU. The implementation, and what it models, is kernels/cuda_emu/cublaslt.cpp
// (the arithmetic cublaslt_matmul.cpp).
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>

// ---- statuses and basic enums (cublas_api.h) -------------------------------------------------
typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
} cublasOperation_t;

// Only CUBLAS_COMPUTE_32F is implemented; the others are named so that a refusal can be tested.
typedef enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

// ---- handles and descriptors -----------------------------------------------------------------
// Opaque here as in cuBLASLt; defined in cublaslt.cpp (the layout in cublaslt_matmul.h).
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_st* cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_st* cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque_st* cublasLtMatmulPreference_t;

// Semi-opaque and copyable as in cuBLASLt (callers cache it): the emulation records in it the
// problem the heuristic found it for.
typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

// ---- attributes ------------------------------------------------------------------------------
// The matmul descriptor's attributes the emulation implements (cuBLASLt's values; the stored
// size in the comment is what cublasLtMatmulDescSetAttribute checks). Others are refused.
typedef enum {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,           // int32_t (cublasComputeType_t)
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,             // int32_t (cudaDataType_t)
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                 // int32_t (cublasOperation_t)
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                 // int32_t (cublasOperation_t)
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,               // uint32_t (cublasLtEpilogue_t)
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,           // void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,  // void*
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,       // int64_t
  CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,       // const void* (fp32 on the device)
  CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,       // const void*
  CUBLASLT_MATMUL_DESC_D_SCALE_POINTER = 20,       // const void*
  CUBLASLT_MATMUL_DESC_AMAX_D_POINTER = 21,        // void*
  CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,            // int8_t
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,        // int32_t (cudaDataType_t; -1: D's type)
} cublasLtMatmulDescAttributes_t;

// Every epilogue cuBLASLt defines; the emulation implements DEFAULT, BIAS, GELU_AUX_BIAS, DGELU
// and BGRADB, and its heuristic refuses the others.
typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_RELU_AUX = 130,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_RELU_BIAS = 6,
  CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134,
  CUBLASLT_EPILOGUE_DRELU = 136,
  CUBLASLT_EPILOGUE_DRELU_BGRAD = 152,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = 160,
  CUBLASLT_EPILOGUE_GELU_BIAS = 36,
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
  CUBLASLT_EPILOGUE_DGELU = 192,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

// The preference's attributes (all accepted with their sizes; none changes the emulation's
// answer).
typedef enum {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,            // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t
  CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,  // uint32_t
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,  // uint32_t
  CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,        // float
  CUBLASLT_MATMUL_PREF_IMPL_MASK = 12,             // uint64_t
} cublasLtMatmulPreferenceAttributes_t;

// ---- calls -----------------------------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes);

// Column-major: element (i, j) at i + j * ld.
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount);

// alpha and beta are host pointers (CUBLASLT_POINTER_MODE_HOST, the only mode), read at the
// call; A, B, C and the epilogue's buffers are read when the work runs on `stream`.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream);
