// gpu label: every op of the CUDA backend against the CPU backend (the executable
// specification) on the same random inputs (never zeros), in varied shapes, with and without
// dropout and the optional tensors. Device outputs sit between NaN-pattern guards and start as
// NaN (written outputs) or random values (accumulated ones): a stray write or an unwritten
// element fails. Without a device every test prints "skipped: no CUDA device".
//
// Tolerances (rel L2 ||cuda - cpu|| / ||cpu||, fp32 vs fp32):
// - 1e-5 (kTol) for elementwise and short reductions: both sides round each product once and
//   sum <= a few hundred terms in another order: ~sqrt(K) * 6e-8 <= 1e-6.
// - 1e-5 for LayerNorm / column sums: the CPU sums in double, the GPU too (in other groupings).
// - 2e-5 (kAttnBwdTol) for attention backward: dS = P (dP - D) cancels D, the mean of dP over
//   the row, so the relative error of dQ / dK grows with the cancellation (up to 512 keys).
// - losses: 1e-6 relative on the summed loss (double sums of per-row double values).
// - 2e-3 (kGeluEpilogueTol) where cuBLASLt's GELU_AUX_BIAS / DGELU epilogues compute the tanh
//   GELU (ld % 8 == 0): its tanh may be the hardware approximation (tanh.approx.f32, relative
//   error ~2^-11), not the formula of common/math.h. expect_close prints the measured error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "cuda_test_util.h"

namespace packbert::test {
namespace {

constexpr double kAttnBwdTol = 2e-5;
constexpr double kGeluEpilogueTol = 2e-3;

struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu;
  Backends() {
    CudaBackendOptions o;
    o.sync_each_op = true;  // a fault names its op
    gpu = make_cuda_backend(0, o);
  }
};

Tensor hv(std::vector<float>& v, std::initializer_list<int64_t> dims) { return view(v.data(), dims); }
Tensor hv(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return view(v.data(), dims);
}

Dropout make_dropout(float p, uint64_t seed, DropoutSite site, uint32_t layer = 5) {
  Dropout d;
  d.p = p;
  d.seed = seed;
  d.step = 1234;
  d.layer = layer;
  d.site = site;
  return d;
}

TEST(CudaOps, CopyAndZero) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(1);
  auto x = random_floats(rng, 1001);
  DevBuf<float> d({1001}), e({1001});
  b.gpu->copy(d.tensor(), hv(x, {1001}));
  b.gpu->copy(e.tensor(), d.tensor());
  std::vector<float> back(1001, 0.f);
  b.gpu->copy(hv(back, {1001}), e.tensor());
  EXPECT_EQ(back, x);
  EXPECT_TRUE(e.guards_intact());
  b.gpu->zero(e.tensor());
  for (float v : e.values()) ASSERT_EQ(v, 0.f);
  EXPECT_TRUE(e.guards_intact());
  EXPECT_THROW(b.gpu->zero(hv(x, {1001})), Error);  // a host tensor is refused
}

// ---- linear -----------------------------------------------------------------------------------
TEST(CudaOps, LinearForward) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(2);
  const int64_t shapes[][3] = {{37, 24, 40}, {1, 8, 3}, {130, 64, 96}, {5, 1, 7}, {64, 128, 2}};
  for (const auto& s : shapes)
    for (Epilogue ep :
         {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu, Epilogue::bias_gelu_tanh}) {
      const int64_t n = s[0], k = s[1], m = s[2];
      auto x = random_floats(rng, n * k), w = random_floats(rng, m * k), bias = random_floats(rng, m);
      std::vector<float> out(n * m), pre(n * m);
      const bool gelu = has_gelu(ep), with_bias = ep != Epilogue::none;
      const bool epilogue_gelu = ep == Epilogue::bias_gelu_tanh && m % 8 == 0;
      b.cpu->linear_forward(hv(x, {n, k}), hv(w, {m, k}), with_bias ? hv(bias, {m}) : Tensor(), ep,
                            hv(out, {n, m}), gelu ? hv(pre, {n, m}) : Tensor());
      DevBuf<float> dx({n, k}, x), dw({m, k}, w), db({m}, bias), dout({n, m}), dpre({n, m});
      b.gpu->linear_forward(dx.tensor(), dw.tensor(), with_bias ? db.tensor() : Tensor(), ep,
                            dout.tensor(), gelu ? dpre.tensor() : Tensor());
      const std::string what = fmt::format("linear_forward n{} k{} m{} ep{}{}", n, k, m,
                                           static_cast<int>(ep),
                                           epilogue_gelu ? " GELU_AUX_BIAS" : "");
      EXPECT_DEV_OUTPUT_OK(dout);
      expect_close(what + " out", dout.doubles(), dbl(out), epilogue_gelu ? kGeluEpilogueTol : kTol);
      if (gelu) {
        EXPECT_DEV_OUTPUT_OK(dpre);
        expect_close(what + " pre", dpre.doubles(), dbl(pre), kTol);
      }
    }
}

TEST(CudaOps, LinearBackward) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(3);
  const int64_t shapes[][3] = {{37, 24, 40}, {1, 8, 3}, {130, 64, 96}, {300, 16, 5}};
  // variant bits: 1 dx, 2 dw, 4 db, 8 dx_accumulate, 16 x_gelu_pre, 32 out_gelu_pre, 64 the
  // tanh GELU for both
  const int variants[] = {1,          1 | 8,          2 | 4,      4,
                          2,          1 | 2 | 4,      1 | 16,     1 | 2 | 4 | 32,
                          1 | 16 | 2 | 4, 1 | 16 | 64, 1 | 2 | 4 | 32 | 64};
  for (const auto& s : shapes)
    for (int var : variants) {
      const int64_t n = s[0], k = s[1], m = s[2];
      auto x = random_floats(rng, n * k), w = random_floats(rng, m * k);
      auto g = random_floats(rng, n * m), dx0 = random_floats(rng, n * k);
      auto dw0 = random_floats(rng, m * k), db0 = random_floats(rng, m);
      auto xpre = random_floats(rng, n * k, 2.f), opre = random_floats(rng, n * m, 2.f);
      const bool want_dx = var & 1, want_dw = var & 2, want_db = var & 4;
      LinearBackwardOptions ho, go;
      ho.dx_accumulate = go.dx_accumulate = var & 8;
      ho.gelu = go.gelu = var & 64 ? Gelu::tanh : Gelu::erf;
      const bool epilogue_dgelu = (var & 64) && (var & 16) && k % 8 == 0;  // DGELU
      std::vector<float> hdx = dx0, hdw = dw0, hdb = db0, hg = g;
      DevBuf<float> ddx({n, k});  // written (NaN) or accumulated onto dx0
      if (var & 8) ddx.set(dx0);
      DevBuf<float> dx_({n, k}, x), dw_({m, k}, w), dg({n, m}, g), ddw({m, k}, dw0), ddb({m}, db0);
      DevBuf<float> dxpre({n, k}, xpre), dopre({n, m}, opre);
      if (var & 16) ho.x_gelu_pre = hv(xpre, {n, k}), go.x_gelu_pre = dxpre.tensor();
      if (var & 32) ho.out_gelu_pre = hv(opre, {n, m}), go.out_gelu_pre = dopre.tensor();
      b.cpu->linear_backward(hv(x, {n, k}), hv(w, {m, k}), hv(hg, {n, m}),
                             want_dx ? hv(hdx, {n, k}) : Tensor(), want_dw ? hv(hdw, {m, k}) : Tensor(),
                             want_db ? hv(hdb, {m}) : Tensor(), ho);
      b.gpu->linear_backward(dx_.tensor(), dw_.tensor(), dg.tensor(),
                             want_dx ? ddx.tensor() : Tensor(), want_dw ? ddw.tensor() : Tensor(),
                             want_db ? ddb.tensor() : Tensor(), go);
      const std::string what = fmt::format("linear_backward n{} k{} m{} var{}{}", n, k, m, var,
                                           epilogue_dgelu ? " DGELU" : "");
      if (want_dx) {
        EXPECT_DEV_OUTPUT_OK(ddx);
        expect_close(what + " dx", ddx.doubles(), dbl(hdx), epilogue_dgelu ? kGeluEpilogueTol : kTol);
      }
      if (want_dw) expect_close(what + " dw", ddw.doubles(), dbl(hdw), kTol);
      if (want_db) expect_close(what + " db", ddb.doubles(), dbl(hdb), kTol);
      EXPECT_TRUE(ddw.guards_intact() && ddb.guards_intact()) << what;
      // dout is turned into d(pre) in place only with out_gelu_pre; otherwise untouched.
      expect_close(what + " dout", dg.doubles(), dbl(hg), kTol);
    }
}

// An epilogue that cuBLASLt's heuristic offers but its matmul refuses (the emulated cuBLASLt's
// test-only switch, PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES): every op falls back to DEFAULT +
// its kernel with the CPU's results, and each refusal is met once per shape, never retried.
TEST(CudaOps, EpiloguesRefusedAtRunTime) {
  PB_REQUIRE_CUDA_DEVICE();
  if (!kEmulated) GTEST_SKIP() << "the refusal is the emulated cuBLASLt's switch";
  struct Switch {
    Switch() { setenv("PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES", "1", 1); }
    ~Switch() { unsetenv("PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES"); }
  } refuse;
  Backends b;
  auto rng = make_rng(31);
  const int64_t n = 37, k = 24, m = 40;  // k, m % 8 == 0: GELU_AUX_BIAS and DGELU are asked for
  auto x = random_floats(rng, n * k), w = random_floats(rng, m * k), bias = random_floats(rng, m);
  auto g = random_floats(rng, n * m), dw0 = random_floats(rng, m * k), db0 = random_floats(rng, m);
  auto xpre = random_floats(rng, n * k, 2.f);
  std::vector<float> out(n * m), pre(n * m), dx(n * k), dw = dw0, db = db0;
  LinearBackwardOptions ho, go;
  ho.gelu = go.gelu = Gelu::tanh;
  ho.x_gelu_pre = hv(xpre, {n, k});
  b.cpu->linear_forward(hv(x, {n, k}), hv(w, {m, k}), hv(bias, {m}), Epilogue::bias_gelu_tanh,
                        hv(out, {n, m}), hv(pre, {n, m}));
  b.cpu->linear_backward(hv(x, {n, k}), hv(w, {m, k}), hv(g, {n, m}), hv(dx, {n, k}),
                         hv(dw, {m, k}), hv(db, {m}), ho);
  testing::internal::CaptureStderr();
  for (int call = 0; call < 2; ++call) {
    DevBuf<float> dxin({n, k}, x), dwin({m, k}, w), dbias({m}, bias), dg({n, m}, g);
    DevBuf<float> dxpre({n, k}, xpre), dout({n, m}), dpre({n, m}), ddx({n, k});
    DevBuf<float> ddw({m, k}, dw0), ddb({m}, db0);
    go.x_gelu_pre = dxpre.tensor();
    b.gpu->linear_forward(dxin.tensor(), dwin.tensor(), dbias.tensor(), Epilogue::bias_gelu_tanh,
                          dout.tensor(), dpre.tensor());
    b.gpu->linear_backward(dxin.tensor(), dwin.tensor(), dg.tensor(), ddx.tensor(),
                           ddw.tensor(), ddb.tensor(), go);
    const std::string what = fmt::format("refused epilogues, call {}", call);
    EXPECT_DEV_OUTPUT_OK(dout);
    EXPECT_DEV_OUTPUT_OK(ddx);
    // The kernels compute the tanh GELU of common/math.h: the fp32 tolerance, not the epilogues'.
    expect_close(what + " out", dout.doubles(), dbl(out), kTol);
    expect_close(what + " pre", dpre.doubles(), dbl(pre), kTol);
    expect_close(what + " dx", ddx.doubles(), dbl(dx), kTol);
    expect_close(what + " dw", ddw.doubles(), dbl(dw), kTol);
    expect_close(what + " db", ddb.doubles(), dbl(db), kTol);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  auto count = [&err](const std::string& needle) {
    size_t c = 0;
    for (size_t at = err.find(needle); at != std::string::npos; at = err.find(needle, at + 1)) ++c;
    return c;
  };
  // GELU_AUX_BIAS, then BIAS (forward), BGRADB and DGELU (backward): four refusals in all, each
  // met by the matmul once and remembered by the backend for the second call.
  EXPECT_EQ(count("refused at run time (m="), 4u) << err;
  EXPECT_EQ(count("cuBLASLt refused epilogue"), 4u) << err;
}

// ---- embeddings, LayerNorm --------------------------------------------------------------------
TEST(CudaOps, EmbeddingForwardBackward) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(4);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t h = trial % 2 ? 130 : 64, vocab = 50, positions = 40, types = 2;
    const std::vector<int32_t> lens = {1, 17, 40, 3, 9};
    const auto ids = random_sample_ids(rng, lens.size());
    const HostLayout l = trial < 2 ? padded(lens, ids, 40) : unpadded(lens, ids);
    const int64_t rows = l.rows;
    const Dropout d = make_dropout(trial % 2 ? 0.1f : 0.f, rng(), DropoutSite::embedding, 0);
    auto word = random_floats(rng, vocab * h), pos = random_floats(rng, positions * h);
    auto type = random_floats(rng, types * h), gamma = random_floats(rng, h), beta = random_floats(rng, h);
    auto tok = random_ints(rng, rows, 0, vocab - 1), seg = random_ints(rng, rows, 0, types - 1);
    // Host side.
    EmbeddingParams hp{hv(word, {vocab, h}), hv(pos, {positions, h}), hv(type, {types, h}),
                       hv(gamma, {h}), hv(beta, {h})};
    std::vector<float> out(rows * h), mean(rows), rstd(rows);
    b.cpu->embedding_forward(l.view(), hv(tok, {rows}), hv(seg, {rows}), hp, d, hv(out, {rows, h}),
                             hv(mean, {rows}), hv(rstd, {rows}));
    auto dy = random_floats(rng, rows * h);
    auto gw0 = random_floats(rng, vocab * h), gp0 = random_floats(rng, positions * h);
    auto gt0 = random_floats(rng, types * h), gg0 = random_floats(rng, h), gb0 = random_floats(rng, h);
    std::vector<float> hdy = dy, gw = gw0, gp = gp0, gt = gt0, gg = gg0, gb = gb0;
    EmbeddingParams hg{hv(gw, {vocab, h}), hv(gp, {positions, h}), hv(gt, {types, h}),
                       hv(gg, {h}), hv(gb, {h})};
    b.cpu->embedding_backward(l.view(), hv(tok, {rows}), hv(seg, {rows}), hp, d, hv(mean, {rows}),
                              hv(rstd, {rows}), hv(hdy, {rows, h}), hg);
    // Device side.
    DevLayout dl(l);
    DevBuf<float> dword({vocab, h}, word), dpos({positions, h}, pos), dtype({types, h}, type),
        dgamma({h}, gamma), dbeta({h}, beta), dout({rows, h}), dmean({rows}), drstd({rows}),
        ddy({rows, h}, dy), dgw({vocab, h}, gw0), dgp({positions, h}, gp0), dgt({types, h}, gt0),
        dgg({h}, gg0), dgb({h}, gb0);
    DevBuf<int32_t> dtok({rows}, tok), dseg({rows}, seg);
    EmbeddingParams dp{dword.tensor(), dpos.tensor(), dtype.tensor(), dgamma.tensor(), dbeta.tensor()};
    b.gpu->embedding_forward(dl.view(), dtok.tensor(), dseg.tensor(), dp, d, dout.tensor(),
                             dmean.tensor(), drstd.tensor());
    const std::string what = fmt::format("embedding trial {} rows {} h {} p {}", trial, rows, h, d.p);
    EXPECT_DEV_OUTPUT_OK(dout);
    EXPECT_DEV_OUTPUT_OK(dmean);
    EXPECT_DEV_OUTPUT_OK(drstd);
    expect_close(what + " out", dout.doubles(), dbl(out), kTol);
    expect_close(what + " mean", dmean.doubles(), dbl(mean), kTol);
    expect_close(what + " rstd", drstd.doubles(), dbl(rstd), kTol);
    // Backward from the CPU's saved statistics, so only the backward is compared.
    dmean.set(mean);
    drstd.set(rstd);
    EmbeddingParams dg{dgw.tensor(), dgp.tensor(), dgt.tensor(), dgg.tensor(), dgb.tensor()};
    b.gpu->embedding_backward(dl.view(), dtok.tensor(), dseg.tensor(), dp, d, dmean.tensor(),
                              drstd.tensor(), ddy.tensor(), dg);
    expect_close(what + " d(sum)", ddy.doubles(), dbl(hdy), kTol);
    expect_close(what + " dword", dgw.doubles(), dbl(gw), kTol);
    expect_close(what + " dpos", dgp.doubles(), dbl(gp), kTol);
    expect_close(what + " dtype", dgt.doubles(), dbl(gt), kTol);
    expect_close(what + " dgamma", dgg.doubles(), dbl(gg), kTol);
    expect_close(what + " dbeta", dgb.doubles(), dbl(gb), kTol);
    EXPECT_TRUE(dgw.guards_intact() && dgp.guards_intact() && dgt.guards_intact() &&
                dgg.guards_intact() && dgb.guards_intact())
        << what;
  }
}

TEST(CudaOps, ResidualLayerNorm) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(5);
  // bits: 1 bias, 2 residual, 4 dropout, 8 ln_in aliases x, 16 dresidual aliases dout,
  // 32 parameter gradients
  for (int var : {0, 1 | 2 | 4 | 32, 1 | 2 | 32, 2 | 4 | 8 | 16, 1 | 4 | 16 | 32, 8}) {
    const int64_t h = var & 8 ? 96 : 130;
    const std::vector<int32_t> lens = {1, 33, 12, 64};
    const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 64);
    const int64_t rows = l.rows;
    const bool drop = var & 4, alias_in = var & 8, alias_res = var & 16, pg = var & 32;
    const Dropout d = make_dropout(drop ? 0.15f : 0.f, rng(), DropoutSite::ffn_output);
    auto x = random_floats(rng, rows * h), bias = random_floats(rng, h), res = random_floats(rng, rows * h);
    auto gamma = random_floats(rng, h), beta = random_floats(rng, h);
    std::vector<float> hx = x, out(rows * h), ln_in(rows * h), mean(rows), rstd(rows);
    const SeqLayout hl = drop ? l.view() : SeqLayout{};
    b.cpu->residual_layernorm_forward(
        hl, hv(hx, {rows, h}), var & 1 ? hv(bias, {h}) : Tensor(), var & 2 ? hv(res, {rows, h}) : Tensor(),
        {hv(gamma, {h}), hv(beta, {h})}, d, hv(out, {rows, h}),
        alias_in ? hv(hx, {rows, h}) : hv(ln_in, {rows, h}), hv(mean, {rows}), hv(rstd, {rows}));
    if (alias_in) ln_in = hx;
    DevLayout dl(l);
    const SeqLayout gl = drop ? dl.view() : SeqLayout{};
    DevBuf<float> dx({rows, h}, x), dbias({h}, bias), dres({rows, h}, res), dgamma({h}, gamma),
        dbeta({h}, beta), dout({rows, h}), dln({rows, h}), dmean({rows}), drstd({rows});
    b.gpu->residual_layernorm_forward(
        gl, dx.tensor(), var & 1 ? dbias.tensor() : Tensor(), var & 2 ? dres.tensor() : Tensor(),
        {dgamma.tensor(), dbeta.tensor()}, d, dout.tensor(), alias_in ? dx.tensor() : dln.tensor(),
        dmean.tensor(), drstd.tensor());
    const std::string what = fmt::format("residual_layernorm var {}", var);
    EXPECT_DEV_OUTPUT_OK(dout);
    EXPECT_DEV_OUTPUT_OK(dmean);
    expect_close(what + " out", dout.doubles(), dbl(out), kTol);
    expect_close(what + " ln_in", (alias_in ? dx : dln).doubles(), dbl(ln_in), kTol);
    expect_close(what + " rstd", drstd.doubles(), dbl(rstd), kTol);

    // Backward from the CPU's saved tensors.
    auto dy = random_floats(rng, rows * h), gg0 = random_floats(rng, h), gb0 = random_floats(rng, h),
         gbias0 = random_floats(rng, h);
    std::vector<float> hdy = dy, hdx(rows * h), hdres(rows * h), gg = gg0, gb = gb0, gbias = gbias0;
    b.cpu->residual_layernorm_backward(
        hl, hv(hdy, {rows, h}), hv(ln_in, {rows, h}), hv(mean, {rows}), hv(rstd, {rows}),
        {hv(gamma, {h}), Tensor()}, d, hv(hdx, {rows, h}),
        alias_res ? hv(hdy, {rows, h}) : hv(hdres, {rows, h}), pg ? hv(gbias, {h}) : Tensor(),
        {pg ? hv(gg, {h}) : Tensor(), pg ? hv(gb, {h}) : Tensor()});
    DevBuf<float> ddy({rows, h}, dy), dlnin({rows, h}, ln_in), dmean2({rows}, mean), drstd2({rows}, rstd),
        ddx({rows, h}), ddres({rows, h}), dgg({h}, gg0), dgb({h}, gb0), dgbias({h}, gbias0);
    b.gpu->residual_layernorm_backward(
        gl, ddy.tensor(), dlnin.tensor(), dmean2.tensor(), drstd2.tensor(), {dgamma.tensor(), Tensor()},
        d, ddx.tensor(), alias_res ? ddy.tensor() : ddres.tensor(), pg ? dgbias.tensor() : Tensor(),
        {pg ? dgg.tensor() : Tensor(), pg ? dgb.tensor() : Tensor()});
    EXPECT_DEV_OUTPUT_OK(ddx);
    expect_close(what + " dx", ddx.doubles(), dbl(hdx), kTol);
    expect_close(what + " dresidual", (alias_res ? ddy : ddres).doubles(),
                 dbl(alias_res ? hdy : hdres), kTol);
    if (pg) {
      expect_close(what + " dgamma", dgg.doubles(), dbl(gg), kTol);
      expect_close(what + " dbeta", dgb.doubles(), dbl(gb), kTol);
      expect_close(what + " dbias", dgbias.doubles(), dbl(gbias), kTol);
    }
  }
}

// ---- attention --------------------------------------------------------------------------------
void attention_case(Backends& b, std::mt19937_64& rng, const HostLayout& l, int64_t hidden,
                    int heads, float p, const std::string& name) {
  const int64_t rows = l.rows;
  const Dropout d = make_dropout(p, rng(), DropoutSite::attention_probs, 7);
  auto qkv = random_floats(rng, rows * 3 * hidden), dy = random_floats(rng, rows * hidden);
  std::vector<float> out(rows * hidden), lse(rows * heads), dqkv(rows * 3 * hidden);
  b.cpu->attention_forward(l.view(), hv(qkv, {rows, 3 * hidden}), heads, d,
                           hv(out, {rows, hidden}), hv(lse, {rows, heads}));
  b.cpu->attention_backward(l.view(), hv(qkv, {rows, 3 * hidden}), hv(out, {rows, hidden}),
                            hv(lse, {rows, heads}), hv(dy, {rows, hidden}), heads, d,
                            hv(dqkv, {rows, 3 * hidden}));
  DevLayout dl(l);
  DevBuf<float> dq({rows, 3 * hidden}, qkv), ddy({rows, hidden}, dy), dout({rows, hidden}),
      dlse({rows, heads}), ddqkv({rows, 3 * hidden});
  b.gpu->attention_forward(dl.view(), dq.tensor(), heads, d, dout.tensor(), dlse.tensor());
  const std::string what = fmt::format("attention {} H{} heads{} p{}", name, hidden, heads, p);
  EXPECT_DEV_OUTPUT_OK(dout);
  EXPECT_DEV_OUTPUT_OK(dlse);
  expect_close(what + " out", dout.doubles(), dbl(out), kTol);
  expect_close(what + " lse", dlse.doubles(), dbl(lse), kTol);
  // Backward from the CPU's forward outputs (lse layouts agree: [rows, heads] on both).
  DevBuf<float> hout({rows, hidden}, out), hlse({rows, heads}, lse);
  b.gpu->attention_backward(dl.view(), dq.tensor(), hout.tensor(), hlse.tensor(), ddy.tensor(),
                            heads, d, ddqkv.tensor());
  EXPECT_DEV_OUTPUT_OK(ddqkv);
  expect_close(what + " dqkv", ddqkv.doubles(), dbl(dqkv), kAttnBwdTol);
}

TEST(CudaOps, Attention) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(6);
  const std::vector<int32_t> lens = {1, 2, 17, 64, 33, 127, 5};
  for (float p : {0.f, 0.1f}) {
    const auto ids = random_sample_ids(rng, lens.size());
    attention_case(b, rng, unpadded(lens, ids), 128, 2, p, "unpadded");  // head dim 64
    attention_case(b, rng, padded(lens, ids, 128), 96, 3, p, "padded");  // head dim 32
    attention_case(b, rng, packed(lens, ids, 128), 40, 2, p, "packed");  // head dim 20
    attention_case(b, rng, unpadded({1}, {ids[0]}), 64, 4, p, "one token");
  }
  const std::vector<int32_t> long_lens = kEmulated ? std::vector<int32_t>{300, 1}
                                                   : std::vector<int32_t>{512, 300, 1};
  const auto ids = random_sample_ids(rng, long_lens.size());
  attention_case(b, rng, unpadded(long_lens, ids), 128, 2, 0.1f, "long");
}

// ---- heads ------------------------------------------------------------------------------------
TEST(CudaOps, GatherRows) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(7);
  const int64_t rows = 57, h = 70, m = 23;
  auto x = random_floats(rng, rows * h), dy = random_floats(rng, m * h);
  auto idx = random_ints(rng, m, 0, rows - 1);
  idx[3] = idx[7];  // a repeated index: its two gradients add up
  std::vector<float> out(m * h), dx(rows * h);
  b.cpu->gather_rows(hv(x, {rows, h}), hv(idx, {m}), hv(out, {m, h}));
  b.cpu->gather_rows_backward(hv(dy, {m, h}), hv(idx, {m}), hv(dx, {rows, h}));
  DevBuf<float> dxin({rows, h}, x), dout({m, h}), ddy({m, h}, dy), ddx({rows, h});
  DevBuf<int32_t> didx({m}, idx);
  b.gpu->gather_rows(dxin.tensor(), didx.tensor(), dout.tensor());
  b.gpu->gather_rows_backward(ddy.tensor(), didx.tensor(), ddx.tensor());
  EXPECT_DEV_OUTPUT_OK(dout);
  EXPECT_DEV_OUTPUT_OK(ddx);
  EXPECT_EQ(dout.values(), out);
  // The first contributor of each row lands on zero and the repeated ones add in order of i,
  // as on the CPU: the same bits.
  EXPECT_EQ(ddx.values(), dx);
  idx[0] = static_cast<int32_t>(rows);
  didx.set(idx);
  EXPECT_THROW(b.gpu->gather_rows(dxin.tensor(), didx.tensor(), dout.tensor()), Error);
}

// The backward's two regimes at a masked-token scale: distinct rows (all in parallel; the
// ordered pass does nothing) and rows hit several times (the ordered pass adds the later
// contributors in order of i): bit for bit the CPU's sums in order.
TEST(CudaOps, GatherRowsBackwardOrderAtScale) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(17);
  const int64_t rows = 6000, h = 96, m = 4000;
  for (const bool repeats : {false, true}) {
    std::vector<int32_t> idx(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) idx[static_cast<size_t>(r)] = static_cast<int32_t>(r);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(static_cast<size_t>(m));
    if (repeats)
      for (int64_t i = 0; i < m; i += 7) idx[static_cast<size_t>(i)] = idx[static_cast<size_t>(i % 1000 / 4)];
    auto dy = random_floats(rng, m * h);
    std::vector<float> dx(rows * h);
    b.cpu->gather_rows_backward(hv(dy, {m, h}), hv(idx, {m}), hv(dx, {rows, h}));
    DevBuf<float> ddy({m, h}, dy), ddx({rows, h});
    DevBuf<int32_t> didx({m}, idx);
    b.gpu->gather_rows_backward(ddy.tensor(), didx.tensor(), ddx.tensor());
    EXPECT_DEV_OUTPUT_OK(ddx);
    EXPECT_EQ(ddx.values(), dx) << (repeats ? "repeated rows" : "distinct rows");
  }
}

// The embedding tables' scatter (cuda::embedding_scatter) at a batch's scale, against the host
// loop in row order (the CPU backend's): a table element hit by at most 256 rows adds them in
// row order on the GPU too -- the same bits; the [MASK]-like word hit by ~1,200 rows and the two
// token types (~1,500 each) add 256-row pieces in order -- within fp32 rounding of another
// grouping. Padding rows add nothing; tables not given are skipped.
TEST(CudaOps, EmbeddingScatterOrderAtScale) {
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = make_rng(21);
  const int64_t h = 70, vocab = 1000, positions = 512, types = 2, hot = 7;
  std::vector<int32_t> lens(12);
  for (auto& n : lens) n = static_cast<int32_t>(1 + rng() % 512);
  const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 512);
  const int64_t rows = l.rows;
  auto tok = random_ints(rng, rows, 0, vocab - 1), seg = random_ints(rng, rows, 0, types - 1);
  for (auto& t : tok)
    if (rng() % 5 < 2) t = hot;
  const auto d = random_floats(rng, rows * h);
  const auto w0 = random_floats(rng, vocab * h), p0 = random_floats(rng, positions * h),
             t0 = random_floats(rng, types * h);
  std::vector<float> w = w0, p = p0, t = t0;
  std::vector<int64_t> hits(static_cast<size_t>(vocab), 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (l.token_seq[r] < 0) continue;
    ++hits[static_cast<size_t>(tok[r])];
    for (int64_t c = 0; c < h; ++c) {
      w[tok[r] * h + c] += d[r * h + c];
      p[l.token_pos[r] * h + c] += d[r * h + c];
      t[seg[r] * h + c] += d[r * h + c];
    }
  }
  DevLayout dl(l);
  const SeqLayout sl = dl.view();
  cuda::DeviceLayout layout;
  layout.seq_start = sl.seq_start.ptr<int32_t>();
  layout.seq_len = sl.seq_len.ptr<int32_t>();
  layout.sample_id = sl.sample_id.ptr<int64_t>();
  layout.token_seq = sl.token_seq.ptr<int32_t>();
  layout.token_pos = sl.token_pos.ptr<int32_t>();
  layout.rows = rows;
  layout.num_seqs = sl.num_seqs;
  layout.max_len = sl.max_len;
  DevBuf<int32_t> dtok({rows}, tok), dseg({rows}, seg);
  DevBuf<float> dd({rows, h}, d), dw({vocab, h}, w0), dp({positions, h}, p0), dt({types, h}, t0);
  const size_t bytes = cuda::embedding_scatter_scratch_bytes(rows, h, vocab + positions + types);
  ASSERT_GT(bytes, 0u);
  void* scratch = cuda_alloc(bytes);
  cuda_ok(cuda::embedding_scatter(layout, dtok.tensor().ptr<int32_t>(),
                                  dseg.tensor().ptr<int32_t>(), h, dd.tensor().ptr<float>(),
                                  dw.tensor().ptr<float>(), vocab, dp.tensor().ptr<float>(),
                                  positions, dt.tensor().ptr<float>(), types, scratch, bytes,
                                  nullptr),
          "embedding_scatter");
  cuda_ok(cudaDeviceSynchronize(), "embedding_scatter");
  std::printf("[ops-error] embedding_scatter: %lld rows, word %lld hit %lld times\n",
              static_cast<long long>(rows), static_cast<long long>(hot),
              static_cast<long long>(hits[static_cast<size_t>(hot)]));
  ASSERT_GT(hits[static_cast<size_t>(hot)], 256) << "the test needs a word cut into pieces";
  const std::vector<float> gw = dw.values(), gp = dp.values(), gt = dt.values();
  EXPECT_EQ(gp, p) << "positions: each hit <= 12 times, added in row order";
  int64_t differ = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    if (hits[static_cast<size_t>(v)] > 256) continue;
    for (int64_t c = 0; c < h; ++c) differ += gw[v * h + c] != w[v * h + c];
  }
  EXPECT_EQ(differ, 0) << "words hit <= 256 times: row order, the same bits";
  auto rows_of = [h](const std::vector<float>& a, int64_t r) {
    return std::vector<double>(a.begin() + r * h, a.begin() + (r + 1) * h);
  };
  // Pieces and the CPU's one running sum are two fp32 summation orders of ~1500 (a token
  // type) or ~1200 (the hot word) terms: each is off the exact sum by about sqrt(n) 2^-24
  // ~ 2e-6 relative (1.06e-6 measured between them on an H200 for the types).
  expect_close("embedding_scatter hot word (pieces)", rows_of(gw, hot), rows_of(w, hot), 1e-5);
  expect_close("embedding_scatter token types (pieces)", dbl(gt), dbl(t), 1e-5);
  // Only the word table given: the others stay as they were.
  dw.set(w0);
  dp.set(p0);
  cuda_ok(cuda::embedding_scatter(layout, dtok.tensor().ptr<int32_t>(),
                                  dseg.tensor().ptr<int32_t>(), h, dd.tensor().ptr<float>(),
                                  dw.tensor().ptr<float>(), vocab, nullptr, positions, nullptr,
                                  types, scratch, bytes, nullptr),
          "embedding_scatter");
  cuda_ok(cudaDeviceSynchronize(), "embedding_scatter");
  EXPECT_EQ(dp.values(), p0);
  expect_close("embedding_scatter word table alone", dw.doubles(), dbl(w), 1e-5);
  EXPECT_TRUE(dw.guards_intact() && dp.guards_intact() && dt.guards_intact());
  cuda_free(scratch);
}

TEST(CudaOps, SoftmaxCrossEntropy) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(8);
  const int64_t shapes[][2] = {{37, 1000}, {1, 1}, {5, 30528}, {64, 2}};
  for (const auto& s : shapes)
    for (int mode = 0; mode < 3; ++mode) {  // 0 no dlogits, 1 separate, 2 in place
      const int64_t m = s[0], v = s[1];
      auto z = random_floats(rng, m * v, 4.f);
      if (v > 3) z[2] = z[1] = 9.f;  // a tie in row 0: the first maximum wins
      auto labels = random_ints(rng, m, 0, static_cast<int32_t>(v - 1));
      labels[0] = v > 1 ? 1 : 0;
      std::vector<float> hz = z, hd(m * v), loss = {0.75f};
      std::vector<int32_t> correct = {3};
      b.cpu->softmax_cross_entropy(hv(hz, {m, v}), hv(labels, {m}), 0.125f, hv(loss, {1}),
                                   hv(correct, {1}),
                                   mode == 0 ? Tensor() : mode == 1 ? hv(hd, {m, v}) : hv(hz, {m, v}));
      DevBuf<float> dz({m, v}, z), dd({m, v}), dloss({1}, {0.75f});
      DevBuf<int32_t> dlab({m}, labels), dcorrect({1}, {3});
      b.gpu->softmax_cross_entropy(dz.tensor(), dlab.tensor(), 0.125f, dloss.tensor(),
                                   dcorrect.tensor(),
                                   mode == 0 ? Tensor() : mode == 1 ? dd.tensor() : dz.tensor());
      const std::string what = fmt::format("softmax_cross_entropy m{} v{} mode{}", m, v, mode);
      expect_close(what + " loss", dloss.doubles(), dbl(loss), 1e-6);
      EXPECT_EQ(dcorrect.values(), correct) << what;
      if (mode == 1) {
        EXPECT_DEV_OUTPUT_OK(dd);
        expect_close(what + " dlogits", dd.doubles(), dbl(hd), kTol);
      }
      if (mode == 2) expect_close(what + " dlogits", dz.doubles(), dbl(hz), kTol);
      if (mode != 2) {
        EXPECT_EQ(dz.values(), z) << what << ": logits changed";
      }
    }
}

TEST(CudaOps, MlmLoss) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(9);
  for (bool grads : {false, true}) {
    const int64_t m = 29, h = 48, v = 301;
    auto x = random_floats(rng, m * h), w = random_floats(rng, v * h, 0.2f), bias = random_floats(rng, v);
    auto labels = random_ints(rng, m, 0, static_cast<int32_t>(v - 1));
    auto dw0 = random_floats(rng, v * h), db0 = random_floats(rng, v);
    std::vector<float> ws(m * v), loss = {0.5f}, dx(m * h), dw = dw0, db = db0;
    std::vector<int32_t> correct = {0};
    b.cpu->mlm_loss(hv(x, {m, h}), hv(w, {v, h}), hv(bias, {v}), hv(labels, {m}), 1.f / 77,
                    hv(ws, {m, v}), hv(loss, {1}), hv(correct, {1}), grads ? hv(dx, {m, h}) : Tensor(),
                    grads ? hv(dw, {v, h}) : Tensor(), grads ? hv(db, {v}) : Tensor());
    DevBuf<float> dxin({m, h}, x), dwin({v, h}, w), dbin({v}, bias), dws({m, v}), dloss({1}, {0.5f}),
        ddx({m, h}), ddw({v, h}, dw0), ddb({v}, db0);
    DevBuf<int32_t> dlab({m}, labels), dcorrect({1}, {0});
    b.gpu->mlm_loss(dxin.tensor(), dwin.tensor(), dbin.tensor(), dlab.tensor(), 1.f / 77, dws.tensor(),
                    dloss.tensor(), dcorrect.tensor(), grads ? ddx.tensor() : Tensor(),
                    grads ? ddw.tensor() : Tensor(), grads ? ddb.tensor() : Tensor());
    const std::string what = fmt::format("mlm_loss grads {}", grads);
    expect_close(what + " loss", dloss.doubles(), dbl(loss), 1e-6);
    EXPECT_EQ(dcorrect.values(), correct);
    EXPECT_DEV_OUTPUT_OK(dws);
    expect_close(what + " logits_ws", dws.doubles(), dbl(ws), kTol);
    if (grads) {
      EXPECT_DEV_OUTPUT_OK(ddx);
      expect_close(what + " dx", ddx.doubles(), dbl(dx), kTol);
      expect_close(what + " dw", ddw.doubles(), dbl(dw), kTol);
      expect_close(what + " db", ddb.doubles(), dbl(db), kTol);
    }
  }
}

TEST(CudaOps, NspLoss) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(10);
  for (bool grads : {false, true}) {
    const int64_t h = 40;
    const std::vector<int32_t> lens = {3, 1, 20, 7};
    const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 24);
    const int64_t rows = l.rows, s = static_cast<int64_t>(lens.size());
    auto x = random_floats(rng, rows * h), wp = random_floats(rng, h * h, 0.3f), bp = random_floats(rng, h);
    auto wc = random_floats(rng, 2 * h), bc = random_floats(rng, 2);
    auto labels = random_ints(rng, s, 0, 1);
    auto dx0 = random_floats(rng, rows * h), gwp0 = random_floats(rng, h * h), gbp0 = random_floats(rng, h);
    auto gwc0 = random_floats(rng, 2 * h), gbc0 = random_floats(rng, 2);
    std::vector<float> ws(nsp_workspace_elems(s, h)), loss = {0.25f}, dx = dx0, gwp = gwp0, gbp = gbp0,
                                                      gwc = gwc0, gbc = gbc0;
    std::vector<int32_t> correct = {1};
    PoolerParams hp{hv(wp, {h, h}), hv(bp, {h}), hv(wc, {2, h}), hv(bc, {2})};
    PoolerParams hg = grads ? PoolerParams{hv(gwp, {h, h}), hv(gbp, {h}), hv(gwc, {2, h}), hv(gbc, {2})}
                            : PoolerParams{};
    b.cpu->nsp_loss(l.view(), hv(x, {rows, h}), hp, hv(labels, {s}), 1.f / 9,
                    hv(ws, {nsp_workspace_elems(s, h)}), hv(loss, {1}), hv(correct, {1}),
                    grads ? hv(dx, {rows, h}) : Tensor(), hg);
    DevLayout dl(l);
    DevBuf<float> dxin({rows, h}, x), dwp({h, h}, wp), dbp({h}, bp), dwc({2, h}, wc), dbc({2}, bc),
        dws({nsp_workspace_elems(s, h)}), dloss({1}, {0.25f}), ddx({rows, h}, dx0), dgwp({h, h}, gwp0),
        dgbp({h}, gbp0), dgwc({2, h}, gwc0), dgbc({2}, gbc0);
    DevBuf<int32_t> dlab({s}, labels), dcorrect({1}, {1});
    PoolerParams dp{dwp.tensor(), dbp.tensor(), dwc.tensor(), dbc.tensor()};
    PoolerParams dg = grads ? PoolerParams{dgwp.tensor(), dgbp.tensor(), dgwc.tensor(), dgbc.tensor()}
                            : PoolerParams{};
    b.gpu->nsp_loss(dl.view(), dxin.tensor(), dp, dlab.tensor(), 1.f / 9, dws.tensor(), dloss.tensor(),
                    dcorrect.tensor(), grads ? ddx.tensor() : Tensor(), dg);
    // Measured as test_cuda_lowp_ops.cpp's NspLossLowpMatchesCpuEmulation says why: the loss
    // against its rounding bound (a rel 1e-6 reached 4.2e-7 in 200 seeds, margin 2.4), the
    // logits' gradient in units of scale, cls_b against its size plus what was added.
    const std::string what = fmt::format("nsp_loss grads {}", grads);
    const float scale = 1.f / 9;
    const double bound = nsp_loss_bound(l, x, wp, bp, wc, bc, labels, 0.25, scale, h);
    expect_bound(what + " loss / its rounding bound",
                 std::abs(static_cast<double>(dloss.values()[0]) - loss[0]) / bound, 1.0);
    EXPECT_EQ(dcorrect.values(), correct);
    EXPECT_TRUE(dws.guards_intact());
    const auto gws = dws.values();
    // The logits (or, with gradients, their gradient) at offset 4 s h, as on the CPU.
    const std::vector<double> glog(gws.begin() + 4 * s * h, gws.end()),
        hlog(ws.begin() + 4 * s * h, ws.end());
    if (!grads) {
      expect_close(what + " logits at 4sh", glog, hlog, kTol);
      continue;
    }
    double d2 = 0;
    for (size_t i = 0; i < glog.size(); ++i) d2 += (glog[i] - hlog[i]) * (glog[i] - hlog[i]);
    expect_measure(what + " dlogits at 4sh / (scale sqrt(2 s))",
                   std::sqrt(d2) / (scale * std::sqrt(2.0 * static_cast<double>(s))), kTol);
    expect_close(what + " dx", ddx.doubles(), dbl(dx), kTol);
    expect_close(what + " dense_w", dgwp.doubles(), dbl(gwp), kTol);
    expect_close(what + " dense_b", dgbp.doubles(), dbl(gbp), kTol);
    expect_close(what + " cls_w", dgwc.doubles(), dbl(gwc), kTol);
    const std::vector<double> got_b = dgbc.doubles();
    double db2 = 0, b2 = 0;
    for (size_t i = 0; i < 2; ++i) {
      db2 += (got_b[i] - gbc[i]) * (got_b[i] - gbc[i]);
      b2 += static_cast<double>(gbc[i]) * gbc[i];
    }
    expect_measure(what + " cls_b / (|cls_b| + 2 scale s)",
                   std::sqrt(db2) / (std::sqrt(b2) + 2 * scale * static_cast<double>(s)), kTol);
  }
}

// ---- optimizer --------------------------------------------------------------------------------
TEST(CudaOps, L2Norm) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(11);
  for (int64_t n : {int64_t{1}, int64_t{8192}, int64_t{100003}, int64_t{3000001}}) {
    auto x = random_floats(rng, n);
    std::vector<float> out(1);
    b.cpu->l2_norm(hv(x, {n}), hv(out, {1}));
    DevBuf<float> dx({n}, x), dout({1});
    b.gpu->l2_norm(dx.tensor(), dout.tensor());
    b.gpu->l2_norm(dx.tensor(), dout.tensor());  // twice: the same bits (deterministic)
    const float first = dout.values()[0];
    b.gpu->l2_norm(dx.tensor(), dout.tensor());
    EXPECT_EQ(dout.values()[0], first);
    expect_close(fmt::format("l2_norm n{}", n), dout.doubles(), dbl(out), 1e-6);
  }
}

TEST(CudaOps, SumSquares) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(13);
  for (int64_t n : {int64_t{1}, int64_t{8192}, int64_t{100003}, int64_t{3000001}}) {
    auto x = random_floats(rng, n);
    double want = 0;
    b.cpu->sum_squares(hv(x, {n}), view(&want, {1}));
    DevBuf<float> dx({n}, x);
    DevBuf<double> dout({1});
    b.gpu->sum_squares(dx.tensor(), dout.tensor());
    const double got = dout.values()[0];
    expect_measure("sum_squares n=" + std::to_string(n) + " vs cpu (rel)",
                   std::abs(got - want) / want, 1e-12);
    DevBuf<float> dnorm({1});
    b.gpu->l2_norm(dx.tensor(), dnorm.tensor());  // the root of the same sum
    EXPECT_EQ(dnorm.values()[0], static_cast<float>(std::sqrt(got))) << n;
    DevBuf<float> dfrom({1});
    b.gpu->norm_from_sum_squares(dout.tensor(), dfrom.tensor());  // and from that sum
    EXPECT_EQ(dfrom.values()[0], dnorm.values()[0]) << n;
  }
}

TEST(CudaOps, LambStep) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(12);
  // Tensors with gaps between them (left alone), sizes across the chunk boundary, both flags.
  const std::vector<LambTensor> first = {{0, 1000, 1}, {1000, 64, 0}, {1100, 20000, 1},
                                         {21100, 1, 0},  {21105, 8192, 1}, {29297, 0, 1}};
  // The same rows with the flags flipped: the backend keeps the work list it derived from a
  // table and must notice a new one (the host table is compared, never read back).
  std::vector<LambTensor> flipped = first;
  for (LambTensor& r : flipped) r.decay = 1 - r.decay;
  const int64_t n = 29400, t = static_cast<int64_t>(first.size());
  for (const auto& [gnorm, rows] : {std::pair{0.5f, first}, std::pair{7.f, first},
                                    std::pair{2.f, flipped}, std::pair{3.f, first}}) {
    auto w = random_floats(rng, n), g = random_floats(rng, n), m = random_floats(rng, n, 0.1f);
    auto v = random_floats(rng, n, 0.1f);
    for (auto& x : v) x = std::abs(x);
    LambConfig cfg;
    cfg.lr = 1e-3f;
    cfg.step = 7;
    std::vector<float> hw = w, hg = g, hm = m, hvv = v, norms(2 * t), gn = {gnorm};
    b.cpu->lamb_step(lamb_table(rows.data(), t), cfg, hv(gn, {1}), hv(hw, {n}), hv(hg, {n}),
                     hv(hm, {n}), hv(hvv, {n}), hv(norms, {2 * t}));
    DevBuf<float> dw({n}, w), dg({n}, g), dm({n}, m), dv({n}, v), dnorms({2 * t}), dgn({1}, {gnorm});
    b.gpu->lamb_step(lamb_table(rows.data(), t), cfg, dgn.tensor(), dw.tensor(), dg.tensor(),
                     dm.tensor(), dv.tensor(), dnorms.tensor());
    const std::string what = fmt::format("lamb_step global norm {}{}", gnorm,
                                         rows[0].decay == first[0].decay ? "" : ", flipped");
    EXPECT_DEV_OUTPUT_OK(dnorms);
    expect_close(what + " params", dw.doubles(), dbl(hw), kTol);
    expect_close(what + " update", dg.doubles(), dbl(hg), kTol);
    expect_close(what + " m", dm.doubles(), dbl(hm), kTol);
    expect_close(what + " v", dv.doubles(), dbl(hvv), kTol);
    expect_close(what + " norms", dnorms.doubles(), dbl(norms), 1e-6);
  }
  // A non-finite norm skips the step inside the op on both backends (no read-back), and both
  // keep the same record; a finite step after it updates and ends the run.
  auto w = random_floats(rng, n), g = random_floats(rng, n), m = random_floats(rng, n, 0.1f);
  auto v = random_floats(rng, n, 0.1f);
  for (auto& x : v) x = std::abs(x);
  DevBuf<float> dw({n}, w), dm({n}, m), dv({n}, v), dnorms({2 * t});
  DevBuf<int32_t> drecord({3}, {0, 0, 0});
  std::vector<int32_t> record = {0, 0, 0};
  std::vector<float> hw = w, hm = m, hvv = v, norms(2 * t);
  LambConfig cfg;
  cfg.lr = 1e-3f;
  cfg.step = 3;
  for (float gnorm : {std::numeric_limits<float>::quiet_NaN(), 1.5f}) {
    std::vector<float> hg = g, gn = {gnorm};
    b.cpu->lamb_step(lamb_table(first.data(), t), cfg, hv(gn, {1}), hv(hw, {n}), hv(hg, {n}),
                     hv(hm, {n}), hv(hvv, {n}), hv(norms, {2 * t}), Tensor(),
                     hv(record, {3}));
    DevBuf<float> dg({n}, g), dgn({1}, {gnorm});
    b.gpu->lamb_step(lamb_table(first.data(), t), cfg, dgn.tensor(), dw.tensor(), dg.tensor(),
                     dm.tensor(), dv.tensor(), dnorms.tensor(), Tensor(), drecord.tensor());
    EXPECT_EQ(drecord.values(), record) << "global norm " << gnorm;
    if (std::isnan(gnorm)) {
      EXPECT_EQ(dw.values(), w);
      EXPECT_EQ(dm.values(), m);
      EXPECT_EQ(dv.values(), v);
      EXPECT_EQ(record, (std::vector<int32_t>{1, 1, 1}));
    } else {
      expect_close("lamb_step after a skipped step: params", dw.doubles(), dbl(hw), kTol);
      EXPECT_EQ(record, (std::vector<int32_t>{1, 0, 1}));
    }
  }
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaOps, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
