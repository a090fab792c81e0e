// The CPU backend gives the same bits with 1 and 2 threads (fixed reduction orders), so a
// multi-rank run with one thread per rank and a laptop run with all cores agree exactly.
// (Attention has its own such test in test_ops_attention.cpp.)
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"

namespace packbert::test {
namespace {

// Runs f with 1 and then 2 threads and returns both results.
template <typename F>
auto with_threads(F&& f) {
  const int before = cpu::num_threads();
  cpu::set_num_threads(1);
  auto one = f();
  cpu::set_num_threads(2);
  auto two = f();
  cpu::set_num_threads(before);
  return std::make_pair(one, two);
}

TEST(Threads, LinearBackwardBitsDoNotDependOnThreads) {
  auto rng = make_rng(81);
  auto be = make_cpu_backend();
  const int64_t n = 300, k = 96, m = 160;
  const auto x = random_floats(rng, n * k), w = random_floats(rng, m * k),
             g = random_floats(rng, n * m);
  const auto [a, b] = with_threads([&] {
    std::vector<float> dx(n * k), dw(m * k, 0.f), db(m, 0.f), y(n * m);
    be->linear_forward(view(x.data(), {n, k}), view(w.data(), {m, k}), Tensor(), Epilogue::none,
                       view(y.data(), {n, m}), Tensor());
    be->linear_backward(view(x.data(), {n, k}), view(w.data(), {m, k}), view(g.data(), {n, m}),
                        view(dx.data(), {n, k}), view(dw.data(), {m, k}), view(db.data(), {m}), {});
    return std::vector<std::vector<float>>{y, dx, dw, db};
  });
  EXPECT_EQ(a, b);
}

TEST(Threads, LayerNormOpsBitsDoNotDependOnThreads) {
  auto rng = make_rng(82);
  auto be = make_cpu_backend();
  const std::vector<int32_t> lens = {100, 37, 250, 1, 64};
  const HostLayout l = packed(lens, random_sample_ids(rng, lens.size()), 256);
  const int64_t h = 200, rows = l.rows, vocab = 300;
  const auto x = random_floats(rng, rows * h), res = random_floats(rng, rows * h),
             dy = random_floats(rng, rows * h), gamma = random_floats(rng, h),
             beta = random_floats(rng, h), word = random_floats(rng, vocab * h),
             pos = random_floats(rng, 256 * h), type = random_floats(rng, 2 * h);
  const auto ids = random_ints(rng, rows, 0, static_cast<int32_t>(vocab - 1));
  const auto segs = random_ints(rng, rows, 0, 1);
  Dropout d;
  d.p = 0.1f;
  d.seed = rng();
  const LayerNormParams ln{view(gamma.data(), {h}), view(beta.data(), {h})};
  const EmbeddingParams emb{view(word.data(), {vocab, h}), view(pos.data(), {256, h}),
                            view(type.data(), {2, h}), ln.gamma, ln.beta};
  const auto [a, b] = with_threads([&] {
    std::vector<float> out(rows * h), hin(rows * h), mean(rows), rstd(rows), dx(rows * h),
        dres(rows * h), dbias(h, 0.f), dg(h, 0.f), dbeta(h, 0.f), dword(vocab * h, 0.f),
        dpos(256 * h, 0.f), dtype(2 * h, 0.f), eg(h, 0.f), eb(h, 0.f), dcopy = dy;
    be->residual_layernorm_forward(l.view(), view(x.data(), {rows, h}), view(gamma.data(), {h}),
                                   view(res.data(), {rows, h}), ln, d, view(out.data(), {rows, h}),
                                   view(hin.data(), {rows, h}), view(mean.data(), {rows}),
                                   view(rstd.data(), {rows}));
    be->residual_layernorm_backward(l.view(), view(dy.data(), {rows, h}),
                                    view(hin.data(), {rows, h}), view(mean.data(), {rows}),
                                    view(rstd.data(), {rows}), ln, d, view(dx.data(), {rows, h}),
                                    view(dres.data(), {rows, h}), false, view(dbias.data(), {h}),
                                    LayerNormParams{view(dg.data(), {h}), view(dbeta.data(), {h})});
    be->embedding_forward(l.view(), view(ids.data(), {rows}), view(segs.data(), {rows}), emb, d,
                          view(out.data(), {rows, h}), view(mean.data(), {rows}),
                          view(rstd.data(), {rows}));
    be->embedding_backward(
        l.view(), view(ids.data(), {rows}), view(segs.data(), {rows}), emb, d,
        view(mean.data(), {rows}), view(rstd.data(), {rows}), view(dcopy.data(), {rows, h}),
        EmbeddingParams{view(dword.data(), {vocab, h}), view(dpos.data(), {256, h}),
                        view(dtype.data(), {2, h}), view(eg.data(), {h}), view(eb.data(), {h})});
    return std::vector<std::vector<float>>{out,   dx,   dres,  dbias, dg, dbeta,
                                           dword, dpos, dtype, eg,    eb};
  });
  EXPECT_EQ(a, b);
}

TEST(Threads, LossAndOptimizerBitsDoNotDependOnThreads) {
  auto rng = make_rng(83);
  auto be = make_cpu_backend();
  const int64_t m = 50, v = 3001, n = 70001;
  const auto z = random_floats(rng, m * v, 3.f);
  const auto labels = random_ints(rng, m, 0, static_cast<int32_t>(v - 1));
  const auto w0 = random_floats(rng, n), g0 = random_floats(rng, n, 0.01f);
  const std::vector<LambTensor> table = {{0, 40000, 1}, {40000, 30001, 0}};
  const auto [a, b] = with_threads([&] {
    std::vector<float> dz(m * v), loss(1, 0.f), norm(1), w = w0, g = g0, mm(n, 0.f), vv(n, 0.f),
                                                         norms(4);
    std::vector<int32_t> correct(1, 0);
    be->softmax_cross_entropy(view(z.data(), {m, v}), view(labels.data(), {m}), 0.1f,
                              view(loss.data(), {1}), view(correct.data(), {1}),
                              view(dz.data(), {m, v}));
    be->l2_norm(view(g.data(), {n}), view(norm.data(), {1}));
    LambConfig cfg;
    cfg.lr = 1e-3f;
    be->lamb_step(lamb_table(table.data(), 2), cfg, view(norm.data(), {1}), view(w.data(), {n}),
                  view(g.data(), {n}), view(mm.data(), {n}), view(vv.data(), {n}),
                  view(norms.data(), {4}));
    return std::vector<std::vector<float>>{dz, loss, norm, w, g, mm, vv, norms};
  });
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace packbert::test
