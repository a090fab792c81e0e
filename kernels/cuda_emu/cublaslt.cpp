// cuBLASLt on the emulated device: the matmul packbert's linear layers run (cuda_gemm.cpp),
// computed on the CPU in stream order. This file is the API (handles, descriptors, the
// heuristic, the matmul's call); the checks both make are cublaslt_checks.cpp's, the arithmetic
// it describes cublaslt_matmul.cpp's.
//
// What is modelled, as the cuBLAS documentation defines it (cublasLtMatmul; cublasLtEpilogue_t;
// cublasLtMatmulDescAttributes_t), in column-major terms (element (i, j) at i + j * ld):
//   D = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, C and D m x n, then the epilogue:
//   BIAS           adds bias[i] (a packed vector of D's row count) to every column;
//   GELU_AUX_BIAS  adds the bias, writes that GELU input to the aux matrix (D's type, leading
//                  dimension EPILOGUE_AUX_LD), and D = gelu(input), GELU's tanh approximation;
//   DGELU          multiplies alpha op(A) op(B) + beta C by gelu'(aux), the derivative of that
//                  same tanh form (the epilogue follows the scaling, as for the others);
//   BGRADB         writes the bias gradient, one element per column of D: the sum of op(B)'s
//                  column over k, in the bias data type, not scaled by alpha (the
//                  documentation does not say; packbert asks for it with alpha = 1 only).
//   The bias and bias-gradient vectors have CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, by default
//   (-1) D's type, as the attribute's documentation says; the aux matrix has D's type.
//   Arithmetic: inputs widened exactly, products summed over k in double, the epilogue in
//   double, then D (and aux, and the bias gradient) rounded once to fp32 and, for bf16 / f16,
//   from there to nearest even (cuda_bf16.h / cuda_fp16.h). beta == 0 does not read C (C
//   need not be a valid input then, as cuBLAS documents for its GEMMs: it may hold NaN).
//   Types: compute CUBLAS_COMPUTE_32F with fp32 scale; A and B of one type in fp32 / bf16 /
//   f16; C and D of one type, A's or fp32; a bias of D's type or fp32.
//   In place (C == D) needs C's and D's layouts to agree; C != D may differ in ld only.
//   alpha and beta are host values read at the call (the default pointer mode); every buffer
//   is read and written when the work runs on the stream, so a result is there only once the
//   stream has been waited for, and inputs are whatever earlier work on the stream left.
// Checks: shapes (INVALID_VALUE, also for ld < rows and an aux ld below D's rows), the type and
//   epilogue combinations above (NOT_SUPPORTED from the heuristic and from the matmul), the
//   aux leading dimension's documented multiple of 8 (NOT_SUPPORTED), an algorithm that the
//   heuristic did not give for these types and epilogue, and at the matmul every buffer it
//   touches lying inside one device allocation (or pinned memory) for the extent its layout
//   implies, ld * (cols - 1) + rows elements, aligned to its element: a failure is a sticky
//   device fault (runtime.h) naming the matrix, as the GPU would fault, and EXECUTION_FAILED.
// A test-only switch: with PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES=1 in the environment the
//   heuristic still offers every epilogue, but the matmul refuses any other than DEFAULT with
//   NOT_SUPPORTED before it touches anything, saying so on stderr once per refusal (what a
//   cuBLASLt version whose heuristic promised more than its kernels take does; the backend
//   must fall back to its kernels and not ask again).
// What it cannot tell: which shapes, transposes, alignments or epilogue combinations a real
//   cuBLASLt version offers algorithms for (its heuristic answers one algorithm, workspace 0,
//   for every supported combination and ignores the preference's workspace and alignment
//   limits), the algorithms themselves (split-k, tiling, tensor cores), and so the GPU's
//   order of fp32 accumulation and its rounding of intermediates: the emulation is more exact
//   than the GPU, which differs from it by fp32 rounding errors growing with k.
#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "kernels/cuda_emu/cublaslt_checks.h"
#include "kernels/cuda_emu/cublaslt_matmul.h"
#include "kernels/cuda_emu/runtime.h"

struct cublasLtContext {};  // one device, no per-context state

// Kept only so that setting them can be checked; the emulation's answers do not depend on them.
struct cublasLtMatmulPreferenceOpaque_st {
  uint32_t search_mode = 0;
  uint64_t max_workspace_bytes = 0;
  uint32_t reduction_scheme_mask = 0;
  uint32_t min_alignment[4] = {256, 256, 256, 256};
  float max_waves_count = 0.f;
  uint64_t impl_mask = ~uint64_t{0};
};

namespace {

namespace emu = packbert::emu;
using namespace packbert::emu::cublaslt;

// Written into every algorithm the heuristic returns, with the problem it was found for.
constexpr uint64_t kAlgoMagic = 0x7062656d754c7431ull;

void complain(const char* call, const std::string& what) {
  std::fprintf(stderr, "cublasLt emulation: %s: %s\n", call, what.c_str());
}

// The test-only switch above, read at every matmul (a test sets it before it runs).
bool refuse_epilogues_at_run() {
  const char* v = std::getenv("PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES");
  return v && *v && std::strcmp(v, "0") != 0;
}

}  // namespace

// ---- status names ----------------------------------------------------------------------------
const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute (the emulation's fault message is on stderr)";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the license";
  }
  return "unknown status";
}

// ---- handles and descriptors -----------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new (std::nothrow) cublasLtContext();
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new (std::nothrow) cublasLtMatmulDescOpaque_st();
  if (!*desc) return CUBLAS_STATUS_ALLOC_FAILED;
  (*desc)->compute = compute;
  (*desc)->scale = scale;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// Copies an attribute's value when the caller's size is the attribute's.
template <typename T>
cublasStatus_t set_value(T* field, const void* buf, size_t size) {
  if (size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (!desc || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: {
      int32_t v;
      const cublasStatus_t s = set_value(&v, buf, size);
      if (s == CUBLAS_STATUS_SUCCESS) desc->compute = static_cast<cublasComputeType_t>(v);
      return s;
    }
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
      int32_t v;
      const cublasStatus_t s = set_value(&v, buf, size);
      if (s == CUBLAS_STATUS_SUCCESS) desc->scale = static_cast<cudaDataType_t>(v);
      return s;
    }
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_value(&desc->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_value(&desc->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_value(&desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_value(&desc->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_value(&desc->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return set_value(&desc->a_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return set_value(&desc->b_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return set_value(&desc->d_scale, buf, size);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return set_value(&desc->amax_d, buf, size);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return set_value(&desc->fast_accum, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_value(&desc->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_value(&desc->aux_ld, buf, size);
  }
  complain("cublasLtMatmulDescSetAttribute",
           "attribute " + std::to_string(static_cast<int>(attr)) + " is not emulated");
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new (std::nothrow) cublasLtMatrixLayoutOpaque_st{type, rows, cols, ld};
  return *layout ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new (std::nothrow) cublasLtMatmulPreferenceOpaque_st();
  return *pref ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (!pref || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return set_value(&pref->search_mode, buf, size);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_value(&pref->max_workspace_bytes, buf, size);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return set_value(&pref->reduction_scheme_mask, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_value(&pref->min_alignment[0], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_value(&pref->min_alignment[1], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_value(&pref->min_alignment[2], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_value(&pref->min_alignment[3], buf, size);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return set_value(&pref->max_waves_count, buf, size);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: return set_value(&pref->impl_mask, buf, size);
  }
  complain("cublasLtMatmulPreferenceSetAttribute",
           "attribute " + std::to_string(static_cast<int>(attr)) + " is not emulated");
  return CUBLAS_STATUS_INVALID_VALUE;
}

// ---- the heuristic and the matmul ------------------------------------------------------------
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!returned) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  if (!pref || requested <= 0 || !results) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  std::string why;
  const cublasStatus_t st = check_problem(op, a, b, c, d, &p, &why);
  if (st == CUBLAS_STATUS_INVALID_VALUE) complain("cublasLtMatmulAlgoGetHeuristic", why);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = static_cast<uint64_t>(p.a.type);
  r.algo.data[2] = static_cast<uint64_t>(p.d.type);
  r.algo.data[3] = p.epilogue;
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_layout, const void* B,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_layout, void* D,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* /*workspace*/, size_t /*workspace_bytes*/,
                              cudaStream_t stream) {
  const char* call = "cublasLtMatmul";
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  std::string why;
  const cublasStatus_t st = check_problem(op, a_layout, b_layout, c_layout, d_layout, &p, &why);
  if (st == CUBLAS_STATUS_INVALID_VALUE) complain(call, why);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta) {
    complain(call, "null alpha or beta");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (algo && algo->data[0] != kAlgoMagic) {
    complain(call, "the algorithm did not come from cublasLtMatmulAlgoGetHeuristic");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (algo && (algo->data[1] != static_cast<uint64_t>(p.a.type) ||
               algo->data[2] != static_cast<uint64_t>(p.d.type) || algo->data[3] != p.epilogue))
    return CUBLAS_STATUS_NOT_SUPPORTED;  // found for other types or another epilogue
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT && refuse_epilogues_at_run()) {
    complain(call, "epilogue " + std::to_string(p.epilogue) + " refused at run time (m=" +
                       std::to_string(p.m) + " n=" + std::to_string(p.n) +
                       " k=" + std::to_string(p.k) + ", PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES)");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (C == D && (p.c.ld != p.d.ld)) {
    complain(call, "in place (C == D) with C's ld " + std::to_string(p.c.ld) + " and D's " +
                       std::to_string(p.d.ld));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool uses_bias = has_bias_input(p.epilogue) || p.epilogue == CUBLASLT_EPILOGUE_BGRADB;
  if ((uses_bias && !op->bias) || (has_aux(p.epilogue) && !op->aux)) {
    complain(call, "epilogue " + std::to_string(p.epilogue) + " without its " +
                       (uses_bias && !op->bias ? "BIAS_POINTER" : "EPILOGUE_AUX_POINTER"));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float alpha_value, beta_value;
  std::memcpy(&alpha_value, alpha, sizeof(float));
  std::memcpy(&beta_value, beta, sizeof(float));

  const auto ld = [](int64_t v) { return static_cast<uint64_t>(v); };
  const bool ok =
      check_buffer("matrix A", A, p.a.type, p.a.rows, p.a.cols, ld(p.a.ld)) &&
      check_buffer("matrix B", B, p.b.type, p.b.rows, p.b.cols, ld(p.b.ld)) &&
      (beta_value == 0.f || check_buffer("matrix C", C, p.c.type, p.m, p.n, ld(p.c.ld))) &&
      check_buffer("matrix D", D, p.d.type, p.m, p.n, ld(p.d.ld)) &&
      (!has_bias_input(p.epilogue) ||
       check_buffer("bias vector", op->bias, p.bias_type, p.m, 1, p.m)) &&
      (p.epilogue != CUBLASLT_EPILOGUE_BGRADB ||
       check_buffer("bias gradient vector", op->bias, p.bias_type, p.n, 1, p.n)) &&
      (!has_aux(p.epilogue) ||
       check_buffer("aux matrix", op->aux, p.d.type, p.m, p.n, ld(p.aux_ld)));
  if (!ok) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (is_fp8_type(p.a.type)) {
    // FP8's tensor-core requirement on the matrices' addresses: 16-byte alignment.
    const void* ptrs[4] = {A, B, C, D};
    const char* names[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; ++i)
      if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0 && (i != 2 || beta_value != 0.f)) {
        complain(call, std::string("FP8 with matrix ") + names[i] + " not 16-byte aligned");
        return CUBLAS_STATUS_NOT_SUPPORTED;
      }
    const std::pair<const char*, const void*> scalars[4] = {{"A scale", p.a_scale},
                                                            {"B scale", p.b_scale},
                                                            {"D scale", p.d_scale},
                                                            {"D amax", p.amax_d}};
    for (const auto& [name, ptr] : scalars)
      if (ptr && !check_buffer(name, ptr, CUDA_R_32F, 1, 1, 1))
        return CUBLAS_STATUS_EXECUTION_FAILED;
  }

  void* bias = op->bias;
  void* aux = op->aux;
  const double alpha_d = alpha_value, beta_d = beta_value;
  const cudaError_t e = emu::enqueue(stream, call, [p, alpha_d, beta_d, A, B, C, D, bias, aux] {
    run_matmul(p, alpha_d, beta_d, A, B, C, D, bias, aux);
  });
  if (e == cudaSuccess) emu::count_launch();
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
