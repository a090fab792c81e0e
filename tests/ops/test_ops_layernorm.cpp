// embedding_* and residual_layernorm_*: against double loops, finite differences, and the
// layout invariance of dropout (the same sequences in any placement give the same bits).
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "ops_test_util.h"
#include "reference_ops.h"

namespace packbert::test {
namespace {

using ref::Vec;

// Host-side tables of an embedding, with their views.
struct Embedding {
  int64_t vocab, positions, types, hidden;
  std::vector<float> word, pos, type, gamma, beta;
  Embedding(std::mt19937_64& rng, int64_t v, int64_t p, int64_t t, int64_t h)
      : vocab(v), positions(p), types(t), hidden(h), word(random_floats(rng, v * h)),
        pos(random_floats(rng, p * h)), type(random_floats(rng, t * h)),
        gamma(random_floats(rng, h)), beta(random_floats(rng, h)) {
    for (auto& g : gamma) g += 1.5f;  // LayerNorm scales near 1, like trained BERT
  }
  EmbeddingParams params() const {
    return {view(word.data(), {vocab, hidden}), view(pos.data(), {positions, hidden}),
            view(type.data(), {types, hidden}), view(gamma.data(), {hidden}),
            view(beta.data(), {hidden})};
  }
  ref::EmbeddingInputs doubles() const {
    return {to_double(word), to_double(pos), to_double(type), to_double(gamma), to_double(beta), hidden};
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

Dropout make_dropout(float p, uint64_t seed, DropoutSite site, uint32_t layer = 0) {
  Dropout d;
  d.p = p;
  d.seed = seed;
  d.step = 1234;
  d.layer = layer;
  d.site = site;
  return d;
}

TEST(Embedding, ForwardMatchesDouble) {
  auto rng = make_rng(21);
  auto be = make_cpu_backend();
  for (float p : {0.f, 0.1f}) {
    for (int64_t h : {37, 768}) {
      const Embedding e(rng, 97, 64, 2, h);
      const std::vector<int32_t> lens = {5, 64, 1, 33};
      const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 64);
      std::vector<int32_t> ids, segs;
      random_tokens(rng, l, e.vocab, e.types, ids, segs);
      const Dropout d = make_dropout(p, rng(), DropoutSite::embedding);
      Guarded<float> out({l.rows, h}), mean({l.rows}), rstd({l.rows});
      be->embedding_forward(l.view(), view(ids.data(), {l.rows}), view(segs.data(), {l.rows}),
                            e.params(), d, out.tensor(), mean.tensor(), rstd.tensor());
      Vec want_mean, want_rstd;
      const Vec want = ref::embedding(e.doubles(), ids, segs, l,
                                      make_dropout_stream(p, d.seed, d.step, 0, 0), &want_mean,
                                      &want_rstd);
      const std::string what = fmt::format("embedding_forward H={} p={}", h, p);
      EXPECT_OUTPUT_OK(out);
      EXPECT_OUTPUT_OK(mean);
      EXPECT_OUTPUT_OK(rstd);
      expect_close(what, out.doubles(), want, kTol);
      // Row means are near 0, so their error is measured against the spread of the row (the
      // scale LayerNorm divides out): mean - m_ref in units of 1 / rstd.
      Vec mean_err(l.rows), zeros(l.rows, 0.0);
      for (int64_t r = 0; r < l.rows; ++r) mean_err[r] = (mean.data()[r] - want_mean[r]) * want_rstd[r];
      const double mean_rms = rel_l2(mean_err, zeros) / std::sqrt(static_cast<double>(l.rows));
      expect_measure(what + " mean (x rstd)", mean_rms, kTol);
      expect_close(what + " rstd", rstd.doubles(), want_rstd, kTol);
    }
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  auto rng = make_rng(22);
  auto be = make_cpu_backend();
  const Embedding e(rng, 11, 8, 2, 10);
  const std::vector<int32_t> lens = {3, 1, 6, 4};
  const HostLayout l = padded(lens, random_sample_ids(rng, lens.size()), 8);
  std::vector<int32_t> ids, segs;
  random_tokens(rng, l, e.vocab, e.types, ids, segs);
  const Dropout d = make_dropout(0.25f, rng(), DropoutSite::embedding);
  const DropoutStream ds = make_dropout_stream(d.p, d.seed, d.step, 0, 0);
  const int64_t h = e.hidden;

  std::vector<float> out(l.rows * h), mean(l.rows), rstd(l.rows);
  be->embedding_forward(l.view(), view(ids.data(), {l.rows}), view(segs.data(), {l.rows}),
                        e.params(), d, view(out.data(), {l.rows, h}), view(mean.data(), {l.rows}),
                        view(rstd.data(), {l.rows}));
  // The objective weights r are zero on padding rows; dout there holds garbage that the op
  // must ignore ("padding rows add nothing").
  std::vector<float> r = random_floats(rng, l.rows * h);
  std::vector<float> dout = r;
  for (int64_t row = 0; row < l.rows; ++row)
    if (l.token_seq[row] < 0)
      for (int64_t c = 0; c < h; ++c) r[row * h + c] = 0.f;
  const Vec rd = to_double(r);

  const auto w0 = random_floats(rng, e.word.size()), p0 = random_floats(rng, e.pos.size()),
             t0 = random_floats(rng, e.type.size()), g0 = random_floats(rng, h),
             b0 = random_floats(rng, h);
  Guarded<float> dw({e.vocab, h}, w0), dp({e.positions, h}, p0), dt({e.types, h}, t0),
      dg({h}, g0), db({h}, b0);
  const EmbeddingParams grads{dw.tensor(), dp.tensor(), dt.tensor(), dg.tensor(), db.tensor()};
  be->embedding_backward(l.view(), view(ids.data(), {l.rows}), view(segs.data(), {l.rows}),
                         e.params(), d, view(mean.data(), {l.rows}), view(rstd.data(), {l.rows}),
                         view(dout.data(), {l.rows, h}), grads);

  ref::EmbeddingInputs in = e.doubles();
  auto check = [&](const char* what, Vec& param, Guarded<float>& got, const std::vector<float>& init) {
    const Vec g = fd_gradient(
        [&](const Vec&) { return dot_d(rd, ref::embedding(in, ids, segs, l, ds)); }, param,
        all_coords(param.size()));
    Vec inc = got.doubles();
    for (size_t i = 0; i < inc.size(); ++i) inc[i] -= init[i];
    EXPECT_TRUE(got.guards_intact()) << what;
    expect_close(fmt::format("embedding_backward d{} (FD)", what), inc, g, kTol);
  };
  check("word", in.word, dw, w0);
  check("position", in.pos, dp, p0);
  check("token_type", in.type, dt, t0);
  check("gamma", in.gamma, dg, g0);
  check("beta", in.beta, db, b0);
}

// Forward/backward of h = dropout(x + bias) + residual; out = LN(h), with every optional part.
struct ResidualCase {
  bool bias, residual;
  float p;
};

void check_residual_ln(const ResidualCase& c, int64_t h, uint64_t salt) {
  auto rng = make_rng(salt);
  auto be = make_cpu_backend();
  const std::vector<int32_t> lens = {4, 1, 7};
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  const int64_t rows = l.rows;
  const auto x = random_floats(rng, rows * h), bias = random_floats(rng, h),
             res = random_floats(rng, rows * h), gamma = random_floats(rng, h),
             beta = random_floats(rng, h), r = random_floats(rng, rows * h);
  const Dropout d = make_dropout(c.p, rng(), DropoutSite::attention_output, 5);
  const DropoutStream ds = make_dropout_stream(c.p, d.seed, d.step, d.layer,
                                               static_cast<uint32_t>(d.site));
  const std::string what = fmt::format("residual_layernorm{}{} p={} H={}", c.bias ? " +bias" : "",
                                       c.residual ? " +residual" : "", c.p, h);

  Guarded<float> out({rows, h}), hin({rows, h}), mean({rows}), rstd({rows});
  const LayerNormParams ln{view(gamma.data(), {h}), view(beta.data(), {h})};
  be->residual_layernorm_forward(l.view(), view(x.data(), {rows, h}),
                                 c.bias ? view(bias.data(), {h}) : Tensor(),
                                 c.residual ? view(res.data(), {rows, h}) : Tensor(), ln, d,
                                 out.tensor(), hin.tensor(), mean.tensor(), rstd.tensor());
  Vec xv = to_double(x), bv = c.bias ? to_double(bias) : Vec(), rv = c.residual ? to_double(res) : Vec(),
      gv = to_double(gamma), betav = to_double(beta);
  Vec want_hin, want_mean, want_rstd;
  const Vec want = ref::residual_layernorm(xv, bv, rv, gv, betav, rows, h, &l, ds, &want_hin,
                                           &want_mean, &want_rstd);
  for (auto* g : {&out, &hin, &mean, &rstd}) EXPECT_OUTPUT_OK(*g);
  expect_close(what + " forward", out.doubles(), want, kTol);
  expect_close(what + " forward ln_in", hin.doubles(), want_hin, kTol);
  expect_close(what + " forward rstd", rstd.doubles(), want_rstd, kTol);

  // Backward; with dropout on, dresidual aliases dout (the documented in-place use), else it is
  // a guarded buffer of its own.
  std::vector<float> dout = r;
  const auto b0 = random_floats(rng, h), g0 = random_floats(rng, h), be0 = random_floats(rng, h);
  Guarded<float> dx({rows, h}), dres({rows, h}), dbias({h}, b0), dgamma({h}, g0), dbeta({h}, be0);
  const bool alias = c.p > 0;
  be->residual_layernorm_backward(l.view(), view(dout.data(), {rows, h}), hin.tensor(),
                                  mean.tensor(), rstd.tensor(), ln, d, dx.tensor(),
                                  !c.residual ? Tensor() : alias ? view(dout.data(), {rows, h}) : dres.tensor(),
                                  c.bias ? dbias.tensor() : Tensor(),
                                  LayerNormParams{dgamma.tensor(), dbeta.tensor()});
  const Vec rd = to_double(r);
  auto loss = [&] { return dot_d(rd, ref::residual_layernorm(xv, bv, rv, gv, betav, rows, h, &l, ds)); };
  // Central differences on (at most) 600 random coordinates of each input: wide rows make a
  // full sweep quadratic in H.
  auto check = [&](const std::string& name, const Vec& got, Vec& param) {
    const auto idx = some_coords(rng, param.size(), 600);
    const Vec fd = fd_gradient([&](const Vec&) { return loss(); }, param, idx);
    expect_close(what + " " + name + " (FD)", pick(got, idx), fd, kTol);
  };
  auto inc = [](const Guarded<float>& g, const std::vector<float>& init) {
    Vec v = g.doubles();
    for (size_t i = 0; i < v.size(); ++i) v[i] -= init[i];
    return v;
  };
  EXPECT_OUTPUT_OK(dx);
  check("dx", dx.doubles(), xv);
  if (c.residual && !alias) EXPECT_OUTPUT_OK(dres);
  if (c.residual) check("dresidual", alias ? to_double(dout) : dres.doubles(), rv);
  if (c.bias) check("dbias", inc(dbias, b0), bv);
  check("dgamma", inc(dgamma, g0), gv);
  check("dbeta", inc(dbeta, be0), betav);
  for (auto* g : {&dbias, &dgamma, &dbeta}) EXPECT_TRUE(g->guards_intact());
}

TEST(ResidualLayerNorm, MatchesDoubleAndFiniteDifferences) {
  check_residual_ln({true, true, 0.1f}, 24, 31);
  check_residual_ln({true, true, 0.f}, 13, 32);
  check_residual_ln({false, false, 0.f}, 16, 33);  // the MLM transform's plain LayerNorm
  check_residual_ln({true, false, 0.3f}, 9, 34);
  check_residual_ln({false, true, 0.1f}, 768, 35);
}

// ln_in may alias x (x becomes h), with the same results.
TEST(ResidualLayerNorm, LnInMayAliasX) {
  auto rng = make_rng(36);
  auto be = make_cpu_backend();
  const HostLayout l = unpadded({3, 5}, random_sample_ids(rng, 2));
  const int64_t rows = l.rows, h = 20;
  const auto x = random_floats(rng, rows * h), bias = random_floats(rng, h),
             res = random_floats(rng, rows * h), gamma = random_floats(rng, h), beta = random_floats(rng, h);
  const LayerNormParams ln{view(gamma.data(), {h}), view(beta.data(), {h})};
  const Dropout d = make_dropout(0.2f, rng(), DropoutSite::ffn_output, 2);
  std::vector<float> out1(rows * h), hin1(rows * h), out2(rows * h), m(rows), s(rows);
  be->residual_layernorm_forward(l.view(), view(x.data(), {rows, h}), view(bias.data(), {h}),
                                 view(res.data(), {rows, h}), ln, d, view(out1.data(), {rows, h}),
                                 view(hin1.data(), {rows, h}), view(m.data(), {rows}), view(s.data(), {rows}));
  std::vector<float> x2 = x;
  be->residual_layernorm_forward(l.view(), view(x2.data(), {rows, h}), view(bias.data(), {h}),
                                 view(res.data(), {rows, h}), ln, d, view(out2.data(), {rows, h}),
                                 view(x2.data(), {rows, h}), view(m.data(), {rows}), view(s.data(), {rows}));
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
                          e.params(), demb, view(o.emb.data(), {l.rows, h}), view(m.data(), {l.rows}),
                          view(s.data(), {l.rows}));
    be->residual_layernorm_forward(l.view(), view(x2.data(), {l.rows, h}), Tensor(),
                                   view(r2.data(), {l.rows, h}), ln, dres,
                                   view(o.ln.data(), {l.rows, h}), view(hin.data(), {l.rows, h}),
                                   view(m.data(), {l.rows}), view(s.data(), {l.rows}));
    be->residual_layernorm_backward(l.view(), view(dy2.data(), {l.rows, h}), view(hin.data(), {l.rows, h}),
                                    view(m.data(), {l.rows}), view(s.data(), {l.rows}), ln, dres,
                                    view(o.dx.data(), {l.rows, h}), Tensor(), Tensor(), {});
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
                          Dropout(), view(out.data(), {3, 4}), view(m.data(), {3}), view(s.data(), {3}));
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("embedding_forward: row 1 has token id 10"), std::string::npos)
        << err.what();
  }
}

}  // namespace
}  // namespace packbert::test
