// make_nccl_transport in a build without CUDA (the CUDA build compiles nccl_transport.cpp).
#include "comm/nccl_transport.h"
#include "kernels/base/error.h"

namespace packbert {

std::unique_ptr<GradBucketTransport> make_nccl_transport(MPI_Comm, const NcclTransportSetup&) {
  PB_THROW(
      "grad reducer: NCCL asked for, but this build has no CUDA (configure with "
      "-DPACKBERT_CUDA=ON)");
}

}  // namespace packbert
