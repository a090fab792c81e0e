#include "train/tensorboard.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "core/files.h"
#include "kernels/base/error.h"
#include "train/tfevents.h"

namespace packbert {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "events.out.tfevents.";

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The event files of `dir` (TensorBoard reads every file whose name holds "tfevents"), sorted.
std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() &&
        entry.path().filename().string().find("tfevents") != std::string::npos)
      files.push_back(entry.path());
  PB_REQUIRE(!ec, "{}: cannot list the TensorBoard logdir (log.tensorboard_dir): {}", dir.string(),
             ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  PB_REQUIRE(in.good(), "{}: cannot read the TensorBoard event file", path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Cuts `path` at its first record past `step`, or at a record cut short.
void cut_after(const fs::path& path, int64_t step) {
  const std::string bytes = read_all(path);
  const TfRecordScan scan = scan_tfrecords(bytes);
  size_t keep = scan.complete_bytes;
  for (size_t i = 0; i < scan.records.size(); ++i)
    if (scan.records[i].second > step) {
      keep = i == 0 ? 0 : scan.records[i - 1].first;
      break;
    }
  if (keep == bytes.size()) return;
  std::error_code ec;
  fs::resize_file(path, keep, ec);
  PB_REQUIRE(!ec,
             "{}: cannot cut the TensorBoard event file at byte {} (the records past step {}): {}",
             path.string(), keep, step, ec.message());
}

// A name that sorts after every file of `existing`: events.out.tfevents.<seconds>.packbert.<n>.
std::string new_file_name(const std::vector<fs::path>& existing) {
  const auto now = static_cast<long long>(wall_time());
  for (int n = 0;; ++n) {
    char name[96];
    std::snprintf(name, sizeof name, "%s%010lld.packbert.%04d", kPrefix, now, n);
    if (existing.empty() || existing.back().filename().string() < name) return name;
    if (n == 9999) {
      PB_THROW(
          "{}: the TensorBoard logdir holds event files named after {} that this run's "
          "file would not sort after (a clock set back?)",
          existing.back().parent_path().string(), name);
    }
  }
}

// The numbers of `j` under `prefix`, in its order, objects flattened with "/".
void flatten(const nlohmann::json& j, const std::string& prefix,
             std::vector<std::pair<std::string, double>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string tag = prefix + "/" + it.key();
    if (it->is_object()) {
      flatten(*it, tag, out);
    } else if (it->is_number() && !it->is_boolean()) {
      const double v = it->get<double>();
      if (std::isfinite(v)) out.emplace_back(tag, v);
    }
  }
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t start_step,
                                     const std::string& config_toml) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  PB_REQUIRE(!ec, "{}: cannot create the TensorBoard logdir (log.tensorboard_dir): {}", dir,
             ec.message());
  const std::vector<fs::path> existing = event_files(dir);
  PB_REQUIRE(start_step > 0 || existing.empty(),
             "{}: the TensorBoard logdir (log.tensorboard_dir) holds another run's event files "
             "({}); a fresh run needs its own logdir (remove them, or name another)",
             dir, existing.empty() ? std::string() : existing.front().filename().string());
  for (const fs::path& f : existing) cut_after(f, start_step);

  path_ = (fs::path(dir) / new_file_name(existing)).string();
  file_ = open_for_append(path_, "TensorBoard event file");
  const double t = wall_time();
  append(event_file_version(t));
  if (start_step > 0) append(event_session_start(t, start_step + 1));
  // A fenced block, so that the text plugin's markdown keeps the lines.
  append(event_text(t, start_step > 0 ? start_step + 1 : 0, "config",
                    "```toml\n" + config_toml + "```"));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> scalars;
  const std::string group = record.value("event", std::string("metrics"));
  nlohmann::json numbers = record;
  numbers.erase("step");
  flatten(numbers, group, scalars);
  append(event_scalars(wall_time(), record.value("step", int64_t{0}), scalars));
}

void TensorBoardWriter::append(const std::string& event) {
  const std::string r = tfrecord(event);
  PB_REQUIRE(std::fwrite(r.data(), 1, r.size(), file_) == r.size() && std::fflush(file_) == 0,
             "{}: cannot write the TensorBoard event file: {}", path_, std::strerror(errno));
}

}  // namespace packbert
