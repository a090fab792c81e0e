// NCCL's calls in the emulated build (include/nccl.h): none is available.
#include <nccl.h>

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidUsage: return "invalid usage";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "NCCL error";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  return "NCCL is not available in the emulated CUDA build (PACKBERT_CUDA=EMULATED): it runs "
         "one device in one process";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInvalidUsage; }
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int, ncclUniqueId, int) {
  *comm = nullptr;
  return ncclInvalidUsage;
}
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                           cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                        cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclGroupStart() { return ncclInvalidUsage; }
ncclResult_t ncclGroupEnd() { return ncclInvalidUsage; }
