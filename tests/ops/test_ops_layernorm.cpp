// embedding_* and residual_layernorm_*: the layout invariance of dropout (the same sequences in
// any placement give the same bits), ln_in aliasing x, out-of-range ids. Their cases against
// double loops and finite differences are the op table's (op_cases.h), run by
// test_ops_reference.cpp.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "ops_test_util.h"

namespace packbert::test {
namespace {

// Host-side tables of an embedding, with their views.
struct Embedding {
  int64_t vocab, positions, types, hidden;
  std::vector<float> word, pos, type, gamma, beta;
  Embedding(std::mt19937_64& rng, int64_t v, int64_t p, int64_t t, int64_t h)
      : vocab(v),
        positions(p),
        types(t),
        hidden(h),
        word(random_floats(rng, v * h)),
        pos(random_floats(rng, p * h)),
        type(random_floats(rng, t * h)),
        gamma(random_floats(rng, h)),
        beta(random_floats(rng, h)) {
    for (auto& g : gamma) g += 1.5f;  // LayerNorm scales near 1, like trained BERT
  }
  EmbeddingParams params() const {
    return {view(word.data(), {vocab, hidden}), view(pos.data(), {positions, hidden}),
            view(type.data(), {types, hidden}), view(gamma.data(), {hidden}),
            view(beta.data(), {hidden})};
  }
};

// Token ids of a layout: random in real rows, 0 in padding rows.
void random_tokens(std::mt19937_64& rng, const HostLayout& l, int64_t vocab, int64_t types,
                   std::vector<int32_t>& ids, std::vector<int32_t>& segs) {
  ids = random_ints(rng, l.rows, 0, static_cast<int32_t>(vocab - 1));
  segs = random_ints(rng, l.rows, 0, static_cast<int32_t>(types - 1));
  for (int64_t r = 0; r < l.rows; ++r)
    if (l.token_seq[r] < 0) ids[r] = 0, segs[r] = 0;
}

// ln_in may alias x (x becomes h), with the same results.
TEST(ResidualLayerNorm, LnInMayAliasX) {
  auto rng = make_rng(36);
  auto be = make_cpu_backend();
  const HostLayout l = unpadded({3, 5}, random_sample_ids(rng, 2));
  const int64_t rows = l.rows, h = 20;
  const auto x = random_floats(rng, rows * h), bias = random_floats(rng, h),
             res = random_floats(rng, rows * h), gamma = random_floats(rng, h),
             beta = random_floats(rng, h);
  const LayerNormParams ln{view(gamma.data(), {h}), view(beta.data(), {h})};
  const Dropout d = make_dropout(0.2f, rng(), DropoutSite::ffn_output, 2);
  std::vector<float> out1(rows * h), hin1(rows * h), out2(rows * h), m(rows), s(rows);
  be->residual_layernorm_forward(l.view(), view(x.data(), {rows, h}), view(bias.data(), {h}),
                                 view(res.data(), {rows, h}), ln, d, view(out1.data(), {rows, h}),
                                 view(hin1.data(), {rows, h}), view(m.data(), {rows}),
                                 view(s.data(), {rows}));
  std::vector<float> x2 = x;
  be->residual_layernorm_forward(l.view(), view(x2.data(), {rows, h}), view(bias.data(), {h}),
                                 view(res.data(), {rows, h}), ln, d, view(out2.data(), {rows, h}),
                                 view(x2.data(), {rows, h}), view(m.data(), {rows}),
                                 view(s.data(), {rows}));
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(hin1, x2);
}

// The same sequences unpadded, packed and padded: every token's output is the same bits, so
// dropout masks follow the sample, never the batch position.
TEST(DropoutPlacement, TokenOpsIdenticalInEveryLayout) {
  auto rng = make_rng(37);
  auto be = make_cpu_backend();
  std::vector<int32_t> lens;
  for (int i = 0; i < 9; ++i) lens.push_back(1 + static_cast<int32_t>(rng() % 60));
  const auto sids = random_sample_ids(rng, lens.size());
  const HostLayout base = unpadded(lens, sids);
  const Embedding e(rng, 50, 64, 2, 36);
  const int64_t h = e.hidden;
  std::vector<int32_t> ids, segs;
  random_tokens(rng, base, e.vocab, e.types, ids, segs);
  const auto x = random_floats(rng, base.rows * h), res = random_floats(rng, base.rows * h),
             dy = random_floats(rng, base.rows * h);
  const LayerNormParams ln{view(e.gamma.data(), {h}), view(e.beta.data(), {h})};
  const Dropout demb = make_dropout(0.1f, rng(), DropoutSite::embedding);
  const Dropout dres = make_dropout(0.1f, demb.seed, DropoutSite::ffn_output, 7);

  struct Result {
    std::vector<float> emb, ln, dx;
  };
  auto run = [&](const HostLayout& l) {
    const auto i2 = relayout(ids, base, l, 1, 0), s2 = relayout(segs, base, l, 1, 0);
    const auto x2 = relayout(x, base, l, h, 0.5f), r2 = relayout(res, base, l, h, 0.5f),
               dy2 = relayout(dy, base, l, h, 0.f);
    Result o;
    o.emb.resize(l.rows * h), o.ln.resize(l.rows * h), o.dx.resize(l.rows * h);
    std::vector<float> m(l.rows), s(l.rows), hin(l.rows * h);
    be->embedding_forward(l.view(), view(i2.data(), {l.rows}), view(s2.data(), {l.rows}),
                          e.params(), demb, view(o.emb.data(), {l.rows, h}),
                          view(m.data(), {l.rows}), view(s.data(), {l.rows}));
    be->residual_layernorm_forward(l.view(), view(x2.data(), {l.rows, h}), Tensor(),
                                   view(r2.data(), {l.rows, h}), ln, dres,
                                   view(o.ln.data(), {l.rows, h}), view(hin.data(), {l.rows, h}),
                                   view(m.data(), {l.rows}), view(s.data(), {l.rows}));
    be->residual_layernorm_backward(l.view(), view(dy2.data(), {l.rows, h}),
                                    view(hin.data(), {l.rows, h}), view(m.data(), {l.rows}),
                                    view(s.data(), {l.rows}), ln, dres,
                                    view(o.dx.data(), {l.rows, h}), Tensor(), false, Tensor(), {});
    // Back to the unpadded placement for comparison.
    return Result{relayout(o.emb, l, base, h, 0.f), relayout(o.ln, l, base, h, 0.f),
                  relayout(o.dx, l, base, h, 0.f)};
  };
  const Result a = run(base), b = run(packed(lens, sids, 64)), c = run(padded(lens, sids, 64));
  EXPECT_EQ(a.emb, b.emb);
  EXPECT_EQ(a.emb, c.emb);
  EXPECT_EQ(a.ln, b.ln);
  EXPECT_EQ(a.ln, c.ln);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dx, c.dx);
  // And dropout did drop something.
  size_t zeros = 0;
  for (float v : a.emb) zeros += v == 0.f;
  EXPECT_GT(zeros, 0u);
}

TEST(Embedding, RejectsOutOfRangeIds) {
  auto rng = make_rng(38);
  auto be = make_cpu_backend();
  const Embedding e(rng, 10, 8, 2, 4);
  const HostLayout l = unpadded({3}, {1});
  std::vector<int32_t> ids = {1, 10, 2}, segs = {0, 0, 1};
  std::vector<float> out(12), m(3), s(3);
  try {
    be->embedding_forward(l.view(), view(ids.data(), {3}), view(segs.data(), {3}), e.params(),
                          Dropout(), view(out.data(), {3, 4}), view(m.data(), {3}),
                          view(s.data(), {3}));
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("embedding_forward: row 1 has token id 10"),
              std::string::npos)
        << err.what();
  }
}

}  // namespace
}  // namespace packbert::test
