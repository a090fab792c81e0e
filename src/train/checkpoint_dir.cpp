#include "train/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include "core/mpi_check.h"
#include "kernels/base/error.h"
#include "core/watchdog.h"
#include "train/checkpoint_internal.h"

namespace packbert {

namespace fs = std::filesystem;

namespace {

std::string os_error(int err) { return std::strerror(err); }

// Who holds the lock, as the lock file records it: one line.
std::string holder_text() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  std::string text =
      fmt::format("host {}, pid {}, started {}", host, static_cast<long>(::getpid()), when);
  if (const char* job = std::getenv("SLURM_JOB_ID"); job && *job)
    text += fmt::format(", Slurm job {}", job);
  return text + "\n";
}

// The holder's line from the lock file; the holder writes it just after taking the lock, so an
// empty file is read again for up to a second.
std::string read_holder(const std::string& path) {
  for (int i = 0; i < 20; ++i) {
    std::string text;
    try {
      text = detail::read_text(path);
    } catch (const std::exception&) {
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (!text.empty()) return text;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "a process that has not recorded itself in the file";
}

bool is_checkpoint_name(const std::string& name) {
  if (detail::parse_step_name(name) >= 0) return true;
  const size_t at = name.find(".corrupt");
  return at != std::string::npos && detail::parse_step_name(name.substr(0, at)) >= 0;
}

// What write_checkpoint leaves behind when it is killed mid-write or mid-prune:
// .step_NNNNNNNN.tmp-PID and .step_NNNNNNNN.old-PID.
bool is_leftover_name(const std::string& name) {
  if (name.size() < 2 || name[0] != '.') return false;
  for (const char* tag : {".tmp-", ".old-"}) {
    const size_t at = name.find(tag);
    if (at != std::string::npos && detail::parse_step_name(name.substr(1, at - 1)) >= 0)
      return true;
  }
  return false;
}

int64_t step_of(const std::string& name) {
  const int64_t step = detail::parse_step_name(name.substr(0, name.find('.')));
  return step < 0 ? 0 : step;
}

// The path, absolute, with links and dots resolved as far as it exists.
std::string comparable(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(path, ec);
  return ec ? fs::absolute(path).lexically_normal().string() : p.string();
}

// Rank `from`'s string on every rank.
std::string broadcast(MPI_Comm comm, std::string s, int from) {
  const WatchScope watch("MPI_Bcast (checkpoint.dir claim)");
  int64_t n = static_cast<int64_t>(s.size());
  PB_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, from, comm));
  s.resize(static_cast<size_t>(n));
  if (n > 0) PB_MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, from, comm));
  return s;
}

// Deletes dir's checkpoints and write leftovers (checkpoint.overwrite): each renamed away first,
// so that a crash mid-way never leaves a partial step_ directory. Returns the names deleted.
std::vector<std::string> delete_checkpoints(const std::string& dir) {
  std::vector<std::string> names = checkpoints_in(dir);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (is_leftover_name(it->path().filename().string()))
      names.push_back(it->path().filename().string());
  const std::string pid = std::to_string(::getpid());
  for (const std::string& name : names) {
    const std::string from = detail::join(dir, name);
    const std::string doomed = detail::join(dir, ".overwritten-" + name + "-" + pid);
    fs::remove_all(doomed, ec);
    PB_REQUIRE(::rename(from.c_str(), doomed.c_str()) == 0,
               "checkpoint.overwrite: cannot delete {}: {}", from, os_error(errno));
    fs::remove_all(doomed, ec);
    PB_REQUIRE(!ec, "checkpoint.overwrite: cannot delete {}: {}", doomed, ec.message());
  }
  return names;
}

// Creates dir if needed and checks a file can be made in it, so that a bad checkpoint.dir
// fails before any training instead of at the first checkpoint.
void require_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  PB_REQUIRE(!ec, "checkpoint.dir: cannot create the directory {}: {}", dir, ec.message());
  const std::string probe = detail::join(dir, ".write_probe." + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PB_REQUIRE(fd >= 0, "checkpoint.dir: cannot write into {}: {}", dir, os_error(errno));
  ::close(fd);
  fs::remove(probe, ec);
}

// The refusal of a run that does not continue dir's checkpoints, `found` (non-empty).
[[noreturn]] void refuse_checkpoints(const TrainConfig::Checkpoint& k,
                                     const std::vector<std::string>& found) {
  const std::string& newest = found.back();
  const bool damaged = newest.find(".corrupt") != std::string::npos;
  PB_THROW(
      "checkpoint.dir {} holds {} checkpoint(s) of an earlier run (newest: {}{}), and this "
      "run {}: its checkpoints would be written among them and prune theirs. Nothing was "
      "changed. To continue that run, give --resume auto; to start this one elsewhere, give "
      "another checkpoint.dir; to delete them and start here, give "
      "--checkpoint.overwrite=true",
      k.dir, found.size(), newest, damaged ? ", damaged and set aside" : "",
      k.resume.empty() ? std::string("starts fresh")
                       : fmt::format("resumes {}, which is not one of them", k.resume));
}

// Rank 0's part of claim_checkpoint_dir. A refused run writes nothing in dir: a run using dir
// now is found (and named) by taking the lock on the lock file as it is, and this run records
// itself there, or makes the file where there is none, only once dir's checkpoints allow the
// run. Where there is no lock file no run is using dir; one that starts meanwhile holds the
// file this run then makes, and is named.
std::unique_ptr<CheckpointDirLock> claim_on_root(const TrainConfig::Checkpoint& k) {
  require_writable_dir(k.dir);
  std::unique_ptr<CheckpointDirLock> lock = CheckpointDirLock::existing(k.dir);
  const bool fresh = !continues_checkpoint_dir(k);
  std::vector<std::string> found;
  if (fresh) found = checkpoints_in(k.dir);
  if (!found.empty() && !k.overwrite) refuse_checkpoints(k, found);
  if (lock)
    lock->record();
  else
    lock = std::make_unique<CheckpointDirLock>(k.dir);
  if (!found.empty()) {
    const std::vector<std::string> deleted = delete_checkpoints(k.dir);
    spdlog::warn("checkpoint.overwrite: deleted {} checkpoint(s) under {} before starting: {}",
                 found.size(), k.dir, fmt::join(deleted, ", "));
  }
  return lock;
}

// A TOML value as the config file spells it.
std::string show(const toml::node& n) {
  if (const auto* s = n.as_string()) {
    std::string out = "\"";
    for (const char ch : s->get()) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    return out + "\"";
  }
  if (const auto* f = n.as_floating_point()) return fmt::format("{}", f->get());
  if (const auto* i = n.as_integer()) return fmt::format("{}", i->get());
  if (const auto* b = n.as_boolean()) return b->get() ? "true" : "false";
  std::ostringstream os;
  os << toml::toml_formatter(n);
  return os.str();
}

bool same(const toml::node& a, const toml::node& b) {
  if (a.type() != b.type()) return false;
  if (const auto* s = a.as_string()) return s->get() == b.as_string()->get();
  if (const auto* f = a.as_floating_point()) return f->get() == b.as_floating_point()->get();
  if (const auto* i = a.as_integer()) return i->get() == b.as_integer()->get();
  if (const auto* x = a.as_boolean()) return x->get() == b.as_boolean()->get();
  return show(a) == show(b);
}

// "section.key" -> value.
std::map<std::string, const toml::node*> flatten(const toml::table& t) {
  std::map<std::string, const toml::node*> out;
  for (const auto& [section, node] : t) {
    if (const toml::table* keys = node.as_table()) {
      for (const auto& [key, value] : *keys)
        out[fmt::format("{}.{}", section.str(), key.str())] = &value;
    } else {
      out[std::string(section.str())] = &node;
    }
  }
  return out;
}

toml::table parse_config(const std::string& text, const char* which) {
  try {
    return toml::parse(text, std::string_view(which));
  } catch (const toml::parse_error& e) {
    PB_THROW("{} config is not TOML: {}", which, e.description());
  }
}

}  // namespace

CheckpointDirLock::CheckpointDirLock(const std::string& dir) : CheckpointDirLock(dir, true) {
  record();
}

std::unique_ptr<CheckpointDirLock> CheckpointDirLock::existing(const std::string& dir) {
  std::unique_ptr<CheckpointDirLock> lock(new CheckpointDirLock(dir, false));
  if (lock->fd_ < 0) return nullptr;
  return lock;
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir, bool create) {
  const std::string file = path(dir);
  fd_ = ::open(file.c_str(), O_RDWR | (create ? O_CREAT : 0) | O_CLOEXEC, 0644);
  if (fd_ < 0 && errno == EACCES) fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0 && errno == ENOENT && !create) return;
  PB_REQUIRE(fd_ >= 0, "checkpoint.dir: cannot open the lock file {}: {}", file, os_error(errno));
  int r = 0;
  do {
    r = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      ::close(fd_);
      fd_ = -1;
      PB_THROW(
          "checkpoint.dir {} is in use by another run: {} (it holds the lock {}). Two runs "
          "in one checkpoint directory would prune each other's checkpoints: wait for it to "
          "end, stop it, or give this run another checkpoint.dir",
          dir, read_holder(file), file);
    }
    spdlog::warn(
        "checkpoint.dir {}: cannot lock {}: {} (the file system offers no flock here: "
        "docs/training.md, Checkpoints); going on without the lock: nothing stops a "
        "second run from using this directory at the same time",
        dir, file, os_error(err));
    return;
  }
  held_ = true;
}

void CheckpointDirLock::record() {
  if (!held()) return;
  const std::string text = holder_text();
  // The record is for people; a lock file we cannot write (another user's) leaves the old one.
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t w = ::pwrite(fd_, text.data(), text.size(), 0);
    (void)w;
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

std::string CheckpointDirLock::path(const std::string& dir) {
  return detail::join(dir, ".packbert.lock");
}

std::vector<std::string> checkpoints_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_checkpoint_name(name) && it->is_directory(ec)) out.push_back(name);
  }
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
    return std::make_pair(step_of(a), a) < std::make_pair(step_of(b), b);
  });
  return out;
}

bool continues_checkpoint_dir(const TrainConfig::Checkpoint& k) {
  if (k.resume == "auto") return true;
  if (k.resume.empty() || k.dir.empty()) return false;
  fs::path resume(comparable(k.resume)), dir(comparable(k.dir));
  if (!resume.has_filename()) resume = resume.parent_path();  // "step_N/"
  if (!dir.has_filename()) dir = dir.parent_path();
  return resume.parent_path() == dir;
}

std::unique_ptr<CheckpointDirLock> claim_checkpoint_dir(MPI_Comm comm,
                                                        const TrainConfig::Checkpoint& k) {
  if (k.dir.empty()) return nullptr;
  int rank = 0;
  PB_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  std::unique_ptr<CheckpointDirLock> lock;
  std::string error;
  if (rank == 0) {
    try {
      lock = claim_on_root(k);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = broadcast(comm, error, 0);
  PB_REQUIRE(error.empty(), "{}", error);
  return lock;
}

std::vector<ConfigChange> config_changes(const std::string& before, const std::string& after) {
  const toml::table b = parse_config(before, "the checkpoint's");
  const toml::table a = parse_config(after, "this run's");
  std::map<std::string, const toml::node*> fb = flatten(b), fa = flatten(a);
  // The key table's order (the config file's), then keys it no longer has, by name.
  std::vector<std::string> keys;
  for (const config::KeyDoc& k : train_config_keys()) keys.push_back(k.name);
  for (const auto* m : {&fa, &fb})
    for (const auto& [key, n] : *m)
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  std::vector<ConfigChange> out;
  for (const std::string& key : keys) {
    if (key == "checkpoint.resume" || key == "checkpoint.overwrite") continue;
    const auto ib = fb.find(key), ia = fa.find(key);
    const bool in_b = ib != fb.end(), in_a = ia != fa.end();
    if (!in_b && !in_a) continue;
    if (in_b && in_a && same(*ib->second, *ia->second)) continue;
    out.push_back(
        {key, in_b ? show(*ib->second) : "(absent)", in_a ? show(*ia->second) : "(absent)"});
  }
  return out;
}

std::string describe(const std::vector<ConfigChange>& changes) {
  std::vector<std::string> parts;
  for (const ConfigChange& c : changes)
    parts.push_back(fmt::format("{} {} -> {}", c.key, c.before, c.after));
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace packbert
