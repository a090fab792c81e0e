// The setup of `packbert train` (run_train_internal.h): the stop signals and the agreement to
// stop, the collective watchdog's action, the effective config in the log, and the memory plan
// against this rank's device.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/mpi_check.h"
#include "core/watchdog.h"
#include "kernels/backend.h"
#include "kernels/base/error.h"
#include "kernels/device.h"
#include "train/memory_plan.h"
#include "train/run_train.h"
#include "train/run_train_internal.h"

namespace packbert {

namespace train_run {

namespace {

std::atomic<int> g_stop_signal{0};

// A stop signal: the run stops after the step in flight (stop_requested), and until the ranks
// agree to, the collective watchdog bounds every wait of the step (core/watchdog.h): a rank that
// waits for a dead peer then ends the job in seconds instead of at the launcher's SIGKILL.
extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  CollectiveWatchdog::global().note_stop_signal(sig);
}

}  // namespace

int stop_signal() { return g_stop_signal.load(); }

bool stop_requested(MPI_Comm comm) {
  int stop = g_stop_signal.load() != 0 ? 1 : 0;
  const WatchScope watch("MPI_Allreduce (stop flag)");
  PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, comm));
  if (stop != 0) CollectiveWatchdog::global().stop_agreed();  // every rank is alive and stops
  return stop != 0;
}

void abort_job(const std::string&) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, CollectiveWatchdog::kExitCode);
  std::_Exit(CollectiveWatchdog::kExitCode);
}

void log_effective_config(const TrainConfig& c, int rank) {
  if (rank != 0) return;
  std::istringstream toml(train_config_to_toml(c));
  spdlog::info("effective config:");
  for (std::string line; std::getline(toml, line);)
    if (!line.empty()) spdlog::info("  {}", line);
}

size_t check_memory_plan(MPI_Comm comm, const TrainConfig& c, const TrainerOptions& o, int rank,
                         int world) {
  const bool cuda = o.device == Device::cuda;
  size_t free = 0, total = 0;
  bool known = false;
  if (cuda) {
    known = cuda_device_memory(o.cuda_device, free, total);  // makes this rank's context
  } else {
    const Backend::MemoryInfo m = make_cpu_backend()->memory_info();
    free = m.free;
    total = m.total;
    known = total > 0;
  }
  const std::string where = cuda ? fmt::format("cuda:{}", o.cuda_device) : "this host's RAM";
  const MemoryPlan plan = plan_memory(c, world, {DeviceMemory{where, free, "free now"}},
                                      /*knobs=*/false, rank);
  // The CUDA context already holds its part of what was free.
  size_t need = plan.total();
  for (const MemoryItem& it : plan.items)
    if (it.key == "cuda_context") need -= it.bytes;
  const int short_here = known && need > free ? 1 : 0;
  int short_any = short_here;
  PB_MPI_CHECK(MPI_Allreduce(&short_here, &short_any, 1, MPI_INT, MPI_MAX, comm));
  if (short_any == 0) return plan.buffers;
  constexpr double kMiB = 1 << 20;
  if (rank == 0) {
    const MemoryPlan full = plan_memory(c, world, {DeviceMemory{where, free, "free now"}});
    const std::string table = format_memory_plan(full);
    if (cuda)
      spdlog::error("memory plan (packbert plan --config FILE --ranks {}):\n{}", world, table);
    else
      spdlog::warn("memory plan (packbert plan --config FILE --ranks {}):\n{}", world, table);
  }
  if (!cuda) {
    if (short_here)
      spdlog::warn(
          "memory: rank {} needs {:.1f} MiB, {:.1f} MiB of RAM are available: the run may "
          "swap or be killed",
          rank, need / kMiB, free / kMiB);
    return plan.buffers;
  }
  // Each rank says what it found before any exits: the first to fail aborts the job.
  if (short_here)
    spdlog::error(
        "memory: this config needs {:.1f} MiB on {} (rank {} of {}), {:.1f} MiB are "
        "free: {:.1f} MiB short. Nothing was loaded; the plan and what each knob saves "
        "are above",
        need / kMiB, where, rank, world, free / kMiB, (need - free) / kMiB);
  PB_MPI_CHECK(MPI_Barrier(comm));
  PB_THROW("memory: the config does not fit {} rank's device (the memory plan above){}",
           short_here ? "this" : "another", short_here ? "" : "; nothing was loaded");
}

}  // namespace train_run

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = train_run::on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // mpirun passes SIGUSR1 on to every rank and lets them finish; on SIGTERM it gives them a
  // second before SIGKILL (odls_base_sigkill_timeout), too short for a large checkpoint.
  sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace packbert
