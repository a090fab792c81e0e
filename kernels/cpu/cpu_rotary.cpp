// rotary_embedding (kernels/ops/rotary.h) on the CPU: rows in parallel, each row's cos / sin
// computed once (common/rotary_math.h) and applied to every head of q and k. A bf16 / f16 row's
// q | k is widened into the thread's scratch, rotated in fp32 and rounded back once.
#include <omp.h>

#include "kernels/common/rotary_math.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_float_rows.h"
#include "kernels/ops/rotary.h"

namespace packbert {

void CpuBackend::rotary_embedding(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                  float theta, bool inverse) {
  const char* op = "rotary_embedding";
  const checks::OpArgs args(op, Device::cpu);
  const auto [rows, h, d] = checks::rotary_embedding_args(args, qkv, num_heads, theta);
  cpu::check_layout(op, layout, rows);
  const int64_t half = d / 2, ld = 3 * h;
  // theta^(-2i/d) for each pair, once per call: the same doubles rotary_inv_freq gives the
  // CUDA kernels per pair.
  double* inv_freq = reduction_scratch(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rotary_inv_freq(theta, i, d);
  const bool f32 = qkv.dtype == DType::f32;
  // Per thread: cos | sin of the row's pairs, then (16-bit qkv) the row's q | k in fp32.
  const auto scratch = static_cast<size_t>(2 * half + (f32 ? 0 : 2 * h));
  reserve_thread_scratch(scratch);
  const int32_t* seq = layout.token_seq.ptr<int32_t>();
  const int32_t* pos = layout.token_pos.ptr<int32_t>();
#pragma omp parallel for schedule(static) if (rows * h >= 16384)
  for (int64_t r = 0; r < rows; ++r) {
    if (seq[r] < 0) continue;
    float* cs = thread_scratch(omp_get_thread_num(), scratch);
    for (int64_t i = 0; i < half; ++i)
      rotary_cos_sin(pos[r], inv_freq[i], inverse, &cs[i], &cs[half + i]);
    float* x = f32 ? qkv.ptr<float>() + r * ld : cs + 2 * half;
    if (!f32) cpu::widen_row(x, qkv.data, qkv.dtype, r * ld, 2 * h);
    for (int64_t head = 0; head < 2 * num_heads; ++head) {  // q's heads, then k's
      float* xh = x + head * d;
      for (int64_t i = 0; i < half; ++i) rotary_rotate(xh[i], xh[half + i], cs[i], cs[half + i]);
    }
    if (!f32) cpu::narrow_row(qkv.data, qkv.dtype, r * ld, x, 2 * h);
  }
}

}  // namespace packbert
