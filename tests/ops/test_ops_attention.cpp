// attention_forward / attention_backward: the same bits in every layout and with any thread
// count, and bad layouts refused. Their cases against the double reference and finite
// differences (mixed lengths 1..200, with and without dropout) are the op table's (op_cases.h),
// run by test_ops_reference.cpp.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "op_cases.h"
#include "ops_test_util.h"

namespace packbert::test {
namespace {

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
  const Dropout d = make_dropout(0.1f, rng(), DropoutSite::attention_probs, 3, 77);
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
  const Dropout d = make_dropout(0.1f, rng(), DropoutSite::attention_probs, 3, 77);
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
