// attention_forward / attention_backward: the same bits in every layout and with any thread
// count, global and with a local window; window 0 is a window wider than every sequence; a
// local window's query block never reads keys beyond its window's reach; bad layouts and
// negative windows refused. Their cases against the double reference and finite differences
// (mixed lengths 1..200, with and without dropout, global and windowed) are the op table's
// (op_cases.h), run by test_ops_reference.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_backend.h"
#include "op_cases.h"
#include "ops_test_util.h"

namespace packbert::test {
namespace {

struct AttnRun {
  std::vector<float> out, lse, dqkv;
};

// finite: every output element must be finite (else only the guards are checked).
AttnRun run_attention(Backend& be, const HostLayout& l, const std::vector<float>& qkv,
                      const std::vector<float>& dout, int64_t hidden, int heads, const Dropout& d,
                      int64_t window = 0, bool finite = true) {
  AttnRun r;
  Guarded<float> out({l.rows, hidden}), lse({l.rows, heads}), dqkv({l.rows, 3 * hidden});
  be.attention_forward(l.view(), view(qkv.data(), {l.rows, 3 * hidden}), heads, window, d,
                       out.tensor(), lse.tensor());
  if (finite) {
    EXPECT_OUTPUT_OK(out);
    EXPECT_OUTPUT_OK(lse);
  }
  if (!dout.empty()) {
    be.attention_backward(l.view(), view(qkv.data(), {l.rows, 3 * hidden}), out.tensor(),
                          lse.tensor(), view(dout.data(), {l.rows, hidden}), heads, window, d,
                          dqkv.tensor());
    if (finite) EXPECT_OUTPUT_OK(dqkv);
    EXPECT_TRUE(dqkv.guards_intact());
    r.dqkv = dqkv.values();
  }
  EXPECT_TRUE(out.guards_intact() && lse.guards_intact());
  r.out = out.values();
  r.lse = lse.values();
  return r;
}

// The same sequences unpadded, packed and padded give the same bits per sequence: out, lse and
// dqkv, with dropout on (masks keyed by sample and position, not row), global and with a local
// window (positions inside each sequence: a window never reaches a neighbour in the pack).
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
  for (int64_t window : {int64_t{0}, int64_t{7}, int64_t{40}}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const AttnRun a = run_attention(*be, base, qkv, dout, hidden, heads, d, window);
    for (const HostLayout& l : {packed(lens, sids, 256), padded(lens, sids, 200)}) {
      const AttnRun b =
          run_attention(*be, l, relayout(qkv, base, l, 3 * hidden, 0.25f),
                        relayout(dout, base, l, hidden, 0.f), hidden, heads, d, window);
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
}

// Window 0 is global attention: the same bits as any window whose half-width reaches every key
// of the longest sequence (w / 2 >= max_len - 1), odd or even; a narrower one differs.
TEST(Attention, WindowZeroIsAWindowWiderThanEverySequence) {
  auto rng = make_rng(58);
  auto be = make_cpu_backend();
  const auto lens = mixed_lengths(rng, 4);
  const HostLayout l = packed(lens, random_sample_ids(rng, lens.size()), 256);
  const auto qkv = random_floats(rng, l.rows * 96, 2.f);
  const auto dout = random_floats(rng, l.rows * 32);
  const Dropout d = make_dropout(0.1f, rng(), DropoutSite::attention_probs, 3, 77);
  const AttnRun global = run_attention(*be, l, qkv, dout, 32, 2, d, 0);
  const int64_t m = l.max_len;
  for (int64_t window : {2 * (m - 1), 2 * m - 1, 2 * m, int64_t{1} << 40}) {
    const AttnRun wide = run_attention(*be, l, qkv, dout, 32, 2, d, window);
    EXPECT_EQ(wide.out, global.out) << "window " << window;
    EXPECT_EQ(wide.lse, global.lse) << "window " << window;
    EXPECT_EQ(wide.dqkv, global.dqkv) << "window " << window;
  }
  const AttnRun narrower = run_attention(*be, l, qkv, dout, 32, 2, d, 2 * (m - 2));
  EXPECT_NE(narrower.out, global.out);
}

// The CPU's work with a local window of half-width h grows with len x (128 + 2h), not len^2:
// a query block [i0, i0 + 128) (kQueryBlock, cpu_attention.cpp) reads only the keys
// [i0 - h, i0 + 128 + h). Shown without timing: K and V of the first and the last `a` positions
// are NaN, which reaches every output of global attention (a NaN score, a NaN value times a zero
// probability); with the window, every query r with a + 128 + h <= r < len - a - 128 - h, and
// every key j with a + 128 + 2h <= j < len - a - 128 - 2h (whose queries are such), keep the
// bits of the run without NaNs: out, lse, dq; dk, dv. A mask over whole rows, or over the keys
// of a whole block of queries without its window's bounds, would read the NaNs everywhere.
TEST(Attention, LocalWindowReadsOnlyKeysWithinItsReach) {
  auto rng = make_rng(59);
  auto be = make_cpu_backend();
  const int32_t len = 2048, a = 512;
  const int64_t hidden = 32, window = 32, h = window / 2, ld = 3 * hidden;
  const int heads = 2;
  const HostLayout l = unpadded({len}, random_sample_ids(rng, 1));
  const auto qkv = random_floats(rng, l.rows * ld, 2.f);
  const auto dout = random_floats(rng, l.rows * hidden);
  std::vector<float> poisoned = qkv;
  for (int64_t r = 0; r < len; ++r)
    if (r < a || r >= len - a)
      std::fill(poisoned.begin() + r * ld + hidden, poisoned.begin() + (r + 1) * ld,
                std::numeric_limits<float>::quiet_NaN());
  const Dropout d = make_dropout(0.1f, rng(), DropoutSite::attention_probs, 3, 77);
  const AttnRun clean = run_attention(*be, l, qkv, dout, hidden, heads, d, window);
  const AttnRun local = run_attention(*be, l, poisoned, dout, hidden, heads, d, window, false);
  const AttnRun global = run_attention(*be, l, poisoned, dout, hidden, heads, d, 0, false);
  EXPECT_TRUE(std::isnan(global.out[len / 2 * hidden]) && std::isnan(global.dqkv[len / 2 * ld]))
      << "the NaN keys would not reach global attention: the test shows nothing";
  // Rows [from, to) of columns [c0, c0 + n) hold the same bytes.
  auto same = [](const std::vector<float>& x, const std::vector<float>& y, int64_t from, int64_t to,
                 int64_t width, int64_t c0, int64_t n) {
    for (int64_t r = from; r < to; ++r)
      if (std::memcmp(&x[r * width + c0], &y[r * width + c0], n * sizeof(float)) != 0) return false;
    return true;
  };
  const int64_t q0 = a + 128 + h, q1 = len - q0, k0 = a + 128 + 2 * h, k1 = len - k0;
  EXPECT_TRUE(same(local.out, clean.out, q0, q1, hidden, 0, hidden));
  EXPECT_TRUE(same(local.lse, clean.lse, q0, q1, heads, 0, heads));
  EXPECT_TRUE(same(local.dqkv, clean.dqkv, q0, q1, ld, 0, hidden)) << "dq";
  EXPECT_TRUE(same(local.dqkv, clean.dqkv, k0, k1, ld, hidden, 2 * hidden)) << "dk, dv";
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
    be->attention_forward(bad.view(), view(qkv.data(), {l.rows, 24}), 2, 0, Dropout(),
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
  EXPECT_THROW(be->attention_forward(l.view(), view(qkv.data(), {l.rows, 24}), 5, 0, Dropout(),
                                     view(out.data(), {l.rows, 8}), view(lse.data(), {l.rows, 2})),
               Error);  // 8 not divisible by 5 heads
  // A negative window, in both ops, is an error naming it.
  const std::string e = error_of([&] {
    be->attention_forward(l.view(), view(qkv.data(), {l.rows, 24}), 2, -1, Dropout(),
                          view(out.data(), {l.rows, 8}), view(lse.data(), {l.rows, 2}));
  });
  EXPECT_NE(e.find("window -1 is negative"), std::string::npos) << e;
  std::vector<float> dqkv(l.rows * 24);
  EXPECT_THROW(be->attention_backward(l.view(), view(qkv.data(), {l.rows, 24}),
                                      view(out.data(), {l.rows, 8}), view(lse.data(), {l.rows, 2}),
                                      view(out.data(), {l.rows, 8}), 2, -128, Dropout(),
                                      view(dqkv.data(), {l.rows, 24})),
               Error);
}

}  // namespace
}  // namespace packbert::test
