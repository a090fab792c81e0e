// One BERT encoder layer composed from the ops exactly as backend.h sketches it: the composed
// gradients match finite differences of a double reference layer, and the unpadded, packed and
// padded layouts give the same outputs and gradients (DESIGN.md, Equivalence), dropout on.
#include <gtest/gtest.h>

#include <map>

#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"
#include "reference_ops.h"

namespace packbert::test {
namespace {

using ref::Vec;

constexpr int64_t kH = 32, kHeads = 4, kF = 64;

// Parameter tensors by name, as floats.
struct Params {
  std::map<std::string, std::vector<float>> p;
  explicit Params(std::mt19937_64& rng) {
    p["wqkv"] = random_floats(rng, 3 * kH * kH, 0.3f);
    p["bqkv"] = random_floats(rng, 3 * kH, 0.1f);
    p["wo"] = random_floats(rng, kH * kH, 0.3f);
    p["bo"] = random_floats(rng, kH, 0.1f);
    p["g1"] = random_floats(rng, kH, 0.2f);
    p["be1"] = random_floats(rng, kH, 0.1f);
    p["w1"] = random_floats(rng, kF * kH, 0.3f);
    p["b1"] = random_floats(rng, kF, 0.1f);
    p["w2"] = random_floats(rng, kH * kF, 0.3f);
    p["b2"] = random_floats(rng, kH, 0.1f);
    p["g2"] = random_floats(rng, kH, 0.2f);
    p["be2"] = random_floats(rng, kH, 0.1f);
    for (auto* g : {&p["g1"], &p["g2"]})
      for (auto& v : *g) v += 1.f;
  }
  Tensor t(const std::string& n, std::initializer_list<int64_t> d) {
    return view(p.at(n).data(), d);
  }
};

Dropout site(float p, uint64_t seed, DropoutSite s) {
  Dropout d;
  d.p = p, d.seed = seed, d.step = 3, d.layer = 5, d.site = s;
  return d;
}

struct LayerResult {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
};

// Forward and backward of one layer in layout l; x and dy are [l.rows, H].
LayerResult run_layer(Backend& be, const HostLayout& hl, Params& w, const std::vector<float>& x,
                      const std::vector<float>& dy, float p, uint64_t seed) {
  const SeqLayout l = hl.view();
  const int64_t t = hl.rows;
  auto buf = [&](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  auto T = [](std::vector<float>& v, std::initializer_list<int64_t> d) {
    return view(v.data(), d);
  };
  const Dropout dp = site(p, seed, DropoutSite::attention_probs),
                da = site(p, seed, DropoutSite::attention_output),
                df = site(p, seed, DropoutSite::ffn_output);
  std::vector<float> xx = x;
  auto qkv = buf(t * 3 * kH), ctx = buf(t * kH), lse = buf(t * kHeads), a = buf(t * kH),
       h1 = buf(t * kH), ln1 = buf(t * kH), m1 = buf(t), r1 = buf(t), f = buf(t * kF),
       pre = buf(t * kF), o = buf(t * kH), ln2 = buf(t * kH), m2 = buf(t), r2 = buf(t);
  LayerResult res;
  res.y = buf(t * kH);
  be.linear_forward(T(xx, {t, kH}), w.t("wqkv", {3 * kH, kH}), w.t("bqkv", {3 * kH}),
                    Epilogue::bias, T(qkv, {t, 3 * kH}), Tensor());
  be.attention_forward(l, T(qkv, {t, 3 * kH}), kHeads, 0, dp, T(ctx, {t, kH}), T(lse, {t, kHeads}));
  be.linear_forward(T(ctx, {t, kH}), w.t("wo", {kH, kH}), Tensor(), Epilogue::none, T(a, {t, kH}),
                    Tensor());
  const LayerNormParams ln1p{w.t("g1", {kH}), w.t("be1", {kH})},
      ln2p{w.t("g2", {kH}), w.t("be2", {kH})};
  be.residual_layernorm_forward(l, T(a, {t, kH}), w.t("bo", {kH}), T(xx, {t, kH}), ln1p, da,
                                T(h1, {t, kH}), T(ln1, {t, kH}), T(m1, {t}), T(r1, {t}));
  be.linear_forward(T(h1, {t, kH}), w.t("w1", {kF, kH}), w.t("b1", {kF}), Epilogue::bias_gelu,
                    T(f, {t, kF}), T(pre, {t, kF}));
  be.linear_forward(T(f, {t, kF}), w.t("w2", {kH, kF}), Tensor(), Epilogue::none, T(o, {t, kH}),
                    Tensor());
  // ln2_in aliases o (the documented in-place use).
  be.residual_layernorm_forward(l, T(o, {t, kH}), w.t("b2", {kH}), T(h1, {t, kH}), ln2p, df,
                                T(res.y, {t, kH}), T(o, {t, kH}), T(m2, {t}), T(r2, {t}));

  for (auto& [n, v] : w.p) res.grads[n].assign(v.size(), 0.f);
  auto G = [&](const std::string& n, std::initializer_list<int64_t> d) {
    return view(res.grads[n].data(), d);
  };
  std::vector<float> d_y = dy;
  auto d_o = buf(t * kH), d_pre = buf(t * kF), d_a = buf(t * kH), d_ctx = buf(t * kH),
       d_qkv = buf(t * 3 * kH);
  res.dx = buf(t * kH);
  // dh1 is the residual gradient, written in place over d_y.
  be.residual_layernorm_backward(l, T(d_y, {t, kH}), T(o, {t, kH}), T(m2, {t}), T(r2, {t}), ln2p,
                                 df, T(d_o, {t, kH}), T(d_y, {t, kH}), false, G("b2", {kH}),
                                 LayerNormParams{G("g2", {kH}), G("be2", {kH})});
  LinearBackwardOptions fused;
  fused.x_gelu_pre = T(pre, {t, kF});
  be.linear_backward(T(f, {t, kF}), w.t("w2", {kH, kF}), T(d_o, {t, kH}), T(d_pre, {t, kF}),
                     G("w2", {kH, kF}), Tensor(), fused);
  LinearBackwardOptions acc;
  acc.dx_accumulate = true;
  be.linear_backward(T(h1, {t, kH}), w.t("w1", {kF, kH}), T(d_pre, {t, kF}), T(d_y, {t, kH}),
                     G("w1", {kF, kH}), G("b1", {kF}), acc);
  be.residual_layernorm_backward(l, T(d_y, {t, kH}), T(ln1, {t, kH}), T(m1, {t}), T(r1, {t}), ln1p,
                                 da, T(d_a, {t, kH}), T(res.dx, {t, kH}), false, G("bo", {kH}),
                                 LayerNormParams{G("g1", {kH}), G("be1", {kH})});
  be.linear_backward(T(ctx, {t, kH}), w.t("wo", {kH, kH}), T(d_a, {t, kH}), T(d_ctx, {t, kH}),
                     G("wo", {kH, kH}), Tensor(), {});
  be.attention_backward(l, T(qkv, {t, 3 * kH}), T(ctx, {t, kH}), T(lse, {t, kHeads}),
                        T(d_ctx, {t, kH}), kHeads, 0, dp, T(d_qkv, {t, 3 * kH}));
  be.linear_backward(T(xx, {t, kH}), w.t("wqkv", {3 * kH, kH}), T(d_qkv, {t, 3 * kH}),
                     T(res.dx, {t, kH}), G("wqkv", {3 * kH, kH}), G("bqkv", {3 * kH}), acc);
  return res;
}

// The same layer in double, from the reference ops.
Vec ref_layer(const HostLayout& l, const std::map<std::string, Vec>& w, const Vec& x, float p,
              uint64_t seed) {
  auto ds = [&](DropoutSite s) {
    const Dropout d = site(p, seed, s);
    return make_dropout_stream(d.p, d.seed, d.step, d.layer, static_cast<uint32_t>(d.site));
  };
  const int64_t t = l.rows;
  const Vec qkv = ref::linear(x, w.at("wqkv"), &w.at("bqkv"), t, kH, 3 * kH);
  Vec ctx(t * kH, 0.0);
  for (size_t s = 0; s < l.seq_len.size(); ++s) {
    const Vec o = ref::attention_seq(qkv, l, s, kHeads, kH, ds(DropoutSite::attention_probs));
    for (int32_t i = 0; i < l.seq_len[s]; ++i)
      std::copy_n(o.begin() + i * kH, kH, ctx.begin() + l.row(s, i) * kH);
  }
  const Vec a = ref::linear(ctx, w.at("wo"), nullptr, t, kH, kH);
  const Vec h1 = ref::residual_layernorm(a, w.at("bo"), x, w.at("g1"), w.at("be1"), t, kH, &l,
                                         ds(DropoutSite::attention_output));
  Vec f = ref::linear(h1, w.at("w1"), &w.at("b1"), t, kH, kF);
  for (auto& v : f) v = ref::gelu(v);
  const Vec o = ref::linear(f, w.at("w2"), nullptr, t, kF, kH);
  return ref::residual_layernorm(o, w.at("b2"), h1, w.at("g2"), w.at("be2"), t, kH, &l,
                                 ds(DropoutSite::ffn_output));
}

TEST(EncoderLayer, ComposedGradientsMatchFiniteDifferences) {
  auto rng = make_rng(91);
  auto be = make_cpu_backend();
  Params w(rng);
  const std::vector<int32_t> lens = {4, 1, 9, 6};
  const HostLayout l = unpadded(lens, random_sample_ids(rng, lens.size()));
  const auto x = random_floats(rng, l.rows * kH), r = random_floats(rng, l.rows * kH);
  const uint64_t seed = rng();
  const float p = 0.1f;
  const LayerResult got = run_layer(*be, l, w, x, r, p, seed);

  std::map<std::string, Vec> wd;
  for (auto& [n, v] : w.p) wd[n] = to_double(v);
  Vec xd = to_double(x);
  const Vec rd = to_double(r);
  expect_close("encoder layer forward", to_double(got.y), ref_layer(l, wd, xd, p, seed), kTol);
  auto loss = [&] { return dot_d(rd, ref_layer(l, wd, xd, p, seed)); };
  auto check = [&](const std::string& what, const std::vector<float>& g, Vec& param) {
    const auto idx = some_coords(rng, param.size(), 60);
    expect_close("encoder layer d" + what + " (FD)", pick(to_double(g), idx),
                 fd_gradient([&](const Vec&) { return loss(); }, param, idx), kTol);
  };
  check("x", got.dx, xd);
  for (auto& [n, v] : wd) check(n, got.grads.at(n), v);
}

TEST(EncoderLayer, LayoutsAreEquivalent) {
  auto rng = make_rng(92);
  auto be = make_cpu_backend();
  Params w(rng);
  std::vector<int32_t> lens;
  for (int i = 0; i < 10; ++i) lens.push_back(1 + static_cast<int32_t>(rng() % 64));
  const auto sids = random_sample_ids(rng, lens.size());
  const HostLayout base = unpadded(lens, sids);
  const auto x = random_floats(rng, base.rows * kH), dy = random_floats(rng, base.rows * kH);
  const uint64_t seed = rng();
  const LayerResult a = run_layer(*be, base, w, x, dy, 0.1f, seed);
  for (const HostLayout& l : {packed(lens, sids, 64), padded(lens, sids, 64)}) {
    // Padding rows hold the [PAD] embedding in real runs: finite values, zero upstream gradient.
    const LayerResult b = run_layer(*be, l, w, relayout(x, base, l, kH, 0.5f),
                                    relayout(dy, base, l, kH, 0.f), 0.1f, seed);
    const std::string name = l.rows == static_cast<int64_t>(lens.size()) * 64 ? "padded" : "packed";
    expect_close("encoder layer " + name + " vs unpadded: y",
                 to_double(relayout(b.y, l, base, kH, 0.f)), to_double(a.y), kTol);
    expect_close("encoder layer " + name + " vs unpadded: dx",
                 to_double(relayout(b.dx, l, base, kH, 0.f)), to_double(a.dx), kTol);
    for (const auto& [n, g] : a.grads)
      expect_close("encoder layer " + name + " vs unpadded: d" + n, to_double(b.grads.at(n)),
                   to_double(g), kTol);
    // Gradients never leak into padding rows.
    for (int64_t row = 0; row < l.rows; ++row) {
      if (l.token_seq[row] >= 0) continue;
      for (int64_t c = 0; c < kH; ++c) ASSERT_EQ(b.dx[row * kH + c], 0.f) << name << " row " << row;
    }
  }
}

}  // namespace
}  // namespace packbert::test
