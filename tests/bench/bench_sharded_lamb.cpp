// The optimizer step per rank, sharded (optim.sharded) against replicated, with the real
// optimizer (optim/distributed_lamb.h): a DistributedLamb over a GradReducer on MPI (the ranks
// may share one GPU), over the flat buffers of a BERT model (--model large|base|tiny, 336M /
// 110M / 4.4M parameters) in --precision fp32 or bf16 (the default: fp32 master weights, the
// 16-bit copy the GEMMs read, the fp32 parts the model reads, Bert::fp32_ranges, and the gathers
// by layer, Bert::forward_groups), on the backend of --device (cpu by default).
//
// Timed mode (the default; run it at several rank counts):
//
//   for n in 1 2 4 8; do
//     mpirun -np $n build/tests/bench_sharded_lamb --model large --precision bf16 --iters 3
//   done
//
// One markdown row per (ranks, optimizer), times the slowest rank's, best of --iters:
//   state per rank     the largest rank's optimizer state (DistributedLamb::largest_state_bytes:
//                      m, v, norms, and in mixed precision the fp32 master weights)
//   sent per rank      the bytes a step's collectives make the largest rank send, the
//                      gradient's round included (largest_bytes_sent), and that over the
//                      replicated all-reduce's 2 (N - 1) / N x 4 B per parameter
//   grad round ms      the gradient's round (GradReducer begin .. finish): the all-reduce, or
//                      sharded the reduce-scatter
//   step ms            DistributedLamb::step(1, false), sync_weights(), synchronize(): LAMB over
//                      the rank's range, the sums over ranks, the gathers of what the model
//                      reads, the zeroing of the rest of the gradient
//   step floor ms      the bytes that step moves through this rank's memory (LAMB's passes, the
//                      zeroing, the bytes gathered in) at the copy bandwidth measured here
//   LAMB ms, CPU ms    LAMB alone (a Lamb over the same range, no gathers), wall and process CPU
//                      time, and its bytes per second against the measured copy bandwidth
//   peak RSS           the largest rank's resident high-water mark over the row (host memory)
// Ranks that share cores (oversubscribed) time the same work side by side: wall times per rank
// shrink with N only where the ranks have cores of their own; the LAMB CPU ms column (CPU
// device) gives the work per rank whatever the sharing. MPI's waits spin, so a step's CPU time
// would count the waiting too: the step has no CPU column.
//
// Memory (host, CPU device): every rank holds the gradient whole (the step zeroes what it does
// not own, so all its pages are touched), the 16-bit copy whole (bf16) and the fp32 weights:
// whole in fp32 (the gathers write them) and with the replicated row, otherwise only the
// rank's range and the fp32 parts the model reads (the rest of the buffer's pages stay
// untouched, as a real run's master weights would not). A row whose memory the host's
// MemAvailable cannot take (the ranks of one host summed, with a margin) is skipped and says
// so. The gradient's round on MPI (non-blocking collectives, every bucket in flight at once)
// holds temporaries of up to twice the gradient per rank: it is timed only where those fit
// too, and the table's notes give what its first round added to the resident peak.
// --skip-replicated leaves out the replicated row (8 B of state per parameter on every rank)
// and, in bf16, leaves the fp32 weights outside the rank's range untouched.
//
// Balance mode (--balance; one process, no mpirun): for rank counts 1 .. 1024, the cut's
// balance (shard_imbalance of plan_shards: the largest range over the mean), the largest rank's
// state and per-step bytes sent, sharded against replicated, in fp32 and bf16, from
// OptimizerLayout and optimizer_state_bytes / optimizer_bytes_sent (no communicator). The
// fp32 parts of the bf16 model come from a Bert built in bf16 on the CPU backend.
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "comm/grad_reducer.h"
#include "comm/shard_exchange.h"
#include "kernels/base/error.h"
#include "kernels/backend.h"
#include "model/bert.h"
#include "model/config.h"
#include "model/params.h"
#include "mpi_timing.h"
#include "optim/distributed_lamb.h"
#include "optim/lamb.h"
#include "optim/sharding.h"
#include "train/trainer.h"

namespace packbert {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

struct Args {
  std::string model = "large";
  Precision precision = Precision::bf16;
  int iters = 3;
  Device device = Device::cpu;
  bool replicated = true;
  bool balance = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--skip-replicated") {
      a.replicated = false;
      continue;
    }
    if (k == "--balance") {
      a.balance = true;
      continue;
    }
    PB_REQUIRE(i + 1 < argc, "argument '{}' needs a value", k);
    const std::string v = argv[++i];
    if (k == "--model")
      a.model = v;
    else if (k == "--precision")
      a.precision = parse_precision(v);
    else if (k == "--iters")
      a.iters = std::max(1, std::atoi(v.c_str()));
    else if (k == "--device")
      a.device = v == "cuda" ? Device::cuda : Device::cpu;
    else
      PB_THROW(
          "unknown argument '{}' (--model large|base|tiny, --precision fp32|bf16, "
          "--iters N, --device cpu|cuda, --skip-replicated, --balance)",
          k);
  }
  PB_REQUIRE(a.precision != Precision::fp16,
             "--precision fp16: the optimizer's figures are bf16's; use fp32 or bf16");
  return a;
}

int64_t range_elems(const Ranges& ranges) {
  int64_t n = 0;
  for (const auto& [a, b] : ranges) n += b - a;
  return n;
}

// Elements of [lo, hi) inside the ranges.
int64_t overlap(const Ranges& ranges, int64_t lo, int64_t hi) {
  int64_t n = 0;
  for (const auto& [a, b] : ranges) n += std::max<int64_t>(0, std::min(b, hi) - std::max(a, lo));
  return n;
}

double mib(double bytes) { return bytes / (1 << 20); }
double gib(double bytes) { return bytes / (1 << 30); }

// ---- balance mode -------------------------------------------------------------------------

void balance_table(const OptimizerLayout& layout, const char* precision) {
  std::cout << fmt::format(
      "\n{} ({}):\n\n", precision,
      layout.lowp_bytes > 0
          ? fmt::format("fp32 master weights whole on every rank, 16-bit "
                        "copy gathered whole, {:.2f}M fp32 elements "
                        "gathered (biases, LayerNorm)",
                        static_cast<double>(range_elems(layout.fp32_ranges)) / 1e6)
          : std::string("the fp32 weights gathered whole"));
  std::cout << "| ranks | balance (max/mean) | state sharded MiB | state replicated MiB | "
               "state ratio | sent sharded MB | sent replicated MB | sent ratio |\n"
               "|---|---|---|---|---|---|---|---|\n";
  for (int ranks : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1000, 1024}) {
    const std::vector<int64_t> bounds = plan_shards(layout.num_elems, ranks);
    size_t state_sharded = 0, state_replicated = 0;
    int64_t sent_sharded = 0, sent_replicated = 0;
    for (int r = 0; r < ranks; ++r) {
      state_sharded = std::max(state_sharded, optimizer_state_bytes(layout, bounds, true, r));
      state_replicated =
          std::max(state_replicated, optimizer_state_bytes(layout, bounds, false, r));
      sent_sharded = std::max(sent_sharded, optimizer_bytes_sent(layout, bounds, true, r));
      sent_replicated = std::max(sent_replicated, optimizer_bytes_sent(layout, bounds, false, r));
    }
    std::cout << fmt::format(
        "| {} | {:.4f} | {:.1f} | {:.1f} | {:.3f} | {:.1f} | {:.1f} | {} |\n", ranks,
        shard_imbalance(bounds), mib(static_cast<double>(state_sharded)),
        mib(static_cast<double>(state_replicated)),
        static_cast<double>(state_sharded) / static_cast<double>(state_replicated),
        static_cast<double>(sent_sharded) / 1e6, static_cast<double>(sent_replicated) / 1e6,
        sent_replicated > 0 ? fmt::format("{:.4f}", static_cast<double>(sent_sharded) /
                                                        static_cast<double>(sent_replicated))
                            : std::string("-"));
  }
}

int run_balance(const Args& args) {
  const BertConfig config = bert_preset(args.model);
  const ParamTable table(config);
  const int64_t n = table.total();
  OptimizerLayout fp32;
  fp32.num_elems = n;
  fp32.table = lamb_params(table);
  fp32.fp32_ranges = {{0, n}};
  OptimizerLayout bf16 = fp32;
  bf16.lowp_bytes = dtype_size(DType::bf16);
  bf16.masters_sharded = true;  // sharded, a rank keeps its range of them (replicated: whole)
  {
    // The parts the bf16 model reads in fp32: the model's own list. The weights' pages stay
    // untouched (read as zero pages); the 16-bit copy is written once.
    auto backend = make_backend(Device::cpu);
    BackendBuffer w = backend->alloc(DType::f32, {n});
    BertOptions bo;
    bo.precision = Precision::bf16;
    const Bert bert(config, *backend, w.tensor(), Tensor(), bo);
    bf16.fp32_ranges = bert.weights().fp32_ranges();
  }
  std::cout << fmt::format(
      "bench_sharded_lamb --balance: BERT-{} ({:.1f}M parameters, {} tensors), the cut "
      "plan_shards (ranges equal to within {} elements, cut inside tensors); the largest rank's "
      "optimizer state and bytes sent per step (gradient round included; ring counts), sharded "
      "against replicated\n",
      args.model, static_cast<double>(n) / 1e6, table.tensors().size(), kShardAlign);
  balance_table(fp32, "fp32");
  balance_table(bf16, "bf16");
  std::cout << "\nstate: optimizer_state_bytes (m, v, the norms and sums; in bf16 the fp32 master "
               "weights too: whole when replicated, sharded the rank's range and the fp32 values "
               "the model reads). sent: optimizer_bytes_sent (replicated: the "
               "gradient's all-reduce, 2 (N - 1) / N x 4 B per parameter; sharded: the "
               "reduce-scatter, the sums over ranks, the gathers of the weights).\n";
  return 0;
}

// ---- timed mode ---------------------------------------------------------------------------

// Host memory the kernel would give now (MemAvailable), in bytes; 0 when unknown.
double mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream s(line.substr(13));
    double kb = 0;
    s >> kb;
    return kb * 1024;
  }
  return 0;
}

// This process's resident high-water mark (VmHWM), in bytes, since the last reset_peak_rss().
double peak_rss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream s(line.substr(6));
    double kb = 0;
    s >> kb;
    return kb * 1024;
  }
  rusage u{};  // no /proc: the process's peak
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024;
}

// The high-water mark back to the current resident size (Linux: clear_refs 5).
void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
}

// Whether `bytes` more per rank fit the host: the ranks of each host summed, +10% + 0.5 GiB,
// against the least MemAvailable any of them sees (both returned). The same answer on every
// rank.
bool fits(double bytes, MPI_Comm node, double* need, double* available) {
  double host_need = 0, avail = mem_available(), least = 0;
  MPI_Allreduce(&bytes, &host_need, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Allreduce(&avail, &least, 1, MPI_DOUBLE, MPI_MIN, node);
  const double with_margin = host_need * 1.1 + 512.0 * (1 << 20);
  const int ok_here = least <= 0 || with_margin <= least;
  int ok = 0;
  MPI_Allreduce(&ok_here, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  *need = with_margin;  // what the messages report: the margin included
  *available = least;
  return ok != 0;
}

// A pattern of weights (or gradients) into [begin, end) of an f32 buffer, through a small host
// buffer.
void fill(Backend& backend, const Tensor& buffer, int64_t begin, int64_t end) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<float> host(static_cast<size_t>(std::min(kChunk, std::max<int64_t>(end - begin, 0))));
  for (int64_t a = begin; a < end; a += kChunk) {
    const int64_t len = std::min(kChunk, end - a);
    for (int64_t i = 0; i < len; ++i)
      host[static_cast<size_t>(i)] = 0.01f * static_cast<float>((a + i) % 97) - 0.4f;
    backend.copy(slice(buffer, a, len), view(host.data(), {len}));
  }
}

double max_over_ranks(double x) {
  double m = x;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

int run_timed(const Args& args, int rank, int size) {
  const BertConfig config = bert_preset(args.model);
  const ParamTable table(config);
  const int64_t n = table.total();
  const bool mixed = args.precision != Precision::fp32;
  const std::vector<LambParam> params = lamb_params(table);
  std::vector<GradSpan> spans;
  for (const ParamTensor& t : table.tensors()) spans.push_back({t.offset, t.size});
  const std::vector<int64_t> bounds = DistributedLamb::shard_bounds(n, size);
  const int64_t own_begin = bounds[static_cast<size_t>(rank)];
  const int64_t own_end = bounds[static_cast<size_t>(rank) + 1];
  const bool host_memory = args.device == Device::cpu;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);

  // The fp32 weights this rank touches: whole unless a bf16 run is sharded only (then its
  // range and the fp32 parts; those are known once the model exists, a small part).
  const bool w_whole = !mixed || args.replicated || size == 1;
  const double lowp_bytes = mixed ? 2.0 * static_cast<double>(n) : 0.0;
  double need = 0, available = 0;
  const double base_bytes =
      4.0 * static_cast<double>(w_whole ? n : own_end - own_begin) + lowp_bytes +
      4.0 * static_cast<double>(n);  // the weights touched, the 16-bit copy, the gradient
  if (host_memory && !fits(base_bytes, node, &need, &available)) {
    if (rank == 0)
      std::cout << fmt::format(
          "bench_sharded_lamb: BERT-{} {} at {} rank(s) does not fit this host: the weights{} "
          "and the gradient need {:.1f} GiB over its ranks, {:.1f} GiB available\n",
          args.model, precision_name(args.precision), size, mixed ? ", the 16-bit copy" : "",
          gib(need), gib(available));
    MPI_Comm_free(&node);
    return 0;
  }

  BackendOptions bo;
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  bo.cuda_device = local ? std::atoi(local) : 0;
  auto backend = make_backend(args.device, bo);
  BackendBuffer w = backend->alloc(DType::f32, {n}), g = backend->alloc(DType::f32, {n});
  // The model, for the fp32 parts it reads, its forward groups and its 16-bit copy (no
  // gradient, no arena until a forward).
  BertOptions bert_options;
  bert_options.precision = args.precision;
  if (!host_memory) backend->zero(w.tensor());  // defined before the first 16-bit copy
  Bert bert(config, *backend, w.tensor(), Tensor(), bert_options);
  const Ranges fp32_ranges = bert.weights().fp32_ranges();
  if (w_whole) {
    fill(*backend, w.tensor(), 0, n);
  } else {
    fill(*backend, w.tensor(), own_begin, own_end);
    for (const auto& [a, b] : fp32_ranges) fill(*backend, w.tensor(), a, b);
  }
  if (mixed) bert.refresh_lowp_params();
  fill(*backend, g.tensor(), 0, n);
  // The copy bandwidth over this rank's range (all ranks at once, as the step runs): read +
  // write bytes per second.
  const int64_t bw_len = std::max<int64_t>(own_end - own_begin, 1);
  const double bandwidth_s =
      bench::slowest_rank_time(args.iters, [&] {
        backend->copy(slice(g.tensor(), own_begin, bw_len), slice(w.tensor(), own_begin, bw_len));
        backend->synchronize();
      }).wall;
  const double bandwidth = 2.0 * static_cast<double>(bw_len) * 4 / bandwidth_s;

  GradReducerOptions ro;
  ro.shard_bounds = bounds;
  ro.device_transport = GradTransport::mpi;  // the bench's ranks may share one GPU
  ro.cuda_device = bo.cuda_device;
  GradReducer reducer(MPI_COMM_WORLD, *backend, g.tensor(), spans, ro);
  LrScheduleConfig lr;  // a small rate keeps the weights finite
  lr.base_lr = 1e-9;
  lr.max_steps = 1000000;
  LambOptions lo;
  lo.check_finite = false;
  const double allreduce_bytes =
      size > 1 ? 2.0 * (size - 1) / size * 4.0 * static_cast<double>(n) : 0.0;

  std::vector<std::string> rows(2);
  std::vector<std::string> notes;
  // Sharded first: its peak RSS is then its own (the replicated row's includes it, and is
  // larger).
  for (bool sharded : {true, false}) {
    std::string& row = rows[sharded ? 1 : 0];
    const char* name = sharded ? "sharded" : "replicated";
    if (sharded && size == 1) continue;
    if (!sharded && !args.replicated) continue;
    // The masters whole (w): the timed step as before they were sharded (Tensor(): no
    // compact fp32 buffer).
    OptimizedBuffers buffers{
        w.tensor(), g.tensor(), bert.weights().lowp(), fp32_ranges, bert.weights().forward_groups(),
        Tensor()};
    const int64_t begin = sharded ? own_begin : 0, end = sharded ? own_end : n;
    OptimizerLayout layout;
    layout.num_elems = n;
    layout.table = params;
    layout.lowp_bytes = mixed ? 2 : 0;
    layout.fp32_ranges = fp32_ranges;
    // LAMB's state: the optimizer's figure less the master weights (the buffer w, already
    // resident).
    const double lamb_state =
        static_cast<double>(optimizer_state_bytes(layout, bounds, sharded, rank)) -
        (mixed ? 4.0 * static_cast<double>(n) : 0.0);
    reset_peak_rss();
    if (host_memory && !fits(lamb_state, node, &need, &available)) {
      row = fmt::format(
          "| {} | {} | skipped: LAMB's state needs {:.1f} GiB more on the host "
          "(its ranks summed), {:.1f} GiB available |",
          size, name, gib(need), gib(available));
      for (int c = 0; c < 9; ++c) row += " - |";  // the row's other columns
      row += "\n";
      continue;
    }
    // The gradient's round on MPI holds temporaries besides the buffer (measured below, on
    // the first round: up to twice the gradient per rank with every bucket in flight at once).
    // It is timed where the host takes that much more.
    const double round_temp = size > 1 ? 2.0 * 4.0 * static_cast<double>(n) : 0.0;
    const bool time_round = !host_memory || fits(lamb_state + round_temp, node, &need, &available);
    if (!time_round)
      notes.push_back(fmt::format(
          "{}: the gradient's round not timed: with its MPI temporaries (est. {:.1f} GiB per "
          "rank) the host's ranks would need {:.1f} GiB, {:.1f} GiB available",
          name, gib(round_temp), gib(need), gib(available)));
    double state = 0, sent = 0, round_rss = 0;
    bench::RankTime round, step;
    {
      DistributedLamb optimizer(*backend, params, reducer, buffers, LrSchedule(lr), lo, sharded);
      state = static_cast<double>(optimizer.largest_state_bytes());
      sent = static_cast<double>(optimizer.largest_bytes_sent());
      for (int it = 0; it < args.iters; ++it) {
        const double rss_before = peak_rss();
        const bench::RankTime r =
            !time_round ? bench::RankTime{} : bench::slowest_rank_time(1, [&] {
              reducer.begin(optimizer.collective());
              for (int i = static_cast<int>(spans.size()) - 1; i >= 0; --i) reducer.ready_tensor(i);
              reducer.finish();
              backend->synchronize();
            });
        if (it == 0 && time_round) round_rss = max_over_ranks(peak_rss() - rss_before);
        const bench::RankTime s = bench::slowest_rank_time(1, [&] {
          optimizer.step(1.0f, /*read_back=*/false);
          optimizer.sync_weights();
          backend->synchronize();
        });
        round.wall = std::min(round.wall, r.wall);
        step.wall = std::min(step.wall, s.wall);
      }
    }
    // LAMB alone over the same range: its wall and CPU time (the work per rank).
    bench::RankTime lamb_t;
    {
      ShardExchange exchange(reducer);
      LambShard shard;
      shard.begin = own_begin;
      shard.end = own_end;
      shard.sum_over_ranks = [&](const Tensor& v) { exchange.sum(v); };
      Lamb lamb(*backend, params, n, LrSchedule(lr), lo, sharded ? &shard : nullptr);
      lamb_t = bench::slowest_rank_time(args.iters, [&] {
        lamb.step(w.tensor(), g.tensor(), bert.weights().lowp(), 1.0f, /*read_back=*/false);
        backend->synchronize();
      });
    }
    // The bytes through this rank's memory. LAMB's passes over what it owns: the gradient's
    // norm (read g, 4 B), the weights' norm (read w, 4 B), the update (read g, w, m, v, write u,
    // m, v: 28 B), the apply (read w, u, write w: 12 B, and the 16-bit copy: 2 B), the zeroing
    // of the gradient (4 B). A sharded step also zeroes the rest of the gradient (4 B) and
    // writes what it gathers in.
    const double owned = static_cast<double>(end - begin);
    const double lamb_bytes = (52.0 + (mixed ? 2.0 : 0.0)) * owned;
    double step_bytes = lamb_bytes;
    if (sharded) {
      const double rest = static_cast<double>(n) - owned;
      step_bytes += 4.0 * rest;
      step_bytes +=
          mixed ? 2.0 * rest + 4.0 * static_cast<double>(range_elems(fp32_ranges) -
                                                         overlap(fp32_ranges, own_begin, own_end))
                : 4.0 * rest;
    }
    const double lamb_bytes_max = max_over_ranks(lamb_bytes);
    const double step_bytes_max = max_over_ranks(step_bytes);
    const double rss = max_over_ranks(peak_rss());
    row = fmt::format(
        "| {} | {} | {:.1f} | {:.1f} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {} | "
        "{:.1f} ({:.0f}%) | {:.2f} |\n",
        size, name, mib(state), sent / 1e6,
        size > 1 ? fmt::format("{:.3f}", sent / allreduce_bytes) : std::string("-"),
        time_round ? fmt::format("{:.1f}", 1e3 * round.wall) : std::string("-"), 1e3 * step.wall,
        1e3 * step_bytes_max / bandwidth, 1e3 * lamb_t.wall,
        host_memory ? fmt::format("{:.1f}", 1e3 * lamb_t.cpu) : std::string("-"),
        lamb_bytes_max / lamb_t.wall / 1e9, 100.0 * lamb_bytes_max / lamb_t.wall / bandwidth,
        gib(rss));
    if (time_round && size > 1)
      notes.push_back(
          fmt::format("{}: the gradient's first round raised the resident peak by "
                      "{:.2f} GiB (the largest rank; MPI's temporaries)",
                      name, gib(round_rss)));
  }
  if (rank == 0) {
    std::cout << fmt::format(
        "bench_sharded_lamb: BERT-{} ({:.1f}M parameters), {}, {} rank(s) on {}, best of {}; "
        "measured copy bandwidth {:.1f} GB/s per rank (all ranks copying at once); shard "
        "imbalance {:.4f} (largest range over the mean)\n\n",
        args.model, static_cast<double>(n) / 1e6, precision_name(args.precision), size,
        device_name(args.device), args.iters, bandwidth / 1e9, shard_imbalance(bounds));
    std::cout << "| ranks | optimizer | state per rank MiB | sent per rank MB | sent / all-reduce "
                 "| grad round ms | step ms | step floor ms | LAMB ms | LAMB CPU ms | "
                 "LAMB GB/s (of the copy's) | peak RSS GiB |\n"
                 "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    for (const std::string& r : rows) std::cout << r;
    if (!notes.empty()) std::cout << "\n";
    for (const std::string& note : notes) std::cout << note << "\n";
    std::cout
        << "\nstate, sent, bytes and peak RSS: the largest rank's; times: the slowest "
           "rank's. sent: the step's collectives with the gradient's round, by the ring "
           "count; all-reduce: 2 (N - 1) / N x 4 B per parameter. grad round: all-reduce "
           "(replicated) or reduce-scatter (sharded). step: LAMB, the sums over ranks, the "
           "gathers (sharded) and the gradient's zeroing. step floor: the step's bytes "
           "through this rank's memory at the measured copy bandwidth (the bytes MPI "
           "copies besides not counted). LAMB CPU ms: the process CPU time of the slowest "
           "rank (oversubscribed ranks wait for cores: wall > CPU). peak RSS: the row's resident "
           "high-water mark (VmHWM, reset at the row's start).\n";
    if (host_memory)
      std::cout << fmt::format(
          "memory: every rank holds the gradient whole ({:.2f} GiB: the sharded step zeroes the "
          "part it does not own), {} and its LAMB state; a row that the host's MemAvailable "
          "(the ranks of one host summed, +10% + 0.5 GiB) cannot take is skipped, and the "
          "gradient's round is timed only where its MPI temporaries (est. twice the gradient "
          "per rank) fit as well.\n",
          gib(4.0 * static_cast<double>(n)),
          mixed ? fmt::format("the 16-bit copy whole ({:.2f} GiB), the fp32 weights {}",
                              gib(lowp_bytes),
                              w_whole ? "whole" : "of its range and the fp32 parts only")
                : std::string("the fp32 weights whole"));
  }
  MPI_Comm_free(&node);
  return 0;
}

}  // namespace
}  // namespace packbert

int main(int argc, char** argv) {
  packbert::Args args;
  try {
    args = packbert::parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  if (args.balance) {  // one process, no MPI
    try {
      return packbert::run_balance(args);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << std::endl;
      return 1;
    }
  }
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 1;
  try {
    rc = packbert::run_timed(args, rank, size);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << rank << "] error: " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
