// The emulated cuBLASLt (kernels/cuda_emu/cublaslt.cpp) against naive column-major loops in
// double: transposes, alpha / beta, fp32 / bf16 / f16 operands and outputs, leading dimensions
// above the row count, each epilogue packbert uses, and the refusals and faults a GPU gives.
// Inputs reach the device through cudaMemcpyAsync on the matmul's stream, and fresh device
// memory holds NaN, so a matmul that read its operands at the call instead of in stream order
// would produce NaN.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_emu/runtime.h"

namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;

// GELU's tanh form and its derivative, the latter written with sech^2 (a form of its own, so
// that a slip in the emulation's formula does not repeat here).
double ref_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}
double ref_gelu_derivative(double x) {
  const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  const double sech = 1.0 / std::cosh(u);
  return 0.5 * (1.0 + std::tanh(u)) +
         0.5 * x * kSqrt2OverPi * (1.0 + 0.134145 * x * x) * sech * sech;
}

size_t size_of(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// The 16 bits of v rounded to bf16 / f16, by the conversions the device code uses.
uint16_t low_bits(cudaDataType_t t, double v) {
  const float f = static_cast<float>(v);
  return t == CUDA_R_16BF ? __float2bfloat16_rn(f).x : __float2half_rn(f).x;
}

// A column-major matrix on the host, padding (rows..ld) included.
struct Mat {
  cudaDataType_t type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 1;
  std::vector<unsigned char> bytes;
  Mat(cudaDataType_t t, int64_t r, int64_t c, int64_t l)
      : type(t),
        rows(r),
        cols(c),
        ld(l),
        bytes(size_of(t) * static_cast<size_t>(l * (c - 1) + r)) {}
  size_t count() const { return bytes.size() / size_of(type); }
  double flat(size_t e) const {
    if (type == CUDA_R_32F) {
      float f;
      std::memcpy(&f, &bytes[e * 4], 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, &bytes[e * 2], 2);
    return type == CUDA_R_16BF ? __bfloat162float(__nv_bfloat16{b}) : __half2float(__half{b});
  }
  void set_flat(size_t e, double v) {  // rounded to the type
    const float f = static_cast<float>(v);
    const uint16_t b = type == CUDA_R_32F ? 0 : low_bits(type, v);
    if (type == CUDA_R_32F)
      std::memcpy(&bytes[e * 4], &f, 4);
    else
      std::memcpy(&bytes[e * 2], &b, 2);
  }
  double at(int64_t i, int64_t j) const { return flat(static_cast<size_t>(i + j * ld)); }
  bool same_bytes(const Mat& o, int64_t i, int64_t j) const {
    const size_t s = size_of(type), e = static_cast<size_t>(i + j * ld) * s;
    return std::memcmp(&bytes[e], &o.bytes[e], s) == 0;
  }
};

void fill_random(Mat& m, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (size_t e = 0; e < m.count(); ++e) m.set_flat(e, u(rng));
}
void fill_nan(Mat& m) {
  for (size_t e = 0; e < m.count(); ++e) m.set_flat(e, std::numeric_limits<double>::quiet_NaN());
}

// How far got is from the reference: 0 within tolerance (fp32: 1e-6 relative; bf16 / f16: the
// reference rounded by the same conversion), 1 one unit in the last place off (bf16 / f16),
// 2 beyond.
int mismatch(cudaDataType_t t, double got, double ref) {
  if (t == CUDA_R_32F) return std::fabs(got - ref) <= 1e-6 * std::fabs(ref) + 1e-30 ? 0 : 2;
  if (std::isnan(got)) return 2;
  auto ordered = [](uint16_t b) { return (b & 0x8000) ? -static_cast<int>(b & 0x7fff) : b; };
  return std::min(2, std::abs(ordered(low_bits(t, got)) - ordered(low_bits(t, ref))));
}

void* to_device(const Mat& m, cudaStream_t s) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, m.bytes.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(p, m.bytes.data(), m.bytes.size(), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  return p;
}
void from_device(Mat& m, const void* p) {
  EXPECT_EQ(cudaMemcpy(m.bytes.data(), p, m.bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
}

// The cuBLASLt objects of one call, destroyed in any case; the preference says what packbert's
// says (workspace, alignments), which the emulation must accept.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit Lt(cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    EXPECT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const uint64_t workspace = 1 << 20;
    const uint32_t align = 16;
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace, sizeof(workspace)),
              CUBLAS_STATUS_SUCCESS);
    for (int attr = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
         attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; ++attr)  // A, B, C, D
      EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                    pref, static_cast<cublasLtMatmulPreferenceAttributes_t>(attr), &align, 4),
                CUBLAS_STATUS_SUCCESS);
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    for (auto l : {a, b, c, d}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, T value) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)),
              CUBLAS_STATUS_SUCCESS);
  }
  void layouts(const Mat& ma, const Mat& mb, const Mat& mc, const Mat& md) {
    for (auto [l, m] : {std::pair{&a, &ma}, {&b, &mb}, {&c, &mc}, {&d, &md}})
      EXPECT_EQ(cublasLtMatrixLayoutCreate(l, m->type, static_cast<uint64_t>(m->rows),
                                           static_cast<uint64_t>(m->cols), m->ld),
                CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t heuristic(int* found, cublasLtMatmulHeuristicResult_t* r) {
    return cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, d, pref, 1, r, found);
  }
  cublasStatus_t matmul(const void* A, const void* B, void* CD, float beta, cudaStream_t stream,
                        const cublasLtMatmulAlgo_t* algo = nullptr, float alpha = 1.f,
                        void* D = nullptr) {
    return cublasLtMatmul(handle, op, &alpha, A, a, B, b, &beta, CD, c, D ? D : CD, d, algo,
                          nullptr, 0, stream);
  }
};

// One matmul: D (m x n) = alpha op(A) op(B) + beta C, then the epilogue.
struct Spec {
  bool ta = false, tb = false;
  int64_t m = 6, n = 5, k = 7;
  int64_t pad = 0;  // every ld is its matrix's rows + pad
  cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
  float alpha = 1.f, beta = 0.f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int32_t bias_type = CUDA_R_32F;  // -1: BIAS_DATA_TYPE left unset (D's type)
  bool in_place = true;            // C == D, as packbert calls it
  Spec& trans(bool a, bool b) { return ta = a, tb = b, *this; }
  Spec& dims(int64_t m_, int64_t n_, int64_t k_) { return m = m_, n = n_, k = k_, *this; }
  Spec& padded(int64_t p) { return pad = p, *this; }
  Spec& types(cudaDataType_t a, cudaDataType_t c) { return ab = a, cd = c, *this; }
  Spec& scale(float a, float b) { return alpha = a, beta = b, *this; }
  Spec& with(cublasLtEpilogue_t e, int32_t bias = CUDA_R_32F) {
    return epilogue = e, bias_type = bias, *this;
  }
  Spec& separate_c() { return in_place = false, *this; }
};

std::string describe(const Spec& s) {
  std::ostringstream o;
  o << "trans " << s.ta << s.tb << ", m n k " << s.m << " " << s.n << " " << s.k << ", pad "
    << s.pad << ", types " << s.ab << "/" << s.cd << ", alpha " << s.alpha << ", beta " << s.beta
    << ", epilogue " << s.epilogue << ", bias type " << s.bias_type << ", in place " << s.in_place;
  return o.str();
}

// Runs one matmul through the emulated runtime and checks D (and aux, and the bias gradient)
// element by element against the reference; D's and aux's padding must stay as it was.
void run_case(const Spec& s, uint64_t seed) {
  SCOPED_TRACE(describe(s));
  std::mt19937_64 rng(seed);
  const cublasLtEpilogue_t e = s.epilogue;
  const bool bias_in = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool bgrad = e == CUBLASLT_EPILOGUE_BGRADB;
  const bool uses_aux = e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
  const int64_t ar = s.ta ? s.k : s.m, ac = s.ta ? s.m : s.k;
  const int64_t br = s.tb ? s.n : s.k, bc = s.tb ? s.k : s.n;
  Mat a(s.ab, ar, ac, ar + s.pad), b(s.ab, br, bc, br + s.pad), c(s.cd, s.m, s.n, s.m + s.pad);
  fill_random(a, rng, -1, 1);
  fill_random(b, rng, -1, 1);
  if (s.beta == 0.f)
    fill_nan(c);  // must not be read
  else
    fill_random(c, rng, -1, 1);
  Mat d = c;
  if (!s.in_place) fill_nan(d);
  const auto bt = static_cast<cudaDataType_t>(s.bias_type == -1 ? s.cd : s.bias_type);
  const int64_t bias_len = bgrad ? s.n : s.m;
  Mat bias(bt, bias_len, 1, bias_len);
  fill_random(bias, rng, -1, 1);  // BGRADB overwrites it: an implementation adding to it fails
  Mat aux(s.cd, s.m, s.n, (s.m + s.pad + 7) / 8 * 8);
  if (e == CUBLASLT_EPILOGUE_DGELU)
    fill_random(aux, rng, -3, 3);
  else
    fill_nan(aux);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  void* da = to_device(a, stream);
  void* db = to_device(b, stream);
  void* dc = to_device(c, stream);
  void* dd = s.in_place ? dc : to_device(d, stream);
  void* dbias = bias_in || bgrad ? to_device(bias, stream) : nullptr;
  void* daux = uses_aux ? to_device(aux, stream) : nullptr;
  {
    Lt lt;
    lt.set(CUBLASLT_MATMUL_DESC_TRANSA, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
    lt.set(CUBLASLT_MATMUL_DESC_TRANSB, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
    lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, e);
    if (dbias) lt.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, dbias);
    if (dbias && s.bias_type != -1) lt.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, s.bias_type);
    if (daux) lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, daux);
    if (daux) lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux.ld);
    lt.layouts(a, b, c, d);
    int found = 0;
    cublasLtMatmulHeuristicResult_t r{};
    ASSERT_EQ(lt.heuristic(&found, &r), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(found, 1);
    EXPECT_EQ(r.state, CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(r.workspaceSize, 0u);
    ASSERT_EQ(lt.matmul(da, db, dc, s.beta, stream, &r.algo, s.alpha, dd), CUBLAS_STATUS_SUCCESS);
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Mat got_d = d, got_bias = bias, got_aux = aux;
  from_device(got_d, dd);
  if (dbias) from_device(got_bias, dbias);
  if (daux) from_device(got_aux, daux);
  for (void* p : {da, db, dc, s.in_place ? nullptr : dd, dbias, daux}) cudaFree(p);
  cudaStreamDestroy(stream);

  // Low-precision results may be one unit off, but not often: a different rounding would be.
  int bad = 0, one_off = 0, low = 0;
  auto expect = [&](cudaDataType_t t, double got, double ref, const char* what, int64_t i,
                    int64_t j) {
    const int off = mismatch(t, got, ref);
    low += t != CUDA_R_32F;
    one_off += off == 1;
    if (off > 1 && bad++ < 5)
      ADD_FAILURE() << what << "(" << i << "," << j << "): got " << got << ", expected " << ref;
  };
  auto op_a = [&](int64_t i, int64_t p) { return s.ta ? a.at(p, i) : a.at(i, p); };
  auto op_b = [&](int64_t p, int64_t j) { return s.tb ? b.at(j, p) : b.at(p, j); };
  for (int64_t j = 0; j < s.n; ++j) {
    for (int64_t i = 0; i < s.m; ++i) {
      double ab = 0.0;
      for (int64_t p = 0; p < s.k; ++p) ab += op_a(i, p) * op_b(p, j);
      double x = double{s.alpha} * ab + (s.beta == 0.f ? 0.0 : double{s.beta} * c.at(i, j));
      if (bias_in) x += bias.at(i, 0);
      if (e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        expect(s.cd, got_aux.at(i, j), x, "aux", i, j);
        x = ref_gelu(x);
      }
      if (e == CUBLASLT_EPILOGUE_DGELU) x *= ref_gelu_derivative(aux.at(i, j));
      expect(s.cd, got_d.at(i, j), x, "D", i, j);
    }
    // The padding between columns (the last column has none: the layout's extent ends there).
    for (int64_t i = s.m; j + 1 < s.n && i < d.ld; ++i)
      if (!got_d.same_bytes(d, i, j) && bad++ < 5) ADD_FAILURE() << "D's padding written at " << i;
    for (int64_t i = s.m; uses_aux && j + 1 < s.n && i < aux.ld; ++i)
      if (!got_aux.same_bytes(aux, i, j) && bad++ < 5) ADD_FAILURE() << "aux padding written";
    if (bgrad) {
      double sum = 0.0;
      for (int64_t p = 0; p < s.k; ++p) sum += op_b(p, j);
      expect(bt, got_bias.at(j, 0), sum, "bias gradient", j, 0);
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LE(one_off * 4, low) << one_off << " of " << low << " low-precision values one unit off";
}

TEST(EmuCublasLt, ReferenceGeluDerivativeMatchesDifferences) {
  for (double x = -4.0; x <= 4.0; x += 0.37) {
    const double h = 1e-5;
    const double numeric = (ref_gelu(x + h) - ref_gelu(x - h)) / (2 * h);
    EXPECT_NEAR(ref_gelu_derivative(x), numeric, 1e-8) << x;
  }
}

TEST(EmuCublasLt, Fp32EveryTransposeAndLeadingDimension) {
  uint64_t seed = 1;
  for (int t = 0; t < 4; ++t)
    for (int64_t pad : {0, 3}) {
      run_case(Spec().trans(t & 1, t & 2).padded(pad), seed++);
      run_case(Spec().trans(t & 1, t & 2).padded(pad).dims(6, 5, 64).scale(0.75f, -1.5f), seed++);
    }
}

TEST(EmuCublasLt, AlphaBetaWithSeparateC) {
  run_case(Spec().separate_c().scale(2.f, 0.5f), 11);
  run_case(Spec().separate_c().scale(2.f, 0.f).padded(2), 12);  // C all NaN, not read
}

TEST(EmuCublasLt, LowPrecisionOperands) {
  uint64_t seed = 20;
  for (cudaDataType_t t : {CUDA_R_16BF, CUDA_R_16F})
    for (cudaDataType_t out : {t, CUDA_R_32F})
      for (int tr = 0; tr < 4; ++tr)  // beta 1 into fp32: packbert's weight gradients
        run_case(Spec()
                     .types(t, out)
                     .trans(tr & 1, tr & 2)
                     .dims(6, 5, 33)
                     .padded(tr == 3 ? 5 : 0)
                     .scale(1.f, tr == 2 ? 1.f : 0.f),
                 seed++);
}

TEST(EmuCublasLt, BiasEpilogue) {  // transa = T: packbert's forward, out^T = op_T(w) x^T
  run_case(Spec().trans(true, false).with(CUBLASLT_EPILOGUE_BIAS), 40);
  run_case(Spec().trans(true, false).with(CUBLASLT_EPILOGUE_BIAS).types(CUDA_R_16BF, CUDA_R_16BF),
           41);  // bf16 D, fp32 bias
  run_case(Spec()
               .trans(true, false)
               .with(CUBLASLT_EPILOGUE_BIAS, -1)
               .scale(1.f, 1.f)
               .types(CUDA_R_16F, CUDA_R_16F),
           42);  // the bias in D's type
}

TEST(EmuCublasLt, GeluAuxBiasEpilogueWritesDAndAux) {
  const Spec s = Spec().trans(true, false).dims(8, 5, 7).with(CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  run_case(s, 50);
  run_case(Spec(s).padded(3).types(CUDA_R_16BF, CUDA_R_16BF), 51);  // aux ld 16, D's ld 11
}

TEST(EmuCublasLt, DgeluEpilogue) {
  const Spec s = Spec().dims(16, 5, 7).with(CUBLASLT_EPILOGUE_DGELU);
  run_case(s, 60);
  run_case(Spec(s).types(CUDA_R_16F, CUDA_R_16F).scale(0.25f, 0.f).padded(1), 61);
}

TEST(EmuCublasLt, BgradbEpilogueWritesColumnSumsOfOpB) {
  // packbert's dw^T += x^T op_T(dout^T) with db the column sums of dout.
  const Spec s = Spec().trans(false, true).dims(6, 5, 40).scale(1.f, 1.f);
  run_case(Spec(s).with(CUBLASLT_EPILOGUE_BGRADB), 70);
  run_case(Spec(s).with(CUBLASLT_EPILOGUE_BGRADB).types(CUDA_R_16BF, CUDA_R_32F), 71);
  run_case(Spec(s)
               .with(CUBLASLT_EPILOGUE_BGRADB, -1)
               .types(CUDA_R_16F, CUDA_R_16F)
               .trans(0, 0)
               .scale(1.f, 0.f),
           72);  // the gradient in D's type
}

// The heuristic's answer for a problem given by its types, epilogue and shapes.
struct Probe {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t a = CUDA_R_32F, b = CUDA_R_32F, c = CUDA_R_32F, d = CUDA_R_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int64_t aux_ld = 8, b_rows = 8, lda = 8;
};
cublasStatus_t probe(const Probe& p, int* found) {
  Lt lt(p.compute);
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue);
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld);
  lt.layouts(Mat(p.a, 8, 8, p.lda), Mat(p.b, p.b_rows, 8, 8), Mat(p.c, 8, 8, 8), Mat(p.d, 8, 8, 8));
  cublasLtMatmulHeuristicResult_t r{};
  *found = -1;
  return lt.heuristic(found, &r);
}

// NOT_SUPPORTED for what the emulation has no algorithm for, INVALID_VALUE for what is
// inconsistent; no result either way.
TEST(EmuCublasLt, HeuristicRefusals) {
  int found = -1;
  EXPECT_EQ(probe(Probe(), &found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
  std::vector<Probe> refused(8);
  refused[0].a = refused[0].b = CUDA_R_16BF;  // bf16 operands, f16 output
  refused[0].c = refused[0].d = CUDA_R_16F;
  refused[1].b = CUDA_R_16BF;  // A and B of different types
  refused[2].compute = CUBLAS_COMPUTE_64F;
  refused[3].epilogue = CUBLASLT_EPILOGUE_RELU;
  refused[4].epilogue = CUBLASLT_EPILOGUE_DGELU;  // aux ld not a multiple of 8
  refused[4].aux_ld = 12;
  refused[5].d = CUDA_R_16F;  // C and D of different types
  refused[6].b_rows = 7;      // op(B) 7 x 8 after op(A) 8 x 8
  refused[7].lda = 7;         // ld below rows
  for (size_t i = 0; i < refused.size(); ++i) {
    EXPECT_EQ(probe(refused[i], &found),
              i < 6 ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE)
        << i;
    EXPECT_EQ(found, 0) << i;
  }
}

TEST(EmuCublasLt, MatmulRejectsInconsistentShapesWithoutFault) {
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, 64 * sizeof(float)), cudaSuccess);
  Lt lt;
  lt.layouts(Mat(CUDA_R_32F, 4, 3, 4), Mat(CUDA_R_32F, 2, 4, 2), Mat(CUDA_R_32F, 4, 4, 4),
             Mat(CUDA_R_32F, 4, 4, 4));
  EXPECT_EQ(lt.matmul(buf, buf, buf + 16, 0.f, nullptr), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_FALSE(packbert::emu::faulted());
  cudaFree(buf);
}

TEST(EmuCublasLt, AttributesAreCheckedAndStatusesNamed) {
  Lt lt;
  const int64_t wide = CUBLAS_OP_T;
  const int32_t narrow = 64;
  const uint64_t align = 16;  // the alignment attributes are uint32_t
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &narrow,
                                           sizeof(narrow)),
            CUBLAS_STATUS_INVALID_VALUE);
  const auto unknown = static_cast<cublasLtMatmulDescAttributes_t>(99);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt.op, unknown, &narrow, sizeof(narrow)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(
                lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof(align)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STRNE(cublasLtGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED), "");
}

// Last in the file: the fault it provokes is sticky for the rest of the process.
TEST(EmuCublasLt, MatrixOutsideItsAllocationIsAStickyFault) {
  ASSERT_FALSE(packbert::emu::faulted()) << "an earlier test faulted the emulated device";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // A is 4 x 4 with ld 6: its layout spans 6 * 3 + 4 = 22 floats.
  float *a_exact = nullptr, *a_short = nullptr, *bcd = nullptr;
  ASSERT_EQ(cudaMalloc(&a_exact, 22 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&a_short, 21 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bcd, 32 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a_exact, 0, 22 * sizeof(float), stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(bcd, 0, 32 * sizeof(float), stream), cudaSuccess);
  Lt lt;
  lt.layouts(Mat(CUDA_R_32F, 4, 4, 6), Mat(CUDA_R_32F, 4, 4, 4), Mat(CUDA_R_32F, 4, 4, 4),
             Mat(CUDA_R_32F, 4, 4, 4));
  EXPECT_EQ(lt.matmul(a_exact, bcd, bcd + 16, 0.f, stream), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_FALSE(packbert::emu::faulted());
  EXPECT_EQ(lt.matmul(a_short, bcd, bcd + 16, 0.f, stream), CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_TRUE(packbert::emu::faulted());
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorLaunchFailure);
}

}  // namespace
