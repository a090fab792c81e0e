// attention_forward / attention_backward: mixed lengths 1..200 against the double reference and
// finite differences, with and without dropout, and the same bits in every layout.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"
#include "reference_ops.h"

namespace packbert::test {
namespace {

using ref::Vec;

Dropout attn_dropout(float p, uint64_t seed) {
  Dropout d;
  d.p = p;
  d.seed = seed;
  d.step = 77;
  d.layer = 3;
  d.site = DropoutSite::attention_probs;
  return d;
}

DropoutStream stream_of(const Dropout& d) {
  return make_dropout_stream(d.p, d.seed, d.step, d.layer, static_cast<uint32_t>(d.site));
}

// Lengths 1..200 with the edge cases always present (1, 2, odd, 200) and random others.
std::vector<int32_t> mixed_lengths(std::mt19937_64& rng, int extra) {
  std::vector<int32_t> lens = {1, 200, 2, 3, 17, 64, 127};
  for (int i = 0; i < extra; ++i) lens.push_back(1 + static_cast<int32_t>(rng() % 200));
  std::shuffle(lens.begin(), lens.end(), rng);
  return lens;
}

struct AttnRun {
  std::vector<float> out, lse, dqkv;
};

AttnRun run_attention(Backend& be, const HostLayout& l, const std::vector<float>& qkv,
                      const std::vector<float>& dout, int64_t hidden, int heads, const Dropout& d) {
  AttnRun r;
  Guarded<float> out({l.rows, hidden}), lse({l.rows, heads}), dqkv({l.rows, 3 * hidden});
  be.attention_forward(l.view(), view(qkv.data(), {l.rows, 3 * hidden}), heads, d, out.tensor(),
                       lse.tensor());
  EXPECT_OUTPUT_OK(out);
  EXPECT_OUTPUT_OK(lse);
  if (!dout.empty()) {
    be.attention_backward(l.view(), view(qkv.data(), {l.rows, 3 * hidden}), out.tensor(),
                          lse.tensor(), view(dout.data(), {l.rows, hidden}), heads, d,
                          dqkv.tensor());
    EXPECT_OUTPUT_OK(dqkv);
    r.dqkv = dqkv.values();
  }
  r.out = out.values();
  r.lse = lse.values();
  return r;
}

void check_forward(int64_t hidden, int heads, float p, uint64_t salt) {
  auto rng = make_rng(salt);
  auto be = make_cpu_backend();
  const auto lens = mixed_lengths(rng, 6);
  const HostLayout l = packed(lens, random_sample_ids(rng, lens.size()), 256);
  const auto qkv = random_floats(rng, l.rows * 3 * hidden, 2.f);
  const Dropout d = attn_dropout(p, rng());
  const AttnRun got = run_attention(*be, l, qkv, {}, hidden, heads, d);

  Vec want_out(l.rows * hidden, 0.0), want_lse(l.rows * heads, 0.0);
  const Vec qd = to_double(qkv);
  for (size_t s = 0; s < lens.size(); ++s) {
    Vec lse;
    const Vec o = ref::attention_seq(qd, l, s, heads, hidden, stream_of(d), &lse);
    for (int32_t i = 0; i < lens[s]; ++i) {
      std::copy_n(o.begin() + i * hidden, hidden, want_out.begin() + l.row(s, i) * hidden);
      std::copy_n(lse.begin() + i * heads, heads, want_lse.begin() + l.row(s, i) * heads);
    }
  }
  const std::string what = fmt::format("attention_forward lens 1..200 H={} heads={} p={}", hidden, heads, p);
  expect_close(what, to_double(got.out), want_out, kTol);  // padding rows: both 0
  expect_close(what + " lse", to_double(got.lse), want_lse, kTol);
}

TEST(Attention, ForwardMatchesDoubleMixedLengths) {
  check_forward(48, 3, 0.f, 41);
  check_forward(48, 3, 0.1f, 42);
  check_forward(14, 2, 0.1f, 43);  // odd head dim 7
}

// Gradient wrt qkv against central differences of the double forward of L = sum(r * out).
// Perturbing a coordinate only changes its own sequence, so each difference recomputes one
// sequence. `coords` = 0 checks every coordinate.
void check_backward(const std::vector<int32_t>& lens, int64_t hidden, int heads, float p,
                    size_t coords, uint64_t salt) {
  auto rng = make_rng(salt);
  auto be = make_cpu_backend();
  const HostLayout l = packed(lens, random_sample_ids(rng, lens.size()), 256);
  const int64_t ld = 3 * hidden;
  const auto qkv = random_floats(rng, l.rows * ld, 2.f);
  const auto r = random_floats(rng, l.rows * hidden);
  const Dropout d = attn_dropout(p, rng());
  const AttnRun got = run_attention(*be, l, qkv, r, hidden, heads, d);

  Vec qd = to_double(qkv);
  const Vec rd = to_double(r);
  const std::vector<size_t> idx = coords ? some_coords(rng, qd.size(), coords) : all_coords(qd.size());
  Vec fd;
  for (size_t i : idx) {
    const int64_t row = static_cast<int64_t>(i) / ld;
    const int32_t s = l.token_seq[row];
    if (s < 0) {  // padding: not an input of anything
      fd.push_back(0.0);
      continue;
    }
    auto loss = [&](const Vec& q) {
      const Vec o = ref::attention_seq(q, l, s, heads, hidden, stream_of(d));
      double sum = 0;
      for (int32_t t = 0; t < lens[s]; ++t)
        for (int64_t c = 0; c < hidden; ++c) sum += rd[l.row(s, t) * hidden + c] * o[t * hidden + c];
      return sum;
    };
    fd.push_back(fd_gradient(loss, qd, {i})[0]);
  }
  const std::string what = fmt::format("attention_backward dqkv ({} seqs, max len {}) H={} heads={} p={} (FD)",
                                       lens.size(), l.max_len, hidden, heads, p);
  expect_close(what, pick(to_double(got.dqkv), idx), fd, kTol);
}

TEST(Attention, BackwardMatchesFiniteDifferencesSmall) {
  check_backward({1, 2, 5, 8, 3}, 8, 2, 0.f, 0, 51);
  check_backward({1, 2, 5, 8, 3}, 8, 2, 0.2f, 0, 52);
}

TEST(Attention, BackwardMatchesFiniteDifferencesMixedLengths) {
  auto rng = make_rng(53);
  check_backward(mixed_lengths(rng, 2), 32, 2, 0.f, 300, 54);
  check_backward(mixed_lengths(rng, 2), 32, 2, 0.1f, 300, 55);
}

// The same sequences unpadded, packed and padded give the same bits per sequence: out, lse and
// dqkv, with dropout on (masks keyed by sample and position, not row).
TEST(Attention, LayoutsGiveIdenticalResults) {
  auto rng = make_rng(56);
  auto be = make_cpu_backend();
  const auto lens = mixed_lengths(rng, 5);
  const auto sids = random_sample_ids(rng, lens.size());
  const int64_t hidden = 32;
  const int heads = 4;
  const HostLayout base = unpadded(lens, sids);
  const auto qkv = random_floats(rng, base.rows * 3 * hidden, 2.f);
  const auto dout = random_floats(rng, base.rows * hidden);
  const Dropout d = attn_dropout(0.1f, rng());
  const AttnRun a = run_attention(*be, base, qkv, dout, hidden, heads, d);
  for (const HostLayout& l : {packed(lens, sids, 256), padded(lens, sids, 200)}) {
    const AttnRun b = run_attention(*be, l, relayout(qkv, base, l, 3 * hidden, 0.25f),
                                    relayout(dout, base, l, hidden, 0.f), hidden, heads, d);
    EXPECT_EQ(relayout(b.out, l, base, hidden, 0.f), a.out);
    EXPECT_EQ(relayout(b.lse, l, base, heads, 0.f), a.lse);
    EXPECT_EQ(relayout(b.dqkv, l, base, 3 * hidden, 0.f), a.dqkv);
    // Padding rows hold zeros in every output.
    for (int64_t row = 0; row < l.rows; ++row) {
      if (l.token_seq[row] >= 0) continue;
      for (int64_t c = 0; c < hidden; ++c) ASSERT_EQ(b.out[row * hidden + c], 0.f);
      for (int64_t c = 0; c < 3 * hidden; ++c) ASSERT_EQ(b.dqkv[row * 3 * hidden + c], 0.f);
    }
  }
}

// Same bits with 1 and 2 threads (tasks own disjoint outputs and sum in a fixed order).
TEST(Attention, ThreadCountDoesNotChangeBits) {
  auto rng = make_rng(57);
  auto be = make_cpu_backend();
  const auto lens = mixed_lengths(rng, 3);
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  const auto qkv = random_floats(rng, l.rows * 96, 2.f);
  const auto dout = random_floats(rng, l.rows * 32);
  const Dropout d = attn_dropout(0.1f, rng());
  const int before = cpu::num_threads();
  cpu::set_num_threads(1);
  const AttnRun one = run_attention(*be, l, qkv, dout, 32, 2, d);
  cpu::set_num_threads(2);
  const AttnRun two = run_attention(*be, l, qkv, dout, 32, 2, d);
  cpu::set_num_threads(before);
  EXPECT_EQ(one.out, two.out);
  EXPECT_EQ(one.lse, two.lse);
  EXPECT_EQ(one.dqkv, two.dqkv);
}

TEST(Attention, RejectsBadLayouts) {
  auto be = make_cpu_backend();
  HostLayout l = unpadded({3, 4}, {1, 2});
  std::vector<float> qkv(l.rows * 24, 0.5f), out(l.rows * 8), lse(l.rows * 2);
  auto call = [&](const HostLayout& bad) {
    be->attention_forward(bad.view(), view(qkv.data(), {l.rows, 24}), 2, Dropout(),
                          view(out.data(), {l.rows, 8}), view(lse.data(), {l.rows, 2}));
  };
  EXPECT_NO_THROW(call(l));
  HostLayout overlap = l;
  overlap.seq_start[1] = 2;  // sequences overlap
  EXPECT_THROW(call(overlap), Error);
  HostLayout long_seq = l;
  long_seq.max_len = 3;  // shorter than sequence 1
  EXPECT_THROW(call(long_seq), Error);
  HostLayout bad_id = l;
  bad_id.sample_id[0] = int64_t{1} << 44;  // beyond the dropout key
  EXPECT_THROW(call(bad_id), Error);
  EXPECT_THROW(be->attention_forward(l.view(), view(qkv.data(), {l.rows, 24}), 5, Dropout(),
                                     view(out.data(), {l.rows, 8}), view(lse.data(), {l.rows, 2})),
               Error);  // 8 not divisible by 5 heads
}

}  // namespace
}  // namespace packbert::test
