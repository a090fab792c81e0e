// The backend runner of the op table (tests/ops/op_cases.h), labels gpu and emulated: every
// case of every op on the CUDA backend against the CPU backend (the executable specification) on
// the same inputs, in fp32 (BackendOps.*) and, as a mode, in bf16 / f16 against the CPU
// backend's emulation of low precision (BackendOpsLowp.*); the tolerances are the table's. Then
// the CUDA backend's own checks that are no per-op case (BackendOpsCuda.*): copies, epilogues
// refused at run time, the embedding scatter's order at scale, the MLM backward's blocks, native
// kernels without staging, prefetch's overlap, an encoder layer's ops captured into a CUDA
// graph, attention's fixed launch replayed over new batches, the dropout step read from device
// memory when the ops run. Without a device every test prints "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "../ops/op_cases.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/cuda_kernels.h"

namespace packbert::test {
namespace {

// BackendOps.<op> (fp32 cases) and BackendOpsLowp.<op> (bf16 / f16 cases) for every table of
// the registry (op_cases.h): every case of the mode on the CPU backend and the CUDA backend.
void run_cases(const OpCases& cases, bool lowp) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  EXPECT_GT(run_against(cases, lowp, *b.cpu, host_memory(), *b.gpu, cuda_memory()), 0)
      << "no case of this mode";
}
const bool registered_fp32 = register_op_tests(
    "BackendOps", kEmulated, [](const OpCase& c) { return !is_lowp(c.dtype); },
    [](const OpCases& cases) { run_cases(cases, false); });
const bool registered_lowp = register_op_tests(
    "BackendOpsLowp", kEmulated, [](const OpCase& c) { return is_lowp(c.dtype); },
    [](const OpCases& cases) { run_cases(cases, true); });

// ---- the CUDA backend's own checks ------------------------------------------------------------
TEST(BackendOpsCuda, CopyAndZero) {
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

// An epilogue that cuBLASLt's heuristic offers but its matmul refuses (the emulated cuBLASLt's
// test-only switch, PACKBERT_EMU_CUBLASLT_REFUSE_EPILOGUES): every op falls back to DEFAULT +
// its kernel with the CPU's results, and each refusal is met once per shape, never retried.
TEST(BackendOpsCuda, EpiloguesRefusedAtRunTime) {
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
    b.gpu->linear_backward(dxin.tensor(), dwin.tensor(), dg.tensor(), ddx.tensor(), ddw.tensor(),
                           ddb.tensor(), go);
    const std::string what = fmt::format("refused epilogues, call {}", call);
    EXPECT_OUTPUT_OK(dout);
    EXPECT_OUTPUT_OK(ddx);
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

// The embedding tables' scatter (cuda::embedding_scatter) at a batch's scale, against the host
// loop in row order (the CPU backend's): a table element hit by at most 256 rows adds them in
// row order on the GPU too -- the same bits; the [MASK]-like word hit by ~1,200 rows and the two
// token types (~1,500 each) add 256-row pieces in order -- within fp32 rounding of another
// grouping. Padding rows add nothing; tables not given are skipped.
TEST(BackendOpsCuda, EmbeddingScatterOrderAtScale) {
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
  cuda_ok(cuda::embedding_scatter(
              layout, dtok.tensor().ptr<int32_t>(), dseg.tensor().ptr<int32_t>(), h,
              dd.tensor().ptr<float>(), dw.tensor().ptr<float>(), vocab, dp.tensor().ptr<float>(),
              positions, dt.tensor().ptr<float>(), types, scratch, bytes, nullptr),
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
  cuda_ok(
      cuda::embedding_scatter(layout, dtok.tensor().ptr<int32_t>(), dseg.tensor().ptr<int32_t>(), h,
                              dd.tensor().ptr<float>(), dw.tensor().ptr<float>(), vocab, nullptr,
                              positions, nullptr, types, scratch, bytes, nullptr),
      "embedding_scatter");
  cuda_ok(cudaDeviceSynchronize(), "embedding_scatter");
  EXPECT_EQ(dp.values(), p0);
  expect_close("embedding_scatter word table alone", dw.doubles(), dbl(w), 1e-5);
  EXPECT_TRUE(dw.guards_intact() && dp.guards_intact() && dt.guards_intact());
  cuda_free(scratch);
}

// The blocks of the MLM decoder's backward (vocabulary columns, cuda_losses.cpp): their rounded
// gradient [m, block] fits the 64 MiB of scratch unless a block is at its minimum of 8 columns,
// blocks are multiples of 8 columns (but a whole vocabulary that fits), and the shape of the
// test below takes three.
TEST(BackendOpsCuda, MlmBackwardBlocksFitTheirScratch) {
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

// The native bf16 / f16 LayerNorm and embedding kernels are asserted by the memory they do not
// use: the adapter widens every low-precision tensor into a grow-only fp32 staging buffer of
// [rows, H] on first use, the native forward kernels allocate nothing and the native LayerNorm
// backward one fp32 [rows, H] buffer (dx for dbias). A fresh backend's first calls on a large
// shape are measured with cudaMemGetInfo. embedding_backward stages one [rows, H] buffer either
// way (dout widened, or the fp32 gradient scratch), so it is not told apart here; it dispatches
// on the same predicate as the forward.
TEST(BackendOpsCuda, NativeKernelsNeedNoStaging) {
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = make_rng(603);
  const DType t = DType::bf16;
  const int64_t rows = 4096, h = 1024, vocab = 64, positions = 64;
  const double copy = static_cast<double>(rows * h) * sizeof(float);  // one fp32 [rows, H]
  std::vector<int32_t> lens(64, 64);
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  DevLayout dl(l);
  Dev16 x(t, {rows, h}, round16(t, random_floats(rng, rows * h))), out(t, {rows, h}),
      ln_in(t, {rows, h}), dx(t, {rows, h});
  DevBuf<float> bias({h}, random_floats(rng, h)), gamma({h}, random_floats(rng, h)),
      beta({h}, random_floats(rng, h)), mean({rows}), rstd({rows}),
      dbias({h}, random_floats(rng, h)), word({vocab, h}, random_floats(rng, vocab * h)),
      pos({positions, h}, random_floats(rng, positions * h)),
      type({2, h}, random_floats(rng, 2 * h));
  DevBuf<int32_t> tok({rows}, random_ints(rng, rows, 0, vocab - 1)),
      seg({rows}, random_ints(rng, rows, 0, 1));
  const Dropout d = make_dropout(0.1f, rng(), DropoutSite::ffn_output, 1, 4321);
  const EmbeddingParams ep{word.tensor(), pos.tensor(), type.tensor(), gamma.tensor(),
                           beta.tensor()};
  // NSP over the 64 sequences: its weights in bf16, its biases, workspace and gradients fp32.
  const int64_t s = static_cast<int64_t>(lens.size());
  Dev16 wp(t, {h, h}, round16(t, random_floats(rng, h * h, 0.03f))),
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
    Dev16 sx(t, {3, h}, round16(t, random_floats(rng, 3 * h))), so(t, {3, h}), sln(t, {3, h}),
        sdx(t, {3, h});
    DevBuf<float> sm({3}), sr({3});
    DevBuf<int32_t> st({3}, {1, 2, 3}), ss({3}, {0, 1, 0});
    warm->residual_layernorm_forward(sdl.view(), sx.tensor(), bias.tensor(), Tensor(),
                                     {gamma.tensor(), beta.tensor()}, d, so.tensor(), sln.tensor(),
                                     sm.tensor(), sr.tensor());
    warm->residual_layernorm_backward(sdl.view(), so.tensor(), sln.tensor(), sm.tensor(),
                                      sr.tensor(), {gamma.tensor(), Tensor()}, d, sdx.tensor(),
                                      Tensor(), false, dbias.tensor(), {});
    warm->embedding_forward(sdl.view(), st.tensor(), ss.tensor(), ep, d, so.tensor(), sm.tensor(),
                            sr.tensor());
    warm->nsp_loss(sdl.view(), sx.tensor(), np,
                   Tensor(labels.data(), DType::i32, {1}, Device::cuda), 1.f,
                   Tensor(nsp_ws.data(), DType::f32, {nsp_workspace_elems(1, h)}, Device::cuda),
                   loss.tensor(), correct.tensor(), sdx.tensor(), ng);
    cuda_synchronize(*warm);
  }
  auto gpu = make_cuda_backend(0, CudaBackendOptions{});
  cuda_synchronize(*gpu);
  double before = used();
  gpu->residual_layernorm_forward(dl.view(), x.tensor(), bias.tensor(), Tensor(),
                                  {gamma.tensor(), beta.tensor()}, d, out.tensor(), ln_in.tensor(),
                                  mean.tensor(), rstd.tensor());
  cuda_synchronize(*gpu);
  double grew = used() - before;
  std::printf("[lowp-error] residual_layernorm_forward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 0.5 * copy) << "residual_layernorm_forward staged its bf16 tensors";
  before = used();
  gpu->residual_layernorm_backward(dl.view(), out.tensor(), ln_in.tensor(), mean.tensor(),
                                   rstd.tensor(), {gamma.tensor(), Tensor()}, d, dx.tensor(),
                                   Tensor(), false, dbias.tensor(), {});
  cuda_synchronize(*gpu);
  grew = used() - before;
  std::printf("[lowp-error] residual_layernorm_backward staging %.1f MiB\n", grew / 1048576.0);
  EXPECT_LT(grew, 1.5 * copy) << "residual_layernorm_backward staged its bf16 tensors";
  before = used();
  gpu->embedding_forward(dl.view(), tok.tensor(), seg.tensor(), ep, d, out.tensor(), mean.tensor(),
                         rstd.tensor());
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

// ---- Backend::prefetch -----------------------------------------------------------------------
// A host function on the compute stream that holds it until opened (or 20 s pass).
struct Gate {
  std::atomic<bool> open{false}, timed_out{false};
};
void CUDART_CB hold_stream(void* p) {
  auto* g = static_cast<Gate*>(p);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!g->open.load()) {
    if (std::chrono::steady_clock::now() > until) {
      g->timed_out = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// n i32 of device memory, read on a stream of its own (not ordered after the backend's).
std::vector<int32_t> read_aside(const int32_t* d, size_t n) {
  cudaStream_t side = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  std::vector<int32_t> h(n);
  cuda_ok(cudaMemcpyAsync(h.data(), d, n * 4, cudaMemcpyDeviceToHost, side), "read aside");
  cuda_ok(cudaStreamSynchronize(side), "cudaStreamSynchronize");
  cuda_ok(cudaStreamDestroy(side), "cudaStreamDestroy");
  return h;
}

// The model's batch upload (Backend::prefetch, two buffers used in turn) overlaps the ops issued
// before it: its copies complete while the compute stream is held by ops issued before it (an
// upload in stream order would wait for them); the ops issued after it see the data; and a copy
// into a buffer that ops issued before the previous prefetch read waits for them.
TEST(BackendOpsCuda, PrefetchOverlapsTheOpsBeforeIt) {
  PB_REQUIRE_CUDA_DEVICE();
  auto be = make_cuda_backend(0, CudaBackendOptions{});  // no wait after each op
  auto* cb = dynamic_cast<CudaBackend*>(be.get());
  ASSERT_NE(cb, nullptr);
  auto rng = make_rng(604);
  const int64_t n = 4099;
  auto ints = [&] { return random_ints(rng, static_cast<size_t>(n), -1000000, 1000000); };
  const std::vector<int32_t> a0 = ints(), a1 = ints(), b1 = ints(), a2 = ints(), b2 = ints();
  DevBuf<int32_t> a({n}), b({n}), c({n}), c2({n});
  // An op issued after a prefetch sees its data (the stream waits for the copies): the backend's
  // stream alone is waited for.
  be->prefetch({{a.tensor(), a0.data()}});
  be->copy(c.tensor(), a.tensor());
  be->synchronize();
  EXPECT_EQ(c.values(), a0) << "an op issued after a prefetch did not see its data";

  be->prefetch({{b.tensor(), b1.data()}});  // the buffers in turn: b, a, b, a, b
  be->prefetch({{a.tensor(), a1.data()}});
  // The stream is held; an op issued after it reads a (the previous micro-step's batch).
  Gate gate;
  cuda_ok(cudaLaunchHostFunc(cb->stream(), hold_stream, &gate), "cudaLaunchHostFunc");
  be->copy(c.tensor(), a.tensor());
  // The next prefetch, into the other buffer, waits only for the ops before the previous one.
  const std::vector<int32_t> b3 = ints();
  be->prefetch({{b.tensor(), b3.data()}});
  cuda_ok(cudaStreamSynchronize(cb->copy_stream()), "cudaStreamSynchronize");
  EXPECT_EQ(read_aside(b.data(), static_cast<size_t>(n)), b3)
      << "the prefetch did not complete while the ops issued before it were held";
  gate.open = true;
  be->synchronize();
  EXPECT_FALSE(gate.timed_out.load());
  EXPECT_EQ(c.values(), a1) << "an op issued after a prefetch did not see its data";
  EXPECT_EQ(b.values(), b3);

  // Held again: an op reads a, then a prefetch into b, then one into a again, which must wait
  // for that op (issued before the previous prefetch): the copy stream is synchronised while
  // the hold lasts, and the op still reads a's old values.
  Gate gate2;
  cuda_ok(cudaLaunchHostFunc(cb->stream(), hold_stream, &gate2), "cudaLaunchHostFunc");
  be->copy(c2.tensor(), a.tensor());
  be->prefetch({{b.tensor(), b2.data()}});
  be->prefetch({{a.tensor(), a2.data()}});
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gate2.open = true;
  });
  cuda_ok(cudaStreamSynchronize(cb->copy_stream()), "cudaStreamSynchronize");
  opener.join();
  be->synchronize();
  EXPECT_FALSE(gate2.timed_out.load());
  EXPECT_EQ(c2.values(), a1) << "a prefetch overwrote a buffer before an earlier op read it";
  EXPECT_EQ(a.values(), a2);
  EXPECT_EQ(b.values(), b2);
  EXPECT_TRUE(a.guards_intact() && b.guards_intact() && c.guards_intact() && c2.guards_intact());
}

// ---- CUDA graphs ------------------------------------------------------------------------------
// Random values of scale `scale` into an f32, bf16 or f16 buffer (16-bit ones rounded).
void fill_random(std::mt19937_64& rng, GuardedBytes& g, float scale) {
  const std::vector<float> v = random_floats(rng, g.size(), scale);
  if (g.dtype() == DType::f32) {
    g.set_bytes(v.data());
  } else {
    const std::vector<uint16_t> bits = round16(g.dtype(), v);
    g.set_bytes(bits.data());
  }
}

// The ops `issue` enqueues, captured on the backend's stream and instantiated; destroyed with it.
// An op's error or the capture's is a test failure and leaves exec null.
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};
std::unique_ptr<CapturedGraph> capture(CudaBackend& cb, const std::function<void()>& issue) {
  auto g = std::make_unique<CapturedGraph>();
  EXPECT_EQ(cudaStreamBeginCapture(cb.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::string error;
  try {
    issue();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(cb.stream(), &g->graph);
  EXPECT_EQ(error, "") << "an op failed during the capture";
  EXPECT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
  if (error.empty() && ended == cudaSuccess) {
    EXPECT_EQ(cudaGraphInstantiate(&g->exec, g->graph, 0), cudaSuccess);
  }
  return g;
}

// A CUDA backend as the trainer makes it: no index validation (which reads back and waits).
std::unique_ptr<Backend> trainer_backend() {
  CudaBackendOptions o;
  o.validate_indices = false;
  return make_cuda_backend(0, o);
}
CudaBackend& as_cuda(Backend& b) { return dynamic_cast<CudaBackend&>(b); }

// A device buffer of dtype t filled by fill_random.
std::unique_ptr<GuardedBytes> dev_random(std::mt19937_64& rng, DType t, std::vector<int64_t> dims,
                                         float scale) {
  auto g = std::make_unique<GuardedBytes>(cuda_memory(), t, std::move(dims));
  fill_random(rng, *g, scale);
  return g;
}

// Graph readiness of an encoder layer's ops: after one eager run (which sizes the backend's
// scratch, workspaces and attention work list), the forward and backward of a layer -- linear
// with bias and GELU epilogues, attention with dropout over the grouped multi-stream launch,
// residual LayerNorm with dropout -- captured on the backend's stream end the capture without
// error (no host wait, allocation or pageable copy inside, every forked stream joined) and the
// graph's replay writes the same bits as the eager run, in fp32 and bf16.
TEST(BackendOpsCuda, EncoderOpsCaptureIntoAGraph) {
  PB_REQUIRE_CUDA_DEVICE();
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    auto be = trainer_backend();
    CudaBackend* cb = &as_cuda(*be);
    auto rng = make_rng(605);
    const int heads = 2;
    const int64_t h = 64 * heads, inter = 4 * h;
    const std::vector<int32_t> lens = {30, 1, 65, 129};
    const HostLayout hl = unpadded(lens, random_sample_ids(rng, lens.size()));
    const int64_t rows = hl.rows;
    DevLayout dl(hl);
    SeqLayout l = dl.view();
    l.host_seq_len = lens.data();
    const float p = 0.1f;
    const Dropout att = make_dropout(p, rng(), DropoutSite::attention_probs, 1, 7);
    const Dropout res = make_dropout(p, rng(), DropoutSite::ffn_output, 1, 7);
    auto act = [&](std::vector<int64_t> dims) { return dev_random(rng, t, std::move(dims), 1.f); };
    auto f32 = [&](std::vector<int64_t> dims, float scale = 1.f) {
      return dev_random(rng, DType::f32, std::move(dims), scale);
    };
    // Inputs (read only).
    auto x = act({rows, h}), wqkv = dev_random(rng, t, {3 * h, h}, 0.1f), bqkv = f32({3 * h});
    auto w1 = dev_random(rng, t, {inter, h}, 0.1f), b1 = f32({inter});
    auto gamma = f32({h}), beta = f32({h}), dy = act({rows, h});
    // Written by the layer.
    auto qkv = act({rows, 3 * h}), ctx = act({rows, h}), lse = f32({rows, heads});
    auto ln_in = act({rows, h}), mean = f32({rows}), rstd = f32({rows}), y = act({rows, h});
    auto pre = act({rows, inter}), gel = act({rows, inter});
    auto dln_out = act({rows, h}), dres = act({rows, h}), dctx = act({rows, h});
    auto dqkv = act({rows, 3 * h}), dx = act({rows, h}), dgel = act({rows, inter});
    auto dbias = f32({h}), dgamma = f32({h}), dbeta = f32({h}), dwqkv = f32({3 * h, h});
    auto dbqkv = f32({3 * h}), dw1 = f32({inter, h}), db1 = f32({inter});
    const std::vector<GuardedBytes*> written = {
        qkv.get(),   ctx.get(),   lse.get(),  ln_in.get(),   mean.get(),   rstd.get(),
        y.get(),     pre.get(),   gel.get(),  dln_out.get(), dres.get(),   dctx.get(),
        dqkv.get(),  dx.get(),    dgel.get(), dbias.get(),   dgamma.get(), dbeta.get(),
        dwqkv.get(), dbqkv.get(), dw1.get(),  db1.get()};
    const LayerNormParams ln{gamma->tensor(), beta->tensor()};
    auto layer = [&] {
      for (GuardedBytes* g :
           {dbias.get(), dgamma.get(), dbeta.get(), dwqkv.get(), dbqkv.get(), dw1.get(), db1.get()})
        be->zero(g->tensor());  // the gradients accumulate
      be->linear_forward(x->tensor(), wqkv->tensor(), bqkv->tensor(), Epilogue::bias, qkv->tensor(),
                         Tensor());
      be->attention_forward(l, qkv->tensor(), heads, 0, att, ctx->tensor(), lse->tensor());
      be->residual_layernorm_forward(l, ctx->tensor(), Tensor(), x->tensor(), ln, res, y->tensor(),
                                     ln_in->tensor(), mean->tensor(), rstd->tensor());
      be->linear_forward(y->tensor(), w1->tensor(), b1->tensor(), Epilogue::bias_gelu,
                         gel->tensor(), pre->tensor());
      // Backward: a GELU MLP's first GEMM (dgel is the gradient wrt gel, made from dy), the
      // LayerNorm, attention and the QKV projection.
      be->copy(dgel->tensor(), gel->tensor());
      LinearBackwardOptions lo;
      lo.out_gelu_pre = pre->tensor();
      be->linear_backward(y->tensor(), w1->tensor(), dgel->tensor(), dln_out->tensor(),
                          dw1->tensor(), db1->tensor(), lo);
      be->residual_layernorm_backward(l, dln_out->tensor(), ln_in->tensor(), mean->tensor(),
                                      rstd->tensor(), ln, res, dctx->tensor(), dres->tensor(),
                                      false, dbias->tensor(), {dgamma->tensor(), dbeta->tensor()});
      be->attention_backward(l, qkv->tensor(), ctx->tensor(), lse->tensor(), dctx->tensor(), heads,
                             0, att, dqkv->tensor());
      be->linear_backward(x->tensor(), wqkv->tensor(), dqkv->tensor(), dx->tensor(),
                          dwqkv->tensor(), dbqkv->tensor());
    };
    layer();  // eager: sizes what the ops keep
    be->synchronize();
    std::vector<std::vector<uint8_t>> eager;
    for (GuardedBytes* g : written) eager.push_back(g->bytes());
    for (GuardedBytes* g : written) be->zero(g->tensor());

    const auto graph = capture(*cb, layer);
    ASSERT_NE(graph->exec, nullptr);
    be->synchronize();
    for (size_t i = 0; i < written.size(); ++i) {  // the capture ran nothing
      const std::vector<uint8_t> b = written[i]->bytes();
      EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](uint8_t v) { return v == 0; }))
          << "tensor " << i << " was written during the capture";
    }
    ASSERT_EQ(cudaGraphLaunch(graph->exec, cb->stream()), cudaSuccess);
    be->synchronize();
    for (size_t i = 0; i < written.size(); ++i) {
      EXPECT_EQ(written[i]->bytes(), eager[i]) << "tensor " << i << " differs after the replay";
      EXPECT_TRUE(written[i]->guards_intact()) << "tensor " << i;
    }
  }
}

// SeqLayout::fixed_launch: attention in one grid sized by the bound, from num_seqs and max_len
// alone. Bit for bit the length-bucketed launch's results, and a graph captured over one batch
// replays correctly over another of the same rows, sequences and bound but other lengths,
// positions and inputs (its layout arrays and inputs rewritten in place), in fp32 and bf16.
TEST(BackendOpsCuda, FixedLaunchAttentionReplaysOverNewBatches) {
  PB_REQUIRE_CUDA_DEVICE();
  const int heads = 2;
  const int64_t h = 64 * heads;
  const int32_t bound = 160;  // the slot length of the padded layout
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    auto be = trainer_backend();
    CudaBackend* cb = &as_cuda(*be);
    auto rng = make_rng(606);
    auto lengths = [&] {
      std::vector<int32_t> v = random_ints(rng, 5, 1, bound);
      v[0] = bound;  // a full slot and a one-token sequence always
      v[1] = 1;
      return v;
    };
    const std::vector<int32_t> lens_a = lengths(), lens_b = lengths();
    const HostLayout ha = padded(lens_a, random_sample_ids(rng, lens_a.size()), bound);
    const HostLayout hb = padded(lens_b, random_sample_ids(rng, lens_b.size()), bound);
    ASSERT_EQ(ha.rows, hb.rows);
    const int64_t rows = ha.rows;
    DevLayout dl(ha);
    SeqLayout fixed = dl.view();
    fixed.max_len = bound;
    fixed.fixed_launch = true;
    SeqLayout bucketed = dl.view();  // the same device arrays, planned from the lengths
    const Dropout d = make_dropout(0.1f, rng(), DropoutSite::attention_probs, 3, 11);
    auto qkv = dev_random(rng, t, {rows, 3 * h}, 2.f), dy = dev_random(rng, t, {rows, h}, 1.f);
    auto out = dev_random(rng, t, {rows, h}, 1.f), dqkv = dev_random(rng, t, {rows, 3 * h}, 1.f);
    auto lse = dev_random(rng, DType::f32, {rows, heads}, 1.f);
    const std::vector<GuardedBytes*> written = {out.get(), lse.get(), dqkv.get()};
    auto attention = [&](const SeqLayout& l) {
      be->attention_forward(l, qkv->tensor(), heads, 0, d, out->tensor(), lse->tensor());
      be->attention_backward(l, qkv->tensor(), out->tensor(), lse->tensor(), dy->tensor(), heads, 0,
                             d, dqkv->tensor());
    };
    auto results = [&] {
      be->synchronize();
      std::vector<std::vector<uint8_t>> r;
      for (GuardedBytes* g : written) r.push_back(g->bytes());
      return r;
    };
    const char* names[] = {"out", "lse", "dqkv"};
    // Batch a: the fixed launch against the bucketed one.
    bucketed.host_seq_len = lens_a.data();
    attention(bucketed);
    const auto want_a = results();
    for (GuardedBytes* g : written) be->zero(g->tensor());
    attention(fixed);
    const auto got_a = results();
    for (size_t i = 0; i < written.size(); ++i)
      EXPECT_EQ(got_a[i], want_a[i]) << names[i] << ": the fixed launch differs";

    // Captured over batch a, replayed over batch b.
    const auto graph = capture(*cb, [&] { attention(fixed); });
    ASSERT_NE(graph->exec, nullptr);
    be->synchronize();
    dl.seq_start.set(hb.seq_start);
    dl.seq_len.set(hb.seq_len);
    dl.sample_id.set(hb.sample_id);
    dl.token_seq.set(hb.token_seq);
    dl.token_pos.set(hb.token_pos);
    fill_random(rng, *qkv, 2.f);
    fill_random(rng, *dy, 1.f);
    bucketed.host_seq_len = lens_b.data();
    attention(bucketed);
    const auto want_b = results();
    ASSERT_NE(want_b[0], want_a[0]);
    for (GuardedBytes* g : written) be->zero(g->tensor());
    ASSERT_EQ(cudaGraphLaunch(graph->exec, cb->stream()), cudaSuccess);
    const auto got_b = results();
    for (size_t i = 0; i < written.size(); ++i) {
      EXPECT_EQ(got_b[i], want_b[i]) << names[i] << ": the replay over batch b differs";
      EXPECT_TRUE(written[i]->guards_intact()) << names[i];
    }
  }
}

// Dropout::device_step: the ops that draw masks (embedding, residual LayerNorm, attention;
// forward and backward) read the step from device memory when they run. A graph captured while
// that memory holds one step and replayed after it was set to another writes the bits of an
// eager run at the other step, in fp32 and bf16.
TEST(BackendOpsCuda, DropoutStepIsReadWhenTheOpsRun) {
  PB_REQUIRE_CUDA_DEVICE();
  const int heads = 2;
  const int64_t h = 64 * heads, vocab = 50, positions = 200;
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    auto be = trainer_backend();
    CudaBackend* cb = &as_cuda(*be);
    auto rng = make_rng(607);
    const std::vector<int32_t> lens = {77, 1, 130};
    const HostLayout hl = unpadded(lens, random_sample_ids(rng, lens.size()));
    const int64_t rows = hl.rows;
    DevLayout dl(hl);
    SeqLayout l = dl.view();
    l.host_seq_len = lens.data();
    DevBuf<int32_t> ids({rows}, random_ints(rng, static_cast<size_t>(rows), 0, vocab - 1));
    DevBuf<int32_t> seg({rows}, random_ints(rng, static_cast<size_t>(rows), 0, 1));
    const uint32_t step_a = 17, step_b = 4242;
    DevBuf<int32_t> step({1}, {static_cast<int32_t>(step_a)});
    auto tab = [&](std::vector<int64_t> dims) { return dev_random(rng, t, std::move(dims), 0.5f); };
    auto f32 = [&](std::vector<int64_t> dims) {
      return dev_random(rng, DType::f32, std::move(dims), 1.f);
    };
    auto word = tab({vocab, h}), pos = tab({positions, h}), type = tab({2, h});
    auto gamma = f32({h}), beta = f32({h});
    auto qkv = dev_random(rng, t, {rows, 3 * h}, 2.f), dy = dev_random(rng, t, {rows, h}, 1.f);
    auto emb = tab({rows, h}), emb_mean = f32({rows}), emb_rstd = f32({rows}),
         demb = tab({rows, h});
    auto ctx = tab({rows, h}), lse = f32({rows, heads}), dqkv = tab({rows, 3 * h});
    auto y = tab({rows, h}), ln_in = tab({rows, h}), mean = f32({rows}), rstd = f32({rows});
    auto dctx = tab({rows, h}), dres = tab({rows, h});
    auto gword = f32({vocab, h}), gpos = f32({positions, h}), gtype = f32({2, h});
    auto ggamma = f32({h}), gbeta = f32({h}), dbias = f32({h}), dlg = f32({h}), dlb = f32({h});
    const std::vector<GuardedBytes*> written = {
        emb.get(),   emb_mean.get(), emb_rstd.get(), ctx.get(),   lse.get(),    y.get(),
        ln_in.get(), mean.get(),     rstd.get(),     dctx.get(),  dres.get(),   dqkv.get(),
        demb.get(),  gword.get(),    gpos.get(),     gtype.get(), ggamma.get(), gbeta.get(),
        dbias.get(), dlg.get(),      dlb.get()};
    const EmbeddingParams ep{word->tensor(), pos->tensor(), type->tensor(), gamma->tensor(),
                             beta->tensor()};
    const EmbeddingParams eg{gword->tensor(), gpos->tensor(), gtype->tensor(), ggamma->tensor(),
                             gbeta->tensor()};
    const LayerNormParams ln{gamma->tensor(), beta->tensor()};
    const uint64_t seed = rng();
    // The ops at host step `host_step`, with the device step or without it (issued, not
    // waited for).
    auto issue = [&](uint32_t host_step, bool device) {
      auto drop = [&](DropoutSite site, float p) {
        Dropout d = make_dropout(p, seed, site, 2, host_step);
        if (device) d.device_step = step.tensor();
        return d;
      };
      const Dropout de = drop(DropoutSite::embedding, 0.1f);
      const Dropout da = drop(DropoutSite::attention_probs, 0.1f);
      const Dropout dr = drop(DropoutSite::attention_output, 0.1f);
      for (GuardedBytes* g : {gword.get(), gpos.get(), gtype.get(), ggamma.get(), gbeta.get(),
                              dbias.get(), dlg.get(), dlb.get()})
        be->zero(g->tensor());
      be->embedding_forward(l, ids.tensor(), seg.tensor(), ep, de, emb->tensor(),
                            emb_mean->tensor(), emb_rstd->tensor());
      be->attention_forward(l, qkv->tensor(), heads, 0, da, ctx->tensor(), lse->tensor());
      be->residual_layernorm_forward(l, ctx->tensor(), beta->tensor(), emb->tensor(), ln, dr,
                                     y->tensor(), ln_in->tensor(), mean->tensor(), rstd->tensor());
      be->residual_layernorm_backward(l, dy->tensor(), ln_in->tensor(), mean->tensor(),
                                      rstd->tensor(), ln, dr, dctx->tensor(), dres->tensor(), false,
                                      dbias->tensor(), {dlg->tensor(), dlb->tensor()});
      be->attention_backward(l, qkv->tensor(), ctx->tensor(), lse->tensor(), dctx->tensor(), heads,
                             0, da, dqkv->tensor());
      be->copy(demb->tensor(), dres->tensor());
      be->embedding_backward(l, ids.tensor(), seg.tensor(), ep, de, emb_mean->tensor(),
                             emb_rstd->tensor(), demb->tensor(), eg);
    };
    auto results = [&] {
      be->synchronize();
      std::vector<std::vector<uint8_t>> r;
      for (GuardedBytes* g : written) r.push_back(g->bytes());
      for (GuardedBytes* g : written) be->zero(g->tensor());
      return r;
    };
    auto differ = [&](const std::vector<std::vector<uint8_t>>& a,
                      const std::vector<std::vector<uint8_t>>& b) {
      std::string which;
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) which += " " + std::to_string(i);
      return which;
    };
    issue(step_a, false);
    const auto at_a = results();
    issue(step_b, false);
    const auto at_b = results();
    // The masks are the step's: the embedding output, the attention context and the gradients
    // of qkv and the word table differ between the steps (statistics taken before a dropout,
    // lse and the LayerNorm beta's gradient do not).
    for (size_t i : {0, 3, 11, 13})
      EXPECT_TRUE(at_a[i] != at_b[i]) << "tensor " << i << " is the same at both steps";
    issue(step_a, true);
    EXPECT_EQ(differ(results(), at_a), "") << "the device step, equal to the host's, changed these";

    // Captured while the device step holds step_a, replayed after it was set to step_b.
    const auto graph = capture(*cb, [&] { issue(step_a, true); });
    ASSERT_NE(graph->exec, nullptr);
    be->synchronize();
    step.set({static_cast<int32_t>(step_b)});
    ASSERT_EQ(cudaGraphLaunch(graph->exec, cb->stream()), cudaSuccess);
    EXPECT_EQ(differ(results(), at_b), "") << "the replay at step_b differs in these";
    step.set({static_cast<int32_t>(step_a)});
    ASSERT_EQ(cudaGraphLaunch(graph->exec, cb->stream()), cudaSuccess);
    EXPECT_EQ(differ(results(), at_a), "") << "the replay at step_a differs in these";
    for (GuardedBytes* g : written) EXPECT_TRUE(g->guards_intact());
  }
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(BackendOps, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
