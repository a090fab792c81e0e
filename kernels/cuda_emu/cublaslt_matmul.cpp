// The emulated cuBLASLt's arithmetic (cublaslt_matmul.h): the matmul and its epilogue computed on
// the CPU, the inputs widened exactly, sums and epilogue in double, each output rounded once as
// cublaslt.cpp's header says.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/fp8_convert.h"
#include "kernels/cuda_emu/cublaslt_matmul.h"

namespace packbert::emu::cublaslt {

namespace {

double load(const void* base, int type, uint64_t i) {
  const char* p = static_cast<const char*>(base) + i * type_bytes(type);
  if (type == CUDA_R_32F) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (type == CUDA_R_16BF) {
    __nv_bfloat16 h;
    std::memcpy(&h, p, 2);
    return __bfloat162float(h);
  }
  if (type == CUDA_R_8F_E4M3) return fp8::e4m3_to_float(static_cast<uint8_t>(*p));
  if (type == CUDA_R_8F_E5M2) return fp8::e5m2_to_float(static_cast<uint8_t>(*p));
  __half h;
  std::memcpy(&h, p, 2);
  return __half2float(h);
}

// Rounds to fp32 first: where the GPU's fp32 epilogue rounds before converting to D's type.
void store(void* base, int type, uint64_t i, double v) {
  char* p = static_cast<char*>(base) + i * type_bytes(type);
  const float f = static_cast<float>(v);
  if (is_fp8_type(type)) {  // saturating, nearest even (cuBLASLt's FP8 output, satfinite)
    *p = static_cast<char>(type == CUDA_R_8F_E4M3 ? fp8::float_to_e4m3(f) : fp8::float_to_e5m2(f));
    return;
  }
  if (type == CUDA_R_32F) {
    std::memcpy(p, &f, 4);
  } else if (type == CUDA_R_16BF) {
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    std::memcpy(p, &h, 2);
  } else {
    const __half h = __float2half_rn(f);
    std::memcpy(p, &h, 2);
  }
}

// GELU's tanh approximation and its derivative, as cuBLASLt's GELU epilogues compute them.
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}
double gelu_tanh_derivative(double x) {
  const double t = std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  const double du_dx = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du_dx;
}

// A device scale factor (fp32), 1 when none is given.
double factor(const void* ptr) {
  if (!ptr) return 1.0;
  float f;
  std::memcpy(&f, ptr, sizeof(f));
  return f;
}

}  // namespace

void run_matmul(const Problem& p, double alpha, double beta, const void* A, const void* B,
                const void* C, void* D, void* bias, void* aux) {
  // FP8: D = scale_d * (alpha * scale_a * scale_b * op(A) op(B) + beta C, then the epilogue),
  // amax_d = max |that| before scale_d. Fast accumulation changes only how a GPU sums; the
  // emulation's double sums are the same either way.
  alpha *= factor(p.a_scale) * factor(p.b_scale);
  const double d_scale = factor(p.d_scale);
  const uint64_t m = p.m, n = p.n, k = p.k;
  const auto lda = static_cast<uint64_t>(p.a.ld), ldb = static_cast<uint64_t>(p.b.ld);
  const auto ldc = static_cast<uint64_t>(p.c.ld), ldd = static_cast<uint64_t>(p.d.ld);
  const auto aux_ld = static_cast<uint64_t>(p.aux_ld);
  // op(A)'s rows and op(B)'s columns, each contiguous over k, widened.
  std::vector<double> a_rows(m * k), b_cols(n * k);
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t q = 0; q < k; ++q)
      a_rows[i * k + q] = load(A, p.a.type, p.transa ? q + i * lda : i + q * lda);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t q = 0; q < k; ++q)
      b_cols[j * k + q] = load(B, p.b.type, p.transb ? j + q * ldb : q + j * ldb);
  std::vector<double> bias_in;
  if (has_bias_input(p.epilogue)) {
    bias_in.resize(m);
    for (uint64_t i = 0; i < m; ++i) bias_in[i] = load(bias, p.bias_type, i);
  }
  // The dot products, 4 x 4 at a time (each operand row loaded once per 4 products: the MLM
  // decoder's GEMMs at vocabulary size take seconds, not minutes).
  std::vector<double> out(m * n), pre;
  for (uint64_t j0 = 0; j0 < n; j0 += 4)
    for (uint64_t i0 = 0; i0 < m; i0 += 4) {
      const uint64_t ni = std::min<uint64_t>(4, m - i0), nj = std::min<uint64_t>(4, n - j0);
      const double* ar[4];
      const double* bc[4];
      for (uint64_t r = 0; r < 4; ++r) {
        ar[r] = &a_rows[(i0 + std::min(r, ni - 1)) * k];
        bc[r] = &b_cols[(j0 + std::min(r, nj - 1)) * k];
      }
      double acc[4][4] = {};
      for (uint64_t q = 0; q < k; ++q)
        for (int r = 0; r < 4; ++r)
          for (int c = 0; c < 4; ++c) acc[r][c] += ar[r][q] * bc[c][q];
      for (uint64_t c = 0; c < nj; ++c)
        for (uint64_t r = 0; r < ni; ++r) out[i0 + r + (j0 + c) * m] = acc[r][c];
    }
  if (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) pre.resize(m * n);
  for (uint64_t j = 0; j < n; ++j) {
    for (uint64_t i = 0; i < m; ++i) {
      double x = alpha * out[i + j * m];
      if (beta != 0.0) x += beta * load(C, p.c.type, i + j * ldc);
      switch (p.epilogue) {
        case CUBLASLT_EPILOGUE_BIAS: x += bias_in[i]; break;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
          x += bias_in[i];
          pre[i + j * m] = x;
          x = gelu_tanh(x);
          break;
        case CUBLASLT_EPILOGUE_DGELU:
          x *= gelu_tanh_derivative(load(aux, p.d.type, i + j * aux_ld));
          break;
        default: break;
      }
      out[i + j * m] = x;
    }
  }
  std::vector<double> bias_grad;
  if (p.epilogue == CUBLASLT_EPILOGUE_BGRADB) {
    bias_grad.assign(n, 0.0);
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t q = 0; q < k; ++q) bias_grad[j] += b_cols[j * k + q];
  }
  if (p.amax_d) {
    float top = 0.f;
    for (double v : out) top = std::max(top, static_cast<float>(std::fabs(v)));
    std::memcpy(p.amax_d, &top, sizeof(top));
  }
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i)
      store(D, p.d.type, i + j * ldd, d_scale == 1.0 ? out[i + j * m] : out[i + j * m] * d_scale);
  if (!pre.empty())
    for (uint64_t j = 0; j < n; ++j)
      for (uint64_t i = 0; i < m; ++i) store(aux, p.d.type, i + j * aux_ld, pre[i + j * m]);
  for (uint64_t j = 0; j < bias_grad.size(); ++j) store(bias, p.bias_type, j, bias_grad[j]);
}

}  // namespace packbert::emu::cublaslt
