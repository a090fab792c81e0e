// gpu label: the CUDA attention ops on their two kernel families, through the grouped
// (length-bucketed, multi-stream) launch:
// - bf16 and fp16 tensor-core kernels (fmha_mma_forward.cu, fmha_mma_backward.cu) against the
//   CPU backend's fp32 attention on the SAME inputs, rounded to bf16 / fp16 on the host first,
//   so the only difference is the kernel's own rounding (P and dS rounded to 16 bits before
//   their products, the outputs rounded when stored, D = dO . O from the 16-bit O);
// - the fp32 kernels against the CPU with the existing fp32 tolerances, now that they launch
//   per bucket on several streams.
// Batches mix lengths 1..512 (odd lengths, 1, every bucket bound and one past it, and a length
// above 512), 1-16 heads, with and without dropout, in the unpadded, padded and packed layouts.
// Outputs sit between NaN guards and start as NaN: every element must be written, nothing
// outside, and rows of no sequence must be exactly 0 (out, lse, dqkv). Without a device every
// test prints "skipped: no CUDA device".
//
// Tolerances, relative L2 per tensor (||gpu - cpu|| / ||cpu||):
// - The inputs agree exactly, Q K^T accumulates exact 16-bit products in fp32, so the scores
//   and lse differ by fp32 rounding only: lse 1e-5 (kTol). That error is absolute: two orders of
//   the 64-term sum of products, of magnitude sum |q_i k_i| * scale (8 on average at this test's
//   input scale), plus a few ulps of |lse| (the exp2/log of the online softmax). Relative to |lse|
//   it is unbounded where lse is near 0, and a lone one-token row makes lse its one score, which
//   can be (1.03e-5 relative once, f16, PACKBERT_TEST_SEED=3362857399646797043 before the
//   one-token case had its own test). So the denominator is at least 1 per element: sqrt(count)
//   (expect_close_floor). A float32 model of two summation orders over 200000 one-token draws
//   gives at most 1.1e-6 against it, and the emulated SingleToken over 5000 seeds at most 5.4e-7
//   (margin 18.6; tests/seed_sweeps.txt).
// - out and dqkv: the kernels round P (and P f, dS) to 16 bits before their products and round
//   each result when they store it. A rounding is a relative error <= u (bf16: 8 significant
//   bits, u = 2^-8 = 3.9e-3; fp16: 11 bits, u = 2^-11 = 4.9e-4), roughly uniform: RMS
//   u / sqrt(3) = 2.3e-3 (bf16), 2.8e-4 (fp16). The final store dominates: the internal
//   roundings of P and dS are independent per key and average out over the sum.
// A float64 model of exactly these roundings (tile-wise online softmax, inputs of this test's
// scale, lengths 64..512) gives per-tensor errors of 2.2e-3 .. 2.5e-3 for bf16 and
// 2.9e-4 .. 3.1e-4 for fp16, for out, dq, dk and dv alike. We allow 4x (bf16: 1e-2, DESIGN.md's
// bf16 GPU-vs-CPU tolerance) and 8x (fp16: 2.5e-3). A wrong fragment layout, a wrong dropout
// bit or a missed tile gives errors of order 1, far above both.
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

double out_tol(DType t) { return t == DType::bf16 ? 1e-2 : 2.5e-3; }
double grad_tol(DType t) { return t == DType::bf16 ? 1e-2 : 2.5e-3; }

// The attention probabilities' dropout of layer 11, step 4321.
Dropout fmha_dropout(float p, uint64_t seed) {
  return make_dropout(p, seed, DropoutSite::attention_probs, 11, 4321);
}

// Columns [c0, c0 + w) of every sequence row of a [rows, width] buffer (padding rows left out,
// they are checked for exact zeros separately).
std::vector<double> seq_cols(const std::vector<float>& v, const HostLayout& l, int64_t width,
                             int64_t c0, int64_t w) {
  std::vector<double> r;
  for (int64_t row = 0; row < l.rows; ++row) {
    if (l.token_seq[static_cast<size_t>(row)] < 0) continue;
    for (int64_t c = c0; c < c0 + w; ++c) r.push_back(v[static_cast<size_t>(row * width + c)]);
  }
  return r;
}

// Elements of rows of no sequence that are not exactly +0.
template <typename T>
size_t nonzero_padding(const std::vector<T>& v, const HostLayout& l, int64_t width) {
  size_t bad = 0;
  for (int64_t row = 0; row < l.rows; ++row) {
    if (l.token_seq[static_cast<size_t>(row)] >= 0) continue;
    for (int64_t c = 0; c < width; ++c) {
      const T x = v[static_cast<size_t>(row * width + c)];
      T zero{};
      bad += std::memcmp(&x, &zero, sizeof(T)) != 0;
    }
  }
  return bad;
}

double l2_norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// expect_close with the denominator at least `floor`: dq and dk of sequences of one token are 0
// in exact arithmetic (P = 1, so dS = dP - D = 0) and only rounding noise on both sides, so a
// batch of such sequences is judged against the scale of the whole gradient instead.
void expect_close_floor(const std::string& what, const std::vector<double>& got,
                        const std::vector<double>& want, double floor, double tol) {
  std::vector<double> diff(got.size());
  bool nan = got.size() != want.size();
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    nan = nan || std::isnan(got[i]) || std::isnan(want[i]);
    diff[i] = got[i] - want[i];
  }
  const double den = std::max(l2_norm(want), floor);
  const double e = nan ? std::numeric_limits<double>::infinity()
                       : (den > 0 ? l2_norm(diff) / den : l2_norm(diff));
  expect_measure(what, e, tol);
}

// The CPU's fp32 forward and backward on the given (already rounded) inputs.
struct Reference {
  std::vector<float> out, lse, dqkv;
};
Reference cpu_reference(Backends& b, const HostLayout& l, std::vector<float>& qkv,
                        std::vector<float>& dy, int64_t hidden, int heads, const Dropout& d) {
  const int64_t rows = l.rows;
  Reference r;
  r.out.resize(rows * hidden);
  r.lse.resize(rows * heads);
  r.dqkv.resize(rows * 3 * hidden);
  b.cpu->attention_forward(l.view(), hv(qkv, {rows, 3 * hidden}), heads, d,
                           hv(r.out, {rows, hidden}), hv(r.lse, {rows, heads}));
  b.cpu->attention_backward(l.view(), hv(qkv, {rows, 3 * hidden}), hv(r.out, {rows, hidden}),
                            hv(r.lse, {rows, heads}), hv(dy, {rows, hidden}), heads, d,
                            hv(r.dqkv, {rows, 3 * hidden}));
  return r;
}

// One bf16 / fp16 case: forward and backward against the CPU, guards, padding, determinism.
void lowp_case(Backends& b, std::mt19937_64& rng, DType dt, const HostLayout& l, int heads,
               float p, const std::string& name) {
  const int64_t rows = l.rows, hidden = int64_t{heads} * 64;
  const Dropout d = fmha_dropout(p, rng());
  // Scale 2: scores of std ~1.3, so the softmax is far from uniform.
  const std::vector<uint16_t> qkv16 = round16(dt, random_floats(rng, rows * 3 * hidden, 2.f));
  const std::vector<uint16_t> dy16 = round16(dt, random_floats(rng, rows * hidden));
  std::vector<float> qkv = widen16(dt, qkv16), dy = widen16(dt, dy16);
  const Reference ref = cpu_reference(b, l, qkv, dy, hidden, heads, d);

  DevLayout dl(l);
  Dev16 dq(dt, {rows, 3 * hidden}, qkv16), ddy(dt, {rows, hidden}, dy16);
  Dev16 dout(dt, {rows, hidden}), ddqkv(dt, {rows, 3 * hidden});
  DevBuf<float> dlse({rows, heads});
  b.gpu->attention_forward(dl.view(), dq.tensor(), heads, d, dout.tensor(), dlse.tensor());
  const std::string what =
      fmt::format("fmha {} {} heads{} p{}", dtype_name(dt), name, heads, p);
  EXPECT_TRUE(dout.guards_intact()) << what << " out: write outside the buffer";
  EXPECT_EQ(dout.non_finite(), 0u) << what << " out: unwritten or non-finite elements";
  EXPECT_OUTPUT_OK(dlse);
  const std::vector<float> out = dout.floats(), lse = dlse.values();
  EXPECT_EQ(nonzero_padding(dout.bits(), l, hidden), 0u) << what << " out padding rows";
  EXPECT_EQ(nonzero_padding(lse, l, heads), 0u) << what << " lse padding rows";
  expect_close(what + " out", seq_cols(out, l, hidden, 0, hidden),
               seq_cols(ref.out, l, hidden, 0, hidden), out_tol(dt));
  const std::vector<double> lse_want = seq_cols(ref.lse, l, heads, 0, heads);
  expect_close_floor(what + " lse", seq_cols(lse, l, heads, 0, heads), lse_want,
                     std::sqrt(static_cast<double>(lse_want.size())), kTol);

  // Backward from the GPU's own forward (as in training).
  b.gpu->attention_backward(dl.view(), dq.tensor(), dout.tensor(), dlse.tensor(), ddy.tensor(),
                            heads, d, ddqkv.tensor());
  EXPECT_TRUE(ddqkv.guards_intact()) << what << " dqkv: write outside the buffer";
  EXPECT_EQ(ddqkv.non_finite(), 0u) << what << " dqkv: unwritten or non-finite elements";
  const std::vector<uint16_t> g16 = ddqkv.bits();
  EXPECT_EQ(nonzero_padding(g16, l, 3 * hidden), 0u) << what << " dqkv padding rows";
  const std::vector<float> g = widen16(dt, g16);
  const char* part[] = {"dq", "dk", "dv"};
  const double whole = l2_norm(seq_cols(ref.dqkv, l, 3 * hidden, 0, 3 * hidden));
  for (int s = 0; s < 3; ++s)
    expect_close_floor(what + " " + part[s], seq_cols(g, l, 3 * hidden, s * hidden, hidden),
                       seq_cols(ref.dqkv, l, 3 * hidden, s * hidden, hidden), 1e-2 * whole,
                       grad_tol(dt));

  // Deterministic: the same bits again (no atomics; buckets on other streams change nothing).
  Dev16 dout2(dt, {rows, hidden}), ddqkv2(dt, {rows, 3 * hidden});
  DevBuf<float> dlse2({rows, heads});
  b.gpu->attention_forward(dl.view(), dq.tensor(), heads, d, dout2.tensor(), dlse2.tensor());
  b.gpu->attention_backward(dl.view(), dq.tensor(), dout.tensor(), dlse.tensor(), ddy.tensor(),
                            heads, d, ddqkv2.tensor());
  EXPECT_EQ(dout2.bits(), dout.bits()) << what << " out differs between runs";
  EXPECT_EQ(dlse2.values(), lse) << what << " lse differs between runs";
  EXPECT_EQ(ddqkv2.bits(), g16) << what << " dqkv differs between runs";
}

// Lengths of every kind: 1, 2, odd, each bucket bound and one past it, tile edges (63, 64, 65).
const std::vector<int32_t> kMixed =
    kEmulated ? std::vector<int32_t>{1, 3, 17, 63, 64, 65, 127, 129, 200}
              : std::vector<int32_t>{1,   2,   3,   17,  63,  64,  65,  127, 128, 129, 200,
                                     255, 256, 257, 301, 383, 384, 385, 450, 511, 512};

TEST(CudaFmha, MixedLengthsUnpadded) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(101);
  for (DType dt : {DType::bf16, DType::f16})
    for (float p : {0.f, 0.1f}) {
      const auto ids = random_sample_ids(rng, kMixed.size());
      lowp_case(b, rng, dt, unpadded(kMixed, ids), 2, p, "unpadded mixed");
    }
}

TEST(CudaFmha, PaddedAndPackedLayouts) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(102);
  const std::vector<int32_t> lens = kEmulated ? std::vector<int32_t>{5, 130, 1, 200, 77, 31}
                                              : std::vector<int32_t>{5, 130, 1, 512, 77, 260, 31};
  const int32_t max_len = kEmulated ? 256 : 512;
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto ids = random_sample_ids(rng, lens.size());
    lowp_case(b, rng, dt, padded(lens, ids, max_len), 3, 0.1f, "padded");
    lowp_case(b, rng, dt, packed(lens, ids, max_len), 4, 0.f, "packed");
  }
}

TEST(CudaFmha, ManyHeadsAndHighDropout) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(103);
  const std::vector<int32_t> lens = kEmulated ? std::vector<int32_t>{130, 96, 1, 45}
                                              : std::vector<int32_t>{512, 384, 96, 1, 45};
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto ids = random_sample_ids(rng, lens.size());
    lowp_case(b, rng, dt, unpadded(lens, ids), 16, 0.1f, "BERT-Large heads");
    lowp_case(b, rng, dt, unpadded(lens, ids), 12, 0.5f, "BERT-Base heads, p 0.5");
  }
}

TEST(CudaFmha, SingleToken) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(104);
  // Without dropout: the dq and dk of a lone one-token sequence are 0 in exact arithmetic, and
  // with dropout both kernels return the rounding of the dropout scale in P f (rounded to 16
  // bits for the P V product; 1.6e-3 relative in bf16 at p = 0.1), which the floor below cannot
  // absorb when nothing else sets the gradient's scale: 0.34-0.62 of it in bf16 over four seeds,
  // the same digits on an H200 and in the emulated build. LongSequences keeps a one-token
  // sequence with dropout, among long ones.
  for (DType dt : {DType::bf16, DType::f16})
    lowp_case(b, rng, dt, unpadded({1}, random_sample_ids(rng, 1)), 1, 0.f, "one token");
}

TEST(CudaFmha, LongSequences) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(108);
  // Longer than 512: correct, not tuned (its own bucket).
  const std::vector<int32_t> lens = kEmulated ? std::vector<int32_t>{520, 1}
                                              : std::vector<int32_t>{777, 1, 600};
  for (DType dt : {DType::bf16, DType::f16})
    lowp_case(b, rng, dt, unpadded(lens, random_sample_ids(rng, lens.size())), 2, 0.1f, "long");
}

TEST(CudaFmha, WithoutIndexValidation) {
  // validate_indices off: the lengths still come to the host (the plan needs them), nothing
  // else is copied.
  PB_REQUIRE_CUDA_DEVICE();
  Backends b(false);
  auto rng = make_rng(105);
  const auto ids = random_sample_ids(rng, kMixed.size());
  lowp_case(b, rng, DType::bf16, packed(kMixed, ids, 512), 2, 0.1f, "no validation");
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
  fast.gpu->attention_forward(dl.view(), dq.tensor(), heads, d, out_a.tensor(), lse_a.tensor());
  fast.gpu->attention_forward(with_host, dq.tensor(), heads, d, out_b.tensor(), lse_b.tensor());
  EXPECT_EQ(out_a.bits(), out_b.bits());
  EXPECT_EQ(lse_a.values(), lse_b.values());

  Backends checked(true);
  std::vector<int32_t> wrong = l.seq_len;
  wrong[3] += 1;
  SeqLayout bad = dl.view();
  bad.host_seq_len = wrong.data();
  const std::string e = error_of([&] {
    checked.gpu->attention_forward(bad, dq.tensor(), heads, d, out_b.tensor(), lse_b.tensor());
  });
  EXPECT_NE(e.find("host_seq_len[3]"), std::string::npos) << e;
}

// The fp32 kernels through the grouped launch: the tolerances of the op table (tests/ops/op_cases.h).
void f32_case(Backends& b, std::mt19937_64& rng, const HostLayout& l, int64_t hidden, int heads,
              float p, const std::string& name) {
  const int64_t rows = l.rows;
  const Dropout d = fmha_dropout(p, rng());
  auto qkv = random_floats(rng, rows * 3 * hidden), dy = random_floats(rng, rows * hidden);
  const Reference ref = cpu_reference(b, l, qkv, dy, hidden, heads, d);
  DevLayout dl(l);
  DevBuf<float> dq({rows, 3 * hidden}, qkv), ddy({rows, hidden}, dy), dout({rows, hidden}),
      dlse({rows, heads}), ddqkv({rows, 3 * hidden});
  b.gpu->attention_forward(dl.view(), dq.tensor(), heads, d, dout.tensor(), dlse.tensor());
  const std::string what = fmt::format("fp32 grouped {} H{} heads{} p{}", name, hidden, heads, p);
  EXPECT_OUTPUT_OK(dout);
  EXPECT_OUTPUT_OK(dlse);
  EXPECT_EQ(nonzero_padding(dout.values(), l, hidden), 0u) << what;
  expect_close(what + " out", dout.doubles(), dbl(ref.out), kTol);
  expect_close(what + " lse", dlse.doubles(), dbl(ref.lse), kTol);
  DevBuf<float> hout({rows, hidden}, ref.out), hlse({rows, heads}, ref.lse);
  b.gpu->attention_backward(dl.view(), dq.tensor(), hout.tensor(), hlse.tensor(), ddy.tensor(),
                            heads, d, ddqkv.tensor());
  EXPECT_OUTPUT_OK(ddqkv);
  EXPECT_EQ(nonzero_padding(ddqkv.values(), l, 3 * hidden), 0u) << what;
  expect_close(what + " dqkv", ddqkv.doubles(), dbl(ref.dqkv), kAttnBwdTol);
}

TEST(CudaFmha, Fp32GroupedLaunch) {
  PB_REQUIRE_CUDA_DEVICE();
  Backends b;
  auto rng = make_rng(106);
  for (float p : {0.f, 0.1f}) {
    const auto ids = random_sample_ids(rng, kMixed.size());
    f32_case(b, rng, unpadded(kMixed, ids), 128, 2, p, "unpadded");  // head dim 64
    f32_case(b, rng, padded(kMixed, ids, 512), 96, 3, p, "padded");  // head dim 32
  }
  f32_case(b, rng, unpadded({kEmulated ? 520 : 700, 2}, random_sample_ids(rng, 2)), 64, 2, 0.1f,
           "long");
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
  const std::vector<uint16_t> qkv16 =
      round16(DType::bf16, random_floats(rng, rows * 3 * 128, 1.f));
  Dev16 dq(DType::bf16, {rows, 384}, qkv16);
  DevBuf<float> lse({rows, 2});
  // A mix the contract allows (qkv bf16, out f32) goes through the adapter: same result as the
  // CPU on the widened input.
  std::vector<float> qkv = widen16(DType::bf16, qkv16), ref_out(rows * 128), ref_lse(rows * 2);
  b.cpu->attention_forward(l.view(), hv(qkv, {rows, 384}), 2, d, hv(ref_out, {rows, 128}),
                           hv(ref_lse, {rows, 2}));
  DevBuf<float> out32({rows, 128});
  b.gpu->attention_forward(dl.view(), dq.tensor(), 2, d, out32.tensor(), lse.tensor());
  EXPECT_OUTPUT_OK(out32);
  expect_close("fmha dispatch bf16 qkv, f32 out", out32.doubles(), dbl(ref_out), kTol);
  // lse is never low precision; a mismatched shape is an error naming the argument.
  Dev16 out16(DType::bf16, {rows, 128}), lse16(DType::bf16, {rows, 2});
  EXPECT_THROW(b.gpu->attention_forward(dl.view(), dq.tensor(), 2, d, out16.tensor(),
                                        lse16.tensor()),
               Error);
  Dev16 short_out(DType::bf16, {rows, 64});
  EXPECT_THROW(b.gpu->attention_forward(dl.view(), dq.tensor(), 2, d, short_out.tensor(),
                                        lse.tensor()),
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
  b.gpu->attention_forward(dl.view(), unaligned, 2, d, uout.tensor(), ulse.tensor());
  EXPECT_EQ(uout.non_finite(), 0u);
  const std::vector<float> uo = uout.floats();
  expect_close("fmha dispatch unaligned bf16 qkv", dbl(uo), dbl(ref_out), out_tol(DType::bf16));
  // Head dim 32 in bf16 (no tensor-core kernel for it) still runs, through the adapter.
  Dev16 out_h4(DType::bf16, {rows, 128});
  DevBuf<float> lse_h4({rows, 4});
  b.gpu->attention_forward(dl.view(), dq.tensor(), 4, d, out_h4.tensor(), lse_h4.tensor());
  EXPECT_EQ(out_h4.non_finite(), 0u);
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaFmha, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
