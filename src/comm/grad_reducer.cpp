#include "comm/grad_reducer.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "core/mpi_check.h"
#include "comm/nccl_transport.h"
#include "kernels/base/error.h"
#include "core/watchdog.h"

namespace packbert {

namespace {

MPI_Datatype mpi_type_of(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;  // gathered, never summed: the bits travel
    default: break;
  }
  PB_THROW("shard exchange: all_gather of a {} buffer (f32, bf16 or f16)", dtype_name(t));
}

// One MPI collective per bucket on host memory; a device buffer is staged through the host.
class MpiTransport final : public GradBucketTransport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size, Backend& backend, const Tensor& grads,
               size_t num_buckets, std::vector<int64_t> bounds)
      : comm_(comm),
        rank_(rank),
        size_(size),
        bounds_(std::move(bounds)),
        backend_(backend),
        grads_(grads),
        staged_(grads.device != Device::cpu),
        requests_(num_buckets, MPI_REQUEST_NULL),
        completed_indices_(num_buckets, 0) {
    if (staged_) host_.assign(static_cast<size_t>(grads.numel()), 0.f);
    host_grads_ = staged_ ? host_.data() : static_cast<float*>(grads.data);
  }

  void begin_round(GradCollective collective) override {
    collective_ = collective;
    // Sized before any request points into it: this rank's range only, each bucket's part at
    // its place in the range (the whole gradient's size would cost every rank (N - 1) / N of a
    // gradient more).
    if (collective == GradCollective::reduce_scatter)
      shard_scratch_.resize(static_cast<size_t>(std::max<int64_t>(own_end() - own_begin(), 1)));
    std::fill(requests_.begin(), requests_.end(), MPI_REQUEST_NULL);
    round_buckets_.clear();
    started_ = 0;
    completed_ = 0;
  }

  void start(int k, const GradBucket& b) override {
    float* h = host_grads_ + b.offset;
    // The backend's copy waits for the ops that wrote the bucket.
    if (staged_) backend_.copy(view(h, {b.size}), slice(grads_, b.offset, b.size));
    MPI_Request* req = &requests_[static_cast<size_t>(k)];
    if (collective_ == GradCollective::allreduce) {
      PB_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, h, static_cast<int>(b.size), MPI_FLOAT, MPI_SUM,
                                  comm_, req));
    } else {
      // The sum of this rank's part lands in scratch (MPI's in-place form would put it at the
      // bucket's start); complete_all() moves it into place.
      const std::vector<int> counts = part_counts(b);
      const GradBucket mine = own_part(b);
      float* recv = shard_scratch_.data() + (mine.size > 0 ? mine.offset - own_begin() : 0);
      PB_MPI_CHECK(MPI_Ireduce_scatter(h, recv, counts.data(), MPI_FLOAT, MPI_SUM, comm_, req));
    }
    round_buckets_.push_back(b);
    started_ = k + 1;
  }

  int test() override {
    if (completed_ == started_) return completed_;
    // Testsome over every started request: completed ones are MPI_REQUEST_NULL and ignored. Any
    // MPI test also runs OpenMPI's progress engine for all of them.
    int outcount = 0;
    PB_MPI_CHECK(MPI_Testsome(started_, requests_.data(), &outcount, completed_indices_.data(),
                              MPI_STATUSES_IGNORE));
    if (outcount != MPI_UNDEFINED) completed_ += outcount;
    return completed_;
  }

  // Test and yield rather than MPI_Waitall: OpenMPI's wait spins a core that the data loader's
  // thread (and, oversubscribed, another rank) may need, while each test still progresses.
  void complete_all() override {
    while (test() < started_) std::this_thread::yield();
    for (const GradBucket& b : round_buckets_) {
      int64_t first = b.offset, size = b.size;
      if (collective_ == GradCollective::reduce_scatter) {
        const GradBucket mine = own_part(b);
        first = mine.offset;
        size = mine.size;
        if (size == 0) continue;
        std::memcpy(host_grads_ + first, shard_scratch_.data() + (first - own_begin()),
                    static_cast<size_t>(size) * sizeof(float));
      }
      if (staged_) backend_.copy(slice(grads_, first, size), view(host_grads_ + first, {size}));
    }
  }

  void all_gather(const std::vector<GradBucket>& buckets, const Tensor& buffer) override {
    const MPI_Datatype type = mpi_type_of(buffer.dtype);
    const size_t elem = dtype_size(buffer.dtype);
    const bool staged = buffer.device != Device::cpu;
    if (staged) gather_host_.resize(buffer.bytes());
    char* host = staged ? gather_host_.data() : static_cast<char*>(buffer.data);
    std::vector<MPI_Request> reqs(buckets.size(), MPI_REQUEST_NULL);
    std::vector<std::vector<int>> counts(buckets.size()), displs(buckets.size());
    for (size_t k = 0; k < buckets.size(); ++k) {
      const GradBucket& b = buckets[k];
      const GradBucket mine = own_part(b);
      if (staged && mine.size > 0) {
        const Tensor h(host + mine.offset * static_cast<int64_t>(elem), buffer.dtype, {mine.size});
        backend_.copy(h, slice(buffer, mine.offset, mine.size));
      }
      counts[k] = part_counts(b);
      displs[k].assign(counts[k].size(), 0);
      for (size_t r = 1; r < counts[k].size(); ++r)
        displs[k][r] = displs[k][r - 1] + counts[k][r - 1];
      PB_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                   host + b.offset * static_cast<int64_t>(elem), counts[k].data(),
                                   displs[k].data(), type, comm_, &reqs[k]));
    }
    int done = 0;
    while (!done) {
      PB_MPI_CHECK(
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
      if (!done) std::this_thread::yield();
    }
    if (staged) {
      for (const GradBucket& b : buckets)
        backend_.copy(slice(buffer, b.offset, b.size),
                      Tensor(host + b.offset * static_cast<int64_t>(elem), buffer.dtype, {b.size}));
    }
  }

  void allreduce_sum(const Tensor& values) override {
    const int count = static_cast<int>(values.numel());
    if (values.device == Device::cpu) {
      PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data, count, MPI_DOUBLE, MPI_SUM, comm_));
      return;
    }
    std::vector<double> host(static_cast<size_t>(count));
    backend_.copy(view(host.data(), {values.numel()}), values);  // waits for the writer
    PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, host.data(), count, MPI_DOUBLE, MPI_SUM, comm_));
    backend_.copy(values, view(host.data(), {values.numel()}));
  }

 private:
  // Counts per rank of bucket b's owned parts (int: MPI's counts; buckets fit an int).
  std::vector<int> part_counts(const GradBucket& b) const {
    const std::vector<int64_t> c = bucket_part_counts(b, bounds_);
    return std::vector<int>(c.begin(), c.end());
  }
  int64_t own_begin() const { return bounds_[static_cast<size_t>(rank_)]; }
  int64_t own_end() const { return bounds_[static_cast<size_t>(rank_) + 1]; }
  GradBucket own_part(const GradBucket& b) const {
    GradBucket p = b;
    p.offset = std::max(b.offset, bounds_[static_cast<size_t>(rank_)]);
    p.size = std::max<int64_t>(
        0, std::min(b.offset + b.size, bounds_[static_cast<size_t>(rank_) + 1]) - p.offset);
    return p;
  }

  MPI_Comm comm_;
  int rank_, size_;
  std::vector<int64_t> bounds_;
  Backend& backend_;
  Tensor grads_;
  bool staged_;
  std::vector<float> host_;      // staged: the host copy of the gradient
  float* host_grads_ = nullptr;  // where MPI reads and writes
  std::vector<float> shard_scratch_;
  std::vector<char> gather_host_;
  GradCollective collective_ = GradCollective::allreduce;
  std::vector<MPI_Request> requests_;   // MPI_REQUEST_NULL once complete (or never started)
  std::vector<int> completed_indices_;  // MPI_Testsome scratch
  std::vector<GradBucket> round_buckets_;
  int started_ = 0;
  int completed_ = 0;
};

}  // namespace

GradReducer::GradReducer(MPI_Comm parent, Backend& backend, const Tensor& grads,
                         std::vector<GradSpan> tensors, const GradReducerOptions& options)
    : num_elems_(grads.defined() ? grads.numel() : 0),
      sched_(std::move(tensors), num_elems_, options.bucket_bytes, "grad reducer") {
  PB_REQUIRE(grads.defined() && grads.dtype == DType::f32 && grads.ndim == 1,
             "grad reducer: the gradient must be a flat f32 buffer, got {}", grads.str());
  check_device("grad reducer", "grads", grads, backend.device());
  // Without MPI (unit tests, a bare run) this is world size 1 and no MPI call is ever made.
  int initialized = 0, finalized = 0;
  PB_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) PB_MPI_CHECK(MPI_Finalized(&finalized));
  if (initialized && !finalized) PB_MPI_CHECK(MPI_Comm_size(parent, &size_));
  const bool nccl = grads.device != Device::cpu && options.device_transport == GradTransport::nccl;
  bounds_ = options.shard_bounds;
  if (bounds_.empty()) {
    for (int r = 0; r <= size_; ++r) bounds_.push_back(num_elems_ * r / size_);
  }
  PB_REQUIRE(bounds_.size() == static_cast<size_t>(size_) + 1 && bounds_.front() == 0 &&
                 bounds_.back() == num_elems_ && std::is_sorted(bounds_.begin(), bounds_.end()),
             "grad reducer: {} shard bounds for {} ranks (need {}, ascending from 0 to {})",
             bounds_.size(), size_, size_ + 1, num_elems_);
  if (size_ > 1) {
    const WatchScope watch("MPI_Comm_dup (gradient reducer)");
    PB_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
    PB_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    PB_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  }
  if (nccl && (size_ > 1 || options.nccl_on_one_rank)) {
    NcclTransportSetup setup;
    setup.cuda_device = options.cuda_device;
    setup.stream = backend.native_stream();
    setup.grads = static_cast<float*>(grads.data);
    setup.num_buckets = sched_.buckets().size();
    setup.shard_bounds = bounds_;
    transport_ = make_nccl_transport(size_ > 1 ? parent : MPI_COMM_NULL, setup);
    transport_name_ = "nccl";
  } else if (size_ > 1) {
    transport_ = std::make_unique<MpiTransport>(comm_, rank_, size_, backend, grads,
                                                sched_.buckets().size(), bounds_);
    transport_name_ = grads.device == Device::cpu ? "mpi" : "mpi via host";
  }
  sched_.set_transport(transport_.get());
}

GradReducer::~GradReducer() {
  const bool pending = sched_.in_round() && sched_.buckets_started() > sched_.buckets_completed();
  const bool nccl = std::strcmp(transport_name_, "nccl") == 0;
  if (pending && !nccl) {
    // A pending non-blocking MPI collective cannot be freed or cancelled (MPI forbids both for
    // collectives): leave it and the communicator to MPI_Abort.
    (void)transport_.release();
    return;
  }
  transport_.reset();  // NCCL's aborts its communicator when a round is in flight
  if (comm_ == MPI_COMM_NULL || pending) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

void GradReducer::begin(GradCollective collective) {
  collective_name_ = collective == GradCollective::allreduce ? "all-reduce (gradient reducer)"
                                                             : "reduce-scatter (gradient reducer)";
  sched_.begin(collective);
}

void GradReducer::ready_tensor(int i) { sched_.ready_tensor(i); }
void GradReducer::ready(int64_t offset, int64_t size) { sched_.ready(offset, size); }
void GradReducer::progress() { sched_.progress(); }
GradReduceStats GradReducer::finish() {
  // At the watchdog's step. With NCCL the host does not wait here
  // (docs/communication.md#nccl-hangs).
  const WatchScope watch(collective_name_);
  return sched_.finish();
}

void GradReducer::complete() {
  const WatchScope watch(collective_name_);
  sched_.complete();
}

void GradReducer::graph_launched() {
  PB_REQUIRE(capturable(),
             "grad reducer: a graph holding a round of the {} transport (only "
             "NCCL's rounds can be captured)",
             transport_name_);
  sched_.graph_launched();
}

std::vector<int64_t> GradReducer::all_ranks(const std::vector<int64_t>& local) {
  if (size_ == 1) return local;
  const int n = static_cast<int>(local.size());
  std::vector<int64_t> all(local.size() * static_cast<size_t>(size_));
  const WatchScope watch("MPI_Allgather (graph keys, gradient reducer)");
  MPI_Request req = MPI_REQUEST_NULL;
  PB_MPI_CHECK(
      MPI_Iallgather(local.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm_, &req));
  // Tested, not waited for: meanwhile the device runs what this rank issued (a peer may be
  // waiting on the device for a collective of ours that it has not reached).
  int done = 0;
  for (;;) {
    PB_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (transport_) transport_->poll();
    std::this_thread::yield();
  }
  return all;
}

GradBucket GradReducer::shard(int k) const {
  const auto& b = sched_.buckets();
  PB_REQUIRE(k >= 0 && static_cast<size_t>(k) < b.size(), "grad reducer: shard({}) of {} buckets",
             k, b.size());
  GradBucket s = b[static_cast<size_t>(k)];
  const int64_t lo = std::max(s.offset, bounds_[static_cast<size_t>(rank_)]);
  const int64_t hi = std::min(s.offset + s.size, bounds_[static_cast<size_t>(rank_) + 1]);
  s.offset = lo;
  s.size = std::max<int64_t>(0, hi - lo);
  return s;
}

}  // namespace packbert
