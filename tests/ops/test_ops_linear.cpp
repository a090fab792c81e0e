// linear_backward without x and with dx alone (its cases against double loops and finite
// differences: the op table, op_cases.h, run by test_ops_reference.cpp).
#include <gtest/gtest.h>

#include "kernels/common/math.h"
#include "kernels/cpu/cpu_backend.h"
#include "ops_test_util.h"
#include "reference_ops.h"

namespace packbert::test {
namespace {

using ref::Vec;

TEST(Linear, OptionalGradientsAreSkipped) {
  auto rng = make_rng(12);
  auto be = make_cpu_backend();
  const int64_t n = 6, k = 5, m = 4;
  const auto x = random_floats(rng, n * k), w = random_floats(rng, m * k),
             g = random_floats(rng, n * m);
  Guarded<float> dx({n, k});
  be->linear_backward(Tensor(), view(w.data(), {m, k}), view(g.data(), {n, m}), dx.tensor(),
                      Tensor(), Tensor(), {});
  EXPECT_OUTPUT_OK(dx);
  const Vec want = [&] {  // dx = g w
    Vec d(n * k, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < k; ++c)
        for (int64_t j = 0; j < m; ++j)
          d[i * k + c] += static_cast<double>(g[i * m + j]) * w[j * k + c];
    return d;
  }();
  expect_close("linear_backward dx only", dx.doubles(), want, kTol);
  EXPECT_THROW(be->linear_backward(Tensor(), view(w.data(), {m, k}), view(g.data(), {n, m}),
                                   Tensor(), view(dx.data(), {m, k}), Tensor(), {}),
               Error);  // dw needs x
}

}  // namespace
}  // namespace packbert::test
