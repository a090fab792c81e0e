// glu_forward / glu_backward on the CUDA backend (kernels/ops/glu.h): the shared argument
// checks, then glu_kernels.cu's one kernel per call, every tensor in its own storage format.
#include "kernels/common/glu_math.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/glu.h"

namespace packbert {

static_assert(static_cast<int>(GluAct::gelu) == kGluGelu &&
                  static_cast<int>(GluAct::gelu_tanh) == kGluGeluTanh &&
                  static_cast<int>(GluAct::silu) == kGluSilu,
              "GluAct and glu_math.h's values differ");

void CudaBackend::glu_forward(const Tensor& x, GluAct act, const Tensor& out) {
  const trace::Range range("glu_forward");
  const char* op = "glu_forward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const checks::GluDims dims = checks::glu_forward_args(args, x, act, out);
  begin(op);
  launched(
      op, "glu_forward",
      cuda::glu_forward(x.data, float_format(op, "x", x), out.data, float_format(op, "out", out),
                        static_cast<int>(act), dims.n, dims.i, stream_));
  end(op);
}

void CudaBackend::glu_backward(const Tensor& x, const Tensor& dout, GluAct act, const Tensor& dx) {
  const trace::Range range("glu_backward");
  const char* op = "glu_backward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const checks::GluDims dims = checks::glu_backward_args(args, x, dout, act, dx);
  begin(op);
  launched(op, "glu_backward",
           cuda::glu_backward(x.data, float_format(op, "x", x), dout.data,
                              float_format(op, "dout", dout), dx.data, float_format(op, "dx", dx),
                              static_cast<int>(act), dims.n, dims.i, stream_));
  end(op);
}

}  // namespace packbert
