// Linear layers: OpenBLAS sgemm (row-major, fp32 accumulate) plus epilogues in OpenMP loops.
#include <cblas.h>

#include "common/math.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_common.h"

namespace packbert {

using cpu::expect;
using cpu::expect_optional;

namespace {

int blas_int(const char* op, int64_t v) {
  PB_REQUIRE(v <= 0x7fffffff, "{}: extent {} exceeds the BLAS int range", op, v);
  return static_cast<int>(v);
}

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                Epilogue epilogue, const Tensor& out, const Tensor& pre) {
  const char* op = "linear_forward";
  expect(op, "x", x, DType::f32, {kAnyDim, kAnyDim});
  expect(op, "w", w, DType::f32, {kAnyDim, x.dim(1)});
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  expect(op, "out", out, DType::f32, {n, m});
  if (epilogue == Epilogue::none) {
    PB_REQUIRE(!bias.defined(), "{}: bias given with Epilogue::none", op);
  } else {
    expect(op, "bias", bias, DType::f32, {m});
  }
  if (epilogue == Epilogue::bias_gelu) {
    expect(op, "pre", pre, DType::f32, {n, m});
  } else {
    PB_REQUIRE(!pre.defined(), "{}: pre is only written by Epilogue::bias_gelu", op);
  }
  if (n == 0 || m == 0) return;

  // With GELU the GEMM writes the pre-activation buffer, which backward needs anyway.
  float* c = epilogue == Epilogue::bias_gelu ? pre.ptr<float>() : out.ptr<float>();
  if (k == 0) {
    for (int64_t i = 0; i < n * m; ++i) c[i] = 0.f;
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(op, n), blas_int(op, m),
                blas_int(op, k), 1.0f, x.ptr<float>(), blas_int(op, k), w.ptr<float>(),
                blas_int(op, k), 0.0f, c, blas_int(op, m));
  }
  if (epilogue == Epilogue::none) return;
  const float* b = bias.ptr<float>();
  float* y = out.ptr<float>();
  const bool with_gelu = epilogue == Epilogue::bias_gelu;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    float* cr = c + r * m;
    float* yr = y + r * m;
    for (int64_t j = 0; j < m; ++j) {
      cr[j] += b[j];
      if (with_gelu) yr[j] = gelu(cr[j]);
    }
  }
}

void CpuBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout,
                                 const Tensor& dx, const Tensor& dw, const Tensor& db,
                                 const LinearBackwardOptions& opt) {
  const char* op = "linear_backward";
  expect(op, "w", w, DType::f32, {kAnyDim, kAnyDim});
  const int64_t m = w.dim(0), k = w.dim(1);
  expect(op, "dout", dout, DType::f32, {kAnyDim, m});
  const int64_t n = dout.dim(0);
  PB_REQUIRE(x.defined() || !dw.defined(), "{}: dw needs the forward input x", op);
  expect_optional(op, "x", x, DType::f32, {n, k});
  expect_optional(op, "dx", dx, DType::f32, {n, k});
  expect_optional(op, "dw", dw, DType::f32, {m, k});
  expect_optional(op, "db", db, DType::f32, {m});
  expect_optional(op, "options.out_gelu_pre", opt.out_gelu_pre, DType::f32, {n, m});
  expect_optional(op, "options.x_gelu_pre", opt.x_gelu_pre, DType::f32, {n, k});
  PB_REQUIRE(!opt.x_gelu_pre.defined() || (dx.defined() && !opt.dx_accumulate),
             "{}: options.x_gelu_pre needs dx and excludes dx_accumulate", op);
  if (n == 0) return;

  float* g = dout.ptr<float>();
  if (opt.out_gelu_pre.defined()) {
    const float* pre = opt.out_gelu_pre.ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n * m; ++i) g[i] *= gelu_grad(pre[i]);
  }
  if (db.defined()) cpu::add_column_sums(g, n, m, m, db.ptr<float>());
  if (dw.defined() && m > 0 && k > 0) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(op, m), blas_int(op, k),
                blas_int(op, n), 1.0f, g, blas_int(op, m), x.ptr<float>(), blas_int(op, k), 1.0f,
                dw.ptr<float>(), blas_int(op, k));
  }
  if (!dx.defined() || k == 0) return;
  float* d = dx.ptr<float>();
  if (m == 0) {
    if (!opt.dx_accumulate)
      for (int64_t i = 0; i < n * k; ++i) d[i] = 0.f;
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(op, n), blas_int(op, k),
              blas_int(op, m), 1.0f, g, blas_int(op, m), w.ptr<float>(), blas_int(op, k),
              opt.dx_accumulate ? 1.0f : 0.0f, d, blas_int(op, k));
  if (opt.x_gelu_pre.defined()) {
    const float* pre = opt.x_gelu_pre.ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n * k; ++i) d[i] *= gelu_grad(pre[i]);
  }
}

}  // namespace packbert
