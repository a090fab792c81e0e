// gpu label: the CUDA attention ops beyond the op table's cases (tests/ops/op_cases.cpp runs the
// fp32 and bf16 / fp16 kernels over every length bucket and layout against the CPU, as
// BackendOps.Attention and BackendOpsLowp.Attention):
// - index validation off changes nothing but the checks: the same bits;
// - lengths given on the host (SeqLayout::host_seq_len) give the same bits, and with validation
//   a copy that disagrees with seq_len is an error naming it;
// - the dtype dispatch: mixes the contract allows go through the adapter, mismatched shapes are
//   errors, an unaligned view and head dim 32 in bf16 still run;
// - a local window: window 0 gives the bits of a window wider than every sequence, and a block
//   reads only the tiles its rows' windows touch.
// Without a device every test prints "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <iostream>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../ops/op_cases.h"
#include "cuda_test_util.h"

namespace packbert::test {
namespace {

// The bf16 output tolerance of the op table (lowp_attention_tol, op_cases.cpp).
constexpr double kBf16OutTol = 1e-2;

// The attention probabilities' dropout of layer 11, step 4321.
Dropout fmha_dropout(float p, uint64_t seed) {
  return make_dropout(p, seed, DropoutSite::attention_probs, 11, 4321);
}

// Lengths of every kind: 1, 2, odd, each bucket bound and one past it, tile edges (63, 64, 65).
const std::vector<int32_t> kMixed =
    kEmulated ? std::vector<int32_t>{1, 3, 17, 63, 64, 65, 127, 129, 200}
              : std::vector<int32_t>{1,   2,   3,   17,  63,  64,  65,  127, 128, 129, 200,
                                     255, 256, 257, 301, 383, 384, 385, 450, 511, 512};

TEST(CudaFmha, WithoutIndexValidation) {
  // validate_indices off: the lengths still come to the host (the plan needs them), nothing
  // else is copied, and the forward and backward give the validated backend's bits.
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = make_rng(105);
  const HostLayout l = packed(kMixed, random_sample_ids(rng, kMixed.size()), 512);
  const int heads = 2;
  const int64_t rows = l.rows, hidden = int64_t{heads} * 64;
  const Dropout d = fmha_dropout(0.1f, rng());
  const std::vector<uint16_t> qkv16 =
      round16(DType::bf16, random_floats(rng, rows * 3 * hidden, 2.f));
  const std::vector<uint16_t> dy16 = round16(DType::bf16, random_floats(rng, rows * hidden));
  DevLayout dl(l);
  Dev16 dq(DType::bf16, {rows, 3 * hidden}, qkv16), ddy(DType::bf16, {rows, hidden}, dy16);
  std::vector<std::vector<uint16_t>> outs, grads;
  std::vector<std::vector<float>> lses;
  for (bool validate : {true, false}) {
    Backends b(validate);
    Dev16 out(DType::bf16, {rows, hidden}), dqkv(DType::bf16, {rows, 3 * hidden});
    DevBuf<float> lse({rows, heads});
    b.gpu->attention_forward(dl.view(), dq.tensor(), heads, 0, d, out.tensor(), lse.tensor());
    b.gpu->attention_backward(dl.view(), dq.tensor(), out.tensor(), lse.tensor(), ddy.tensor(),
                              heads, 0, d, dqkv.tensor());
    EXPECT_EQ(out.non_finite(), 0u);
    EXPECT_EQ(dqkv.non_finite(), 0u);
    outs.push_back(out.bits());
    grads.push_back(dqkv.bits());
    lses.push_back(lse.values());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(lses[0], lses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

// SeqLayout::host_seq_len: without validation the plan comes from the caller's copy (no
// read-back) and the results are the same bits; with validation a copy that disagrees with
// seq_len is an error naming it.
TEST(CudaFmha, HostLengthsGiveTheSameBitsAndAreChecked) {
  PB_REQUIRE_CUDA_DEVICE();
  auto rng = make_rng(106);
  const auto ids = random_sample_ids(rng, kMixed.size());
  const HostLayout l = unpadded(kMixed, ids);
  const int heads = 2;
  const int64_t rows = l.rows, hidden = int64_t{heads} * 64;
  const Dropout d = fmha_dropout(0.1f, rng());
  const std::vector<uint16_t> qkv16 =
      round16(DType::bf16, random_floats(rng, rows * 3 * hidden, 2.f));
  DevLayout dl(l);
  Dev16 dq(DType::bf16, {rows, 3 * hidden}, qkv16);
  Dev16 out_a(DType::bf16, {rows, hidden}), out_b(DType::bf16, {rows, hidden});
  DevBuf<float> lse_a({rows, heads}), lse_b({rows, heads});
  Backends fast(false);
  SeqLayout with_host = dl.view();
  with_host.host_seq_len = l.seq_len.data();
  fast.gpu->attention_forward(dl.view(), dq.tensor(), heads, 0, d, out_a.tensor(), lse_a.tensor());
  fast.gpu->attention_forward(with_host, dq.tensor(), heads, 0, d, out_b.tensor(), lse_b.tensor());
  EXPECT_EQ(out_a.bits(), out_b.bits());
  EXPECT_EQ(lse_a.values(), lse_b.values());

  Backends checked(true);
  std::vector<int32_t> wrong = l.seq_len;
  wrong[3] += 1;
  SeqLayout bad = dl.view();
  bad.host_seq_len = wrong.data();
  const std::string e = error_of([&] {
    checked.gpu->attention_forward(bad, dq.tensor(), heads, 0, d, out_b.tensor(), lse_b.tensor());
  });
  EXPECT_NE(e.find("host_seq_len[3]"), std::string::npos) << e;
}

TEST(CudaFmha, DtypeDispatch) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(107);
  const std::vector<int32_t> lens = {40, 3};
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  DevLayout dl(l);
  const int64_t rows = l.rows;
  const Dropout d = fmha_dropout(0.f, 1);
  const std::vector<uint16_t> qkv16 = round16(DType::bf16, random_floats(rng, rows * 3 * 128, 1.f));
  Dev16 dq(DType::bf16, {rows, 384}, qkv16);
  DevBuf<float> lse({rows, 2});
  // A mix the contract allows (qkv bf16, out f32) goes through the adapter: same result as the
  // CPU on the widened input.
  std::vector<float> qkv = widen16(DType::bf16, qkv16), ref_out(rows * 128), ref_lse(rows * 2);
  b.cpu->attention_forward(l.view(), hv(qkv, {rows, 384}), 2, 0, d, hv(ref_out, {rows, 128}),
                           hv(ref_lse, {rows, 2}));
  DevBuf<float> out32({rows, 128});
  b.gpu->attention_forward(dl.view(), dq.tensor(), 2, 0, d, out32.tensor(), lse.tensor());
  EXPECT_OUTPUT_OK(out32);
  expect_close("fmha dispatch bf16 qkv, f32 out", out32.doubles(), dbl(ref_out), kTol);
  // lse is never low precision; a mismatched shape is an error naming the argument.
  Dev16 out16(DType::bf16, {rows, 128}), lse16(DType::bf16, {rows, 2});
  EXPECT_THROW(
      b.gpu->attention_forward(dl.view(), dq.tensor(), 2, 0, d, out16.tensor(), lse16.tensor()),
      Error);
  Dev16 short_out(DType::bf16, {rows, 64});
  EXPECT_THROW(
      b.gpu->attention_forward(dl.view(), dq.tensor(), 2, 0, d, short_out.tensor(), lse.tensor()),
      Error);
  // A view that is not 16-byte aligned runs too, through the adapter (the result is the
  // widened op's, rounded once: bf16's out tolerance).
  Dev16 big(DType::bf16, {rows * 384 + 8});
  cuda_ok(cudaMemcpy(big.data() + 1, qkv16.data(), qkv16.size() * 2, cudaMemcpyHostToDevice),
          "unaligned qkv");
  const Tensor unaligned(static_cast<void*>(big.data() + 1), DType::bf16, {rows, 384},
                         Device::cuda);
  Dev16 uout(DType::bf16, {rows, 128});
  DevBuf<float> ulse({rows, 2});
  b.gpu->attention_forward(dl.view(), unaligned, 2, 0, d, uout.tensor(), ulse.tensor());
  EXPECT_EQ(uout.non_finite(), 0u);
  const std::vector<float> uo = uout.floats();
  expect_close("fmha dispatch unaligned bf16 qkv", dbl(uo), dbl(ref_out), kBf16OutTol);
  // Head dim 32 in bf16 (no tensor-core kernel for it) still runs, through the adapter.
  Dev16 out_h4(DType::bf16, {rows, 128});
  DevBuf<float> lse_h4({rows, 4});
  b.gpu->attention_forward(dl.view(), dq.tensor(), 4, 0, d, out_h4.tensor(), lse_h4.tensor());
  EXPECT_EQ(out_h4.non_finite(), 0u);
}

// One forward and backward on the GPU from qkv values (rounded to t when 16-bit) and dout: the
// bytes of out, lse and dqkv.
struct WindowRun {
  std::vector<uint8_t> out, lse, dqkv;
};
WindowRun run_window(Backend& gpu, const HostLayout& l, DType t, const std::vector<float>& qkv,
                     const std::vector<float>& dy, int heads, int64_t window, const Dropout& d) {
  const int64_t rows = l.rows, hidden = int64_t{heads} * 64;
  DevLayout dl(l);
  GuardedBytes q(cuda_memory(), t, {rows, 3 * hidden}), g(cuda_memory(), t, {rows, hidden});
  GuardedBytes out(cuda_memory(), t, {rows, hidden}), dqkv(cuda_memory(), t, {rows, 3 * hidden});
  GuardedBytes lse(cuda_memory(), DType::f32, {rows, heads});
  if (t == DType::f32) {
    q.set_bytes(qkv.data());
    g.set_bytes(dy.data());
  } else {
    q.set_bytes(round16(t, qkv).data());
    g.set_bytes(round16(t, dy).data());
  }
  gpu.attention_forward(dl.view(), q.tensor(), heads, window, d, out.tensor(), lse.tensor());
  gpu.attention_backward(dl.view(), q.tensor(), out.tensor(), lse.tensor(), g.tensor(), heads,
                         window, d, dqkv.tensor());
  return {out.bytes(), lse.bytes(), dqkv.bytes()};
}

// Whether rows [from, to) of columns [c0, c0 + n) of two [*, width] buffers of esize-byte
// elements hold the same bytes.
bool same_rows(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t esize,
               int64_t from, int64_t to, int64_t width, int64_t c0, int64_t n) {
  for (int64_t r = from; r < to; ++r) {
    const size_t at = static_cast<size_t>(r * width + c0) * esize;
    if (std::memcmp(&a[at], &b[at], static_cast<size_t>(n) * esize) != 0) return false;
  }
  return true;
}

// Window 0 is global attention: a window whose half-width reaches every key of the longest
// sequence gives the same bits, in fp32 and on the tensor cores.
TEST(CudaFmha, WindowZeroIsAWindowWiderThanEverySequence) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b(false);
  auto rng = make_rng(108);
  const HostLayout l = unpadded(kMixed, random_sample_ids(rng, kMixed.size()));
  const int heads = 2;
  const auto qkv = random_floats(rng, l.rows * 3 * 128, 2.f), dy = random_floats(rng, l.rows * 128);
  const Dropout d = fmha_dropout(0.1f, rng());
  for (DType t : {DType::bf16, DType::f32}) {
    const WindowRun global = run_window(*b.gpu, l, t, qkv, dy, heads, 0, d);
    const WindowRun wide = run_window(*b.gpu, l, t, qkv, dy, heads, 2 * l.max_len, d);
    EXPECT_EQ(wide.out, global.out) << dtype_name(t);
    EXPECT_EQ(wide.lse, global.lse) << dtype_name(t);
    EXPECT_EQ(wide.dqkv, global.dqkv) << dtype_name(t);
  }
}

// A local window of half-width h skips every tile outside its rows' reach (the kernels' loop
// bounds, fmha_mma_common.cuh and attention_kernels.cu). Shown without timing, as the CPU's
// Attention.LocalWindowReadsOnlyKeysWithinItsReach: K and V of the first and the last `a`
// positions are NaN, which global attention carries into every output (a NaN score, or a NaN
// value times a zero probability inside a tile). A block of 64 query rows (16 in fp32) reads the
// K / V tiles from the one holding row0 - h to the one holding row0 + 63 + h: keys within
// 128 + h of each of its queries. So out, lse and dq of every query r with
// a + 128 + h <= r < len - a - 128 - h keep the bits of the run without NaNs. A dK / dV block
// reads the queries within 128 + h of its keys, with their D (dO . O, NaN where O is): dk and dv
// of every key j with a + 256 + 2h <= j < len - a - 256 - 2h keep their bits.
TEST(CudaFmha, LocalWindowSkipsTilesOutsideItsReach) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b(false);
  auto rng = make_rng(109);
  const int32_t len = 2048, a = 512;
  const int heads = 1;
  const int64_t hidden = 64, ld = 3 * hidden, window = 32, h = window / 2;
  const HostLayout l = unpadded({len}, random_sample_ids(rng, 1));
  const auto qkv = random_floats(rng, l.rows * ld, 2.f), dy = random_floats(rng, l.rows * hidden);
  std::vector<float> poisoned = qkv;
  for (int64_t r = 0; r < len; ++r)
    if (r < a || r >= len - a)
      std::fill(poisoned.begin() + r * ld + hidden, poisoned.begin() + (r + 1) * ld,
                std::numeric_limits<float>::quiet_NaN());
  const Dropout d = fmha_dropout(0.1f, rng());
  const int64_t q0 = a + 128 + h, q1 = len - q0, k0 = a + 256 + 2 * h, k1 = len - k0;
  for (DType t : {DType::bf16, DType::f32}) {
    const size_t es = dtype_size(t);
    const WindowRun clean = run_window(*b.gpu, l, t, qkv, dy, heads, window, d);
    const WindowRun local = run_window(*b.gpu, l, t, poisoned, dy, heads, window, d);
    EXPECT_TRUE(same_rows(local.out, clean.out, es, q0, q1, hidden, 0, hidden)) << dtype_name(t);
    EXPECT_TRUE(same_rows(local.lse, clean.lse, 4, q0, q1, heads, 0, heads)) << dtype_name(t);
    EXPECT_TRUE(same_rows(local.dqkv, clean.dqkv, es, q0, q1, ld, 0, hidden))
        << dtype_name(t) << " dq";
    EXPECT_TRUE(same_rows(local.dqkv, clean.dqkv, es, k0, k1, ld, hidden, 2 * hidden))
        << dtype_name(t) << " dk, dv";
  }
  // The NaNs do reach global attention (its forward on the tensor cores; the CPU's test shows
  // the same of every output).
  DevLayout dl(l);
  GuardedBytes q(cuda_memory(), DType::bf16, {l.rows, ld}),
      out(cuda_memory(), DType::bf16, {l.rows, hidden});
  GuardedBytes lse(cuda_memory(), DType::f32, {l.rows, heads});
  q.set_bytes(round16(DType::bf16, poisoned).data());
  b.gpu->attention_forward(dl.view(), q.tensor(), heads, 0, d, out.tensor(), lse.tensor());
  EXPECT_TRUE(std::isnan(out.doubles()[static_cast<size_t>(len / 2 * hidden)]))
      << "the NaN keys would not reach global attention: the test shows nothing";
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaFmha, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
