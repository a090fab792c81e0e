// glu_forward / glu_backward (kernels/ops/glu.h) on the CPU: rows in parallel, each element one
// expression of common/glu_math.h. Tensors in bf16 / f16 are widened row by row into the
// thread's scratch and their outputs rounded back once; f32 tensors are used in place.
#include <omp.h>

#include "kernels/common/glu_math.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_float_rows.h"
#include "kernels/ops/glu.h"

namespace packbert {

static_assert(static_cast<int>(GluAct::gelu) == kGluGelu &&
                  static_cast<int>(GluAct::gelu_tanh) == kGluGeluTanh &&
                  static_cast<int>(GluAct::silu) == kGluSilu,
              "GluAct and glu_math.h's values differ");

namespace {

// One row: out[j] = act(x[j]) * x[i + j].
template <int Act>
void glu_forward_row(const float* x, float* out, int64_t i) {
  for (int64_t j = 0; j < i; ++j) out[j] = glu_value<Act>(x[j], x[i + j]);
}

// One row: dx[j], dx[i + j] from dout[j] and x[j], x[i + j].
template <int Act>
void glu_backward_row(const float* x, const float* dout, float* dx, int64_t i) {
  for (int64_t j = 0; j < i; ++j) glu_grads<Act>(x[j], x[i + j], dout[j], dx[j], dx[i + j]);
}

// Row r of t [*, width] as fp32: the row itself when t is f32, else `scratch` filled with it
// (when `read`).
float* row_f32(const Tensor& t, int64_t r, int64_t width, float* scratch, bool read) {
  if (t.dtype == DType::f32) return t.ptr<float>() + r * width;
  if (read) cpu::widen_row(scratch, t.data, t.dtype, r * width, width);
  return scratch;
}

void store_row(const Tensor& t, int64_t r, int64_t width, const float* row) {
  if (t.dtype != DType::f32) cpu::narrow_row(t.data, t.dtype, r * width, row, width);
}

}  // namespace

void CpuBackend::glu_forward(const Tensor& x, GluAct act, const Tensor& out) {
  const char* op = "glu_forward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [n, i] = checks::glu_forward_args(args, x, act, out);
  const auto scratch = static_cast<size_t>(3 * i);  // x's row (2i), out's (i)
  reserve_thread_scratch(scratch);
  const int a = static_cast<int>(act);
#pragma omp parallel for schedule(static) if (n * i >= 16384)
  for (int64_t r = 0; r < n; ++r) {
    float* s = thread_scratch(omp_get_thread_num(), scratch);
    const float* xr = row_f32(x, r, 2 * i, s, true);
    float* o = row_f32(out, r, i, s + 2 * i, false);
    if (a == kGluGelu) glu_forward_row<kGluGelu>(xr, o, i);
    if (a == kGluGeluTanh) glu_forward_row<kGluGeluTanh>(xr, o, i);
    if (a == kGluSilu) glu_forward_row<kGluSilu>(xr, o, i);
    store_row(out, r, i, o);
  }
}

void CpuBackend::glu_backward(const Tensor& x, const Tensor& dout, GluAct act, const Tensor& dx) {
  const char* op = "glu_backward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [n, i] = checks::glu_backward_args(args, x, dout, act, dx);
  const auto scratch = static_cast<size_t>(5 * i);  // x's row (2i), dout's (i), dx's (2i)
  reserve_thread_scratch(scratch);
  const int a = static_cast<int>(act);
#pragma omp parallel for schedule(static) if (n * i >= 16384)
  for (int64_t r = 0; r < n; ++r) {
    float* s = thread_scratch(omp_get_thread_num(), scratch);
    const float* xr = row_f32(x, r, 2 * i, s, true);
    const float* dr = row_f32(dout, r, i, s + 2 * i, true);
    float* g = row_f32(dx, r, 2 * i, s + 3 * i, false);
    if (a == kGluGelu) glu_backward_row<kGluGelu>(xr, dr, g, i);
    if (a == kGluGeluTanh) glu_backward_row<kGluGeluTanh>(xr, dr, g, i);
    if (a == kGluSilu) glu_backward_row<kGluSilu>(xr, dr, g, i);
    store_row(dx, r, 2 * i, g);
  }
}

}  // namespace packbert
