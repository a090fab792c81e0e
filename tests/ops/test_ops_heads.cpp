// The heads: the MLM decoder loss over chunks of masked tokens against the loss over all of them.
// The heads' cases against double loops and finite differences (gather_rows,
// softmax_cross_entropy, mlm_loss, nsp_loss) are the op table's (op_cases.h), run by
// test_ops_reference.cpp.
#include <gtest/gtest.h>

#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"

namespace packbert::test {
namespace {

// Everything the MLM loss takes and gives, for one set of inputs.
struct MlmCase {
  int64_t m, h, v;
  std::vector<float> x, w, b;
  std::vector<int32_t> labels;
  float scale;
  MlmCase(std::mt19937_64& rng, int64_t m_, int64_t h_, int64_t v_)
      : m(m_),
        h(h_),
        v(v_),
        x(random_floats(rng, m * h)),
        w(random_floats(rng, v * h)),
        b(random_floats(rng, v)),
        labels(random_ints(rng, m, 0, static_cast<int32_t>(v - 1))),
        scale(1.f / static_cast<float>(m + 5)) {}
};

// MST: the loss over chunks of masked tokens adds up to the loss over all of them.
TEST(MlmLoss, ChunksAddUpToTheWhole) {
  auto rng = make_rng(64);
  auto be = make_cpu_backend();
  const MlmCase c(rng, 40, 32, 301);
  auto run = [&](const std::vector<int64_t>& cuts, std::vector<float>& dx, std::vector<float>& dw,
                 std::vector<float>& db, float& loss, int32_t& correct) {
    dx.assign(c.m * c.h, NAN), dw.assign(c.v * c.h, 0.f), db.assign(c.v, 0.f);
    loss = 0.f, correct = 0;
    std::vector<float> ws(c.m * c.v);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t a = cuts[k], n = cuts[k + 1] - a;
      be->mlm_loss(view(c.x.data() + a * c.h, {n, c.h}), view(c.w.data(), {c.v, c.h}),
                   view(c.b.data(), {c.v}), view(c.labels.data() + a, {n}), c.scale,
                   view(ws.data(), {n, c.v}), view(&loss, {1}), view(&correct, {1}),
                   view(dx.data() + a * c.h, {n, c.h}), view(dw.data(), {c.v, c.h}),
                   view(db.data(), {c.v}));
    }
  };
  std::vector<float> dx1, dw1, db1, dx3, dw3, db3;
  float l1, l3;
  int32_t c1, c3;
  run({0, c.m}, dx1, dw1, db1, l1, c1);
  run({0, 7, 8, c.m}, dx3, dw3, db3, l3, c3);
  EXPECT_EQ(c1, c3);
  // Chunks change only the order of fp32 sums (the loss, dw, db over rows): worst 2.1e-7 over
  // 1000 seeds (dx), margin 4.8.
  expect_close("mlm_loss 3 chunks vs 1: loss", {l3}, {l1}, 1e-6);
  expect_close("mlm_loss 3 chunks vs 1: dx", to_double(dx3), to_double(dx1), 1e-6);
  expect_close("mlm_loss 3 chunks vs 1: dw", to_double(dw3), to_double(dw1), 1e-6);
  expect_close("mlm_loss 3 chunks vs 1: db", to_double(db3), to_double(db1), 1e-6);

  // Forward only (evaluation): the same loss, no gradient touched.
  std::vector<float> ws(c.m * c.v);
  float l0 = 0.f;
  int32_t c0 = 0;
  be->mlm_loss(view(c.x.data(), {c.m, c.h}), view(c.w.data(), {c.v, c.h}), view(c.b.data(), {c.v}),
               view(c.labels.data(), {c.m}), c.scale, view(ws.data(), {c.m, c.v}), view(&l0, {1}),
               view(&c0, {1}), Tensor(), Tensor(), Tensor());
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(c0, c1);
}

}  // namespace
}  // namespace packbert::test
