// The model FLOPs of a step (train/model_flops.h): BERT-Large at 512 against a hand
// computation, local windows against a count of the pairs by brute force, and the peak table.
#include <gtest/gtest.h>

#include <random>

#include "model/config.h"
#include "test_util.h"
#include "train/model_flops.h"

namespace packbert::test {
namespace {

// BERT-Large (H 1024, I 4096, 24 layers, vocabulary 30528), one sequence of 512 tokens, 76
// masked, NSP on. Forward, by hand:
//   per layer, linear layers 2 x 512 x (4 H^2 + 2 H I) = 1024 x 12,582,912 = 12,884,901,888
//   per layer, attention 4 H len^2 = 4 x 1024 x 262,144                    =  1,073,741,824
//   24 layers                                        24 x 13,958,643,712 = 335,007,449,088
//   MLM transform 2 x 76 x H^2 = 159,383,552; decoder 2 x 76 x H x V   =   4,751,622,144
//   pooler and NSP 2 x (H^2 + 2 H)                                     =       2,101,248
//   forward total                                                      = 339,920,556,032
// and forward + backward 3 x that = 1,019,761,668,096 (all exact in a double).
TEST(ModelFlops, BertLargeAt512ByHand) {
  const BertConfig c = bert_preset("large");
  ASSERT_EQ(c.vocab_size, 30528);
  const StepFlops f = step_flops(c, StepShape{{512}, 76});
  EXPECT_EQ(f.linears, 3.0 * 24 * 12884901888.0);
  EXPECT_EQ(f.attention, 3.0 * 24 * 1073741824.0);
  EXPECT_EQ(f.heads, 3.0 * (159383552.0 + 4751622144.0 + 2101248.0));
  EXPECT_EQ(f.total(), 1019761668096.0);
  // Twice the sequences, twice the FLOPs; one sequence twice as long: the attention term 4x.
  EXPECT_EQ(step_flops(c, StepShape{{512, 512}, 152}).total(), 2 * f.total());
  EXPECT_EQ(step_flops(c, StepShape{{1024}, 76}).attention, 4 * f.attention);
}

// Local layers: the pairs |i - j| <= window / 2 within a sequence, counted one by one, for
// random lengths and windows (wider than the sequence and 0 included); gated MLPs' Wi 2I wide;
// no NSP head, no pooler.
TEST(ModelFlops, WindowsAndGatedMlpsCountWhatRuns) {
  std::mt19937_64 rng(test_seed());
  BertConfig c = bert_preset("modernbert-tiny");
  for (int trial = 0; trial < 50; ++trial) {
    c.local_window = std::uniform_int_distribution<int64_t>(0, 300)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 400)(rng);
    double pairs_local = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        pairs_local += c.local_window == 0 || std::llabs(i - j) <= c.local_window / 2 ? 1 : 0;
    double want = 0;
    for (int64_t l = 0; l < c.layers; ++l)
      want += 12.0 * static_cast<double>(c.hidden) *
              (c.is_global(l) ? static_cast<double>(n * n) : pairs_local);
    EXPECT_EQ(step_flops(c, StepShape{{n}, 1}).attention, want)
        << "n " << n << " window " << c.local_window;
  }
  const double h = static_cast<double>(c.hidden), i = static_cast<double>(c.intermediate);
  const StepFlops f = step_flops(c, StepShape{{10}, 2});
  EXPECT_EQ(f.linears,
            3.0 * static_cast<double>(c.layers) * 10 * 2 * (4 * h * h + h * 2 * i + i * h));
  EXPECT_EQ(f.heads, 3.0 * 2 * 2 * (h * h + h * static_cast<double>(c.vocab_size)));
}

TEST(ModelFlops, PeaksByDeviceName) {
  EXPECT_EQ(device_peak_flops("NVIDIA H100 80GB HBM3", Precision::bf16), 989.4e12);
  EXPECT_EQ(device_peak_flops("NVIDIA H100 80GB HBM3", Precision::fp8), 1978.9e12);
  EXPECT_EQ(device_peak_flops("NVIDIA H100 PCIe", Precision::bf16), 756.5e12);
  EXPECT_EQ(device_peak_flops("NVIDIA H200", Precision::fp16), 989.4e12);
  EXPECT_EQ(device_peak_flops("NVIDIA A100-SXM4-80GB", Precision::bf16), 312e12);
  EXPECT_EQ(device_peak_flops("NVIDIA A100-SXM4-80GB", Precision::fp8), 0.0);
  EXPECT_EQ(device_peak_flops("NVIDIA B200", Precision::fp8), 4500e12);
  EXPECT_EQ(device_peak_flops("cpu", Precision::fp32), 0.0);
}

}  // namespace
}  // namespace packbert::test
