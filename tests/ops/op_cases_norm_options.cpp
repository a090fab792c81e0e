// The norm options of today's encoders on the LayerNorm-family ops: a free epsilon, norms
// without a bias (ln.beta / ln_beta none), the residual stream's gradient of a pre-norm layer
// (residual_layernorm_backward's dresidual_in), and embeddings without a position or token-type
// table (rotary positions, no token types).
//
// The references: the forward against the double loop (reference_ops.h, with the case's eps),
// the backward against central differences of L = sum(r * out) + sum(q * h), h the LayerNorm's
// input and q the gradient dresidual holds on entry (zero without dresidual_in), rel L2 kTol as
// the other LayerNorm cases. The backend cases compare another backend with the CPU on the same
// inputs with the tolerances of the LayerNorm cases (op_cases.h): the options add one addition
// per element (dresidual_in) or remove one (no beta, no table), which the same bound covers.
#include <fmt/format.h>

#include <cmath>
#include <functional>

#include "op_cases.h"
#include "reference_ops.h"

namespace packbert::test {

namespace {

using Vec = std::vector<double>;

// ModernBERT's epsilon, and BERT's.
constexpr float kModernEps = 1e-5f;

struct NormVariant {
  bool beta = true;          // the norm has a bias
  bool dresidual_in = true;  // the backward adds the residual stream's gradient
  float eps = kModernEps;
  std::string name() const {
    return fmt::format("{}{} eps={}", beta ? "beta" : "no beta",
                       dresidual_in ? " +dresidual_in" : "", eps);
  }
};

// fp32, lengths 4, 1, 7 unpadded, bias, residual and dropout p: forward and backward against
// the double loop and central differences (at most 600 random coordinates of each input).
void add_residual_reference(OpCases& cases, const NormVariant& v, float p, int64_t h) {
  OpCase c;
  c.name = fmt::format("residual_layernorm {} p={} H={}", v.name(), p, h);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = {4, 1, 7};
    const HostLayout l = unpadded(lens, random_sample_ids(g, lens.size()));
    const int64_t rows = l.rows;
    const auto x = random_floats(g, rows * h), b = random_floats(g, h),
               res = random_floats(g, rows * h), gamma = random_floats(g, h),
               beta = random_floats(g, h), dy = random_floats(g, rows * h),
               q = random_floats(g, rows * h);
    const Dropout d = make_dropout(p, g(), DropoutSite::ffn_output, 3);
    r.set_dropout(d);
    const SeqLayout sl = r.layout(l);
    const LayerNormParams ln{r.in("gamma", DType::f32, {h}, gamma),
                             v.beta ? r.in("beta", DType::f32, {h}, beta) : Tensor(), v.eps};
    const Tensor hin = r.out("ln_in", DType::f32, {rows, h}, close_to(kTol));
    const Tensor mean = r.out("mean", DType::f32, {rows}, Check{});
    const Tensor rstd = r.out("rstd", DType::f32, {rows}, close_to(kTol));
    r.backend().residual_layernorm_forward(
        sl, r.in("x", DType::f32, {rows, h}, x, unchanged()),
        r.in("bias", DType::f32, {h}, b, unchanged()),
        r.in("residual", DType::f32, {rows, h}, res, unchanged()), ln, d,
        r.out("out", DType::f32, {rows, h}, close_to(kTol)), hin, mean, rstd);
    const Tensor dres = v.dresidual_in
                            ? r.acc("dresidual", DType::f32, {rows, h}, q, close_to(kTol))
                            : r.out("dresidual", DType::f32, {rows, h}, close_to(kTol));
    r.backend().residual_layernorm_backward(
        sl, r.in("dout", DType::f32, {rows, h}, dy, unchanged()), hin, mean, rstd, ln, d,
        r.out("dx", DType::f32, {rows, h}, close_to(kTol)), dres, v.dresidual_in,
        r.acc("dbias", DType::f32, {h}, random_floats(g, h), close_to(kTol)),
        LayerNormParams{r.acc("dgamma", DType::f32, {h}, random_floats(g, h), close_to(kTol)),
                        v.beta
                            ? r.acc("dbeta", DType::f32, {h}, random_floats(g, h), close_to(kTol))
                            : Tensor()});
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const HostLayout& l = cpu.host_layout(0);
    const int64_t rows = l.rows;
    const DropoutStream ds = stream_of(cpu.dropout());
    Vec xv = cpu.doubles("x"), bv = cpu.doubles("bias"), rv = cpu.doubles("residual"),
        gv = cpu.doubles("gamma"), betav = v.beta ? cpu.doubles("beta") : Vec();
    Vec want_hin, want_rstd;
    const Vec want = ref::residual_layernorm(xv, bv, rv, gv, betav, rows, h, &l, ds, &want_hin,
                                             nullptr, &want_rstd, v.eps);
    expect_close(what + " forward", cpu.doubles("out"), want, kTol);
    expect_close(what + " forward ln_in", cpu.doubles("ln_in"), want_hin, kTol);
    expect_close(what + " forward rstd", cpu.doubles("rstd"), want_rstd, kTol);
    const Vec rd = cpu.initial("dout");
    const Vec q = v.dresidual_in ? cpu.initial("dresidual") : Vec(rd.size(), 0.0);
    auto loss = [&] {
      Vec hnow;
      const Vec out = ref::residual_layernorm(xv, bv, rv, gv, betav, rows, h, &l, ds, &hnow,
                                              nullptr, nullptr, v.eps);
      return dot_d(rd, out) + dot_d(q, hnow);
    };
    auto pick_rng = make_rng(std::hash<std::string>{}(what) + 7);
    auto check = [&](const std::string& name, const Vec& got, Vec& param) {
      const auto idx = some_coords(pick_rng, param.size(), 600);
      const Vec fd = fd_gradient([&](const Vec&) { return loss(); }, param, idx);
      expect_close(what + " " + name + " (FD)", pick(got, idx), fd, kTol);
    };
    check("dx", cpu.doubles("dx"), xv);
    check("dresidual", cpu.doubles("dresidual"), rv);
    check("dbias", increments(cpu, "dbias"), bv);
    check("dgamma", increments(cpu, "dgamma"), gv);
    if (v.beta) check("dbeta", increments(cpu, "dbeta"), betav);
  };
  cases.push_back(std::move(c));
}

// Another backend against the CPU: padded layout (64), dropout 0.1, fp32 or 16-bit storage.
void add_residual_backend(OpCases& cases, DType t, const NormVariant& v, int64_t h) {
  const bool lowp = is_lowp(t);
  OpCase c;
  c.dtype = t;
  c.name = fmt::format("residual_layernorm {} {} h {}", dtype_name(t), v.name(), h);
  const Check out_check = lowp ? lowp_match() : close_to(kTol);
  const Check f32_check = close_to(lowp ? kFp32Tol : kTol);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = {1, 33, 12, 64, 7};
    const HostLayout l = padded(lens, random_sample_ids(g, lens.size()), 64);
    const int64_t rows = l.rows;
    const Dropout d = make_dropout(0.1f, g(), DropoutSite::attention_output, 2, 77);
    const float scale = lowp ? 2.f : 1.f;
    const auto x = random_floats(g, rows * h, scale), res = random_floats(g, rows * h, scale);
    const auto gamma = random_floats(g, h), beta = random_floats(g, h);
    const SeqLayout sl = r.layout(l);
    const LayerNormParams ln{r.in("gamma", DType::f32, {h}, gamma),
                             v.beta ? r.in("beta", DType::f32, {h}, beta) : Tensor(), v.eps};
    const Tensor tx = r.in("x", t, {rows, h}, x, out_check);
    const Tensor tres = r.in("residual", t, {rows, h}, res);
    r.backend().residual_layernorm_forward(
        sl, tx, Tensor(), tres, ln, d, r.out("out", t, {rows, h}, out_check), tx,
        r.out("mean", DType::f32, {rows}, lowp ? f32_check : Check{}),
        r.out("rstd", DType::f32, {rows}, f32_check));
    // The CPU backend's saved tensors for the backward.
    HostT hx(t, {rows, h}, x), hres(t, {rows, h}, res), hout(t, {rows, h}),
        hmean(DType::f32, {rows}), hrstd(DType::f32, {rows});
    std::vector<float> hgamma = gamma, hbeta = beta;
    OpRun::host().residual_layernorm_forward(
        l.view(), hx.tensor(), Tensor(), hres.tensor(),
        {hv(hgamma, {h}), v.beta ? hv(hbeta, {h}) : Tensor(), v.eps}, d, hout.tensor(), hx.tensor(),
        hmean.tensor(), hrstd.tensor());
    const auto dy = random_floats(g, rows * h), q = random_floats(g, rows * h);
    const Tensor dres = v.dresidual_in ? r.acc("dresidual", t, {rows, h}, q, out_check)
                                       : r.out("dresidual", t, {rows, h}, out_check);
    r.backend().residual_layernorm_backward(
        sl, r.in("dout", t, {rows, h}, dy, unchanged()),
        r.in_bits("saved ln_in", t, {rows, h}, hx.b.data(), unchanged()),
        r.in_bits("saved mean", DType::f32, {rows}, hmean.b.data()),
        r.in_bits("saved rstd", DType::f32, {rows}, hrstd.b.data()), {ln.gamma, Tensor(), v.eps}, d,
        r.out("dx", t, {rows, h}, out_check), dres, v.dresidual_in, Tensor(),
        {r.acc("dgamma", DType::f32, {h}, random_floats(g, h), f32_check),
         v.beta ? r.acc("dbeta", DType::f32, {h}, random_floats(g, h), f32_check) : Tensor()});
  };
  cases.push_back(std::move(c));
}

OpCases residual_layernorm_option_cases() {
  OpCases cases;
  const NormVariant modern{false, true, kModernEps};
  for (const NormVariant& v :
       {modern, NormVariant{true, true, kModernEps}, NormVariant{false, false, kModernEps},
        NormVariant{true, false, 1e-3f}}) {
    add_residual_reference(cases, v, 0.1f, 24);
    add_residual_backend(cases, DType::f32, v, 130);
  }
  add_residual_reference(cases, modern, 0.f, 768);
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t h : {int64_t{130}, int64_t{768}}) {
      add_residual_backend(cases, t, modern, h);
      add_residual_backend(cases, t, NormVariant{true, true, kModernEps}, h);
    }
  return cases;
}

// ---- embeddings without a position or token-type table ---------------------------------------
struct EmbeddingVariant {
  bool position = false, token_type = false, beta = false;
  float eps = kModernEps;
  std::string name() const {
    return fmt::format("{}{}{} eps={}", position ? "+position" : "no position",
                       token_type ? " +token_type" : " no token_type", beta ? " +beta" : " no beta",
                       eps);
  }
};

// fp32 reference: the forward against the double loop, the backward against central
// differences of L = sum(r * out) over every coordinate of the tables it has (H 10, 11 x 8 x 2
// tables, dropout 0.25, padding rows holding dout values the op must ignore).
void add_embedding_reference(OpCases& cases, const EmbeddingVariant& v) {
  const int64_t h = 10, vocab = 11, positions = 8, types = 2;
  OpCase c;
  c.name = fmt::format("embedding {} H={}", v.name(), h);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = {3, 1, 6, 4};
    const HostLayout l = padded(lens, random_sample_ids(g, lens.size()), positions);
    const int64_t rows = l.rows;
    const auto word = random_floats(g, vocab * h), pos = random_floats(g, positions * h),
               type = random_floats(g, types * h), beta = random_floats(g, h);
    auto gamma = random_floats(g, h);
    for (auto& x : gamma) x += 1.5f;
    auto tok = random_ints(g, rows, 0, static_cast<int32_t>(vocab - 1));
    auto seg = random_ints(g, rows, 0, static_cast<int32_t>(types - 1));
    for (int64_t i = 0; i < rows; ++i)
      if (l.token_seq[i] < 0) tok[i] = 0, seg[i] = 0;
    const Dropout d = make_dropout(0.25f, g(), DropoutSite::embedding);
    r.set_dropout(d);
    const SeqLayout sl = r.layout(l);
    const Tensor ttok = r.in("tokens", {rows}, tok);
    const Tensor tseg = v.token_type ? r.in("segments", {rows}, seg) : Tensor();
    EmbeddingParams ep;
    ep.word = r.in("word", DType::f32, {vocab, h}, word);
    if (v.position) ep.position = r.in("position", DType::f32, {positions, h}, pos);
    if (v.token_type) ep.token_type = r.in("token_type", DType::f32, {types, h}, type);
    ep.ln_gamma = r.in("gamma", DType::f32, {h}, gamma);
    if (v.beta) ep.ln_beta = r.in("beta", DType::f32, {h}, beta);
    ep.ln_eps = v.eps;
    const Tensor mean = r.out("mean", DType::f32, {rows}, Check{});
    const Tensor rstd = r.out("rstd", DType::f32, {rows}, close_to(kTol));
    r.backend().embedding_forward(sl, ttok, tseg, ep, d,
                                  r.out("out", DType::f32, {rows, h}, close_to(kTol)), mean, rstd);
    EmbeddingParams gr;
    gr.word = r.acc("dword", DType::f32, {vocab, h}, random_floats(g, vocab * h), close_to(kTol));
    if (v.position)
      gr.position = r.acc("dposition", DType::f32, {positions, h}, random_floats(g, positions * h),
                          close_to(kTol));
    if (v.token_type)
      gr.token_type =
          r.acc("dtoken_type", DType::f32, {types, h}, random_floats(g, types * h), close_to(kTol));
    gr.ln_gamma = r.acc("dgamma", DType::f32, {h}, random_floats(g, h), close_to(kTol));
    if (v.beta) gr.ln_beta = r.acc("dbeta", DType::f32, {h}, random_floats(g, h), close_to(kTol));
    r.backend().embedding_backward(
        sl, ttok, tseg, ep, d, mean, rstd,
        r.acc("dout (d sum)", DType::f32, {rows, h}, random_floats(g, rows * h), Check{}), gr);
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const HostLayout& l = cpu.host_layout(0);
    const std::vector<int32_t> tok = ints_of(cpu.doubles("tokens"));
    const std::vector<int32_t> seg =
        v.token_type ? ints_of(cpu.doubles("segments")) : std::vector<int32_t>(l.rows, 0);
    ref::EmbeddingInputs in{cpu.doubles("word"),
                            v.position ? cpu.doubles("position") : Vec(),
                            v.token_type ? cpu.doubles("token_type") : Vec(),
                            cpu.doubles("gamma"),
                            v.beta ? cpu.doubles("beta") : Vec(),
                            h,
                            v.eps};
    const DropoutStream ds = stream_of(cpu.dropout());
    Vec want_rstd;
    expect_close(what + " forward", cpu.doubles("out"),
                 ref::embedding(in, tok, seg, l, ds, nullptr, &want_rstd), kTol);
    expect_close(what + " forward rstd", cpu.doubles("rstd"), want_rstd, kTol);
    Vec rd = cpu.initial("dout (d sum)");
    for (int64_t i = 0; i < l.rows; ++i)
      if (l.token_seq[i] < 0)
        for (int64_t k = 0; k < h; ++k) rd[i * h + k] = 0.0;
    auto check = [&](const char* name, Vec& param, const std::string& grad) {
      const Vec fd =
          fd_gradient([&](const Vec&) { return dot_d(rd, ref::embedding(in, tok, seg, l, ds)); },
                      param, all_coords(param.size()));
      expect_close(fmt::format("{} d{} (FD)", what, name), increments(cpu, grad), fd, kTol);
    };
    check("word", in.word, "dword");
    if (v.position) check("position", in.pos, "dposition");
    if (v.token_type) check("token_type", in.type, "dtoken_type");
    check("gamma", in.gamma, "dgamma");
    if (v.beta) check("beta", in.beta, "dbeta");
  };
  cases.push_back(std::move(c));
}

// Another backend against the CPU: unpadded and padded, dropout 0.1, fp32 or 16-bit storage
// (the tables then in the dtype, values exactly representable in it). The backward runs from
// the CPU backend's statistics.
void add_embedding_backend(OpCases& cases, DType t, const EmbeddingVariant& v, bool unpad) {
  const bool lowp = is_lowp(t);
  const int64_t h = 130, vocab = 50, positions = 64;
  OpCase c;
  c.dtype = t;
  c.name =
      fmt::format("embedding {} {} {}", dtype_name(t), v.name(), unpad ? "unpadded" : "padded");
  const Check out_check = lowp ? lowp_match() : close_to(kTol);
  const Check f32_check = close_to(lowp ? kFp32Tol : kTol);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = {1, 17, 64, 3, 9};
    const auto ids = random_sample_ids(g, lens.size());
    const HostLayout l = unpad ? unpadded(lens, ids) : padded(lens, ids, 64);
    const int64_t rows = l.rows;
    const Dropout d = make_dropout(0.1f, g(), DropoutSite::embedding, 0, 99);
    auto table = [&](int64_t n) {
      std::vector<float> x = random_floats(g, n);
      if (lowp)
        for (float& e : x) e = widen16(t, round16(t, e));
      return x;
    };
    const auto word = table(vocab * h), pos = table(positions * h);
    const auto gamma = random_floats(g, h), beta = random_floats(g, h);
    const auto tok = random_ints(g, rows, 0, static_cast<int32_t>(vocab - 1));
    const SeqLayout sl = r.layout(l);
    const Tensor ttok = r.in("tokens", {rows}, tok);
    EmbeddingParams p;
    p.word = r.in("word", t, {vocab, h}, word);
    if (v.position) p.position = r.in("position", t, {positions, h}, pos);
    p.ln_gamma = r.in("gamma", DType::f32, {h}, gamma);
    if (v.beta) p.ln_beta = r.in("beta", DType::f32, {h}, beta);
    p.ln_eps = v.eps;
    r.backend().embedding_forward(sl, ttok, Tensor(), p, d, r.out("out", t, {rows, h}, out_check),
                                  r.out("mean", DType::f32, {rows}, f32_check),
                                  r.out("rstd", DType::f32, {rows}, f32_check));
    HostT hword(t, {vocab, h}, word), hpos(t, {positions, h}, pos), hout(t, {rows, h}),
        hmean(DType::f32, {rows}), hrstd(DType::f32, {rows});
    std::vector<float> hgamma = gamma, hbeta = beta;
    std::vector<int32_t> htok = tok;
    EmbeddingParams hp;
    hp.word = hword.tensor();
    if (v.position) hp.position = hpos.tensor();
    hp.ln_gamma = hv(hgamma, {h});
    if (v.beta) hp.ln_beta = hv(hbeta, {h});
    hp.ln_eps = v.eps;
    OpRun::host().embedding_forward(l.view(), hv(htok, {rows}), Tensor(), hp, d, hout.tensor(),
                                    hmean.tensor(), hrstd.tensor());
    EmbeddingParams gr;
    gr.word = r.acc("dword", DType::f32, {vocab, h}, random_floats(g, vocab * h), f32_check);
    if (v.position)
      gr.position =
          r.acc("dpos", DType::f32, {positions, h}, random_floats(g, positions * h), f32_check);
    gr.ln_gamma = r.acc("dgamma", DType::f32, {h}, random_floats(g, h), f32_check);
    if (v.beta) gr.ln_beta = r.acc("dbeta", DType::f32, {h}, random_floats(g, h), f32_check);
    r.backend().embedding_backward(sl, ttok, Tensor(), p, d,
                                   r.in_bits("saved mean", DType::f32, {rows}, hmean.b.data()),
                                   r.in_bits("saved rstd", DType::f32, {rows}, hrstd.b.data()),
                                   r.acc("dout (d sum)", t, {rows, h}, random_floats(g, rows * h),
                                         lowp ? Check{} : close_to(kTol)),
                                   gr);
  };
  cases.push_back(std::move(c));
}

OpCases embedding_option_cases() {
  OpCases cases;
  const EmbeddingVariant modern{false, false, false, kModernEps};
  for (const EmbeddingVariant& v : {modern, EmbeddingVariant{true, false, true, kModernEps},
                                    EmbeddingVariant{false, true, true, kLayerNormEps}})
    add_embedding_reference(cases, v);
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (bool unpad : {false, true}) {
      add_embedding_backend(cases, t, modern, unpad);
      add_embedding_backend(cases, t, EmbeddingVariant{true, false, true, kModernEps}, unpad);
    }
  return cases;
}

}  // namespace

OpCases norm_option_cases_residual() { return residual_layernorm_option_cases(); }
OpCases norm_option_cases_embedding() { return embedding_option_cases(); }

}  // namespace packbert::test
