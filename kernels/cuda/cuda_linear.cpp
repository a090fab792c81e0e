// Linear layers through cuBLASLt (fp32 in, fp32 out, CUBLAS_COMPUTE_32F: true fp32 arithmetic,
// no TF32, so the ops tests can compare with the CPU at ~1e-6; with mixed precision bf16 / f16
// operands, still fp32 compute, see "linear layers in bf16 / f16" below), and the two heads
// that are GEMMs plus a loss (MLM decoder, pooler + NSP).
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
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

#include "kernels/common/op_args.h"
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
  key.align_a = alignment(g.a);
  key.align_b = alignment(g.b);
  key.align_c = alignment(g.c);
  key.align_bias = g.bias ? alignment(g.bias) : 0;
  key.align_aux = g.aux ? alignment(g.aux) : 0;

  LtDescs d;
  PB_CUBLASLT_OP(op, cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
  PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                    sizeof(ta)));
  PB_CUBLASLT_OP(op, cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                    sizeof(tb)));
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
  const uint64_t a_rows = static_cast<uint64_t>(g.transa ? g.k : g.m);
  const uint64_t a_cols = static_cast<uint64_t>(g.transa ? g.m : g.k);
  const uint64_t b_rows = static_cast<uint64_t>(g.transb ? g.n : g.k);
  const uint64_t b_cols = static_cast<uint64_t>(g.transb ? g.k : g.n);
  PB_CUBLASLT_OP(op, cublasLtMatrixLayoutCreate(&d.a, g.ab_type, a_rows, a_cols, g.lda));
  PB_CUBLASLT_OP(op, cublasLtMatrixLayoutCreate(&d.b, g.ab_type, b_rows, b_cols, g.ldb));
  PB_CUBLASLT_OP(op, cublasLtMatrixLayoutCreate(&d.c, g.c_type, static_cast<uint64_t>(g.m),
                                                static_cast<uint64_t>(g.n), g.ldc));

  auto it = plans_.find(key);
  if (it == plans_.end()) {
    PB_CUBLASLT_OP(op, cublasLtMatmulPreferenceCreate(&d.pref));
    PB_CUBLASLT_OP(op, cublasLtMatmulPreferenceSetAttribute(
                           d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                           sizeof(workspace_bytes_)));
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
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, d.op, d.a, d.b, d.c, d.c,
                                                             d.pref, 1, &result, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      plan.supported = true;
      plan.algo = result.algo;
    } else if (g.epilogue == CUBLASLT_EPILOGUE_DEFAULT) {
      PB_CUBLASLT_OP(op, st);  // names the status when the query itself failed
      PB_THROW("{}: cuBLASLt has no algorithm for m={} n={} k={} (ld {} {} {}, transa {} "
               "transb {}, A/B type {}, C/D type {}, fp32 compute)", op, g.m, g.n, g.k, g.lda,
               g.ldb, g.ldc, g.transa, g.transb, static_cast<int>(g.ab_type),
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
  const cublasStatus_t st = cublasLtMatmul(lt_, d.op, &g.alpha, g.a, d.a, g.b, d.b, &g.beta,
                                           g.c, d.c, g.c, d.c, &it->second.algo, workspace_,
                                           workspace_bytes_, stream_);
  if (st == CUBLAS_STATUS_SUCCESS) return true;
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

// ---- linear layers -------------------------------------------------------------------------
void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 Epilogue epilogue, const Tensor& out, const Tensor& pre) {
  const trace::Range range("linear_forward");
  if (lowp::any({&x, &w, &bias, &out, &pre})) {
    if (linear_forward_lowp(x, w, bias, epilogue, out, pre)) return;
    return lowp::linear_forward(*this, lowp_, x, w, bias, epilogue, out, pre);
  }
  const char* op = "linear_forward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_forward_args(args, x, w, bias, epilogue, out, pre);
  PB_REQUIRE(!has_gelu(epilogue) || pre.data != out.data, "{}: pre may not alias out", op);
  if (n == 0 || m == 0) return;
  begin(op);
  // With GELU the GEMM writes the pre-activation buffer, which backward needs anyway.
  float* c = has_gelu(epilogue) ? pre.ptr<float>() : out.ptr<float>();
  const float* b = epilogue == Epilogue::none ? nullptr : bias.ptr<float>();
  bool bias_done = false;
  if (k == 0) {
    PB_CUDA_OP(op, cudaMemsetAsync(c, 0, static_cast<size_t>(n * m) * sizeof(float), stream_));
  } else {
    GemmCall g = forward_gemm_call(x.data, w.data, c, n, k, m, CUDA_R_32F);
    if (epilogue == Epilogue::bias_gelu_tanh && gelu_aux_gemm(op, g, out.data, b)) {
      end(op);
      return;
    }
    if (b) {
      g.epilogue = CUBLASLT_EPILOGUE_BIAS;
      g.bias = const_cast<float*>(b);
      bias_done = gemm(op, g);
    }
    if (!bias_done) {
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      gemm(op, g);
    }
  }
  if (b && !bias_done) launched(op, "add_bias_rows", cuda::add_bias_rows(c, b, n, m, stream_));
  if (has_gelu(epilogue))
    launched(op, "gelu_forward",
             cuda::gelu_forward(c, out.ptr<float>(), n * m, gelu_of(epilogue) == Gelu::tanh,
                                stream_));
  end(op);
}

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
                                   float* db, int64_t n, int64_t k, int64_t m,
                                   cudaDataType_t ab, float alpha) {
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

bool CudaBackend::input_grad_gemm(const char* op, const void* w, const void* g, void* dx,
                                  int64_t n, int64_t k, int64_t m, bool accumulate,
                                  cudaDataType_t ab, cudaDataType_t c_type,
                                  const void* tanh_gelu_pre, float alpha) {
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

void CudaBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout,
                                  const Tensor& dx, const Tensor& dw, const Tensor& db,
                                  const LinearBackwardOptions& opt) {
  const trace::Range range("linear_backward");
  if (lowp::any({&x, &w, &dout, &dx, &dw, &db, &opt.out_gelu_pre, &opt.x_gelu_pre})) {
    if (linear_backward_lowp(x, w, dout, dx, dw, db, opt)) return;
    return lowp::linear_backward(*this, lowp_, x, w, dout, dx, dw, db, opt);
  }
  const char* op = "linear_backward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_backward_args(args, x, w, dout, dx, dw, db, opt);
  if (n == 0) return;
  begin(op);

  float* g = dout.ptr<float>();
  const bool tanh_form = opt.gelu == Gelu::tanh;
  if (opt.out_gelu_pre.defined())
    launched(op, "gelu_backward_inplace",
             cuda::gelu_backward_inplace(g, opt.out_gelu_pre.ptr<float>(), n * m, tanh_form,
                                         stream_));
  bool db_done = !db.defined() || m == 0;
  if (dw.defined() && m > 0 && k > 0)
    db_done = weight_grad_gemm(op, x.data, g, dw.ptr<float>(),
                               db_done ? nullptr : db.ptr<float>(), n, k, m, CUDA_R_32F) ||
              db_done;
  if (!db_done) {
    double* partial = scratch_doubles(op, static_cast<size_t>(cuda::column_sum_partials(n, m)));
    launched(op, "add_column_sums",
             cuda::add_column_sums(g, n, m, m, partial, db.ptr<float>(), stream_));
  }
  if (dx.defined() && k > 0) {
    float* d = dx.ptr<float>();
    if (m == 0) {
      if (!opt.dx_accumulate)
        PB_CUDA_OP(op, cudaMemsetAsync(d, 0, static_cast<size_t>(n * k) * sizeof(float), stream_));
    } else {
      const bool fused = input_grad_gemm(op, w.data, g, d, n, k, m, opt.dx_accumulate,
                                         CUDA_R_32F, CUDA_R_32F,
                                         tanh_form ? opt.x_gelu_pre.data : nullptr);
      if (opt.x_gelu_pre.defined() && !fused)
        launched(op, "gelu_backward_inplace",
                 cuda::gelu_backward_inplace(d, opt.x_gelu_pre.ptr<float>(), n * k, tanh_form,
                                             stream_));
    }
  }
  end(op);
}

// ---- linear layers in bf16 / f16 -------------------------------------------------------------
// x, w (and dout) of one low-precision type T, fp32 compute; activations written in T, weight
// and bias gradients in fp32 (C/D fp32 with T operands), the bias read in fp32. The epilogues
// are the fp32 path's: BIAS (bias type fp32) and BGRADB (fp32 bias gradient) when cuBLASLt
// offers them for these types, else the GEMM writes fp32 scratch and the fp32 kernels finish.
// GELU runs on the rounded pre-activation (the CPU emulation takes it of the fp32 value before
// rounding: the two differ by a rounding of the argument, inside the precision's tolerance).
namespace {
cudaDataType_t cuda_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}
// The same view read as f32: the shared shape checks of op_args.h, with dtypes checked here.
Tensor shape_of(Tensor t) {
  if (t.defined()) t.dtype = DType::f32;
  return t;
}
}  // namespace

bool CudaBackend::linear_forward_lowp(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      Epilogue epilogue, const Tensor& out, const Tensor& pre) {
  const char* op = "linear_forward";
  const DType t = x.dtype;
  if (!lowp::is_lowp(t) || w.dtype != t || out.dtype != t || (pre.defined() && pre.dtype != t) ||
      (bias.defined() && bias.dtype != DType::f32))
    return false;
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_forward_args(args, shape_of(x), shape_of(w), bias,
                                                     epilogue, shape_of(out), shape_of(pre));
  PB_REQUIRE(!has_gelu(epilogue) || pre.data != out.data, "{}: pre may not alias out", op);
  if (n == 0 || m == 0) return true;
  begin(op);
  const cuda::FloatFormat f = float_format(op, "out", out);
  void* c = has_gelu(epilogue) ? pre.data : out.data;
  const float* b = epilogue == Epilogue::none ? nullptr : bias.ptr<float>();
  if (k == 0) {
    PB_CUDA_OP(op, cudaMemsetAsync(c, 0, static_cast<size_t>(n * m) * dtype_size(t), stream_));
    if (b) {  // bias only: through fp32 scratch
      float* tmp = scratch_floats(op, static_cast<size_t>(n * m));
      PB_CUDA_OP(op, cudaMemsetAsync(tmp, 0, static_cast<size_t>(n * m) * sizeof(float), stream_));
      launched(op, "add_bias_rows", cuda::add_bias_rows(tmp, b, n, m, stream_));
      launched(op, "convert", cuda::convert(tmp, cuda::FloatFormat::f32, c, f, n * m, stream_));
    }
  } else {
    GemmCall g = forward_gemm_call(x.data, w.data, c, n, k, m, cuda_type(t));
    if (epilogue == Epilogue::bias_gelu_tanh && gelu_aux_gemm(op, g, out.data, b)) {
      end(op);
      return true;
    }
    bool done = false;
    if (b) {
      g.epilogue = CUBLASLT_EPILOGUE_BIAS;
      g.bias = const_cast<float*>(b);
      done = gemm(op, g);
    }
    if (!done && !b) {
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      gemm(op, g);
    } else if (!done) {  // no BIAS epilogue for these types: fp32 scratch, bias, round
      float* tmp = scratch_floats(op, static_cast<size_t>(n * m));
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      g.c = tmp;
      g.c_type = CUDA_R_32F;
      gemm(op, g);
      launched(op, "add_bias_rows", cuda::add_bias_rows(tmp, b, n, m, stream_));
      launched(op, "convert", cuda::convert(tmp, cuda::FloatFormat::f32, c, f, n * m, stream_));
    }
  }
  if (has_gelu(epilogue))
    launched(op, "gelu_forward_lowp",
             cuda::gelu_forward_lowp(c, out.data, f, n * m, gelu_of(epilogue) == Gelu::tanh,
                                     stream_));
  end(op);
  return true;
}

bool CudaBackend::linear_backward_lowp(const Tensor& x, const Tensor& w, const Tensor& dout,
                                       const Tensor& dx, const Tensor& dw, const Tensor& db,
                                       const LinearBackwardOptions& opt) {
  const char* op = "linear_backward";
  const DType t = dout.dtype;
  auto is_t = [t](const Tensor& v) { return !v.defined() || v.dtype == t; };
  auto is_f32 = [](const Tensor& v) { return !v.defined() || v.dtype == DType::f32; };
  if (!lowp::is_lowp(t) || w.dtype != t || !is_t(x) || !is_t(dx) || !is_t(opt.out_gelu_pre) ||
      !is_t(opt.x_gelu_pre) || !is_f32(dw) || !is_f32(db))
    return false;
  LinearBackwardOptions shapes = opt;
  shapes.out_gelu_pre = shape_of(opt.out_gelu_pre);
  shapes.x_gelu_pre = shape_of(opt.x_gelu_pre);
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_backward_args(args, shape_of(x), shape_of(w),
                                                      shape_of(dout), shape_of(dx), dw, db,
                                                      shapes);
  if (n == 0) return true;
  begin(op);
  const cuda::FloatFormat f = float_format(op, "dout", dout);
  void* g = dout.data;
  const bool tanh_form = opt.gelu == Gelu::tanh;
  if (opt.out_gelu_pre.defined())
    launched(op, "gelu_backward_inplace_lowp",
             cuda::gelu_backward_inplace_lowp(g, opt.out_gelu_pre.data, f, n * m, tanh_form,
                                              stream_));
  bool db_done = !db.defined() || m == 0;
  if (dw.defined() && m > 0 && k > 0)  // weight gradients accumulate in fp32
    db_done = weight_grad_gemm(op, x.data, g, dw.ptr<float>(),
                               db_done ? nullptr : db.ptr<float>(), n, k, m, cuda_type(t)) ||
              db_done;
  if (!db_done) {  // column sums of the widened dout, in fixed order as the fp32 path
    float* gf = scratch_floats(op, static_cast<size_t>(n * m));
    launched(op, "convert", cuda::convert(g, f, gf, cuda::FloatFormat::f32, n * m, stream_));
    double* partial = scratch_doubles(op, static_cast<size_t>(cuda::column_sum_partials(n, m)));
    launched(op, "add_column_sums",
             cuda::add_column_sums(gf, n, m, m, partial, db.ptr<float>(), stream_));
  }
  if (dx.defined() && k > 0) {
    if (m == 0) {
      if (!opt.dx_accumulate)
        PB_CUDA_OP(op, cudaMemsetAsync(dx.data, 0, static_cast<size_t>(n * k) * dtype_size(t),
                                       stream_));
    } else {  // dx += in fp32, rounded once
      const bool fused = input_grad_gemm(op, w.data, g, dx.data, n, k, m, opt.dx_accumulate,
                                         cuda_type(t), cuda_type(t),
                                         tanh_form ? opt.x_gelu_pre.data : nullptr);
      if (opt.x_gelu_pre.defined() && !fused)
        launched(op, "gelu_backward_inplace_lowp",
                 cuda::gelu_backward_inplace_lowp(dx.data, opt.x_gelu_pre.data, f, n * k,
                                                  tanh_form, stream_));
    }
  }
  end(op);
  return true;
}

// ---- heads -----------------------------------------------------------------------------------
void CudaBackend::mlm_loss(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& labels,
                           float grad_scale, const Tensor& logits_ws, const Tensor& loss_sum,
                           const Tensor& num_correct, const Tensor& dx, const Tensor& dw,
                           const Tensor& db) {
  const trace::Range range("mlm_loss");
  if (lowp::any({&x, &w, &b, &logits_ws, &loss_sum, &dx, &dw, &db})) {
    if (mlm_loss_lowp(x, w, b, labels, grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db))
      return;
    return lowp::mlm_loss(*this, lowp_, x, w, b, labels, grad_scale, logits_ws, loss_sum,
                          num_correct, dx, dw, db);
  }
  checks::mlm_loss_by_ops(*this, checks::OpArgs("mlm_loss", Device::cuda, pointer_check()), x, w, b,
                          labels, grad_scale, logits_ws, loss_sum, num_correct, dx, dw, db);
}

// The MLM decoder in bf16 / f16: logits (fp32) = x w^T + b from the low-precision x and word
// embeddings (fp32 accumulation, the BIAS epilogue with the fp32 bias), the fp32 softmax
// cross-entropy turning them into their gradient in place, then the two backward GEMMs on that
// gradient rounded to the operands' type -- cuBLASLt takes A and B of one type -- in blocks of
// vocabulary columns whose rounded copy fits kMlmBackwardBlockBytes of scratch. Column blocks,
// not row blocks: block j's GEMM dw[j] += g[:, j]^T x writes its own rows of the word-embedding
// gradient ([V, H] fp32, 125 MB at BERT-Large), so the whole of dw is read and written once per
// call however many blocks there are (row blocks each read and wrote all of it); db[j] comes
// through BGRADB, else from column sums of the fp32 gradient. dx = sum_j g[:, j] w[j] ([m, H],
// small) accumulates in fp32 scratch across the blocks and is rounded once at the end. The CPU
// emulation keeps the gradient in fp32: the two differ by that one rounding (2^-9 relative in
// bf16, per element).
// In f16 the gradient (softmax - onehot) * grad_scale lies far below f16's normal range (about
// 1.4e-8 per element at vocab 30528 and 1 / 2300 masked tokens: under the smallest subnormal,
// so it flushed to zero and db lost 7%): it is rounded times 2^e, a power of two putting its
// largest possible magnitude, |grad_scale|, just under 2^10, and the GEMMs take alpha = 2^-e
// (both exact); db is then summed from the fp32 gradient.
namespace {
constexpr int64_t kMlmBackwardBlockBytes = int64_t{64} << 20;
}  // namespace

int64_t mlm_backward_block_columns(int64_t m, int64_t v, int64_t elem_bytes) {
  const int64_t fit = kMlmBackwardBlockBytes / std::max<int64_t>(1, m * elem_bytes);
  if (fit >= v) return v;
  // A multiple of 8 columns keeps the blocks' GEMM operands 16-byte aligned (tensor cores).
  return std::max<int64_t>(std::min<int64_t>(8, v), fit / 8 * 8);
}

bool CudaBackend::mlm_loss_lowp(const Tensor& x, const Tensor& w, const Tensor& b,
                                const Tensor& labels, float grad_scale, const Tensor& logits_ws,
                                const Tensor& loss_sum, const Tensor& num_correct,
                                const Tensor& dx, const Tensor& dw, const Tensor& db) {
  const char* op = "mlm_loss";
  const DType t = x.dtype;
  auto is_f32 = [](const Tensor& v) { return !v.defined() || v.dtype == DType::f32; };
  if (!lowp::is_lowp(t) || w.dtype != t || (dx.defined() && dx.dtype != t) || !is_f32(b) ||
      !is_f32(logits_ws) || !is_f32(loss_sum) || !is_f32(dw) || !is_f32(db))
    return false;
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [m, h, v] =
      checks::mlm_loss_args(args, shape_of(x), shape_of(w), logits_ws, dx, dw, db);
  if (h == 0 || v == 0) return false;  // degenerate shapes: the adapter's general path
  args("b", b, DType::f32, {v});
  args.optional("dx", shape_of(dx), DType::f32, {m, h});
  args.optional("dw", dw, DType::f32, {v, h});
  args.optional("db", db, DType::f32, {v});
  begin(op);
  float* logits = logits_ws.ptr<float>();
  const cudaDataType_t type = cuda_type(t);
  if (m > 0) {
    GemmCall g = forward_gemm_call(x.data, w.data, logits, m, h, v, type);
    g.c_type = CUDA_R_32F;
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
    g.bias = const_cast<float*>(b.ptr<float>());
    if (!gemm(op, g)) {
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      gemm(op, g);
      launched(op, "add_bias_rows", cuda::add_bias_rows(logits, b.ptr<float>(), m, v, stream_));
    }
  }
  softmax_cross_entropy(logits_ws, labels, grad_scale, loss_sum, num_correct,
                        dx.defined() ? logits_ws : Tensor());
  if (!dx.defined() || m == 0) {
    end(op);
    return true;
  }
  const cuda::FloatFormat f = float_format(op, "x", x);
  const auto es = static_cast<int64_t>(dtype_size(t));
  const int64_t block = mlm_backward_block_columns(m, v, es);
  // Scratch: dx in fp32 [m, h] when there are several blocks (one block writes dx directly),
  // then the rounded gradient of one column block [m, block].
  const bool one_block = block >= v;
  const int64_t dx_bytes = one_block ? 0 : (m * h * 4 + 255) / 256 * 256;
  char* scratch = static_cast<char*>(scratch_bytes(op, static_cast<size_t>(dx_bytes +
                                                                           m * block * es)));
  float* dx32 = reinterpret_cast<float*>(scratch);
  void* g16 = scratch + dx_bytes;
  const char* wb = static_cast<const char*>(w.data);
  float up = 1.f;
  if (t == DType::f16 && grad_scale != 0.f && std::isfinite(grad_scale))
    up = std::ldexp(1.f, 9 - std::ilogb(grad_scale));  // |g| <= |grad_scale| < 2^(ilogb + 1)
  const float down = 1.f / up;                         // exact: a power of two
  for (int64_t c0 = 0; c0 < v; c0 += block) {
    const int64_t n = std::min(block, v - c0);
    const float* gf = logits + c0;  // columns c0 .. c0 + n of the fp32 gradient [m, v]
    launched(op, "convert_rows",
             cuda::convert_rows(gf, cuda::FloatFormat::f32, v, g16, f, n, m, n, stream_, up));
    bool db_done = !db.defined();
    if (dw.defined())
      db_done = weight_grad_gemm(op, x.data, g16, dw.ptr<float>() + c0 * h,
                                 db_done ? nullptr : db.ptr<float>() + c0, m, h, n, type,
                                 down) ||
                db_done;
    if (!db_done) {
      double* partial = scratch_doubles(op, static_cast<size_t>(cuda::column_sum_partials(m, n)));
      launched(op, "add_column_sums",
               cuda::add_column_sums(gf, m, n, v, partial, db.ptr<float>() + c0, stream_));
    }
    if (one_block)
      input_grad_gemm(op, w.data, g16, dx.data, m, h, n, false, type, type, nullptr, down);
    else
      input_grad_gemm(op, wb + c0 * h * es, g16, dx32, m, h, n, c0 > 0, type, CUDA_R_32F,
                      nullptr, down);
  }
  if (!one_block)
    launched(op, "convert",
             cuda::convert(dx32, cuda::FloatFormat::f32, dx.data, f, m * h, stream_));
  end(op);
  return true;
}

void CudaBackend::nsp_loss(const SeqLayout& layout, const Tensor& x, const PoolerParams& params,
                           const Tensor& labels, float grad_scale, const Tensor& workspace,
                           const Tensor& loss_sum, const Tensor& num_correct, const Tensor& dx,
                           const PoolerParams& grads) {
  const trace::Range range("nsp_loss");
  if (lowp::any({&x, &params.dense_w, &params.dense_b, &params.cls_w, &params.cls_b,
                 &workspace, &loss_sum, &dx, &grads.dense_w, &grads.dense_b, &grads.cls_w,
                 &grads.cls_b})) {
    if (nsp_loss_lowp(layout, x, params, labels, grad_scale, workspace, loss_sum, num_correct,
                      dx, grads))
      return;
    return lowp::nsp_loss(*this, lowp_, layout, x, params, labels, grad_scale, workspace,
                          loss_sum, num_correct, dx, grads);
  }
  const char* op = "nsp_loss";
  const auto [h, s] = checks::nsp_loss_args(checks::OpArgs(op, Device::cuda, pointer_check()),
                                            layout, x, params, workspace, dx, grads);
  begin(op);
  device_layout(op, layout, layout.rows);
  if (s == 0) return end(op);
  gather_rows(x, layout.seq_start, nsp_workspace(workspace, s, h)[0]);
  nsp_head(workspace, s, h, params, labels, grad_scale, loss_sum, num_correct, dx.defined(),
           grads);
  if (!dx.defined()) return end(op);
  // dx[seq_start[i]] += dcls[i]; the starts are distinct (a valid layout).
  auto* scratch = static_cast<uint32_t*>(
      scratch_bytes(op, static_cast<size_t>(layout.rows + 1) * sizeof(uint32_t)));
  launched(op, "scatter_add_rows_ordered",
           cuda::scatter_add_rows_ordered(nsp_workspace(workspace, s, h)[3].data,
                                          layout.seq_start.ptr<int32_t>(), dx.data,
                                          cuda::FloatFormat::f32, s, h, layout.rows, scratch,
                                          stream_));
  end(op);
}

// The CPU's workspace layout exactly: [cls | pooled | dpooled | dcls] (s x h each), then the
// logits (s x 2) at 4 s h, which become their gradient in place.
std::array<Tensor, 5> CudaBackend::nsp_workspace(const Tensor& workspace, int64_t s, int64_t h) {
  float* ws = workspace.ptr<float>();
  const Device dev = Device::cuda;
  return {Tensor(ws, DType::f32, {s, h}, dev), Tensor(ws + s * h, DType::f32, {s, h}, dev),
          Tensor(ws + 2 * s * h, DType::f32, {s, h}, dev),
          Tensor(ws + 3 * s * h, DType::f32, {s, h}, dev),
          Tensor(ws + 4 * s * h, DType::f32, {s, 2}, dev)};
}

void CudaBackend::nsp_head(const Tensor& workspace, int64_t s, int64_t h,
                           const PoolerParams& params, const Tensor& labels, float grad_scale,
                           const Tensor& loss_sum, const Tensor& num_correct, bool backward,
                           const PoolerParams& grads) {
  const char* op = "nsp_loss";
  const auto [cls, pooled, dpooled, dcls, logits] = nsp_workspace(workspace, s, h);
  linear_forward(cls, params.dense_w, params.dense_b, Epilogue::bias, pooled, Tensor());
  launched(op, "tanh_inplace", cuda::tanh_inplace(pooled.ptr<float>(), s * h, stream_));
  linear_forward(pooled, params.cls_w, params.cls_b, Epilogue::bias, logits, Tensor());
  softmax_cross_entropy(logits, labels, grad_scale, loss_sum, num_correct,
                        backward ? logits : Tensor());
  if (!backward) return;
  linear_backward(pooled, params.cls_w, logits, dpooled, grads.cls_w, grads.cls_b, {});
  launched(op, "tanh_backward_inplace",
           cuda::tanh_backward_inplace(dpooled.ptr<float>(), pooled.ptr<float>(), s * h, stream_));
  linear_backward(cls, params.dense_w, dpooled, dcls, grads.dense_w, grads.dense_b, {});
}

// NSP with x (and dx) and the two weight matrices in bf16 / f16: only the [CLS] rows and the
// weights are widened (s x h and h x h + 2 h elements, against the adapter's [rows, h] staging
// of x and of dx both ways), the fp32 head runs on them in the workspace, and dcls is added to
// dx's [CLS] rows in fp32 and rounded once -- the CPU emulation's arithmetic exactly.
bool CudaBackend::nsp_loss_lowp(const SeqLayout& layout, const Tensor& x,
                                const PoolerParams& params, const Tensor& labels,
                                float grad_scale, const Tensor& workspace,
                                const Tensor& loss_sum, const Tensor& num_correct,
                                const Tensor& dx, const PoolerParams& grads) {
  const char* op = "nsp_loss";
  const DType t = x.dtype;
  auto is_f32 = [](const Tensor& v) { return !v.defined() || v.dtype == DType::f32; };
  if (!lowp::is_lowp(t) || params.dense_w.dtype != t || params.cls_w.dtype != t ||
      (dx.defined() && dx.dtype != t) || !is_f32(params.dense_b) || !is_f32(params.cls_b) ||
      !is_f32(workspace) || !is_f32(loss_sum) || !is_f32(grads.dense_w) ||
      !is_f32(grads.dense_b) || !is_f32(grads.cls_w) || !is_f32(grads.cls_b))
    return false;
  PoolerParams shapes = params;
  shapes.dense_w = shape_of(params.dense_w);
  shapes.cls_w = shape_of(params.cls_w);
  const auto [h, s] = checks::nsp_loss_args(checks::OpArgs(op, Device::cuda, pointer_check()),
                                            layout, shape_of(x), shapes, workspace,
                                            shape_of(dx), grads);
  begin(op);
  const cuda::DeviceLayout dl = device_layout(op, layout, layout.rows);
  if (s == 0) {
    end(op);
    return true;
  }
  const cuda::FloatFormat f = float_format(op, "x", x);
  const auto es = static_cast<int64_t>(dtype_size(t));
  // Scratch: the widened dense_w [h, h] and cls_w [2, h], the [CLS] rows as gathered [s, h].
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t wp_bytes = aligned(h * h * 4), wc_bytes = aligned(2 * h * 4);
  char* scratch = static_cast<char*>(
      scratch_bytes(op, static_cast<size_t>(wp_bytes + wc_bytes + s * h * es)));
  PoolerParams wide = params;
  wide.dense_w = Tensor(scratch, DType::f32, {h, h}, Device::cuda);
  wide.cls_w = Tensor(scratch + wp_bytes, DType::f32, {2, h}, Device::cuda);
  void* cls16 = scratch + wp_bytes + wc_bytes;
  const cuda::FloatFormat f32 = cuda::FloatFormat::f32;
  launched(op, "convert", cuda::convert(params.dense_w.data, f, wide.dense_w.data, f32, h * h,
                                        stream_));
  launched(op, "convert", cuda::convert(params.cls_w.data, f, wide.cls_w.data, f32, 2 * h,
                                        stream_));
  const Tensor cls = nsp_workspace(workspace, s, h)[0];
  launched(op, "gather_rows", cuda::gather_rows(x.data, dl.seq_start, cls16, f, s, h, stream_));
  launched(op, "convert", cuda::convert(cls16, f, cls.data, f32, s * h, stream_));
  nsp_head(workspace, s, h, wide, labels, grad_scale, loss_sum, num_correct, dx.defined(), grads);
  if (dx.defined())  // dx[seq_start[i]] += dcls[i] (distinct starts), in fp32, rounded once
    launched(op, "add_rows_f32",
             cuda::add_rows_f32(nsp_workspace(workspace, s, h)[3].ptr<float>(), dl.seq_start,
                                dx.data, f, s, h, stream_));
  end(op);
  return true;
}

}  // namespace packbert
