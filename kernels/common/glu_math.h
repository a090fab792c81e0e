// The per-element formulas of glu_forward / glu_backward (kernels/ops/glu.h), shared by the CPU
// and CUDA backends: the GELUs are common/math.h's (the linear epilogues'), SiLU is PyTorch's
// x / (1 + exp(-x)) with the derivative s (1 + x (1 - s)), s = sigmoid(x).
#pragma once

#include <math.h>

#include "kernels/common/host_device.h"
#include "kernels/common/math.h"

namespace packbert {

// GluAct's values (kernels/ops/glu.h), for code that sees no op header.
constexpr int kGluGelu = 0, kGluGeluTanh = 1, kGluSilu = 2;

PB_HD float silu(float x) { return x / (1.0f + expf(-x)); }

PB_HD float silu_grad(float x) {
  const float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

template <int Act>
PB_HD float glu_act(float x) {
  if (Act == kGluGelu) return gelu(x);
  if (Act == kGluGeluTanh) return gelu_tanh(x);
  return silu(x);
}

template <int Act>
PB_HD float glu_act_grad(float x) {
  if (Act == kGluGelu) return gelu_grad(x);
  if (Act == kGluGeluTanh) return gelu_tanh_grad(x);
  return silu_grad(x);
}

// out = act(a) * gate.
template <int Act>
PB_HD float glu_value(float a, float gate) {
  return glu_act<Act>(a) * gate;
}

// The gradients wrt a and gate of glu_value, given dout: da = (dout * gate) * act'(a),
// dgate = dout * act(a).
template <int Act>
PB_HD void glu_grads(float a, float gate, float dout, float& da, float& dgate) {
  da = (dout * gate) * glu_act_grad<Act>(a);
  dgate = dout * glu_act<Act>(a);
}

}  // namespace packbert
