// The optimizer step per rank, sharded (optim.sharded) against unsharded, on the backend of
// --device (cpu by default): LAMB over the rank's tensors (the global norm's sum over ranks
// included), then the all-gather of the weights; the optimizer state each rank holds; the bytes
// each rank's LAMB moves and its speed against the memory bandwidth measured here (a copy of a
// buffer the size of the parameters). Prints a table; times are the slowest rank's, best of
// --iters. Run it at several rank counts:
//
//   for n in 1 2 4 8; do mpirun -np $n build/tests/bench_sharded_lamb --model large; done
//
// Ranks that share cores (oversubscribed) time the same work side by side: the sharded LAMB
// time per rank shrinks with N only where the ranks have cores of their own.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend.h"
#include "comm/grad_reducer.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/lamb.h"
#include "optim/sharding.h"

namespace packbert {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The slowest rank's time of fn, best of iters.
template <typename Fn>
double timed(int iters, Fn&& fn) {
  double best = 1e30;
  for (int it = 0; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    fn();
    double t = now() - t0, slowest = 0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = std::min(best, slowest);
  }
  return best;
}

int run(int argc, char** argv, int rank, int size) {
  std::string model = "large";
  int iters = 3;
  Device device = Device::cpu;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model = v;
    else if (k == "--iters") iters = std::max(1, std::atoi(v.c_str()));
    else if (k == "--device") device = v == "cuda" ? Device::cuda : Device::cpu;
    else PB_THROW("unknown argument '{}' (--model base|large, --iters N, --device cpu|cuda)", k);
  }
  const ParamTable table(bert_preset(model));
  const int64_t n = table.total();
  std::vector<LambParam> params;
  std::vector<GradSpan> spans;
  for (const ParamTensor& t : table.tensors()) {
    params.push_back({t.name, t.offset, t.size, t.no_decay});
    spans.push_back({t.offset, t.size});
  }
  BackendOptions bo;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  bo.cuda_device = local ? std::atoi(local) : 0;
  auto backend = make_backend(device, bo);
  BackendBuffer w = backend->alloc(DType::f32, {n}), g = backend->alloc(DType::f32, {n});
  std::vector<float> host(static_cast<size_t>(n));
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  backend->copy(w.tensor(), view(host.data(), {n}));
  const double bandwidth_s = timed(iters, [&] { backend->copy(g.tensor(), w.tensor()); });
  backend->synchronize();
  const double bandwidth = 2.0 * static_cast<double>(n) * 4 / bandwidth_s;  // read + write

  const std::vector<int64_t> bounds = plan_tensor_shards(params, n, size);
  GradReducerOptions ro;
  ro.shard_bounds = bounds;
  ro.device_transport = GradTransport::mpi;  // the bench's ranks may share one GPU
  GradReducer reducer(MPI_COMM_WORLD, *backend, g.tensor(), spans, ro);
  LrScheduleConfig lr;  // a small rate keeps the weights finite
  lr.base_lr = 1e-9;
  lr.max_steps = 1000000;
  if (rank == 0) {
    std::cout << fmt::format(
        "bench_sharded_lamb: BERT-{} ({:.1f}M parameters), {} rank(s) on {}, best of {}; "
        "measured copy bandwidth {:.1f} GB/s per rank; shard imbalance {:.2f} (largest range "
        "over the mean)\n\n",
        model, static_cast<double>(n) / 1e6, size, device_name(device), iters, bandwidth / 1e9,
        shard_imbalance(bounds));
    std::cout << "| optimizer | state per rank MiB | LAMB ms | LAMB bytes per rank GB | "
                 "GB/s (of the copy's) | all-gather ms | step ms |\n"
                 "|---|---|---|---|---|---|---|\n";
  }
  for (bool sharded : {false, true}) {
    if (sharded && size == 1) continue;
    LambShard shard;
    shard.begin = bounds[static_cast<size_t>(rank)];
    shard.end = bounds[static_cast<size_t>(rank) + 1];
    shard.sum_over_ranks = [&](double* v, int c) { reducer.allreduce_sum(v, c); };
    LambOptions lo;
    lo.check_finite = false;
    Lamb lamb(*backend, params, n, LrSchedule(lr), lo, sharded ? &shard : nullptr);
    auto refill = [&] { backend->copy(g.tensor(), view(host.data(), {n})); };
    refill();
    const double lamb_s = timed(iters, [&] {
      lamb.step(w.tensor(), g.tensor(), {}, 1.0f, /*read_back=*/false);
      backend->synchronize();
    });
    const double gather_s = sharded ? timed(iters, [&] {
      reducer.all_gather(w.tensor());
      backend->synchronize();
    })
                                    : 0.0;
    // LAMB's passes over what it owns: the norm of the gradient (4 B), the weights' norm (4 B),
    // the update (read g, w, m, v, write u, m, v: 28 B), the apply (read w, u, write w: 12 B).
    const double owned = static_cast<double>(sharded ? shard.end - shard.begin : n);
    double owned_max = owned;
    MPI_Allreduce(&owned, &owned_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double bytes = 48.0 * owned_max;
    double state = static_cast<double>(lamb.state_bytes()), state_max = state;
    MPI_Allreduce(&state, &state_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      std::cout << fmt::format("| {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} ({:.0f}%) | {:.1f} | "
                               "{:.1f} |\n",
                               sharded ? "sharded" : "replicated", state_max / (1 << 20),
                               1e3 * lamb_s, bytes / 1e9, bytes / lamb_s / 1e9,
                               100.0 * bytes / lamb_s / bandwidth, 1e3 * gather_s,
                               1e3 * (lamb_s + gather_s));
  }
  if (rank == 0)
    std::cout << "\nstate per rank and LAMB bytes: the largest rank's; a sharded step adds the "
                 "all-gather of the weights (the reduce-scatter replaces the all-reduce).\n";
  return 0;
}

}  // namespace
}  // namespace packbert

int main(int argc, char** argv) {
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 1;
  try {
    rc = packbert::run(argc, argv, rank, size);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << rank << "] error: " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
