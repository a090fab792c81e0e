// Bandwidth of the bucketed gradient all-reduce (src/comm/grad_reducer.h) on a BERT-base sized
// gradient buffer (the Hugging Face BertForPreTraining table, ~110M floats), for several bucket
// sizes, against one blocking MPI_Allreduce of the whole buffer. Prints tables; asserts nothing.
//
//   mpirun --allow-run-as-root -np 2 bench_allreduce [--iters 3] [--buckets-mb 1,4,16,64]
//                                                    [--compute-passes 4] [--scale 1.0]
//
// Table 1, communication alone: every tensor is marked ready at once in backward order, then
// finish(). algbw = buffer bytes / time; busbw = algbw * 2 (n - 1) / n (the bytes each rank moves
// in a ring all-reduce, comparable across rank counts, as nccl-tests reports it).
// Table 2, overlap: a simulated backward writes each tensor's gradient (compute-passes memory
// passes over it) before marking it ready; "exposed" = step time - the same compute without
// communication, i.e. what the all-reduce adds to a step.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/base/error.h"
#include "kernels/backend.h"
#include "comm/grad_reducer.h"
#include "mpi_timing.h"

namespace packbert {
namespace {

// BertForPreTraining (bert-base-uncased) parameters in Hugging Face order; the MLM decoder weight
// is tied to the word embeddings and has no row of its own.
std::vector<GradSpan> bert_base_table(double scale, int64_t& n) {
  const int64_t H = 768, I = 3072, V = 30522, P = 512, L = 12;
  std::vector<int64_t> sizes = {V * H, P * H, 2 * H, H, H};
  for (int64_t l = 0; l < L; ++l) {
    for (int qkv = 0; qkv < 3; ++qkv) sizes.insert(sizes.end(), {H * H, H});
    sizes.insert(sizes.end(), {H * H, H, H, H, I * H, I, H * I, H, H, H});
  }
  sizes.insert(sizes.end(), {H * H, H, H * H, H, H, H, V, 2 * H, 2});
  std::vector<GradSpan> spans;
  n = 0;
  for (int64_t s : sizes) {
    const int64_t scaled =
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(s) * scale));
    spans.push_back({n, scaled});
    n += scaled;
  }
  return spans;
}

// The slowest rank's wall time of fn, best of iters (mpi_timing.h).
template <typename Fn>
double timed(int iters, Fn&& fn) {
  return bench::slowest_rank_time(iters, fn).wall;
}

// The simulated backward of one tensor: passes memory-bound sweeps that write its gradient.
void fake_backward(float* g, int64_t size, int passes) {
  for (int p = 0; p < passes; ++p)
    for (int64_t i = 0; i < size; ++i) g[i] = g[i] * 0.5f + 0.25f;
}

int run(int argc, char** argv, int rank, int size) {
  int iters = 3, passes = 4;
  double scale = 1.0;
  std::vector<double> buckets_mb = {1, 4, 16, 64};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--iters")
      iters = std::atoi(v.c_str());
    else if (k == "--compute-passes")
      passes = std::atoi(v.c_str());
    else if (k == "--scale")
      scale = std::atof(v.c_str());
    else if (k == "--buckets-mb") {
      buckets_mb.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) buckets_mb.push_back(std::atof(x.c_str()));
    } else {
      PB_THROW("unknown argument '{}' (--iters, --buckets-mb, --compute-passes, --scale)", k);
    }
  }
  int64_t n = 0;
  const std::vector<GradSpan> table = bert_base_table(scale, n);
  std::vector<float> grads(static_cast<size_t>(n), 1.0f / static_cast<float>(size));
  const double bytes = static_cast<double>(n) * sizeof(float);
  const double bus = size > 1 ? 2.0 * (size - 1) / size : 1.0;
  if (rank == 0) {
    std::cout << fmt::format(
        "bench_allreduce: {} ranks, {} tensors, {:.1f}M floats ({:.0f} MB), best of {} iters\n\n",
        size, table.size(), static_cast<double>(n) / 1e6, bytes / 1e6, iters);
    std::cout << "| all-reduce | buckets | time ms | algbw GB/s | busbw GB/s |\n"
                 "|---|---|---|---|---|\n";
  }
  if (n <= INT32_MAX) {
    const double t = timed(iters, [&] {
      if (size > 1)
        MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
    });
    if (rank == 0)
      std::cout << fmt::format("| one MPI_Allreduce | 1 | {:.1f} | {:.2f} | {:.2f} |\n", 1e3 * t,
                               bytes / t / 1e9, bus * bytes / t / 1e9);
  }
  struct Row {
    double mb;
    int buckets;
    double comm, step, compute, completed_early;
  };
  std::vector<Row> rows;
  for (double mb : buckets_mb) {
    const auto backend = make_cpu_backend();
    GradReducerOptions options;
    options.bucket_bytes = static_cast<size_t>(mb * 1024 * 1024);
    GradReducer ar(MPI_COMM_WORLD, *backend, view(grads.data(), {n}), table, options);
    auto comm_only = [&] {
      ar.begin();
      for (size_t i = table.size(); i-- > 0;) ar.ready_tensor(static_cast<int>(i));
      ar.finish();
    };
    GradReduceStats last;
    auto with_compute = [&](bool reduce) {
      if (reduce) ar.begin();
      for (size_t i = table.size(); i-- > 0;) {
        fake_backward(grads.data() + table[i].offset, table[i].size, passes);
        if (reduce) ar.ready_tensor(static_cast<int>(i));
      }
      if (reduce) last = ar.finish();
    };
    comm_only();  // warm: first-touch of OpenMPI's shared-memory segments
    Row r{mb, static_cast<int>(ar.buckets().size()), timed(iters, comm_only), 0, 0, 0};
    r.step = timed(iters, [&] { with_compute(true); });
    // Buckets that completed while the backward still ran (last iteration, mean over ranks).
    double early = last.completed_before_finish;
    MPI_Reduce(&early, &r.completed_early, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    r.completed_early /= size;
    r.compute = timed(iters, [&] { with_compute(false); });
    rows.push_back(r);
    if (rank == 0)
      std::cout << fmt::format("| bucketed {:g} MB | {} | {:.1f} | {:.2f} | {:.2f} |\n", mb,
                               r.buckets, 1e3 * r.comm, bytes / r.comm / 1e9,
                               bus * bytes / r.comm / 1e9);
  }
  if (rank == 0) {
    std::cout << fmt::format(
        "\noverlap with a simulated backward ({} write passes over each gradient):\n\n"
        "| bucket MB | compute only ms | step ms | exposed comm ms | comm alone ms | "
        "buckets done before finish |\n"
        "|---|---|---|---|---|---|\n",
        passes);
    for (const Row& r : rows)
      std::cout << fmt::format("| {:g} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} of {} |\n",
                               r.mb, 1e3 * r.compute, 1e3 * r.step, 1e3 * (r.step - r.compute),
                               1e3 * r.comm, r.completed_early, r.buckets);
  }
  return 0;
}

}  // namespace
}  // namespace packbert

int main(int argc, char** argv) {
  int provided = 0, rank = 0, size = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = 0;
  try {
    rc = packbert::run(argc, argv, rank, size);
  } catch (const std::exception& e) {
    std::cerr << "[rank " << rank << "] error: " << e.what() << std::endl;
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
