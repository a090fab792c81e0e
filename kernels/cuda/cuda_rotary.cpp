// rotary_embedding on the CUDA backend (kernels/ops/rotary.h): the shared argument check, the
// layout's tensors (and, with index validation, their contents), then rotary_kernels.cu's one
// kernel on qkv in its own storage format.
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/rotary.h"

namespace packbert {

void CudaBackend::rotary_embedding(const SeqLayout& layout, const Tensor& qkv, int num_heads,
                                   float theta, bool inverse) {
  const trace::Range range("rotary_embedding");
  const char* op = "rotary_embedding";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const checks::RotaryDims dims = checks::rotary_embedding_args(args, qkv, num_heads, theta);
  begin(op);
  const cuda::DeviceLayout dl = device_layout(op, layout, dims.rows);
  launched(op, "rotary_embedding",
           cuda::rotary_embedding(dl, qkv.data, float_format(op, "qkv", qkv), dims.hidden,
                                  num_heads, theta, inverse, stream_));
  end(op);
}

}  // namespace packbert
