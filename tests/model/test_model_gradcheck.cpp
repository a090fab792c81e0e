// Finite-difference check of the whole model's gradients (every parameter tensor), dropout on:
// its masks are a pure function of the keys, so the loss is a smooth deterministic function of
// the parameters and central differences apply.
//
// fp32 settings. The loss is computed in fp32 (the backend is fp32 end to end), so each
// evaluation carries rounding noise of ~1e-7 of the loss, and a difference quotient with step h
// has noise ~1e-7 |L| / h and truncation error ~h^2 L''' / 6. To keep both small:
//   - a very small model (H = 16, vocab 64, 2 layers), so the ~1000 loss evaluations take a
//     fraction of a second and each parameter matters;
//   - weights ~ N(0, 0.25) and random biases / LayerNorm affine, so that attention is far from
//     uniform and every path (Q/K included) carries gradient; at BERT's 0.02 init the Q/K
//     gradients are second order and would be all noise;
//   - steps that change the loss by ~1e-3 of itself (1e-2 .. 0.2 long, ~0.05 per element),
//     far above its noise, with Richardson extrapolation, (4 r(h/2) - r(h)) / 3, cancelling
//     the h^2 term;
//   - the perturbation actually applied (float(w + h) - w), not h.
// Two checks per tensor: the directional derivative along the tensor's own gradient (usually a
// strong signal: it is ||g||) within 1e-3 relative, and single coordinates (the two largest |g|
// and two random ones) within 2e-3 of the tensor's largest |g| plus 1e-2 of their own value.
// Both tolerances add the fp32 rounding noise of the quotient (3 ulp of the loss over the step):
// a gradient that nearly cancels, such as the NSP bias's over a batch whose NSP errors balance
// (||g|| ~ 1e-4), changes the loss by less than its noise over any step that stays in the Taylor
// region. Measured worst over 300 seeds: 0.15 of the directional bound, 0.11 of the coordinate
// one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/common/philox.h"
#include "model_test_util.h"

namespace packbert::test {
namespace {

BertConfig micro_config() {
  BertConfig c;
  c.vocab_size = 64;
  c.real_vocab_size = 60;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 2;
  c.intermediate = 32;
  c.max_position_embeddings = 32;
  return c;
}

// `config` is micro_config() with its options; `label` names it in the output.
void check_every_tensor(const BertConfig& config, const char* label) {
  const Gelu form = config.hidden_act;
  // ~1500 forwards of a model whose ops take microseconds: one thread, since an OpenMP barrier
  // per op would cost more than the op (and much more on a loaded machine).
  const int threads = cpu::num_threads();
  cpu::set_num_threads(1);
  auto rng = model_rng(41);
  auto be = make_cpu_backend();
  HostModel m(config, rng(), 0.25f);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const ParamTensor& t : m.table.tensors()) {
    if (!t.no_decay) continue;
    const bool gamma = t.kind == ParamKind::norm_weight;
    for (int64_t k = 0; k < t.size; ++k)
      m.params[t.offset + k] = gamma ? 1.f + 0.3f * u(rng) : 0.2f * u(rng);
  }
  const auto samples = model_samples(rng, {5, 9, 14, 20, 11}, 4, m.config.real_vocab_size);
  const Batch b = make_batch(samples, BatchLayout::packed, 32, pack_samples(samples, 32));
  const int64_t gm = b.num_masked(), gs = b.num_seqs();
  const auto step = static_cast<uint32_t>(rng() % kDropoutMaxStep);
  const uint64_t seed = rng();

  const StepOutput analytic = run_step(*be, m, {b}, gm, gs, step, seed);
  Bert bert(m.config, *be, m.params_view(), Tensor());
  ForwardOptions loss_only;
  loss_only.gradients = false;
  auto loss = [&] { return bert.forward(b, gm, gs, step, seed, loss_only).loss; };
  const double l0 = loss();
  expect_measure("loss-only forward vs the training forward (rel)",
                 std::abs(l0 - analytic.result.loss) / l0, 1e-6);
  {  // the form reaches the model: the other GELU on the same weights gives another loss (the
     // forward is deterministic, so an ignored form would give the same bits; the two differ
     // by ~1e-5 of the loss here)
    BertConfig other = m.config;
    other.hidden_act = form == Gelu::tanh ? Gelu::erf : Gelu::tanh;
    Bert b2(other, *be, m.params_view(), Tensor());
    EXPECT_NE(b2.forward(b, gm, gs, step, seed, loss_only).loss, l0);
  }

  // (L(w + d) - L(w - d)) / 2 for a perturbation d over [first, first + n), with the applied
  // perturbations' first-order prediction g . (w+ - w-) / 2 returned in *predicted.
  auto half_difference = [&](int64_t first, const std::vector<double>& d, double* predicted) {
    std::vector<float> saved(m.params.begin() + first, m.params.begin() + first + d.size());
    std::vector<float> plus(d.size()), minus(d.size());
    for (size_t k = 0; k < d.size(); ++k) {
      plus[k] = static_cast<float>(saved[k] + d[k]);
      minus[k] = static_cast<float>(saved[k] - d[k]);
    }
    std::copy(plus.begin(), plus.end(), m.params.begin() + first);
    const double lp = loss();
    std::copy(minus.begin(), minus.end(), m.params.begin() + first);
    const double lm = loss();
    std::copy(saved.begin(), saved.end(), m.params.begin() + first);
    double p = 0;
    for (size_t k = 0; k < d.size(); ++k)
      p += static_cast<double>(analytic.grads[first + k]) *
           (static_cast<double>(plus[k]) - minus[k]);
    *predicted = p / 2;
    return (lp - lm) / 2;
  };
  // Richardson extrapolation of the ratio (finite difference) / (first-order prediction)
  // along d: each ratio is 1 + c |d|^2 + O(|d|^4), so (4 r(d / 2) - r(d)) / 3 = 1 + O(|d|^4).
  auto fd_ratio = [&](int64_t first, std::vector<double> d) {
    double p1, p2;
    const double r1 = half_difference(first, d, &p1) / p1;
    for (double& x : d) x /= 2;
    const double r2 = half_difference(first, d, &p2) / p2;
    return (4 * r2 - r1) / 3;
  };

  // The step along a direction whose derivative is `slope`: one that changes the loss by ~1e-3
  // of itself, within [1e-3, max_step]. A single coordinate gets at most 0.05: some are shared
  // by every token (token type, LayerNorm), where a larger step leaves the region in which
  // the Taylor expansion behind the extrapolation holds. The floor is low enough that a steep
  // direction still gets its ~1e-3 step: a floor of 1e-2 gave the token type embeddings
  // (gradient norm 3.5, shared by every token) 6x that, where the ratio is 1.04 at h and the
  // extrapolation kept 2e-3 of h^4 error (seed 714233592657090590, 1 seed in 200). The
  // rounding noise, 3 eps l0 / h over a slope of 1e-3 l0 / h, stays at 3 eps / 1e-3 = 3.6e-4.
  auto step_for = [&](double slope, double max_step) {
    return std::clamp(1e-3 * l0 / slope, 1e-3, max_step);
  };

  // Rounding noise of an extrapolated derivative along a unit direction with step h: each loss
  // evaluation is off by at most ~one fp32 ulp of the loss (measured: a few hundredths of it),
  // and (4 r(h/2) - r(h)) / 3 multiplies that error over h by (4 * 2 + 1) / 3 = 3.
  const double eps32 = std::numeric_limits<float>::epsilon();
  auto noise = [&](double h) { return 3 * eps32 * l0 / h; };

  double worst_dir = 0, worst_coord = 0, worst_key_bias = 0;
  std::string worst_dir_name, worst_coord_name;
  for (const ParamTensor& t : m.table.tensors()) {
    const float* g = analytic.grads.data() + t.offset;
    const double norm = l2(g, t.size);
    double gmax = 0;
    for (int64_t k = 0; k < t.size; ++k) gmax = std::max(gmax, std::abs(static_cast<double>(g[k])));
    if (is_key_bias(t.name) && config.position == Positions::learned) {
      // Exactly zero in exact arithmetic (softmax cancels a bias on every key; a rotary model
      // turns the bias by each key's position, so there it has a gradient like any tensor).
      const ParamTensor& q = m.table.at(t.name.substr(0, t.name.size() - 8) + "query.bias");
      const double e = norm / l2(analytic.grads.data() + q.offset, q.size);
      worst_key_bias = std::max(worst_key_bias, e);
      EXPECT_LE(e, 1e-5) << t.name;
      continue;
    }
    ASSERT_GT(norm, 0) << t.name << " has no gradient";
    // Directional derivative along g / ||g||: a step that changes the loss by ~1e-3 of itself
    // (far above its fp32 noise), at most 0.2 long and ~0.05 per element (tiny tensors such
    // as the NSP bias would leave the Taylor region otherwise).
    std::vector<double> d(t.size);
    const double len = step_for(norm, std::min(0.2, 0.05 * std::sqrt(static_cast<double>(t.size))));
    for (int64_t k = 0; k < t.size; ++k) d[k] = len * g[k] / norm;
    // The tolerance: 1e-3 plus the rounding noise of the quotient. When the step cap stops the
    // predicted change ||g|| len far below 1e-3 of the loss (a gradient that nearly cancels,
    // such as the NSP bias's over a balanced batch), noise dominates the ratio.
    const double dir_err = std::abs(fd_ratio(t.offset, d) - 1) / (1e-3 + noise(len) / norm);
    if (dir_err > worst_dir) worst_dir = dir_err, worst_dir_name = t.name;
    EXPECT_LE(dir_err, 1.0) << t.name << " directional";

    // Coordinates: the two largest |g| and two random ones.
    std::vector<int64_t> coords(t.size);
    for (int64_t k = 0; k < t.size; ++k) coords[k] = k;
    std::partial_sort(coords.begin(), coords.begin() + std::min<int64_t>(2, t.size), coords.end(),
                      [&](int64_t a, int64_t c) { return std::abs(g[a]) > std::abs(g[c]); });
    coords.resize(std::min<int64_t>(2, t.size));
    for (int k = 0; k < 2; ++k) coords.push_back(static_cast<int64_t>(rng() % t.size));
    for (int64_t k : coords) {
      // The derivative itself: g[k] * ratio (a zero gradient has nothing to compare: its
      // finite difference must vanish too, checked through a unit prediction).
      double fd;
      const double h = g[k] != 0 ? step_for(std::abs(g[k]), 0.05) : 1e-2;
      if (g[k] != 0) {
        fd = g[k] * fd_ratio(t.offset + k, {h});
      } else {
        double p;
        fd = half_difference(t.offset + k, {h}, &p) / h;
      }
      const double err = std::abs(fd - g[k]) / (2e-3 * gmax + 1e-2 * std::abs(g[k]) + noise(h));
      if (err > worst_coord) worst_coord = err, worst_coord_name = t.name;
      EXPECT_LE(err, 1.0) << t.name << "[" << k << "]: fd " << fd << " analytic " << g[k];
    }
  }
  cpu::set_num_threads(threads);
  std::printf("[model-error] %s: worst directional %s, worst coordinate %s\n", label,
              worst_dir_name.c_str(), worst_coord_name.c_str());
  print_measure("key bias gradient / query bias gradient (worst layer)", worst_key_bias, 1e-5);
  print_measure("FD directional: |fd/analytic - 1| / (1e-3 + noise)", worst_dir, 1.0);
  print_measure("FD coordinates: |fd - g| / (2e-3 max|g| + 1e-2 |g| + noise)", worst_coord, 1.0);
}

TEST(ModelGradcheck, EveryTensorMatchesFiniteDifferences) {
  check_every_tensor(micro_config(), "erf GELU");
}

// ModernBERT's layer (pre-norm with a final norm, no biases but the decoder's, norms without a
// bias, no token types, its epsilon, no NSP head) and the options one at a time on BERT's.
TEST(ModelGradcheck, PreNormWithoutBiasesEveryTensorMatchesFiniteDifferences) {
  BertConfig c = micro_config();
  c.norm = NormPlacement::pre;
  c.bias = c.norm_bias = c.token_types = c.nsp_head = false;
  c.layer_norm_eps = 1e-5f;
  check_every_tensor(c, "pre-norm, no biases");
}

TEST(ModelGradcheck, PreNormWithBiasesAndNspEveryTensorMatchesFiniteDifferences) {
  BertConfig c = micro_config();
  c.norm = NormPlacement::pre;
  check_every_tensor(c, "pre-norm with biases and NSP");
}

// Rotary positions with two bases, local attention (layer 1: a window of 6 over sequences of
// up to 20 tokens) and the gated MLPs.
TEST(ModelGradcheck, RotaryGegluLocalEveryTensorMatchesFiniteDifferences) {
  BertConfig c = micro_config();
  c.norm = NormPlacement::pre;
  c.position = Positions::rope;
  c.rope_theta = 160000.f;
  c.local_rope_theta = 10.f;
  c.local_window = 6;
  c.global_every = 2;
  c.mlp = MlpKind::geglu;
  c.bias = c.norm_bias = c.token_types = c.nsp_head = false;
  check_every_tensor(c, "pre-norm, rope, local, geglu");
}

TEST(ModelGradcheck, SwigluWithBiasesEveryTensorMatchesFiniteDifferences) {
  BertConfig c = micro_config();
  c.mlp = MlpKind::swiglu;
  c.position = Positions::rope;
  check_every_tensor(c, "post-norm, rope, swiglu");
}

TEST(ModelGradcheck, PostNormWithoutBiasesEveryTensorMatchesFiniteDifferences) {
  BertConfig c = micro_config();
  c.bias = c.norm_bias = c.token_types = false;
  check_every_tensor(c, "post-norm, no biases");
}

// The tanh GELU (model.hidden_act = "gelu_tanh") through the MLP and the MLM transform.
TEST(ModelGradcheck, TanhGeluEveryTensorMatchesFiniteDifferences) {
  BertConfig c = micro_config();
  c.hidden_act = Gelu::tanh;
  check_every_tensor(c, "tanh GELU");
}

}  // namespace
}  // namespace packbert::test
