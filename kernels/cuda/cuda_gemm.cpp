// The CUDA backend's GEMMs through cuBLASLt: the one matmul call with its per-shape plan cache
// (gemm), and the GEMMs of a linear layer (forward, weight gradient, input gradient) that the
// linear layers (cuda_linear.cpp) and the heads (cuda_losses.cpp) share. fp32 compute
// (CUBLAS_COMPUTE_32F: true fp32 arithmetic, no TF32, so the ops tests can compare with the CPU
// at ~1e-6) on fp32 operands, or on bf16 / f16 ones with mixed precision.
//
// Row-major to cuBLASLt's column-major: a row-major [r, c] buffer is a column-major c x r
// matrix with ld = c. So for out [N, M] = x [N, K] w^T (w [M, K]):
//   forward  out^T (M x N) = op_T(w: K x M) * x^T (K x N)          transa = T, transb = N
//   dx       dx^T  (K x N) = w^T (K x M) * dout^T (M x N)          transa = N, transb = N
//   dw       dw^T  (K x M) = x^T (K x N) * op_T(dout^T: M x N)     transa = N, transb = T
// Epilogues used and why (cublasLt.h; cuBLAS docs, cublasLtEpilogue_t):
//   BIAS     forward bias: the vector has D's row count (M), broadcast over columns. ✓
//   BGRADB   dw GEMM's bias gradient: B's columns after op (M) reduced over k (N tokens) --
//            exactly db. It WRITES the gradient, the contract ADDS it, so it goes to scratch
//            and a kernel adds it to db.
//   GELU_AUX_BIAS  forward of Epilogue::bias_gelu_tanh: D = gelu(AB + bias) with AB + bias
//            written to the aux matrix (`pre`, same shape and ld as D).
//   DGELU    dx GEMM of a layer whose input went through the tanh GELU (options.x_gelu_pre):
//            D = (AB) * gelu'(aux). Its bias gradient (DGELU_BGRAD) is not used: it would belong
//            to the previous layer's call, whose weight-gradient GEMM produces it through BGRADB.
//   cuBLASLt's GELU is the tanh approximation (the form PyTorch's _addmm_activation documents
//   for its cuBLASLt path; XLA fuses only the approximate GELU into it), so the exact erf form
//   (Epilogue::bias_gelu, the default) stays BIAS into `pre` + the gelu kernel, and its dGELU a
//   kernel. The aux matrix needs ld % 8 == 0; other shapes take the kernels too.
// When the heuristic offers no algorithm for an epilogue (e.g. an alignment it cannot serve),
// the GEMM runs with DEFAULT and a kernel does the epilogue; the choice is cached per shape.
// An epilogue the heuristic offered but the matmul refuses takes the same fallback, cached too.
#include <cstdio>
#include <cstring>

#include "kernels/cuda/cuda_backend_impl.h"

namespace packbert {

namespace {

// The largest power of two (<= 256) dividing the address: what the heuristic may assume.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

// RAII for cuBLASLt descriptors (destroyed even when a later call throws).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

bool CudaBackend::GemmKey::operator==(const GemmKey& o) const {
  return std::memcmp(this, &o, sizeof(GemmKey)) == 0;
}

size_t CudaBackend::GemmKeyHash::operator()(const GemmKey& k) const {
  size_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(&k);
  for (size_t i = 0; i < sizeof(GemmKey); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool CudaBackend::gemm(const char* op, const GemmCall& g) {
  if (!options_.use_epilogues && g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) return false;
  GemmKey key;
  std::memset(&key, 0, sizeof(key));  // padding bytes too: the key is hashed and compared raw
  key.m = g.m;
  key.n = g.n;
  key.k = g.k;
  key.lda = g.lda;
  key.ldb = g.ldb;
  key.ldc = g.ldc;
  key.transa = g.transa;
  key.transb = g.transb;
  key.epilogue = static_cast<int32_t>(g.epilogue);
  key.beta_zero = g.beta == 0.f;
  key.ab_type = static_cast<int32_t>(g.ab_type);
  key.c_type = static_cast<int32_t>(g.c_type);
  key.b_type = g.b_type;
  key.scaled = (g.a_scale ? 1 : 0) | (g.b_scale ? 2 : 0);
  key.fast_accum = g.fast_accum;
  key.align_a = alignment(g.a);
  key.align_b = alignment(g.b);
  key.align_c = alignment(g.c);
  key.align_bias = g.bias ? alignment(g.bias) : 0;
  key.align_aux = g.aux ? alignment(g.aux) : 0;

  LtDescs d;
  PB_CUBLASLT_OP(op, cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  PB_CUBLASLT_OP(
      op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  PB_CUBLASLT_OP(
      op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &g.epilogue, sizeof(g.epilogue)));
  if (g.bias) {
    PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &g.bias, sizeof(g.bias)));
    const cudaDataType_t bt = CUDA_R_32F;
    PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bt, sizeof(bt)));
  }
  if (g.aux) {  // the aux matrix has D's type (the default), shape and leading dimension
    PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(
                           d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
    const int64_t aux_ld = g.ldc;
    PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                      &aux_ld, sizeof(aux_ld)));
  }
  // FP8: the de-scaling factors, read on the device when the GEMM runs (a graph replays with
  // the values there then), and the accumulation mode.
  for (const auto& [attr, ptr] : {std::pair{CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale},
                                  std::pair{CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale}})
    if (ptr) PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, attr, &ptr, sizeof(ptr)));
  if (g.fast_accum) {
    const int8_t on = 1;
    PB_CUBLASLT_OP(
        op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
  }
  const uint64_t a_rows = static_cast<uint64_t>(g.transa ? g.k : g.m);
  const uint64_t a_cols = static_cast<uint64_t>(g.transa ? g.m : g.k);
  const uint64_t b_rows = static_cast<uint64_t>(g.transb ? g.n : g.k);
  const uint64_t b_cols = static_cast<uint64_t>(g.transb ? g.k : g.n);
  PB_CUBLASLT_OP(op, cublasLtMatrixLayoutCreate(&d.a, g.ab_type, a_rows, a_cols, g.lda));
  const auto b_type = g.b_type >= 0 ? static_cast<cudaDataType_t>(g.b_type) : g.ab_type;
  PB_CUBLASLT_OP(op, cublasLtMatrixLayoutCreate(&d.b, b_type, b_rows, b_cols, g.ldb));
  PB_CUBLASLT_OP(op, cublasLtMatrixLayoutCreate(&d.c, g.c_type, static_cast<uint64_t>(g.m),
                                                static_cast<uint64_t>(g.n), g.ldc));

  auto it = plans_.find(key);
  if (it == plans_.end()) {
    PB_CUBLASLT_OP(op, cublasLtMatmulPreferenceCreate(&d.pref));
    PB_CUBLASLT_OP(
        op, cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes_, sizeof(workspace_bytes_)));
    // The heuristic assumes 256-byte aligned buffers unless told otherwise; views into a
    // workspace (nsp_loss, MLM chunks) can be less aligned.
    const uint32_t aligns[4] = {key.align_a, key.align_b, key.align_c, key.align_c};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      PB_CUBLASLT_OP(op, cublasLtMatmulPreferenceSetAttribute(d.pref, which[i], &aligns[i],
                                                              sizeof(aligns[i])));
    GemmPlan plan;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt_, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan.supported = true;
      plan.algo = result.algo;
    } else if (g.epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
      PB_CUBLASLT_OP(op, st);  // names the status when the query itself failed
      PB_THROW(
          "{}: cuBLASLt has no algorithm for m={} n={} k={} (ld {} {} {}, transa {} "
          "transb {}, A/B type {}, C/D type {}, fp32 compute)",
          op, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.transa, g.transb, static_cast<int>(g.ab_type),
          static_cast<int>(g.c_type));
    } else {
      // Any refusal of an epilogue (no algorithm, NOT_SUPPORTED, INVALID_VALUE for a
      // combination it does not take) falls back to DEFAULT + a kernel; said once per shape so
      // that the device check shows which epilogues are in use.
      fmt::print(stderr,
                 "packbert cuda: {}: cuBLASLt epilogue {} unavailable for m={} n={} k={} "
                 "(A/B type {}, C/D type {}; status {}); using a kernel instead\n",
                 op, static_cast<int>(g.epilogue), g.m, g.n, g.k, static_cast<int>(g.ab_type),
                 static_cast<int>(g.c_type), cublasLtGetStatusName(st));
    }
    it = plans_.emplace(key, plan).first;
  }
  if (!it->second.supported) return false;
  const cublasStatus_t st =
      cublasLtMatmul(lt_, d.op, &g.alpha, g.a, d.a, g.b, d.b, &g.beta, g.c, d.c, g.c, d.c,
                     &it->second.algo, workspace_, workspace_bytes_, stream_);
  if (st == CUBLAS_STATUS_SUCCESS) {
    cuda::count_launch();
    return true;
  }
  if (g.epilogue == CUBLASLT_EPILOGUE_DEFAULT) PB_CUBLASLT_OP(op, st);
  // The heuristic offered this epilogue but the matmul refused it (a refusal returns before
  // any work is queued): the same fallback as a refused heuristic, remembered for the shape so
  // that later calls go straight to DEFAULT + the kernel.
  it->second.supported = false;
  fmt::print(stderr,
             "packbert cuda: {}: cuBLASLt refused epilogue {} at run time for m={} n={} k={} "
             "(A/B type {}, C/D type {}; status {}); using a kernel instead\n",
             op, static_cast<int>(g.epilogue), g.m, g.n, g.k, static_cast<int>(g.ab_type),
             static_cast<int>(g.c_type), cublasLtGetStatusName(st));
  return false;
}

// ---- the GEMMs of a linear layer -----------------------------------------------------------
GemmCall CudaBackend::forward_gemm_call(const void* x, const void* w, void* out, int64_t n,
                                        int64_t k, int64_t m, cudaDataType_t type) {
  // Column-major: out^T [m x n] = w^T [m x k] (w stored k x m, transposed) * x^T [k x n].
  return gemm_call(true, false, m, n, k, w, k, x, k, out, m, type, type);
}

bool CudaBackend::gelu_aux_gemm(const char* op, GemmCall g, void* out, const float* bias) {
  // The aux matrix: leading dimension a multiple of 8, 16-byte aligned (the heuristic is not
  // told its alignment, so a view that breaks it takes the kernels).
  if (g.ldc % 8 != 0 || alignment(g.c) < 16) return false;
  g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  g.aux = g.c;  // the pre-activation
  g.c = out;
  g.bias = const_cast<float*>(bias);
  return gemm(op, g);
}

bool CudaBackend::weight_grad_gemm(const char* op, const void* x, const void* g, float* dw,
                                   float* db, int64_t n, int64_t k, int64_t m, cudaDataType_t ab,
                                   float alpha) {
  // Column-major: dw^T [k x m] += alpha x^T [k x n] * g [n x m]; fp32 output, accumulated.
  GemmCall c = gemm_call(false, true, k, m, n, x, k, g, m, dw, k, ab, CUDA_R_32F);
  c.alpha = alpha;
  c.beta = 1.0f;
  if (db != nullptr && alpha == 1.0f) {
    float* db_tmp = scratch_floats(op, static_cast<size_t>(m));
    c.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    c.bias = db_tmp;
    if (gemm(op, c)) {
      launched(op, "add_inplace", cuda::add_inplace(db, db_tmp, m, stream_));
      return true;
    }
  }
  c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;  // no db wanted, or BGRADB had no algorithm
  c.bias = nullptr;
  gemm(op, c);
  return false;
}

bool CudaBackend::input_grad_gemm(const char* op, const void* w, const void* g, void* dx, int64_t n,
                                  int64_t k, int64_t m, bool accumulate, cudaDataType_t ab,
                                  cudaDataType_t c_type, const void* tanh_gelu_pre, float alpha) {
  // Column-major: dx^T [k x n] (+)= alpha w^T [k x m] * g^T [m x n].
  GemmCall c = gemm_call(false, false, k, n, m, w, k, g, m, dx, k, ab, c_type);
  c.alpha = alpha;
  c.beta = accumulate ? 1.0f : 0.0f;
  // The aux matrix's leading dimension is k; as in gelu_aux_gemm, ld % 8 and 16-byte alignment.
  if (tanh_gelu_pre && k % 8 == 0 && alignment(tanh_gelu_pre) >= 16) {
    c.epilogue = CUBLASLT_EPILOGUE_DGELU;
    c.aux = const_cast<void*>(tanh_gelu_pre);
    if (gemm(op, c)) return true;
    c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    c.aux = nullptr;
  }
  gemm(op, c);
  return false;
}

}  // namespace packbert
