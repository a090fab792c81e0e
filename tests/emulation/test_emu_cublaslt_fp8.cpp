// The emulated cuBLASLt's FP8 GEMMs (kernels/cuda_emu/cublaslt.cpp, check_fp8): the arithmetic
// (A / B scale factors, fp32 accumulation into bf16 / fp32, an FP8 D with its scale and amax,
// fast accumulation) against a loop in double, and one test per rule of the real library's that
// the emulation enforces, each refused with the real library's status. Then the CUDA backend's
// fp8_gemm on an emulated GPU of compute capability 8.0: a clear error naming the device.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "float_format.h"
#include "test_util.h"
#include "kernels/backend.h"
#include "kernels/base/error.h"
#include "kernels/common/fp8_convert.h"

namespace {

using packbert::test::FloatFormat;

bool fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
size_t bytes_of(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : fp8(t) ? 1 : 2; }

// Sets the emulated GPU's compute capability for one scope.
struct ComputeCapability {
  explicit ComputeCapability(const char* v) { setenv("PACKBERT_EMU_COMPUTE_CAPABILITY", v, 1); }
  ~ComputeCapability() { unsetenv("PACKBERT_EMU_COMPUTE_CAPABILITY"); }
};

// One FP8 matmul: D (m x n) = alpha op(A) op(B) + beta C in cuBLASLt's column-major terms.
struct Call {
  cudaDataType_t a = CUDA_R_8F_E4M3, b = CUDA_R_8F_E4M3, c = CUDA_R_16BF, d = CUDA_R_16BF;
  bool ta = true, tb = false;  // TN
  int64_t m = 32, n = 16, k = 48;
  int64_t ld_extra = 0;  // added to every leading dimension
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t bias_type = -1;
  bool scales = true, d_scale = false, amax_d = false;
  int8_t fast_accum = -1;  // -1: not set
  float beta = 0.f;
  int64_t misalign = 0;  // bytes added to A's address
};

struct Buffers {
  std::vector<unsigned char> a, b, c;
  float sa = 0.25f, sb = 8.f, sd = 0.5f;
};

int64_t lda(const Call& c) { return (c.ta ? c.k : c.m) + c.ld_extra; }
int64_t ldb(const Call& c) { return (c.tb ? c.n : c.k) + c.ld_extra; }
int64_t ldc(const Call& c) { return c.m + c.ld_extra; }

// Runs the heuristic, then (if run) the matmul on device copies of `in`; returns the first
// status that is not SUCCESS, or SUCCESS with D (and the amax) read back.
cublasStatus_t matmul(const Call& c, const Buffers& in, bool run, std::vector<unsigned char>* d_out,
                      float* amax_out) {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t size) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, attr, v, size), CUBLAS_STATUS_SUCCESS);
  };
  const int32_t ta = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epilogue, sizeof(c.epilogue));
  if (c.bias_type != -1) set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c.bias_type, 4);
  if (c.fast_accum >= 0) set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &c.fast_accum, 1);

  // Device memory: A, B, C/D, the bias, four scalars (A, B, D scale; D amax).
  const size_t a_bytes =
      static_cast<size_t>(lda(c) * ((c.ta ? c.m : c.k) - 1) + (c.ta ? c.k : c.m)) * bytes_of(c.a);
  const size_t b_bytes =
      static_cast<size_t>(ldb(c) * ((c.tb ? c.k : c.n) - 1) + (c.tb ? c.n : c.k)) * bytes_of(c.b);
  const size_t c_bytes = static_cast<size_t>(ldc(c) * (c.n - 1) + c.m) * bytes_of(c.c);
  const size_t d_bytes = static_cast<size_t>(ldc(c) * (c.n - 1) + c.m) * bytes_of(c.d);
  unsigned char *da = nullptr, *db = nullptr, *dc = nullptr, *dd = nullptr, *dbias = nullptr;
  float* scalars = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&da), a_bytes + 64), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&db), b_bytes), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dc), c_bytes), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dd), d_bytes), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dbias), 4 * static_cast<size_t>(c.m)),
            cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&scalars), 4 * sizeof(float)), cudaSuccess);
  const float s[4] = {in.sa, in.sb, in.sd, -1.f};
  EXPECT_EQ(cudaMemcpy(scalars, s, sizeof(s), cudaMemcpyHostToDevice), cudaSuccess);
  auto upload = [](void* dst, const std::vector<unsigned char>& src, size_t bytes) {
    if (!src.empty()) {
      EXPECT_EQ(cudaMemcpy(dst, src.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  };
  upload(da + c.misalign, in.a, a_bytes);
  upload(db, in.b, b_bytes);
  upload(dc, in.c, c_bytes);
  EXPECT_EQ(cudaMemset(dbias, 0, 4 * static_cast<size_t>(c.m)), cudaSuccess);
  if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias));
  float* sa = scalars;
  float* sb = scalars + 1;
  float* sd = scalars + 2;
  float* amax = scalars + 3;
  if (c.scales) {
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
  }
  if (c.d_scale) set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &sd, sizeof(sd));
  if (c.amax_d) set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &amax, sizeof(amax));
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&la, c.a, static_cast<uint64_t>(c.ta ? c.k : c.m),
                                       static_cast<uint64_t>(c.ta ? c.m : c.k), lda(c)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&lb, c.b, static_cast<uint64_t>(c.tb ? c.n : c.k),
                                       static_cast<uint64_t>(c.tb ? c.k : c.n), ldb(c)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&lc, c.c, static_cast<uint64_t>(c.m),
                                       static_cast<uint64_t>(c.n), ldc(c)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&ld, c.d, static_cast<uint64_t>(c.m),
                                       static_cast<uint64_t>(c.n), ldc(c)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, ld, pref, 1, &r, &found);
  if (st == CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(found, 1);
  }
  if (st == CUBLAS_STATUS_SUCCESS && run) {
    const float alpha = 1.f, beta = c.beta;
    st = cublasLtMatmul(h, op, &alpha, da + c.misalign, la, db, lb, &beta, dc, lc, dd, ld, &r.algo,
                        nullptr, 0, nullptr);
    if (st == CUBLAS_STATUS_SUCCESS) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (d_out) {
        d_out->resize(d_bytes);
        EXPECT_EQ(cudaMemcpy(d_out->data(), dd, d_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      }
      if (amax_out) {
        EXPECT_EQ(cudaMemcpy(amax_out, amax, 4, cudaMemcpyDeviceToHost), cudaSuccess);
      }
    }
  }
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc),
                  static_cast<void*>(dd), static_cast<void*>(dbias), static_cast<void*>(scalars)})
    cudaFree(p);
  for (auto l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
  return st;
}

cublasStatus_t heuristic(const Call& c) { return matmul(c, Buffers(), false, nullptr, nullptr); }

std::vector<unsigned char> random_fp8(std::mt19937_64& g, cudaDataType_t t, size_t n) {
  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<unsigned char> q(n);
  for (auto& b : q) b = packbert::fp8::fp8_cast_value(nd(g), 1.f, t == CUDA_R_8F_E4M3);
  return q;
}
double widen(cudaDataType_t t, unsigned char q) {
  return t == CUDA_R_8F_E4M3 ? packbert::fp8::e4m3_to_float(q) : packbert::fp8::e5m2_to_float(q);
}

// D = sa sb op(A) op(B) (+ beta C) for TN: A(q, i) at q + i lda, B(q, j) at q + j ldb. The sums
// are exact in double (products of FP8 values span < 40 bits), so D is bit for bit the value
// rounded once to fp32 and then to D's type.
TEST(EmuCublasLtFp8, TnProductWithScalesIntoBf16Fp32AndFp8) {
  std::mt19937_64 g(packbert::test::test_seed());
  for (const auto& [ta_t, tb_t] :
       {std::pair{CUDA_R_8F_E4M3, CUDA_R_8F_E4M3}, std::pair{CUDA_R_8F_E5M2, CUDA_R_8F_E4M3},
        std::pair{CUDA_R_8F_E4M3, CUDA_R_8F_E5M2}})
    for (cudaDataType_t d_t : {CUDA_R_16BF, CUDA_R_32F, CUDA_R_8F_E4M3})
      for (int8_t fast : {int8_t{0}, int8_t{1}}) {
        Call c;
        c.a = ta_t, c.b = tb_t, c.d = d_t, c.fast_accum = fast, c.ld_extra = 16;
        c.c = d_t == CUDA_R_8F_E4M3 ? CUDA_R_16BF : d_t;
        c.beta = d_t == CUDA_R_32F ? 1.f : 0.f;  // the weight gradient's accumulation
        c.d_scale = c.amax_d = d_t == CUDA_R_8F_E4M3;
        SCOPED_TRACE("A " + std::to_string(c.a) + " B " + std::to_string(c.b) + " D " +
                     std::to_string(c.d) + " fast " + std::to_string(fast));
        Buffers in;
        in.a = random_fp8(g, c.a, static_cast<size_t>(lda(c) * (c.m - 1) + c.k));
        in.b = random_fp8(g, c.b, static_cast<size_t>(ldb(c) * (c.n - 1) + c.k));
        std::vector<float> cf(static_cast<size_t>(ldc(c) * (c.n - 1) + c.m));
        std::normal_distribution<float> nd(0.f, 100.f);
        for (float& x : cf) x = nd(g);
        in.c.resize(cf.size() * 4);
        std::memcpy(in.c.data(), cf.data(), in.c.size());  // read only when beta = 1 (fp32)
        std::vector<unsigned char> d;
        float amax = -1.f;
        ASSERT_EQ(matmul(c, in, true, &d, &amax), CUBLAS_STATUS_SUCCESS);
        const FloatFormat e4m3 = packbert::test::e4m3_format();
        float top = 0.f;
        int bad = 0;
        for (int64_t j = 0; j < c.n; ++j)
          for (int64_t i = 0; i < c.m; ++i) {
            double x = 0;
            for (int64_t q = 0; q < c.k; ++q)
              x += widen(c.a, in.a[static_cast<size_t>(q + i * lda(c))]) *
                   widen(c.b, in.b[static_cast<size_t>(q + j * ldb(c))]);
            x *= double{in.sa} * in.sb;
            const size_t at = static_cast<size_t>(i + j * ldc(c));
            if (c.beta != 0.f) x += cf[at];
            const auto f = static_cast<float>(x);
            top = std::max(top, std::fabs(f));
            bool same = false;
            if (d_t == CUDA_R_32F) {
              float got;
              std::memcpy(&got, &d[at * 4], 4);
              same = got == f;
            } else if (d_t == CUDA_R_16BF) {
              uint16_t got;
              std::memcpy(&got, &d[at * 2], 2);
              same = got == __float2bfloat16_rn(f).x;
            } else {
              same = d[at] == e4m3.reference(static_cast<double>(f * in.sd));
            }
            if (!same && bad++ < 5) ADD_FAILURE() << "D(" << i << ", " << j << ") wrong";
          }
        EXPECT_EQ(bad, 0);
        if (c.amax_d) {
          EXPECT_EQ(amax, top);
        }
      }
}

// Each rule of the real library's that the emulation enforces (cublaslt.cpp, check_fp8): what
// it refuses, with the status the real one returns, and the nearest call it takes.
TEST(EmuCublasLtFp8, BelowComputeCapability89IsRefused) {
  EXPECT_EQ(heuristic(Call()), CUBLAS_STATUS_SUCCESS);
  {
    const ComputeCapability cc("8.0");
    EXPECT_EQ(heuristic(Call()), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  const ComputeCapability ada("8.9");
  EXPECT_EQ(heuristic(Call()), CUBLAS_STATUS_SUCCESS);
}

TEST(EmuCublasLtFp8, OnlyTnBelowComputeCapability100) {
  for (const auto& [ta, tb] : {std::pair{false, false}, {true, true}, {false, true}}) {
    Call c;
    c.ta = ta, c.tb = tb;
    EXPECT_EQ(heuristic(c), CUBLAS_STATUS_NOT_SUPPORTED) << ta << tb;
    const ComputeCapability blackwell("10.0");
    EXPECT_EQ(heuristic(c), CUBLAS_STATUS_SUCCESS) << ta << tb;
  }
}

TEST(EmuCublasLtFp8, NoE5m2TimesE5m2AndNoMixedWidths) {
  Call both;
  both.a = both.b = CUDA_R_8F_E5M2;
  EXPECT_EQ(heuristic(both), CUBLAS_STATUS_NOT_SUPPORTED);
  Call mixed;
  mixed.b = CUDA_R_16BF;
  EXPECT_EQ(heuristic(mixed), CUBLAS_STATUS_NOT_SUPPORTED);
  for (auto [a, b] :
       {std::pair{CUDA_R_8F_E4M3, CUDA_R_8F_E5M2}, {CUDA_R_8F_E5M2, CUDA_R_8F_E4M3}}) {
    Call ok;
    ok.a = a, ok.b = b;
    EXPECT_EQ(heuristic(ok), CUBLAS_STATUS_SUCCESS);
  }
}

TEST(EmuCublasLtFp8, CAndDTypes) {
  Call c_differs;  // D bf16 with C fp32
  c_differs.c = CUDA_R_32F;
  EXPECT_EQ(heuristic(c_differs), CUBLAS_STATUS_NOT_SUPPORTED);
  Call fp8_c;  // an FP8 D takes a 16-bit C, not an FP8 one
  fp8_c.c = fp8_c.d = CUDA_R_8F_E4M3;
  EXPECT_EQ(heuristic(fp8_c), CUBLAS_STATUS_NOT_SUPPORTED);
  fp8_c.c = CUDA_R_16F;
  EXPECT_EQ(heuristic(fp8_c), CUBLAS_STATUS_SUCCESS);
}

TEST(EmuCublasLtFp8, BiasTypeFollowsD) {
  Call c;
  c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  c.bias_type = CUDA_R_32F;  // D bf16: the bias must be bf16
  EXPECT_EQ(heuristic(c), CUBLAS_STATUS_NOT_SUPPORTED);
  c.bias_type = CUDA_R_16BF;
  EXPECT_EQ(heuristic(c), CUBLAS_STATUS_SUCCESS);
  c.c = c.d = CUDA_R_32F;  // D fp32: bf16 too, never fp32
  EXPECT_EQ(heuristic(c), CUBLAS_STATUS_SUCCESS);
  c.bias_type = CUDA_R_32F;
  EXPECT_EQ(heuristic(c), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST(EmuCublasLtFp8, LeadingDimensionsOf16BytesAndAlignedMatrices) {
  Call c;
  c.ld_extra = 8;  // FP8 A's ld 56: not a multiple of 16 bytes
  EXPECT_EQ(heuristic(c), CUBLAS_STATUS_NOT_SUPPORTED);
  c.ld_extra = 16;
  EXPECT_EQ(heuristic(c), CUBLAS_STATUS_SUCCESS);
  Call misaligned;  // found by the heuristic, refused by the matmul for A's address
  misaligned.misalign = 8;
  std::mt19937_64 g(packbert::test::test_seed() ^ 7);
  Buffers in;
  in.a = random_fp8(g, misaligned.a,
                    static_cast<size_t>(lda(misaligned) * (misaligned.m - 1) + misaligned.k));
  in.b = random_fp8(g, misaligned.b,
                    static_cast<size_t>(ldb(misaligned) * (misaligned.n - 1) + misaligned.k));
  EXPECT_EQ(matmul(misaligned, in, true, nullptr, nullptr), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST(EmuCublasLtFp8, ScalingAttributesOnlyWhereTheyApply) {
  Call amax_bf16;  // D's scale and amax belong to an FP8 D
  amax_bf16.amax_d = true;
  EXPECT_EQ(heuristic(amax_bf16), CUBLAS_STATUS_INVALID_VALUE);
  Call d_scale_bf16;
  d_scale_bf16.d_scale = true;
  EXPECT_EQ(heuristic(d_scale_bf16), CUBLAS_STATUS_INVALID_VALUE);
  Call scaled_bf16;  // A / B scales with 16-bit operands
  scaled_bf16.a = scaled_bf16.b = CUDA_R_16BF;
  EXPECT_EQ(heuristic(scaled_bf16), CUBLAS_STATUS_INVALID_VALUE);
  scaled_bf16.scales = false;
  EXPECT_EQ(heuristic(scaled_bf16), CUBLAS_STATUS_SUCCESS);
}

// The backend refuses FP8 itself, naming the GPU, before cuBLASLt is asked.
TEST(EmuCublasLtFp8, BackendNamesTheDeviceBelow89) {
  const ComputeCapability cc("8.0");
  auto be = packbert::make_backend(packbert::Device::cuda);
  auto a = be->alloc(packbert::DType::e4m3, {16, 16});
  auto s = be->alloc(packbert::DType::f32, {2});
  auto out = be->alloc(packbert::DType::bf16, {16, 16});
  try {
    be->fp8_gemm(a.tensor(), s.tensor(), a.tensor(), s.tensor(), out.tensor(), {});
    FAIL() << "fp8_gemm ran on a GPU of compute capability 8.0";
  } catch (const packbert::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("FP8 GEMMs need 8.9 or newer"), std::string::npos) << what;
    EXPECT_NE(what.find("is compute capability 8.0"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
  }
}

}  // namespace
