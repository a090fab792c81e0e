// gpu label: the CUDA backend's ops with bf16 / f16 tensors, one by one, against the CPU
// backend's emulation (widen, fp32 op, round) on the same 16-bit inputs:
// - linear_forward / linear_backward on cuBLASLt with bf16 / f16 operands (both GELU forms);
// - the MLM decoder (mlm_loss) on the low-precision word embeddings;
// - gather_rows and its backward;
// - the native kernels of embedding_forward / backward and residual_layernorm_forward /
//   backward, element by element (tolerance derived below), and that they take no fp32 staging
//   (the adapter's).
#include <gtest/gtest.h>

#include <iostream>

#include "kernels/common/philox.h"
#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cuda/cuda_backend_impl.h"
#include "lowp_test_util.h"

namespace packbert::test {
namespace {

// The native cuBLASLt path of linear_forward / linear_backward against the CPU's emulation. The
// two differ by one 16-bit rounding per element, not by summation order alone: CUDA applies
// GELU and its derivative to the stored 16-bit pre-activation where the CPU uses the fp32 one,
// and rounds d(pre) to 16 bits before the weight-gradient GEMMs read it. One rounding is at
// most 2^-9 (bf16) or 2^-12 (f16) of a value; GELU multiplies it by x gelu'(x) / gelu(x), ~9
// near x = -3, and db's sum over rows cancels to below its terms. Measured over 1000 seeds
// (tests/seed_sweeps.txt): bf16 4.2e-3 (db of n64 k24 m19), f16 6.8e-4. Bars 1.5e-2 and 2.5e-3
// (margins 3.6 and 3.7); a wrong epilogue, transposition or bias is of order 1e-1 and above.
TEST(CudaLowpOps, LinearOpsMatchCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_synced_cuda_backend();
  std::mt19937_64 rng(test_seed());
  DType dtype = DType::bf16;
  auto check = [&](const std::vector<float>& g, const std::vector<float>& c,
                   const std::string& what) {
    expect_rel_l2(g, c, dtype == DType::bf16 ? 1.5e-2 : 2.5e-3, what);
  };
  struct Shape { int64_t n, k, m; };
  for (DType t : {DType::bf16, DType::f16}) {
    dtype = t;
    for (const Shape sh : {Shape{37, 64, 48}, Shape{64, 24, 19}, Shape{5, 128, 512}}) {
      const int64_t n = sh.n, k = sh.k, m = sh.m;
      const std::string tag = std::string(dtype_name(t)) + " n" + std::to_string(n) + " k" +
                              std::to_string(k) + " m" + std::to_string(m);
      Lowp16 x(t, randn(rng, n * k), {n, k}), w(t, randn(rng, m * k, 0.2f), {m, k});
      std::vector<float> bias = randn(rng, m);
      DevBuf<float> dbias({m}, bias);
      for (Epilogue ep :
           {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu, Epilogue::bias_gelu_tanh}) {
        Lowp16 out(t, std::vector<float>(n * m), {n, m}), pre(t, std::vector<float>(n * m), {n, m});
        const bool gelu = has_gelu(ep);
        const Tensor b = ep == Epilogue::none ? Tensor() : view(bias.data(), {m});
        const Tensor bd = ep == Epilogue::none ? Tensor() : dbias.tensor();
        cpu->linear_forward(x.cpu(), w.cpu(), b, ep, out.cpu(), gelu ? pre.cpu() : Tensor());
        gpu->linear_forward(x.gpu(), w.gpu(), bd, ep, out.gpu(), gelu ? pre.gpu() : Tensor());
        cuda_synchronize(*gpu);
        check(out.gpu_values(), out.cpu_values(),
              tag + " forward epilogue " + std::to_string(static_cast<int>(ep)) +
                  (ep == Epilogue::bias_gelu_tanh && m % 8 == 0 ? " (GELU_AUX_BIAS)" : ""));
        if (!gelu) continue;
        check(pre.gpu_values(), pre.cpu_values(), tag + " forward pre");
        // Backward through the GELU of this forward, dx accumulated, dw and db in fp32.
        Lowp16 dout(t, randn(rng, n * m, 1e-2f), {n, m}), dx(t, randn(rng, n * k), {n, k});
        const std::vector<float> dw0 = randn(rng, m * k, 1e-3f), db0 = randn(rng, m, 1e-3f);
        std::vector<float> dw = dw0, db = db0;
        DevBuf<float> ddw({m, k}, dw0), ddb({m}, db0);
        LinearBackwardOptions oc, og;
        oc.gelu = og.gelu = gelu_of(ep);
        oc.out_gelu_pre = pre.cpu();
        oc.dx_accumulate = true;
        og.out_gelu_pre = pre.gpu();
        og.dx_accumulate = true;
        cpu->linear_backward(x.cpu(), w.cpu(), dout.cpu(), dx.cpu(), view(dw.data(), {m, k}),
                             view(db.data(), {m}), oc);
        gpu->linear_backward(x.gpu(), w.gpu(), dout.gpu(), dx.gpu(), ddw.tensor(), ddb.tensor(), og);
        cuda_synchronize(*gpu);
        check(dout.gpu_values(), dout.cpu_values(), tag + " backward d(pre)");
        check(dx.gpu_values(), dx.cpu_values(), tag + " backward dx +=");
        std::vector<float> dwd = ddw.values(), dbd = ddb.values();
        for (size_t i = 0; i < dw.size(); ++i) dwd[i] -= dw0[i], dw[i] -= dw0[i];
        for (size_t i = 0; i < db.size(); ++i) dbd[i] -= db0[i], db[i] -= db0[i];
        check(dwd, dw, tag + " backward dw");
        check(dbd, db, tag + " backward db");
        // dx through the GELU of the input (x_gelu_pre = the forward's pre as [n, k] when
        // shapes allow: reuse x as the pre-activation of itself).
        Lowp16 dx2(t, std::vector<float>(n * k), {n, k});
        LinearBackwardOptions xc, xg;
        xc.gelu = xg.gelu = gelu_of(ep);  // tanh: the DGELU epilogue where k % 8 == 0
        xc.x_gelu_pre = x.cpu();
        xg.x_gelu_pre = x.gpu();
        Lowp16 dout2(t, randn(rng, n * m, 1e-2f), {n, m});
        cpu->linear_backward(Tensor(), w.cpu(), dout2.cpu(), dx2.cpu(), Tensor(), Tensor(), xc);
        gpu->linear_backward(Tensor(), w.gpu(), dout2.gpu(), dx2.gpu(), Tensor(), Tensor(), xg);
        cuda_synchronize(*gpu);
        check(dx2.gpu_values(), dx2.cpu_values(), tag + " backward dx through x_gelu_pre");
      }
    }
  }
}

// The blocks of the MLM decoder's backward (vocabulary columns, cuda_heads.cpp): their rounded
// gradient [m, block] fits the 64 MiB of scratch unless a block is at its minimum of 8 columns,
// blocks are multiples of 8 columns (but a whole vocabulary that fits), and the shape of the
// test below takes three.
TEST(CudaLowpOps, MlmBackwardBlocksFitTheirScratch) {
  const int64_t budget = int64_t{64} << 20;
  for (const int64_t m : {int64_t{1}, int64_t{37}, int64_t{1099}, int64_t{1100}, int64_t{2300},
                          int64_t{2432}, int64_t{5000000}})
    for (const int64_t v : {int64_t{5}, int64_t{512}, int64_t{30528}}) {
      const int64_t b = mlm_backward_block_columns(m, v, 2);
      const std::string what = fmt::format("m {} v {}: block {}", m, v, b);
      ASSERT_GE(b, 1) << what;
      ASSERT_LE(b, v) << what;
      if (b > 8) {
        EXPECT_LE(m * b * 2, budget) << what;
      }
      if (m * v * 2 <= budget) {
        EXPECT_EQ(b, v) << what;  // one block when it all fits
      } else {
        EXPECT_EQ(b % 8, 0) << what;
        EXPECT_GT(m * (b + 8) * 2, budget) << what;  // and no smaller than it need be
      }
    }
  const int64_t b = mlm_backward_block_columns(2300, 30528, 2);
  EXPECT_EQ((30528 + b - 1) / b, 3);
}

// The MLM decoder on bf16 / f16 operands (the native path: decoder GEMMs on the low-precision
// word embeddings, logits in fp32, the backward in blocks of vocabulary columns with 64 MiB of
// rounded logits gradient) against the CPU's emulation (widen, fp32 op, round). The logits come
// from the same rounded operands in fp32 on both sides: the forward-only logits to 1e-5 and the
// loss sum to 1e-4. The gradients differ by CUDA's rounding of the logits gradient before the
// two GEMMs (2^-9 relative per element in bf16) and dx's own rounding: 1e-2, as the linear ops.
// Shapes: small ones (one block), one with dx and db but no dw (the column-sum path), and 2300
// masked tokens over the BERT vocabulary, which takes three blocks (dx summed over them in fp32).
TEST(CudaLowpOps, MlmLossLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_synced_cuda_backend();
  std::mt19937_64 rng(test_seed());
  const auto& check = expect_rel_l2;
  struct Case {
    int64_t m, h, v;
    bool dw, db;
  };
  for (DType t : {DType::bf16, DType::f16}) {
    for (const Case c : {Case{37, 64, 96, true, true}, Case{19, 128, 1000, true, false},
                         Case{64, 64, 512, false, true}, Case{2300, 64, 30528, true, true}}) {
      const int64_t m = c.m, h = c.h, v = c.v;
      const std::string tag = fmt::format("mlm_loss {} m{} h{} v{}{}{}", dtype_name(t), m, h, v,
                                          c.dw ? " dw" : "", c.db ? " db" : "");
      // Logits of order 1.6: a softmax neither uniform nor one-hot.
      Lowp16 x(t, randn(rng, m * h), {m, h}), w(t, randn(rng, v * h, 0.2f), {v, h});
      const std::vector<float> bias = randn(rng, v);
      const std::vector<int32_t> labels = random_ints(rng, m, 0, static_cast<int32_t>(v - 1));
      DevBuf<float> dbias({v}, bias);
      DevBuf<int32_t> dlabels({m}, labels);
      const float scale = 1.f / static_cast<float>(m);
      for (const bool backward : {false, true}) {
        std::vector<float> logits(m * v), loss = {0.5f};
        std::vector<int32_t> correct = {3};
        DevBuf<float> dlogits({m, v}), dloss({1}, loss);
        DevBuf<int32_t> dcorrect({1}, correct);
        Lowp16 dx(t, std::vector<float>(m * h), {m, h});
        const std::vector<float> dw0 = randn(rng, v * h, 1e-3f), db0 = randn(rng, v, 1e-3f);
        std::vector<float> dw = dw0, db = db0;
        DevBuf<float> ddw({v, h}, dw0), ddb({v}, db0);
        const bool want_dw = backward && c.dw, want_db = backward && c.db;
        cpu->mlm_loss(x.cpu(), w.cpu(), view(bias.data(), {v}), view(labels.data(), {m}), scale,
                      view(logits.data(), {m, v}), view(loss.data(), {1}),
                      view(correct.data(), {1}), backward ? dx.cpu() : Tensor(),
                      want_dw ? view(dw.data(), {v, h}) : Tensor(),
                      want_db ? view(db.data(), {v}) : Tensor());
        gpu->mlm_loss(x.gpu(), w.gpu(), dbias.tensor(), dlabels.tensor(), scale, dlogits.tensor(),
                      dloss.tensor(), dcorrect.tensor(), backward ? dx.gpu() : Tensor(),
                      want_dw ? ddw.tensor() : Tensor(), want_db ? ddb.tensor() : Tensor());
        cuda_synchronize(*gpu);
        const std::string what = tag + (backward ? " backward" : " forward");
        const double lc = loss[0] - 0.5, lg = static_cast<double>(dloss.values()[0]) - 0.5;
        std::printf("[lowp-error] %s loss %.6f vs %.6f\n", what.c_str(), lg, lc);
        expect_measure(what + " loss (rel)", std::abs(lg - lc) / std::abs(lc), 1e-4);
        expect_measure(what + " correct count (near-ties may flip)",
                       std::abs(dcorrect.values()[0] - correct[0]), 2);
        if (!backward) {
          check(dlogits.values(), logits, 1e-5, what + " logits");
          continue;
        }
        check(dx.gpu_values(), dx.cpu_values(), 1e-2, what + " dx");
        auto increments = [](std::vector<float> a, const std::vector<float>& a0) {
          for (size_t i = 0; i < a.size(); ++i) a[i] -= a0[i];
          return a;
        };
        if (want_dw) check(increments(ddw.values(), dw0), increments(dw, dw0), 1e-2, what + " dw");
        else EXPECT_EQ(ddw.values(), dw0) << what << ": dw not given, yet changed";
        if (want_db) check(increments(ddb.values(), db0), increments(db, db0), 1e-2, what + " db");
        else EXPECT_EQ(ddb.values(), db0) << what << ": db not given, yet changed";
        EXPECT_TRUE(ddw.guards_intact() && ddb.guards_intact() && dlogits.guards_intact()) << what;
      }
    }
  }
}

// NSP with bf16 / f16 x, dx and weight matrices (the native path: the [CLS] rows and the weights
// widened, the fp32 head, dcls added to dx's [CLS] rows in fp32 and rounded once) against the
// CPU's emulation, which runs the same fp32 ops on the same widened values in another order
// (cuBLASLt's against OpenBLAS's sums, the CUDA softmax against the CPU's). Each quantity is
// measured against the scale of the terms it is made of, since several cancel:
// - the logits, rel L2: kTol;
// - the loss, init + scale sum_s (lse(z_s) - z_s,label): a cross-entropy near 0 is a difference
//   of two logits' size, so its rounding is relative to the logits' terms, not to the loss: it
//   is held to the bound nsp_loss_bound derives (a wrong label moves it by ~100x that);
// - the logits' gradient scale (p - onehot) in place (p - 1 cancels for a confident
//   prediction): abs error / (scale sqrt(2 s)), each element being at most scale;
// - the parameter gradients, added onto random values: error / (|total| + the size of what
//   was added); cls_b's increment is scale sum_s (p_s - onehot_s), which cancels when the labels
//   balance, and its terms are at most scale each (2 scale s in all);
// - dx to a flipped rounding (1e-2) in its [CLS] rows and bit for bit in every other row.
// Measured over 1000 seeds (scripts/seed_sweep.py --seeds 1000 -- build-emu/tests/emulation/
// test_cuda_lowp_ops --gtest_filter='*NspLoss*'), worst against kTol: dlogits 1.1e-6 (margin 9),
// logits 7.6e-7 (13), cls_b 2.9e-7 (34), the other gradients 2.5e-7 (39), dx 1.3e-4 against
// 1e-2 (80); the loss reached 5.3e-3 of its bound (188), and a flipped label 4.4e3 of it.
TEST(CudaLowpOps, NspLossLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_synced_cuda_backend();
  std::mt19937_64 rng(test_seed());
  for (DType t : {DType::bf16, DType::f16})
    for (const int64_t h : {int64_t{40}, int64_t{130}})
      for (const bool grads : {false, true}) {
        const std::vector<int32_t> lens = {3, 1, 20, 7, 12};
        const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 24);
        const int64_t rows = l.rows, s = static_cast<int64_t>(lens.size());
        const std::string what =
            fmt::format("nsp_loss {} h{}{}", dtype_name(t), h, grads ? " grads" : "");
        Lowp16 x(t, randn(rng, rows * h), {rows, h}), wp(t, randn(rng, h * h, 0.3f), {h, h});
        Lowp16 wc(t, randn(rng, 2 * h), {2, h}), dx(t, randn(rng, rows * h), {rows, h});
        const std::vector<uint16_t> dx0 = dx.host;
        auto bp = randn(rng, h), bc = randn(rng, 2);
        const std::vector<int32_t> labels = random_ints(rng, s, 0, 1);
        const auto gwp0 = randn(rng, h * h), gbp0 = randn(rng, h), gwc0 = randn(rng, 2 * h),
                   gbc0 = randn(rng, 2);
        std::vector<float> ws(nsp_workspace_elems(s, h)), loss = {0.25f}, gwp = gwp0,
                                                          gbp = gbp0, gwc = gwc0, gbc = gbc0;
        std::vector<int32_t> correct = {1};
        auto hv = [](std::vector<float>& v, std::initializer_list<int64_t> dims) {
          return view(v.data(), dims);
        };
        const PoolerParams hp{wp.cpu(), hv(bp, {h}), wc.cpu(), hv(bc, {2})};
        const PoolerParams hg = grads ? PoolerParams{hv(gwp, {h, h}), hv(gbp, {h}),
                                                     hv(gwc, {2, h}), hv(gbc, {2})}
                                      : PoolerParams{};
        cpu->nsp_loss(l.view(), x.cpu(), hp, view(labels.data(), {s}), 1.f / 9,
                      hv(ws, {nsp_workspace_elems(s, h)}), hv(loss, {1}),
                      view(correct.data(), {1}), grads ? dx.cpu() : Tensor(), hg);
        DevLayout dl(l);
        DevBuf<float> dbp({h}, bp), dbc({2}, bc), dws({nsp_workspace_elems(s, h)}),
            dloss({1}, {0.25f}), dgwp({h, h}, gwp0), dgbp({h}, gbp0), dgwc({2, h}, gwc0),
            dgbc({2}, gbc0);
        DevBuf<int32_t> dlab({s}, labels), dcorrect({1}, {1});
        const PoolerParams dp{wp.gpu(), dbp.tensor(), wc.gpu(), dbc.tensor()};
        const PoolerParams dg = grads ? PoolerParams{dgwp.tensor(), dgbp.tensor(),
                                                     dgwc.tensor(), dgbc.tensor()}
                                      : PoolerParams{};
        gpu->nsp_loss(dl.view(), x.gpu(), dp, dlab.tensor(), 1.f / 9, dws.tensor(),
                      dloss.tensor(), dcorrect.tensor(), grads ? dx.gpu() : Tensor(), dg);
        cuda_synchronize(*gpu);
        const float scale = 1.f / 9;
        const double bound = nsp_loss_bound(l, x.cpu_values(), wp.cpu_values(), bp,
                                            wc.cpu_values(), bc, labels, 0.25, scale, h);
        expect_bound(what + " loss / its rounding bound",
                     std::abs(static_cast<double>(dloss.values()[0]) - loss[0]) / bound, 1.0);
        EXPECT_EQ(dcorrect.values(), correct) << what;
        EXPECT_TRUE(dws.guards_intact()) << what;
        const auto gws = dws.values();
        const std::vector<double> glog(gws.begin() + 4 * s * h, gws.end()),
            hlog(ws.begin() + 4 * s * h, ws.end());
        if (grads) {  // scale (p - onehot), each element at most scale
          double d2 = 0;
          for (size_t i = 0; i < glog.size(); ++i) d2 += (glog[i] - hlog[i]) * (glog[i] - hlog[i]);
          expect_measure(what + " dlogits at 4sh / (scale sqrt(2 s))",
                         std::sqrt(d2) / (scale * std::sqrt(2.0 * static_cast<double>(s))), kTol);
        } else {
          expect_close(what + " logits at 4sh", glog, hlog, kTol);
        }
        const std::vector<uint16_t> got = read16(dx.dev, dx.host.size());
        if (!grads) {
          EXPECT_EQ(got, dx0) << what << ": dx changed without gradients";
          continue;
        }
        expect_rel_l2(dx.widen(got), dx.cpu_values(), 1e-2, what + " dx");
        std::vector<bool> cls(static_cast<size_t>(rows), false);
        for (int32_t start : l.seq_start) cls[static_cast<size_t>(start)] = true;
        for (int64_t r = 0; r < rows; ++r) {
          if (cls[static_cast<size_t>(r)]) continue;
          ASSERT_TRUE(std::equal(got.begin() + r * h, got.begin() + (r + 1) * h,
                                 dx0.begin() + r * h))
              << what << ": row " << r << " is no [CLS] row, yet changed";
        }
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

// gather_rows in bf16 / f16 is a bit copy, as the emulation's widen-copy-round; its backward
// adds in fp32 and rounds after each add, the emulation once at the end: the same bits where
// every row is hit once (the model's masked positions), within one ulp per repeat otherwise.
TEST(CudaLowpOps, GatherRowsLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  std::mt19937_64 rng(test_seed());
  const int64_t rows = 300, h = 72, m = 120;
  for (DType t : {DType::bf16, DType::f16}) {
    for (const bool repeats : {false, true}) {
      std::vector<int32_t> idx(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) idx[static_cast<size_t>(r)] = static_cast<int32_t>(r);
      std::shuffle(idx.begin(), idx.end(), rng);
      idx.resize(static_cast<size_t>(m));
      if (repeats) idx[5] = idx[9] = idx[40] = idx[2];
      const std::string what = std::string(dtype_name(t)) + (repeats ? " repeated" : " distinct");
      DevBuf<int32_t> didx({m}, idx);
      Lowp16 x(t, randn(rng, rows * h), {rows, h}), out(t, std::vector<float>(m * h), {m, h});
      cpu->gather_rows(x.cpu(), view(idx.data(), {m}), out.cpu());
      gpu->gather_rows(x.gpu(), didx.tensor(), out.gpu());
      cuda_synchronize(*gpu);
      EXPECT_EQ(read16(out.dev, out.host.size()), out.host) << what << ": gather";
      Lowp16 dout(t, randn(rng, m * h), {m, h}), dx(t, randn(rng, rows * h), {rows, h});
      cpu->gather_rows_backward(dout.cpu(), view(idx.data(), {m}), dx.cpu());
      gpu->gather_rows_backward(dout.gpu(), didx.tensor(), dx.gpu());
      cuda_synchronize(*gpu);
      if (!repeats) {
        EXPECT_EQ(read16(dx.dev, dx.host.size()), dx.host) << what << ": backward";
      } else {
        expect_rel_l2(dx.gpu_values(), dx.cpu_values(), 1e-2, "gather_rows_backward " + what);
      }
    }
  }
}

// ---- native bf16 / f16 LayerNorm and embedding kernels -----------------------------------------
// embedding_forward / backward and residual_layernorm_forward / backward with their "lowp:"
// tensors in bf16 or f16 (the combinations the model passes: those tensors in one dtype, the
// embedding tables f32 or in that dtype) against the CPU backend's emulation (widen, fp32 op,
// round) on the same 16-bit inputs.
//
// Tolerance. Both sides compute the same fp32 expressions per element and differ only in the
// order of the row reductions (Welford merges, double sums of the backward, column sums), which
// moves the fp32 value before the final rounding by a few fp32 ulps of the row's scale (~2e-7
// relative; FMA contraction on the GPU adds half an fp32 ulp). Rounding to 16 bits then gives
// the same bits unless that fp32 value sits that close to a rounding midpoint: probability
// ~2e-7 / 2^-8 = 5e-5 per bf16 element, 4e-4 per f16 element, a few times more for elements
// that are small against their row (cancellation in LayerNorm's output and dx: the error is
// relative to the row, the ulp to the element). So per element: |gpu - cpu| <= 2 ulps of the
// format at |cpu| (a flipped rounding is 1 ulp), plus 1e-5 of the tensor's rms for elements
// near zero; and at least 98% of the elements bit for bit (the estimate gives > 99.5% for f16).
// The fp32 outputs (statistics, parameter gradients) are fp32 against fp32 in another order:
// test_cuda_ops's kTol (1e-5).
//
// The native path is asserted by the memory it does not use: the adapter widens every
// low-precision tensor into a grow-only fp32 staging buffer of [rows, H] on first use, the native
// forward kernels allocate nothing and the native LayerNorm backward one fp32 [rows, H] buffer
// (dx for dbias). A fresh backend's first calls on a large shape are measured with
// cudaMemGetInfo (NativeKernelsNeedNoStaging). embedding_backward stages one [rows, H] buffer
// either way (dout widened, or the fp32 gradient scratch), so it is not told apart there; it
// dispatches on the same predicate as the forward.
TEST(CudaLowpOps, ResidualLayerNormLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_synced_cuda_backend();
  auto rng = make_rng(601);
  // bits: 1 bias, 2 residual, 4 dropout, 8 ln_in aliases x, 16 dresidual aliases dout,
  // 32 parameter gradients (dbias, dgamma, dbeta), 64 no dresidual, 128 the MLM transform's
  // call (no layout, nothing but x)
  const int variants[] = {1 | 2 | 4 | 32,  1 | 2 | 8 | 16 | 32, 2 | 4 | 8, 1 | 4 | 64 | 32,
                          1 | 2 | 4 | 16, 0,                   128 | 8 | 32 | 64};
  for (DType t : {DType::bf16, DType::f16})
    for (int var : variants)
      for (int64_t h : {int64_t{130}, int64_t{768}}) {
        const std::vector<int32_t> lens = {1, 33, 12, 64, 7};
        const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 64);
        const int64_t rows = l.rows;
        const bool drop = var & 4, alias_in = var & 8, alias_res = var & 16, pg = var & 32,
                   no_res = var & 64, plain = var & 128;
        const std::string what = fmt::format("residual_layernorm {} var {} h {}", dtype_name(t),
                                             var, h);
        const Dropout d = lowp_dropout(drop, rng(), DropoutSite::attention_output, 3);
        std::vector<uint16_t> x = round16(t, random_floats(rng, rows * h, 2.f));
        std::vector<uint16_t> res = round16(t, random_floats(rng, rows * h, 2.f));
        auto bias = random_floats(rng, h), gamma = random_floats(rng, h),
             beta = random_floats(rng, h);
        // CPU emulation.
        std::vector<uint16_t> hx = x, out(rows * h), ln_in(rows * h);
        std::vector<float> mean(rows), rstd(rows);
        DevLayout dl(l);
        const SeqLayout hl = plain ? SeqLayout{} : l.view();
        const SeqLayout gl = plain ? SeqLayout{} : dl.view();
        cpu->residual_layernorm_forward(
            hl, view16(hx, t, {rows, h}), var & 1 ? view(bias.data(), {h}) : Tensor(),
            var & 2 ? view16(res, t, {rows, h}) : Tensor(),
            {view(gamma.data(), {h}), view(beta.data(), {h})}, d, view16(out, t, {rows, h}),
            alias_in ? view16(hx, t, {rows, h}) : view16(ln_in, t, {rows, h}),
            view(mean.data(), {rows}), view(rstd.data(), {rows}));
        if (alias_in) ln_in = hx;
        // Device.
        Guarded16 gx(t, {rows, h}, x), gres(t, {rows, h}, res), gout(t, {rows, h}),
            gln(t, {rows, h});
        DevBuf<float> gbias({h}, bias), ggamma({h}, gamma), gbeta({h}, beta), gmean({rows}),
            grstd({rows});
        gpu->residual_layernorm_forward(
            gl, gx.tensor(), var & 1 ? gbias.tensor() : Tensor(),
            var & 2 ? gres.tensor() : Tensor(), {ggamma.tensor(), gbeta.tensor()}, d,
            gout.tensor(), alias_in ? gx.tensor() : gln.tensor(), gmean.tensor(),
            grstd.tensor());
        cuda_synchronize(*gpu);
        expect_lowp_match(what + " out", t, gout, out);
        expect_lowp_match(what + " ln_in", t, alias_in ? gx : gln, ln_in);
        EXPECT_DEV_OUTPUT_OK(gmean);
        EXPECT_DEV_OUTPUT_OK(grstd);
        expect_fp32_close(what + " mean", gmean.values(), mean);
        expect_fp32_close(what + " rstd", grstd.values(), rstd);

        // Backward from the emulation's saved ln_in, mean, rstd (only the backward compared).
        std::vector<uint16_t> dy = round16(t, random_floats(rng, rows * h));
        const auto gg0 = random_floats(rng, h), gb0 = random_floats(rng, h),
                   gbias0 = random_floats(rng, h);
        std::vector<uint16_t> hdy = dy, hdx(rows * h), hdres(rows * h);
        std::vector<float> cg = gg0, cb = gb0, cbias = gbias0;
        const Tensor hres = no_res ? Tensor()
                            : alias_res ? view16(hdy, t, {rows, h})
                                        : view16(hdres, t, {rows, h});
        cpu->residual_layernorm_backward(
            hl, view16(hdy, t, {rows, h}), view16(ln_in, t, {rows, h}), view(mean.data(), {rows}),
            view(rstd.data(), {rows}), {view(gamma.data(), {h}), Tensor()}, d,
            view16(hdx, t, {rows, h}), hres, pg ? view(cbias.data(), {h}) : Tensor(),
            {pg ? view(cg.data(), {h}) : Tensor(), pg ? view(cb.data(), {h}) : Tensor()});
        if (alias_res) hdres = hdy;
        Guarded16 gdy(t, {rows, h}, dy), glnin(t, {rows, h}, ln_in), gdx(t, {rows, h}),
            gdres(t, {rows, h});
        DevBuf<float> gmean2({rows}, mean), grstd2({rows}, rstd), ggg({h}, gg0), ggb({h}, gb0),
            ggbias({h}, gbias0);
        const Tensor dres = no_res ? Tensor() : alias_res ? gdy.tensor() : gdres.tensor();
        gpu->residual_layernorm_backward(
            gl, gdy.tensor(), glnin.tensor(), gmean2.tensor(), grstd2.tensor(),
            {ggamma.tensor(), Tensor()}, d, gdx.tensor(), dres, pg ? ggbias.tensor() : Tensor(),
            {pg ? ggg.tensor() : Tensor(), pg ? ggb.tensor() : Tensor()});
        cuda_synchronize(*gpu);
        expect_lowp_match(what + " dx", t, gdx, hdx);
        if (!no_res) expect_lowp_match(what + " dresidual", t, alias_res ? gdy : gdres, hdres);
        if (!alias_res) {
          EXPECT_EQ(gdy.bits(), dy) << what << ": dout changed";
        }
        EXPECT_EQ(glnin.bits(), ln_in) << what << ": ln_in changed";
        if (pg) {
          expect_fp32_close(what + " dbias", ggbias.values(), cbias);
          expect_fp32_close(what + " dgamma", ggg.values(), cg);
          expect_fp32_close(what + " dbeta", ggb.values(), cb);
        }
        EXPECT_TRUE(ggbias.guards_intact() && ggg.guards_intact() && ggb.guards_intact()) << what;
      }
}

TEST(CudaLowpOps, EmbeddingLowpMatchesCpuEmulation) {
  PB_REQUIRE_CUDA_DEVICE();
  auto cpu = make_cpu_backend();
  auto gpu = make_synced_cuda_backend();
  auto rng = make_rng(602);
  const int64_t vocab = 50, positions = 64, types = 2;
  for (DType t : {DType::bf16, DType::f16})
    for (int trial = 0; trial < 8; ++trial) {
      // trial bits: 1 dropout, 2 tables in t (else f32, as the model passes them), 4 unpadded
      // layout (else padded), and trial 3 / 6 leave out some parameter gradients.
      const bool drop = trial & 1, lowp_tables = trial & 2, unpad = trial & 4;
      const int64_t h = trial % 3 == 0 ? 130 : 256;
      const std::vector<int32_t> lens = {1, 17, 64, 3, 9};
      const auto ids = random_sample_ids(rng, lens.size());
      const HostLayout l = unpad ? unpadded(lens, ids) : padded(lens, ids, 64);
      const int64_t rows = l.rows;
      const DType tt = lowp_tables ? t : DType::f32;
      const std::string what = fmt::format("embedding {} tables {} trial {} h {}", dtype_name(t),
                                           dtype_name(tt), trial, h);
      const Dropout d = lowp_dropout(drop, rng(), DropoutSite::embedding, 0);
      // Tables: f32 values exactly representable in t, so both table dtypes see the same values.
      auto table = [&](int64_t n) {
        std::vector<float> v = random_floats(rng, n);
        for (float& x : v) x = widen16(t, round16(t, x));
        return v;
      };
      std::vector<float> word = table(vocab * h), pos = table(positions * h),
                         type = table(types * h);
      std::vector<uint16_t> word16 = round16(t, word), pos16 = round16(t, pos),
                            type16 = round16(t, type);
      auto gamma = random_floats(rng, h), beta = random_floats(rng, h);
      auto tok = random_ints(rng, rows, 0, vocab - 1), seg = random_ints(rng, rows, 0, types - 1);
      auto tab = [&](std::vector<float>& f, std::vector<uint16_t>& b, int64_t n) {
        return lowp_tables ? view16(b, t, {n, h}) : view(f.data(), {n, h});
      };
      const EmbeddingParams hp{tab(word, word16, vocab), tab(pos, pos16, positions),
                               tab(type, type16, types), view(gamma.data(), {h}),
                               view(beta.data(), {h})};
      std::vector<uint16_t> out(rows * h);
      std::vector<float> mean(rows), rstd(rows);
      cpu->embedding_forward(l.view(), view(tok.data(), {rows}), view(seg.data(), {rows}), hp, d,
                             view16(out, t, {rows, h}), view(mean.data(), {rows}),
                             view(rstd.data(), {rows}));
      DevLayout dl(l);
      DevBuf<float> gword({vocab, h}, word), gpos({positions, h}, pos), gtype({types, h}, type),
          ggamma({h}, gamma), gbeta({h}, beta), gmean({rows}), grstd({rows});
      Guarded16 gword16(t, {vocab, h}, word16), gpos16(t, {positions, h}, pos16),
          gtype16(t, {types, h}, type16), gout(t, {rows, h});
      DevBuf<int32_t> gtok({rows}, tok), gseg({rows}, seg);
      const EmbeddingParams gp{lowp_tables ? gword16.tensor() : gword.tensor(),
                               lowp_tables ? gpos16.tensor() : gpos.tensor(),
                               lowp_tables ? gtype16.tensor() : gtype.tensor(), ggamma.tensor(),
                               gbeta.tensor()};
      gpu->embedding_forward(dl.view(), gtok.tensor(), gseg.tensor(), gp, d, gout.tensor(),
                             gmean.tensor(), grstd.tensor());
      cuda_synchronize(*gpu);
      expect_lowp_match(what + " out", t, gout, out);
      EXPECT_DEV_OUTPUT_OK(gmean);
      EXPECT_DEV_OUTPUT_OK(grstd);
      expect_fp32_close(what + " mean", gmean.values(), mean);
      expect_fp32_close(what + " rstd", grstd.values(), rstd);

      // Backward from the emulation's statistics; the gradients (f32) accumulate.
      const bool some = trial == 3 || trial == 6;
      std::vector<uint16_t> dy = round16(t, random_floats(rng, rows * h)), hdy = dy;
      const auto gw0 = random_floats(rng, vocab * h), gp0 = random_floats(rng, positions * h),
                 gt0 = random_floats(rng, types * h), gg0 = random_floats(rng, h),
                 gb0 = random_floats(rng, h);
      std::vector<float> gw = gw0, gpv = gp0, gt = gt0, gg = gg0, gb = gb0;
      const EmbeddingParams hg{view(gw.data(), {vocab, h}),
                               some ? Tensor() : view(gpv.data(), {positions, h}),
                               view(gt.data(), {types, h}),
                               some ? Tensor() : view(gg.data(), {h}), view(gb.data(), {h})};
      cpu->embedding_backward(l.view(), view(tok.data(), {rows}), view(seg.data(), {rows}), hp, d,
                              view(mean.data(), {rows}), view(rstd.data(), {rows}),
                              view16(hdy, t, {rows, h}), hg);
      Guarded16 gdy(t, {rows, h}, dy);
      DevBuf<float> gmean2({rows}, mean), grstd2({rows}, rstd), ggw({vocab, h}, gw0),
          ggp({positions, h}, gp0), ggt({types, h}, gt0), ggg({h}, gg0), ggb({h}, gb0);
      const EmbeddingParams gg_{ggw.tensor(), some ? Tensor() : ggp.tensor(), ggt.tensor(),
                                some ? Tensor() : ggg.tensor(), ggb.tensor()};
      gpu->embedding_backward(dl.view(), gtok.tensor(), gseg.tensor(), gp, d, gmean2.tensor(),
                              grstd2.tensor(), gdy.tensor(), gg_);
      cuda_synchronize(*gpu);
      EXPECT_TRUE(gdy.guards_intact()) << what << ": dout written outside the buffer";
      expect_fp32_close(what + " dword", ggw.values(), gw);
      expect_fp32_close(what + " dtype", ggt.values(), gt);
      expect_fp32_close(what + " dbeta", ggb.values(), gb);
      if (!some) {
        expect_fp32_close(what + " dpos", ggp.values(), gpv);
        expect_fp32_close(what + " dgamma", ggg.values(), gg);
      } else {
        EXPECT_EQ(ggp.values(), gp0) << what << ": dpos written though not given";
        EXPECT_EQ(ggg.values(), gg0) << what << ": dgamma written though not given";
      }
      EXPECT_TRUE(ggw.guards_intact() && ggp.guards_intact() && ggt.guards_intact() &&
                  ggg.guards_intact() && ggb.guards_intact())
          << what;
    }
}

// See the comment above the LayerNorm tests: the adapter would stage every 16-bit tensor in fp32.
TEST(CudaLowpOps, NativeKernelsNeedNoStaging) {
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = make_rng(603);
  const DType t = DType::bf16;
  const int64_t rows = 4096, h = 1024, vocab = 64, positions = 64;
  const double copy = static_cast<double>(rows * h) * sizeof(float);  // one fp32 [rows, H]
  std::vector<int32_t> lens(64, 64);
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  DevLayout dl(l);
  Guarded16 x(t, {rows, h}, round16(t, random_floats(rng, rows * h))), out(t, {rows, h}),
      ln_in(t, {rows, h}), dx(t, {rows, h});
  DevBuf<float> bias({h}, random_floats(rng, h)), gamma({h}, random_floats(rng, h)),
      beta({h}, random_floats(rng, h)), mean({rows}), rstd({rows}),
      dbias({h}, random_floats(rng, h)), word({vocab, h}, random_floats(rng, vocab * h)),
      pos({positions, h}, random_floats(rng, positions * h)),
      type({2, h}, random_floats(rng, 2 * h));
  DevBuf<int32_t> tok({rows}, random_ints(rng, rows, 0, vocab - 1)),
      seg({rows}, random_ints(rng, rows, 0, 1));
  const Dropout d = lowp_dropout(true, rng(), DropoutSite::ffn_output, 1);
  const EmbeddingParams ep{word.tensor(), pos.tensor(), type.tensor(), gamma.tensor(),
                           beta.tensor()};
  // NSP over the 64 sequences: its weights in bf16, its biases, workspace and gradients fp32.
  const int64_t s = static_cast<int64_t>(lens.size());
  Guarded16 wp(t, {h, h}, round16(t, random_floats(rng, h * h, 0.03f))),
      wc(t, {2, h}, round16(t, random_floats(rng, 2 * h)));
  DevBuf<float> bp({h}, random_floats(rng, h)), bc({2}, random_floats(rng, 2)),
      nsp_ws({nsp_workspace_elems(s, h)}), loss({1}, {0.f}), gwp({h, h}), gbp({h}), gwc({2, h}),
      gbc({2});
  DevBuf<int32_t> labels({s}, random_ints(rng, s, 0, 1)), correct({1}, {0});
  for (DevBuf<float>* g : {&gwp, &gbp, &gwc, &gbc}) g->set(std::vector<float>(g->size(), 0.f));
  const PoolerParams np{wp.tensor(), bp.tensor(), wc.tensor(), bc.tensor()};
  const PoolerParams ng{gwp.tensor(), gbp.tensor(), gwc.tensor(), gbc.tensor()};
  auto used = [] {
    size_t free_b = 0, total_b = 0;
    cuda_ok(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return static_cast<double>(total_b - free_b);
  };
  {
    // Loads the kernels (lazy module loading allocates device memory of its own) on a small shape.
    auto warm = make_cuda_backend(0, CudaBackendOptions{});
    std::vector<int32_t> small = {3};
    const HostLayout sl = unpadded(small, random_sample_ids(rng, 1));
    DevLayout sdl(sl);
    Guarded16 sx(t, {3, h}, round16(t, random_floats(rng, 3 * h))), so(t, {3, h}), sln(t, {3, h}),
        sdx(t, {3, h});
    DevBuf<float> sm({3}), sr({3});
    DevBuf<int32_t> st({3}, {1, 2, 3}), ss({3}, {0, 1, 0});
    warm->residual_layernorm_forward(sdl.view(), sx.tensor(), bias.tensor(), Tensor(),
                                     {gamma.tensor(), beta.tensor()}, d, so.tensor(), sln.tensor(),
                                     sm.tensor(), sr.tensor());
    warm->residual_layernorm_backward(sdl.view(), so.tensor(), sln.tensor(), sm.tensor(),
                                      sr.tensor(), {gamma.tensor(), Tensor()}, d, sdx.tensor(),
                                      Tensor(), dbias.tensor(), {});
    warm->embedding_forward(sdl.view(), st.tensor(), ss.tensor(), ep, d, so.tensor(), sm.tensor(),
                            sr.tensor());
    warm->nsp_loss(sdl.view(), sx.tensor(), np, Tensor(labels.data(), DType::i32, {1},
                                                        Device::cuda),
                   1.f, Tensor(nsp_ws.data(), DType::f32, {nsp_workspace_elems(1, h)},
                               Device::cuda),
                   loss.tensor(), correct.tensor(), sdx.tensor(), ng);
    cuda_synchronize(*warm);
  }
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  cuda_synchronize(*gpu);
  double before = used();
  gpu->residual_layernorm_forward(dl.view(), x.tensor(), bias.tensor(), Tensor(),
                                  {gamma.tensor(), beta.tensor()}, d, out.tensor(),
                                  ln_in.tensor(), mean.tensor(), rstd.tensor());
  cuda_synchronize(*gpu);
  double grew = used() - before;
  std::printf("[lowp-error] residual_layernorm_forward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 0.5 * copy) << "residual_layernorm_forward staged its bf16 tensors";
  before = used();
  gpu->residual_layernorm_backward(dl.view(), out.tensor(), ln_in.tensor(), mean.tensor(),
                                   rstd.tensor(), {gamma.tensor(), Tensor()}, d, dx.tensor(),
                                   Tensor(), dbias.tensor(), {});
  cuda_synchronize(*gpu);
  grew = used() - before;
  std::printf("[lowp-error] residual_layernorm_backward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 1.5 * copy) << "residual_layernorm_backward staged its bf16 tensors";
  before = used();
  gpu->embedding_forward(dl.view(), tok.tensor(), seg.tensor(), ep, d, out.tensor(),
                         mean.tensor(), rstd.tensor());
  cuda_synchronize(*gpu);
  grew = used() - before;
  std::printf("[lowp-error] embedding_forward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 0.5 * copy) << "embedding_forward staged its bf16 output";
  // nsp_loss: the adapter widens x and dx (one copy each, dx both ways); the native path the
  // [CLS] rows and the weights (dense_w [h, h]: a quarter of one copy here).
  before = used();
  gpu->nsp_loss(dl.view(), x.tensor(), np, labels.tensor(), 1.f / static_cast<float>(s),
                nsp_ws.tensor(), loss.tensor(), correct.tensor(), dx.tensor(), ng);
  cuda_synchronize(*gpu);
  grew = used() - before;
  std::printf("[lowp-error] nsp_loss staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 0.5 * copy) << "nsp_loss staged its bf16 tensors";
  EXPECT_TRUE(out.guards_intact() && ln_in.guards_intact() && dx.guards_intact());
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaLowpOps, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
