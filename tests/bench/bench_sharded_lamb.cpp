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
// wall time per rank shrinks with N only where the ranks have cores of their own, so on the CPU
// the table also gives the LAMB's process CPU time per rank (the work, whatever the sharing).
// Memory per rank: the weights (4 B per parameter), the gradient of the range the rank's LAMB
// reads (pages of the rest are never touched) and the LAMB state; --skip-replicated leaves out
// the replicated row, whose state (8 B per parameter on every rank) may not fit N ranks on one
// host.
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/backend.h"
#include "comm/grad_reducer.h"
#include "comm/shard_exchange.h"
#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/lamb.h"
#include "optim/sharding.h"
#include "mpi_timing.h"

namespace packbert {
namespace {

int run(int argc, char** argv, int rank, int size) {
  std::string model = "large";
  int iters = 3;
  Device device = Device::cpu;
  bool replicated = true;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--skip-replicated") {
      replicated = false;
      continue;
    }
    PB_REQUIRE(i + 1 < argc, "argument '{}' needs a value", k);
    const std::string v = argv[++i];
    if (k == "--model") model = v;
    else if (k == "--iters") iters = std::max(1, std::atoi(v.c_str()));
    else if (k == "--device") device = v == "cuda" ? Device::cuda : Device::cpu;
    else PB_THROW("unknown argument '{}' (--model base|large, --iters N, --device cpu|cuda, "
                  "--skip-replicated)", k);
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
  {
    std::vector<float> host(static_cast<size_t>(n));
    for (size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    backend->copy(w.tensor(), view(host.data(), {n}));
  }
  const std::vector<int64_t> bounds = plan_shards(n, size);
  const int64_t mine_begin = bounds[static_cast<size_t>(rank)];
  const int64_t mine_end = bounds[static_cast<size_t>(rank) + 1];
  // The copy bandwidth over this rank's range (the whole buffer when only the replicated row
  // runs at one rank): the gradient's other pages stay untouched when the replicated row is off.
  const int64_t bw_begin = replicated ? 0 : mine_begin, bw_end = replicated ? n : mine_end;
  const double bandwidth_s =
      bench::slowest_rank_time(iters, [&] {
        backend->copy(slice(g.tensor(), bw_begin, bw_end - bw_begin),
                     slice(w.tensor(), bw_begin, bw_end - bw_begin));
        backend->synchronize();
      }).wall;
  // read + write (a rank that owns nothing measures nothing: then the whole buffer's)
  const double bandwidth =
      2.0 * static_cast<double>(std::max<int64_t>(bw_end - bw_begin, 1)) * 4 / bandwidth_s;

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
    std::cout << "| ranks | optimizer | state per rank MiB | LAMB ms | LAMB CPU ms | "
                 "LAMB bytes per rank GB | GB/s (of the copy's) | all-gather ms | "
                 "zero rest ms (est.) | step ms |\n"
                 "|---|---|---|---|---|---|---|---|---|---|\n";
  }
  for (bool sharded : {false, true}) {
    if (sharded && size == 1) continue;
    if (!sharded && !replicated) continue;
    LambShard shard;
    shard.begin = mine_begin;
    shard.end = mine_end;
    shard.sum_over_ranks = [&](const Tensor& v) { ShardExchange(reducer).sum(v); };
    LambOptions lo;
    lo.check_finite = false;
    Lamb lamb(*backend, params, n, LrSchedule(lr), lo, sharded ? &shard : nullptr);
    // The gradient LAMB reads: a copy of the weights, over the range this rank updates.
    const int64_t gb = sharded ? mine_begin : 0, ge = sharded ? mine_end : n;
    if (ge > gb) backend->copy(slice(g.tensor(), gb, ge - gb), slice(w.tensor(), gb, ge - gb));
    const bench::RankTime lamb_t = bench::slowest_rank_time(iters, [&] {
      lamb.step(w.tensor(), g.tensor(), {}, 1.0f, /*read_back=*/false);
      backend->synchronize();
    });
    const double lamb_s = lamb_t.wall;
    const double gather_s = sharded ? bench::slowest_rank_time(iters, [&] {
      ShardExchange(reducer).all_gather(w.tensor());
      backend->synchronize();
    }).wall
                                    : 0.0;
    // LAMB's passes over what it owns: the norm of the gradient (4 B), the weights' norm (4 B),
    // the update (read g, w, m, v, write u, m, v: 28 B), the apply (read w, u, write w: 12 B),
    // the zeroing of the gradient (4 B).
    const double owned = static_cast<double>(sharded ? shard.end - shard.begin : n);
    double owned_max = owned, owned_min = owned;
    MPI_Allreduce(&owned, &owned_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&owned, &owned_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    const double bytes = 52.0 * owned_max;
    // Sharded, the trainer also zeroes the rest of the gradient (4 B per parameter a rank does
    // not own): estimated at the measured bandwidth, since timing it here would make every
    // rank's whole gradient resident.
    const double zero_rest_s =
        sharded ? 4.0 * (static_cast<double>(n) - owned_min) / (bandwidth / 2) : 0.0;
    double state = static_cast<double>(lamb.state_bytes()), state_max = state;
    MPI_Allreduce(&state, &state_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      std::cout << fmt::format("| {} | {} | {:.1f} | {:.1f} | {} | {:.2f} | {:.1f} ({:.0f}%) | "
                               "{:.1f} | {:.1f} | {:.1f} |\n",
                               size, sharded ? "sharded" : "replicated", state_max / (1 << 20),
                               1e3 * lamb_s,
                               device == Device::cpu ? fmt::format("{:.1f}", 1e3 * lamb_t.cpu)
                                                     : std::string("-"),
                               bytes / 1e9, bytes / lamb_s / 1e9,
                               100.0 * bytes / lamb_s / bandwidth, 1e3 * gather_s,
                               1e3 * zero_rest_s, 1e3 * (lamb_s + gather_s + zero_rest_s));
  }
  if (rank == 0)
    std::cout << "\nstate per rank and LAMB bytes: the largest rank's; a sharded step adds the "
                 "all-gather of the weights and the zeroing of the gradient it does not own (the "
                 "reduce-scatter replaces the all-reduce). LAMB CPU ms: the process CPU time "
                 "of the slowest rank (oversubscribed ranks wait for cores: wall > CPU).\n";
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
