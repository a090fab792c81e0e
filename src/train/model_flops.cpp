#include "train/model_flops.h"

#include <algorithm>

namespace packbert {

namespace {

// The (query, key) pairs attention computes in one sequence of n tokens with this window.
double attended_pairs(int64_t n, int64_t window) {
  if (window <= 0 || window / 2 >= n - 1) return static_cast<double>(n) * static_cast<double>(n);
  const int64_t h = window / 2;
  // Row i sees [max(0, i - h), min(n - 1, i + h)]: (2h + 1) keys in the middle, fewer at the
  // two ends, whose rows lose 1 + 2 + ... + h keys each.
  return static_cast<double>(n) * static_cast<double>(2 * h + 1) -
         static_cast<double>(h) * static_cast<double>(h + 1);
}

}  // namespace

StepFlops step_flops(const BertConfig& c, const StepShape& step) {
  const double h = static_cast<double>(c.hidden), i = static_cast<double>(c.intermediate);
  double tokens = 0;
  for (const int64_t n : step.seq_lens) tokens += static_cast<double>(n);
  // Per token and layer: QKV (H x 3H), the attention output (H x H), Wi (H x I or 2I), Wo.
  const double per_token =
      2.0 * (3.0 * h * h + h * h + h * static_cast<double>(c.mlp_in_width()) + i * h);
  StepFlops f;
  f.linears = 3.0 * static_cast<double>(c.layers) * tokens * per_token;
  for (int64_t l = 0; l < c.layers; ++l)
    for (const int64_t n : step.seq_lens)
      f.attention += 3.0 * 4.0 * h * attended_pairs(n, c.window_of(l));  // QK^T and PV
  const double masked = static_cast<double>(step.masked_tokens);
  f.heads = 3.0 * 2.0 * masked * (h * h + h * static_cast<double>(c.vocab_size));
  if (c.nsp_head)
    f.heads += 3.0 * 2.0 * static_cast<double>(step.seq_lens.size()) * (h * h + 2.0 * h);
  return f;
}

double device_peak_flops(const std::string& name, Precision precision) {
  struct Peak {
    const char* name;  // a substring of the device's name; the first match wins
    double bf16, fp8, fp32;
  };
  // Dense (no sparsity) tensor-core peaks, TFLOP/s, NVIDIA's datasheets (SXM parts): A100
  // 312 BF16 / 19.5 FP32; H100 and H200 989.4 BF16, 1978.9 FP8, 66.9 FP32; H100 PCIe 756.5,
  // 1513, 51.2; B200 2250 BF16, 4500 FP8, 80 FP32.
  static const Peak peaks[] = {
      {"H100 PCIe", 756.5, 1513.0, 51.2}, {"H100", 989.4, 1978.9, 66.9},
      {"H200", 989.4, 1978.9, 66.9},      {"B200", 2250.0, 4500.0, 80.0},
      {"A100", 312.0, 0.0, 19.5},
  };
  for (const Peak& p : peaks) {
    if (name.find(p.name) == std::string::npos) continue;
    switch (precision) {
      case Precision::fp32: return p.fp32 * 1e12;
      case Precision::bf16:
      case Precision::fp16: return p.bf16 * 1e12;
      case Precision::fp8: return p.fp8 * 1e12;
    }
  }
  return 0.0;
}

}  // namespace packbert
