// Linear layers: OpenBLAS sgemm (row-major, fp32 accumulate) cut into tiles that run on our
// OpenMP threads (cpu::gemm in cpu_common.h says why), with the epilogues (bias, GELU, dGELU)
// applied to each tile right after its sgemm, while it is still in cache; GELU and its derivative
// in SSE2 (cpu_simd.h: erf to ~1e-7 relative, in the far negative tail too). linear_backward runs
// its dW tiles, dX tiles and bias-gradient column blocks as one task list in one parallel
// region. Fewer parallel regions matter on a shared machine: each fork/join waits for every
// thread to be scheduled, which costs a scheduler tick when other processes keep the cores busy.
#include <cblas.h>

#include <algorithm>

#include "kernels/common/math.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_lowp.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/ops/linear.h"

namespace packbert {

using cpu::expect;
using cpu::expect_optional;

namespace {

int blas_int(const char* op, int64_t v) {
  PB_REQUIRE(v <= 0x7fffffff, "{}: extent {} exceeds the BLAS int range", op, v);
  return static_cast<int>(v);
}

// One GEMM, row-major C = alpha op(A) op(B) + beta C, cut into tiles along the longer side of C
// (each tile packs the other operand again, so when that one is large -- the tied word
// embedding in the MLM decoder's dx GEMM, 30522 x H -- fewer tiles). 16 tiles balance up to 8
// threads; tiles are multiples of 16 rows / columns. Small products are one tile. The tiling
// depends only on the shape, and every element of C is one single-threaded sgemm dot product
// over the whole k, so the bits depend neither on the thread count nor on which thread runs a
// tile.
struct GemmTiles {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool split_m = true;
  int64_t tile = 0, tiles = 0;

  // The C block of tile t: rows [r0, r1), columns [c0, c1).
  struct Block {
    int64_t r0, r1, c0, c1;
  };

  Block block(int64_t t) const {
    const int64_t i0 = t * tile, i1 = std::min(i0 + tile, split_m ? m : n);
    return split_m ? Block{i0, i1, 0, n} : Block{0, m, i0, i1};
  }

  Block run(int64_t t) const {
    const Block q = block(t);
    const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
    const float* at = ta ? a + q.r0 : a + q.r0 * lda;
    const float* bt = tb ? b + q.c0 * ldb : b + q.c0;
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(q.r1 - q.r0),
                static_cast<int>(q.c1 - q.c0), static_cast<int>(k), alpha, at,
                static_cast<int>(lda), bt, static_cast<int>(ldb), beta, c + q.r0 * ldc + q.c0,
                static_cast<int>(ldc));
    return q;
  }
};

GemmTiles plan_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char* op = "gemm";
  for (int64_t v : {m, n, k, lda, ldb, ldc}) blas_int(op, v);
  GemmTiles g;
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
  g.a = a, g.b = b, g.c = c, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.split_m = m >= n;
  const int64_t side = g.split_m ? m : n;
  if (side == 0) return g;  // no tiles
  if (2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < 4e6 &&
      m * n < 65536) {
    g.tile = side, g.tiles = 1;
    return g;
  }
  const int64_t other_floats = g.split_m ? k * n : m * k;
  const int64_t max_tiles = other_floats > (int64_t{1} << 20) ? 4 : 16;
  g.tile = std::max<int64_t>(32, ((side + max_tiles - 1) / max_tiles + 15) / 16 * 16);
  g.tiles = (side + g.tile - 1) / g.tile;
  return g;
}

}  // namespace

namespace cpu {

// The OpenMP build of OpenBLAS (Debian's libopenblas0-openmp) runs one thread by itself when
// called inside an OpenMP parallel region, and its openblas_set_num_threads would also set
// OpenMP's thread count (ours): leave it alone. The pthread build needs the setting.
BlasSingleThread::BlasSingleThread()
    : threads_(openblas_get_parallel() == OPENBLAS_OPENMP ? 1 : openblas_get_num_threads()) {
  if (threads_ != 1) openblas_set_num_threads(1);
}

BlasSingleThread::~BlasSingleThread() {
  if (threads_ != 1) openblas_set_num_threads(threads_);
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const GemmTiles g = plan_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const BlasSingleThread single;
  if (g.tiles == 1) {
    g.run(0);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < g.tiles; ++t) g.run(t);
}

}  // namespace cpu

namespace {

void apply_gelu(bool tanh_form, const float* x, float* y, int64_t n) {
  if (tanh_form)
    cpu::gelu_tanh_to(x, y, n);
  else
    cpu::gelu_to(x, y, n);
}

void mul_gelu_grad(bool tanh_form, float* g, const float* pre, int64_t n) {
  if (tanh_form)
    cpu::mul_gelu_tanh_grad(g, pre, n);
  else
    cpu::mul_gelu_grad(g, pre, n);
}

}  // namespace

void CpuBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                Epilogue epilogue, const Tensor& out, const Tensor& pre) {
  if (lowp::any({&x, &w, &bias, &out, &pre}))
    return lowp::linear_forward(*this, lowp_, x, w, bias, epilogue, out, pre);
  const char* op = "linear_forward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [n, k, m] = checks::linear_forward_args(args, x, w, bias, epilogue, out, pre);
  if (n == 0 || m == 0) return;

  // With GELU the GEMM writes the pre-activation buffer, which backward needs anyway.
  const bool with_gelu = has_gelu(epilogue);
  const bool tanh_form = gelu_of(epilogue) == Gelu::tanh;
  float* c = with_gelu ? pre.ptr<float>() : out.ptr<float>();
  const float* b = bias.defined() ? bias.ptr<float>() : nullptr;
  float* y = out.ptr<float>();
  auto finish = [&](const GemmTiles::Block& q) {  // bias (+ GELU) on one tile
    if (!b && !with_gelu) return;
    for (int64_t r = q.r0; r < q.r1; ++r) {
      float* cr = c + r * m;
      if (b)
        for (int64_t j = q.c0; j < q.c1; ++j) cr[j] += b[j];
      if (with_gelu) apply_gelu(tanh_form, cr + q.c0, y + r * m + q.c0, q.c1 - q.c0);
    }
  };
  if (k == 0) {
    for (int64_t i = 0; i < n * m; ++i) c[i] = 0.f;
    finish(GemmTiles::Block{0, n, 0, m});
    return;
  }
  const GemmTiles g =
      plan_gemm(false, true, n, m, k, 1.0f, x.ptr<float>(), k, w.ptr<float>(), k, 0.0f, c, m);
  const cpu::BlasSingleThread single;
  if (g.tiles == 1) {
    finish(g.run(0));
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < g.tiles; ++t) finish(g.run(t));
}

void CpuBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout,
                                 const Tensor& dx, const Tensor& dw, const Tensor& db,
                                 const LinearBackwardOptions& opt) {
  if (lowp::any({&x, &w, &dout, &dx, &dw, &db, &opt.out_gelu_pre, &opt.x_gelu_pre}))
    return lowp::linear_backward(*this, lowp_, x, w, dout, dx, dw, db, opt);
  const char* op = "linear_backward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [n, k, m] = checks::linear_backward_args(args, x, w, dout, dx, dw, db, opt);
  if (n == 0) return;

  float* g = dout.ptr<float>();
  const bool tanh_form = opt.gelu == Gelu::tanh;
  if (opt.out_gelu_pre.defined()) {
    const float* pre = opt.out_gelu_pre.ptr<float>();
#pragma omp parallel for schedule(static) if (n * m >= 16384)
    for (int64_t r = 0; r < n; ++r) mul_gelu_grad(tanh_form, g + r * m, pre + r * m, m);
  }
  float* d = dx.defined() && k > 0 ? dx.ptr<float>() : nullptr;
  if (d && m == 0) {
    if (!opt.dx_accumulate)
      for (int64_t i = 0; i < n * k; ++i) d[i] = 0.f;
    d = nullptr;
  }
  // The tasks: dW tiles, dX tiles (each followed by its share of the dGELU), then the bias
  // gradient's column blocks. They write disjoint outputs and only read dout, so they run in any
  // order -- unless dx overlaps x, which the dW tiles read: then dW (and db) go first.
  const GemmTiles gw =
      dw.defined() && m > 0 && k > 0
          ? plan_gemm(true, false, m, k, n, 1.0f, g, m, x.ptr<float>(), k, 1.0f, dw.ptr<float>(), k)
          : GemmTiles{};
  const GemmTiles gx = d ? plan_gemm(false, false, n, k, m, 1.0f, g, m, w.ptr<float>(), k,
                                     opt.dx_accumulate ? 1.0f : 0.0f, d, k)
                         : GemmTiles{};
  const float* xpre = opt.x_gelu_pre.defined() ? opt.x_gelu_pre.ptr<float>() : nullptr;
  float* dbp = db.defined() ? db.ptr<float>() : nullptr;
  const int64_t nb = dbp ? cpu::column_blocks(m) : 0;
  auto task = [&](int64_t t) {
    if (t < gw.tiles) {
      gw.run(t);
    } else if (t < gw.tiles + gx.tiles) {
      const GemmTiles::Block q = gx.run(t - gw.tiles);
      if (xpre)
        for (int64_t r = q.r0; r < q.r1; ++r)
          mul_gelu_grad(tanh_form, d + r * k + q.c0, xpre + r * k + q.c0, q.c1 - q.c0);
    } else {
      cpu::add_column_sums_block(g, n, m, m, t - gw.tiles - gx.tiles, dbp);
    }
  };
  const cpu::BlasSingleThread single;
  const int64_t tasks = gw.tiles + gx.tiles + nb;
  const bool small = 2.0 * static_cast<double>(n) * static_cast<double>(m) *
                             static_cast<double>(k) * (gw.tiles > 0 ? 2 : 1) <
                         4e6 &&
                     n * m < 65536;
  const auto* xb = x.defined() ? static_cast<const char*>(x.data) : nullptr;
  const auto* dxb = reinterpret_cast<const char*>(d);
  const bool dx_overlaps_x = xb && dxb && dxb < xb + x.bytes() && xb < dxb + dx.bytes();
  if (small || tasks <= 1) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  } else if (dx_overlaps_x) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < gw.tiles; ++t) task(t);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = gw.tiles; t < tasks; ++t) task(t);
  } else {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
}

}  // namespace packbert
