#include "train/resume.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "core/mpi_check.h"
#include "kernels/base/error.h"
#include "core/watchdog.h"
#include "train/safetensors.h"

namespace packbert {

namespace {

// Rank `from`'s string on every rank.
std::string broadcast_string(MPI_Comm comm, std::string s, int from) {
  const WatchScope watch("MPI_Bcast (resume auto)");
  int64_t n = static_cast<int64_t>(s.size());
  PB_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, from, comm));
  s.resize(static_cast<size_t>(n));
  if (n > 0) PB_MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, from, comm));
  return s;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b < s.size()) {
    const size_t e = s.find('\n', b);
    out.push_back(s.substr(b, e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

// What reading a checkpoint did on one rank, in order of severity: the ranks agree on the worst
// (MPI_MAX of the values).
enum class Outcome : int { read = 0, damaged = 1, failed = 2 };

}  // namespace

std::optional<ResumedCheckpoint> read_newest_valid_checkpoint(MPI_Comm comm,
                                                              const std::string& root,
                                                              const ParamTable& table,
                                                              float* params, float* m, float* v) {
  int rank = 0, world = 1;
  PB_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  PB_MPI_CHECK(MPI_Comm_size(comm, &world));
  // Rank 0's view of the directory is everyone's: all try the same list in the same order.
  std::string listing;
  if (rank == 0) listing = fmt::format("{}", fmt::join(checkpoint_dirs_newest_first(root), "\n"));
  const std::vector<std::string> dirs = split_lines(broadcast_string(comm, listing, 0));

  std::vector<std::string> set_aside;  // "what (why)", for the final error
  for (const std::string& dir : dirs) {
    ResumedCheckpoint out;
    out.dir = dir;
    Outcome outcome = Outcome::read;
    std::string message;
    try {
      out.read = read_checkpoint(dir, table, params, m, v);
    } catch (const DamagedFileError& e) {
      outcome = Outcome::damaged;
      message = e.what();
    } catch (const std::exception& e) {
      outcome = Outcome::failed;
      message = e.what();
    }
    Outcome worst = outcome;
    int first = outcome == Outcome::read ? world : rank;
    {
      const WatchScope watch("MPI_Allreduce (resume auto verdict)");
      int code = static_cast<int>(outcome);
      PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &code, 1, MPI_INT, MPI_MAX, comm));
      worst = static_cast<Outcome>(code);
      if (worst != Outcome::read) {
        first = outcome == worst ? rank : world;
        PB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm));
      }
    }
    if (worst == Outcome::read) return out;
    message = broadcast_string(comm, message, first);
    if (world > 1) message = fmt::format("{} (rank {})", message, first);
    if (worst == Outcome::failed) throw Error(message);
    std::string aside;
    if (rank == 0) {
      aside = set_checkpoint_aside(dir);
      spdlog::warn("resume auto: {} is damaged: {}; moved aside to {}; trying the one before", dir,
                   message, aside);
    }
    aside = broadcast_string(comm, aside, 0);
    set_aside.push_back(fmt::format("{} ({})", aside, message));
  }
  if (!set_aside.empty())
    PB_THROW(
        "resume auto: no valid checkpoint under {}: every one is damaged and was moved "
        "aside: {}. Nothing was trained; to start fresh, remove or move them, or resume "
        "from a checkpoint of your choice with --resume DIR",
        root, fmt::join(set_aside, "; "));
  std::string earlier;
  if (rank == 0) earlier = fmt::format("{}", fmt::join(set_aside_checkpoints(root), ", "));
  earlier = broadcast_string(comm, earlier, 0);
  PB_REQUIRE(earlier.empty(),
             "resume auto: no checkpoint under {}, only damaged ones set aside earlier: {}. A "
             "run does not start fresh over them: remove or move them to start fresh, or give "
             "--resume DIR",
             root, earlier);
  return std::nullopt;
}

}  // namespace packbert
