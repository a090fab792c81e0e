#include "comm/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <string>
#include <thread>
#include <utility>

#include "kernels/base/error.h"
#include "core/watchdog.h"
#include "core/mpi_check.h"
#ifdef PACKBERT_CUDA_EMULATION
#include "kernels/mutants.h"  // PB_MUTANT (the emulated build only)
#endif

namespace packbert {

namespace {

// "cudaEventRecord(ready_[k], compute_)" -> "cudaEventRecord": the name is what a reader needs.
std::string call_name(const char* call) {
  const std::string s(call);
  return s.substr(0, s.find('('));
}

// "<host>/<PCI bus id>": names a GPU across processes (device numbers are per process).
std::string gpu_identity(int device) {
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  PB_MPI_CHECK(MPI_Get_processor_name(host, &len));
  char bus[64] = {0};
  const cudaError_t e = cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof(bus)), device);
  PB_REQUIRE(e == cudaSuccess, "nccl transport: cudaDeviceGetPCIBusId of GPU {} failed: {} ({})",
             device, cudaGetErrorString(e), cudaGetErrorName(e));
  return std::string(host, static_cast<size_t>(len)) + "/" + bus;
}

}  // namespace

// What to change when two ranks share a GPU.
constexpr const char* kOneGpuPerRank =
    "NCCL needs a GPU of its own for every rank: start at most as many ranks per node as it has "
    "GPUs (local rank r takes GPU r), or set train.gpu_allreduce = \"host\" to sum the "
    "gradients through MPI";

// Checked calls inside the transport: a failure aborts the communicator, then throws.
#define PB_NCCL_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)
#define PB_NCCL_NCCL(call) check_nccl((call), #call, __FILE__, __LINE__)

// The scheduler's transport on the GPU: per bucket a ready event on the compute stream, a wait
// and the collective on the communication stream, a done event (see the header).
class NcclTransport final : public GradBucketTransport {
 public:
  NcclTransport(int device, cudaStream_t compute, float* grads, size_t num_buckets,
                std::vector<int64_t> bounds)
      : device_(device), compute_(compute), grads_(grads), bounds_(std::move(bounds)) {
    try {
      create(num_buckets);
    } catch (...) {
      release();  // no destructor runs for a constructor that throws
      throw;
    }
  }

  // Collective over the ranks: joins the communicator of the given id.
  void init_comm(const ncclUniqueId& id, int nranks, int rank) {
    PB_NCCL_CUDA(cudaSetDevice(device_));
    const ncclResult_t r = ncclCommInitRank(&comm_, nranks, id, rank);
    if (r != ncclSuccess) {
      const char* detail = ncclGetLastError(nullptr);
      if (detail && std::string(detail).find("Duplicate GPU") != std::string::npos)
        PB_THROW("nccl transport: ncclCommInitRank: {}: {}", detail, kOneGpuPerRank);
    }
    PB_NCCL_NCCL(r);
    nranks_ = nranks;
    rank_ = rank;
  }

  // A communicator of this rank alone (GradReducerOptions::nccl_on_one_rank).
  void init_alone() {
    ncclUniqueId id{};
    PB_NCCL_NCCL(ncclGetUniqueId(&id));
    init_comm(id, 1, 0);
  }

  ~NcclTransport() override {
    watch_.reset();  // the watchdog no longer polls this transport's events
    (void)cudaSetDevice(device_);
    if (comm_ && !aborted_) {
      // Never wait here: a started bucket not yet complete may be waiting for a peer that died.
      // After a complete step every bucket is done (the optimizer that followed finish() has
      // been waited for), so a clean shutdown destroys the communicator; anything else aborts.
      const bool clean =
          !failed_ && !in_round_ && std::uncaught_exceptions() == 0 &&
          (!round_done_ || cudaEventQuery(round_done_) == cudaSuccess) &&
          (groups_started_ == 0 || cudaEventQuery(group_done_[groups_started_ - 1]) == cudaSuccess);
      if (clean) {
        (void)ncclCommDestroy(comm_);
      } else {
        abort_comm();
      }
      comm_ = nullptr;
    }
    release();
  }

  void begin_round(GradCollective collective) override {
    PB_REQUIRE(!failed_, "nccl transport: the communicator was aborted after an earlier error");
    PB_NCCL_CUDA(cudaSetDevice(device_));
    collective_ = collective;
    started_ = 0;
    completed_ = 0;
    in_round_ = true;
    captured_ = false;
    // Where the watch of a round inside a graph starts timing (launched()): the stream reaches
    // it when it starts the backward.
    if (!capturing()) PB_NCCL_CUDA(cudaEventRecord(round_start_, compute_));
  }

  void start(int k, const GradBucket& b) override {
    const auto i = static_cast<size_t>(k);
    float* data = grads_ + b.offset;
    // Inside a capture the calls below are recorded: the record forks the communication stream
    // into the capture, the done events join it back (complete_all). A capture records events
    // of its own: the watchdog may still be polling an earlier round's.
    captured_ = captured_ || capturing();
    cudaEvent_t ready = (captured_ ? captured_ready_ : ready_)[i];
    // Every write to this bucket has been launched on the compute stream: the event marks them.
    PB_NCCL_CUDA(cudaEventRecord(ready, compute_));
    PB_NCCL_CUDA(cudaStreamWaitEvent(comm_stream_, ready, 0));
    if (collective_ == GradCollective::allreduce) {
      PB_NCCL_NCCL(ncclAllReduce(data, data, static_cast<size_t>(b.size), ncclFloat, ncclSum, comm_,
                                 comm_stream_));
    } else {
      // One in-place ncclReduce per owner of a part of the bucket, in one group.
      const std::vector<int64_t> counts = bucket_part_counts(b, bounds_);
      PB_NCCL_NCCL(ncclGroupStart());
      int64_t at = 0;
      for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] > 0)
          PB_NCCL_NCCL(ncclReduce(data + at, data + at, static_cast<size_t>(counts[r]), ncclFloat,
                                  ncclSum, static_cast<int>(r), comm_, comm_stream_));
        at += counts[r];
      }
      PB_NCCL_NCCL(ncclGroupEnd());
    }
    PB_NCCL_CUDA(cudaEventRecord((captured_ ? captured_done_ : done_)[i], comm_stream_));
    started_ = k + 1;
  }

  int test() override {
    // A captured round's events order the graph's nodes; none of them has run (querying one
    // would invalidate the capture).
    if (captured_ || capturing()) return completed_;
    while (completed_ < started_) {
      const cudaError_t q = cudaEventQuery(done_[static_cast<size_t>(completed_)]);
      if (q == cudaErrorNotReady) break;  // not an error: still running
      PB_NCCL_CUDA(q);
      ++completed_;
    }
    if (completed_ < started_) check_async();
    return completed_;
  }

  void complete_all() override {
    // The communication stream runs the buckets in order: its last done event implies all.
    captured_ = captured_ || capturing();
    if (started_ > 0) {
      cudaEvent_t last = (captured_ ? captured_done_ : done_)[static_cast<size_t>(started_ - 1)];
      PB_NCCL_CUDA(cudaStreamWaitEvent(compute_, last, 0));
      // Captured: the wait joins the capture; the graph's launch is watched (launched()).
      if (!captured_) {
        watch(round_name(), ready_[static_cast<size_t>(started_ - 1)], last);
        round_done_ = last;
      }
    }
    check_async();
    in_round_ = captured_;  // until the graph is launched
  }

  // The compute stream has just launched a graph holding this round's collectives (recorded at
  // this round or an earlier one): what follows on the stream sees the sums. Its end is
  // watched from the round's start (begin_round).
  void launched() override {
    watch_launch(round_name());
    captured_ = false;
    in_round_ = false;
  }

  // Also for a graph of the optimizer's sums after the round (watched from the round's begin).
  void watch_launch(const char* collective) override {
    PB_NCCL_CUDA(cudaSetDevice(device_));
    PB_NCCL_CUDA(cudaEventRecord(launch_done_, compute_));
    watch(collective, round_start_, launch_done_);
    round_done_ = launch_done_;
    check_async();
  }

  void all_gather(const std::vector<GradBucket>& buckets, const Tensor& buffer) override {
    PB_REQUIRE(!failed_, "nccl transport: the communicator was aborted after an earlier error");
    if (buckets.empty()) return;
    PB_NCCL_CUDA(cudaSetDevice(device_));
    // One event covers every write to the buffer issued so far; the compute stream then waits
    // for the last gather (the communication stream runs them in order).
    PB_NCCL_CUDA(cudaEventRecord(ready_[0], compute_));
    PB_NCCL_CUDA(cudaStreamWaitEvent(comm_stream_, ready_[0], 0));
    // An all-gather of unequal parts: one in-place ncclBroadcast per owner, in one group.
    PB_NCCL_NCCL(ncclGroupStart());
    broadcast_parts(buckets, buffer);
    PB_NCCL_NCCL(ncclGroupEnd());
    PB_NCCL_CUDA(cudaEventRecord(done_[0], comm_stream_));
    PB_NCCL_CUDA(cudaStreamWaitEvent(compute_, done_[0], 0));
    watch("NCCL all-gather (shard exchange)", ready_[0], done_[0]);
    check_async();
  }

  void start_groups(const std::vector<std::vector<GatherPart>>& groups) override {
    PB_REQUIRE(!failed_, "nccl transport: the communicator was aborted after an earlier error");
    if (groups.empty()) return;
    PB_NCCL_CUDA(cudaSetDevice(device_));
    while (group_done_.size() < groups.size()) {
      cudaEvent_t e = nullptr;
      PB_NCCL_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      group_done_.push_back(e);
    }
    // One event covers every write issued so far (the optimizer's update); the groups then run
    // in order on the communication stream, each marking its end for the readers of its part.
    // Inside a capture (the optimizer's graph) the last group's end joins the capture: what
    // follows the graph sees every group, nothing is left to wait for, and the graph's launch
    // is watched (watch_launch).
    const bool captured = capturing();
    cudaEvent_t ready = (captured ? captured_ready_ : ready_)[0];
    PB_NCCL_CUDA(cudaEventRecord(ready, compute_));
    PB_NCCL_CUDA(cudaStreamWaitEvent(comm_stream_, ready, 0));
    for (size_t g = 0; g < groups.size(); ++g) {
      PB_NCCL_NCCL(ncclGroupStart());
      for (const GatherPart& part : groups[g]) broadcast_parts(part.pieces, part.buffer);
      PB_NCCL_NCCL(ncclGroupEnd());
      if (!captured) PB_NCCL_CUDA(cudaEventRecord(group_done_[g], comm_stream_));
    }
    if (captured) {
      PB_NCCL_CUDA(cudaEventRecord(captured_done_[0], comm_stream_));
      PB_NCCL_CUDA(cudaStreamWaitEvent(compute_, captured_done_[0], 0));
      groups_started_ = 0;
      check_async();
      return;
    }
    groups_started_ = groups.size();
    watch("NCCL all-gather (shard exchange, by layer)", ready_[0], group_done_[groups.size() - 1]);
    check_async();
  }

  void wait_group(int group) override {
    PB_REQUIRE(group >= 0 && static_cast<size_t>(group) < groups_started_,
               "nccl transport: wait for gather group {} of {}", group, groups_started_);
    PB_NCCL_CUDA(cudaSetDevice(device_));
#ifdef PACKBERT_CUDA_EMULATION
    // Planted mistake (kernels/mutants.h, Mutant::gather_group_wait): the reader
    // does not wait for the group it is about to read.
    if (PB_MUTANT(cuda::Mutant::gather_group_wait)) return;
#endif
    PB_NCCL_CUDA(cudaStreamWaitEvent(compute_, group_done_[static_cast<size_t>(group)], 0));
  }

  void allreduce_sum(const Tensor& values) override {
    PB_REQUIRE(!failed_, "nccl transport: the communicator was aborted after an earlier error");
    PB_REQUIRE(values.device == Device::cuda,
               "nccl transport: allreduce_sum of {} (device memory only)", values.str());
    PB_REQUIRE(!ready_.empty(), "nccl transport: allreduce_sum without a bucket's events");
    PB_NCCL_CUDA(cudaSetDevice(device_));
    // Inside a capture (the optimizer's graph): its own events, and the launch is watched
    // (watch_launch) instead.
    const bool captured = capturing();
    cudaEvent_t ready = (captured ? captured_ready_ : ready_)[0];
    cudaEvent_t done = (captured ? captured_done_ : done_)[0];
    PB_NCCL_CUDA(cudaEventRecord(ready, compute_));
    PB_NCCL_CUDA(cudaStreamWaitEvent(comm_stream_, ready, 0));
    PB_NCCL_NCCL(ncclAllReduce(values.data, values.data, static_cast<size_t>(values.numel()),
                               ncclFloat64, ncclSum, comm_, comm_stream_));
    PB_NCCL_CUDA(cudaEventRecord(done, comm_stream_));
    PB_NCCL_CUDA(cudaStreamWaitEvent(compute_, done, 0));
    if (!captured) watch("NCCL all-reduce (shard exchange sums)", ready, done);
    check_async();
  }

 private:
  // Inside an NCCL group: each piece's owned parts of buffer from their owners to every rank,
  // one in-place ncclBroadcast per owner (an all-gather of unequal parts).
  void broadcast_parts(const std::vector<GradBucket>& pieces, const Tensor& buffer) {
    ncclDataType_t type = ncclFloat;
    switch (buffer.dtype) {
      case DType::f32: type = ncclFloat; break;
      case DType::bf16: type = ncclBfloat16; break;
      case DType::f16: type = ncclFloat16; break;
      default:
        PB_THROW("nccl transport: all_gather of a {} buffer (f32, bf16 or f16)",
                 dtype_name(buffer.dtype));
    }
    const size_t elem = dtype_size(buffer.dtype);
    char* base = static_cast<char*>(buffer.data);
    for (const GradBucket& b : pieces) {
      const std::vector<int64_t> counts = bucket_part_counts(b, bounds_);
      char* at = base + static_cast<size_t>(b.offset) * elem;
      for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] > 0)
          PB_NCCL_NCCL(ncclBroadcast(at, at, static_cast<size_t>(counts[r]), type,
                                     static_cast<int>(r), comm_, comm_stream_));
        at += static_cast<size_t>(counts[r]) * elem;
      }
    }
  }

  // The constructor's work: the device current, the buffer checked, the stream and events.
  void create(size_t num_buckets) {
    PB_NCCL_CUDA(cudaSetDevice(device_));
    if (grads_) {
      cudaPointerAttributes attr{};
      PB_NCCL_CUDA(cudaPointerGetAttributes(&attr, grads_));
      PB_REQUIRE(attr.type == cudaMemoryTypeDevice && attr.device == device_,
                 "nccl transport: the gradient buffer is not memory of GPU {} (type {}, device "
                 "{})",
                 device_, static_cast<int>(attr.type), attr.device);
    }
    // The highest priority the device offers (numerically the least): the buckets' kernels are
    // scheduled ahead of the backward's, so communication overlaps it instead of queueing.
    int least = 0, greatest = 0;
    PB_NCCL_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    PB_NCCL_CUDA(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
    for (size_t k = 0; k < num_buckets; ++k) {
      for (std::vector<cudaEvent_t>* events :
           {&ready_, &done_, &captured_ready_, &captured_done_}) {
        cudaEvent_t e = nullptr;
        PB_NCCL_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events->push_back(e);
      }
    }
    for (cudaEvent_t* e : {&round_start_, &launch_done_})
      PB_NCCL_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    // On the watchdog's thread, past the timeout: frees whatever waits on the communicator.
    watch_ = std::make_unique<AsyncWatch>([this] { abort_comm(); });
  }

  void poll() override {
    for (cudaStream_t st : {compute_, comm_stream_}) {
      const cudaError_t q = cudaStreamQuery(st);
      if (q != cudaErrorNotReady) PB_NCCL_CUDA(q);
    }
  }

  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(compute_, &status);
    return e == cudaSuccess && status != cudaStreamCaptureStatusNone;
  }

  const char* round_name() const {
    return collective_ == GradCollective::allreduce ? "NCCL all-reduce (gradient reducer)"
                                                    : "NCCL reduce-scatter (gradient reducer)";
  }

  // The host does not wait for a collective it issues (the compute stream does): the watchdog
  // polls the event that marks its end (core/watchdog.h, AsyncWatch), timing the wait from when
  // the compute stream reached `ready` (the last bucket's: from then on the device only waits
  // for its peers), not from the call: the host runs ahead of its device.
  void watch(const char* collective, cudaEvent_t ready, cudaEvent_t done) {
    const auto reached = [](cudaEvent_t e) {
      return [e] { return cudaEventQuery(e) != cudaErrorNotReady; };
    };
    watch_->arm(collective, reached(ready), reached(done));
  }

  // A failure of a peer or of the network shows here, not at the call that issued the work.
  void check_async() {
    ncclResult_t async = ncclSuccess;
    PB_NCCL_NCCL(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      check_nccl(async, "ncclCommGetAsyncError", __FILE__, __LINE__);
  }

  // Frees the events and the stream (never throws).
  void release() {
    for (cudaEvent_t e : ready_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : done_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : captured_ready_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : captured_done_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : group_done_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : {round_start_, launch_done_})
      if (e) (void)cudaEventDestroy(e);
    round_start_ = launch_done_ = nullptr;
    ready_.clear();
    done_.clear();
    captured_ready_.clear();
    captured_done_.clear();
    group_done_.clear();
    if (comm_stream_) (void)cudaStreamDestroy(comm_stream_);
    comm_stream_ = nullptr;
  }

  // Once, from the host thread or the watchdog's (comm_ stays set: the other may be reading it).
  void abort_comm() {
    failed_ = true;
    if (comm_ && !aborted_.exchange(true)) (void)ncclCommAbort(comm_);
  }

  void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
    if (e == cudaSuccess) return;
    abort_comm();
    PB_THROW("nccl transport: {}:{}: {} failed: {} ({})", file, line, call_name(call),
             cudaGetErrorString(e), cudaGetErrorName(e));
  }

  void check_nccl(ncclResult_t r, const char* call, const char* file, int line) {
    if (r == ncclSuccess) return;
    // The communicator's own description of the last failure, when it has one.
    const char* detail = comm_ && !aborted_ ? ncclGetLastError(comm_) : nullptr;
    const std::string more = detail && *detail ? std::string(" (") + detail + ")" : "";
    abort_comm();
    PB_THROW("nccl transport: {}:{}: {} failed: {}{} (NCCL error {})", file, line, call_name(call),
             ncclGetErrorString(r), more, static_cast<int>(r));
  }

  int device_;
  cudaStream_t compute_;
  float* grads_;
  cudaStream_t comm_stream_ = nullptr;
  std::vector<cudaEvent_t> ready_, done_;                    // per bucket
  std::vector<cudaEvent_t> captured_ready_, captured_done_;  // per bucket, in captures only
  std::vector<cudaEvent_t> group_done_;                      // per gather group (start_groups)
  cudaEvent_t round_start_ = nullptr;                        // recorded at each round's begin
  cudaEvent_t launch_done_ = nullptr;                        // after a graph holding a round
  cudaEvent_t round_done_ = nullptr;  // the last round's end (null: none yet)
  size_t groups_started_ = 0;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  std::unique_ptr<AsyncWatch> watch_;
  std::vector<int64_t> bounds_;  // who owns what (GradReducerOptions::shard_bounds)
  int nranks_ = 1;
  int rank_ = 0;
  GradCollective collective_ = GradCollective::allreduce;
  std::atomic<bool> failed_{false};
  bool in_round_ = false;
  bool captured_ = false;  // this round's collectives are being recorded into a graph
  int started_ = 0;
  int completed_ = 0;
};

#undef PB_NCCL_CUDA
#undef PB_NCCL_NCCL

std::unique_ptr<GradBucketTransport> make_nccl_transport(MPI_Comm parent,
                                                         const NcclTransportSetup& setup) {
  PB_REQUIRE(setup.grads != nullptr, "nccl transport: no gradient buffer");
  PB_REQUIRE(setup.cuda_device >= 0, "nccl transport: CUDA device {}", setup.cuda_device);
  PB_REQUIRE(setup.stream != nullptr, "nccl transport: the backend has no stream");
  const auto compute = static_cast<cudaStream_t>(setup.stream);
  std::unique_ptr<NcclTransport> transport;
  if (parent == MPI_COMM_NULL) {
    transport = std::make_unique<NcclTransport>(setup.cuda_device, compute, setup.grads,
                                                setup.num_buckets, setup.shard_bounds);
    transport->init_alone();
    return transport;
  }
  int rank = 0, size = 1;
  PB_MPI_CHECK(MPI_Comm_size(parent, &size));

  // The bootstrap's own communicator (its collectives match no one else's), freed on return.
  struct BootComm {
    MPI_Comm comm = MPI_COMM_NULL;
    ~BootComm() {
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
  } boot;
  // Every rank waits for every other below (MPI collectives, ncclCommInitRank): watched.
  const WatchScope watch("NCCL bootstrap (MPI collectives, ncclCommInitRank)");
  PB_MPI_CHECK(MPI_Comm_dup(parent, &boot.comm));
  PB_MPI_CHECK(MPI_Comm_set_errhandler(boot.comm, MPI_ERRORS_RETURN));
  PB_MPI_CHECK(MPI_Comm_rank(boot.comm, &rank));
  // Every step below that can fail on one rank alone is followed by an agreement, so that the
  // others throw too instead of waiting in NCCL for it.
  const auto agree = [&](const std::string& local_error, const char* what) {
    int ok = local_error.empty() ? 1 : 0, all_ok = 0;
    PB_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, boot.comm));
    if (!ok) PB_THROW("{}", local_error);
    PB_REQUIRE(all_ok,
               "nccl transport: rank {}: another rank failed to {} (its log names the "
               "error)",
               rank, what);
  };

  std::string error, gpu;
  try {
    transport = std::make_unique<NcclTransport>(setup.cuda_device, compute, setup.grads,
                                                setup.num_buckets, setup.shard_bounds);
    gpu = gpu_identity(setup.cuda_device);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "set up its GPU");

  // NCCL needs a GPU of its own for every rank; two ranks on one GPU would fail inside
  // ncclCommInitRank with a less telling message. Every rank sees the same table and so throws
  // the same error.
  constexpr size_t kIdLen = MPI_MAX_PROCESSOR_NAME + 64;
  std::vector<char> mine(kIdLen, 0), all(kIdLen * static_cast<size_t>(size), 0);
  std::copy_n(gpu.begin(), std::min(gpu.size(), kIdLen - 1), mine.begin());
  PB_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(kIdLen), MPI_CHAR, all.data(),
                             static_cast<int>(kIdLen), MPI_CHAR, boot.comm));
  for (int a = 0; a < size; ++a) {
    const std::string ga(&all[static_cast<size_t>(a) * kIdLen]);
    for (int b = a + 1; b < size; ++b) {
      PB_REQUIRE(ga != std::string(&all[static_cast<size_t>(b) * kIdLen]),
                 "nccl transport: ranks {} and {} both use GPU {}: {}", a, b, ga, kOneGpuPerRank);
    }
  }

  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      error = fmt::format("nccl transport: ncclGetUniqueId failed: {} (NCCL error {})",
                          ncclGetErrorString(r), static_cast<int>(r));
  }
  agree(error, "create the NCCL unique id");
  PB_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, boot.comm));

  try {
    transport->init_comm(id, size, rank);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "join the NCCL communicator");
  return transport;
}

}  // namespace packbert
