// Checkpoint directories (checkpoint.h): written atomically, found, pruned, set aside when
// damaged, and read back into the model's and the optimizer's buffers. config.json's text is
// checkpoint_config.cpp's, trainer_state.json's checkpoint_trainer_state.cpp's, and
// verify_checkpoint checkpoint_verify.cpp's.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <vector>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "kernels/base/error.h"
#include "train/checkpoint_internal.h"
#include "train/safetensors.h"

namespace packbert {

namespace fs = std::filesystem;
using namespace detail;

namespace {

constexpr const char* kAsideSuffix = ".corrupt";

std::string os_error(int err) { return std::strerror(err); }

}  // namespace

namespace detail {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PB_REQUIRE(in, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  PB_REQUIRE(!in.bad(), "{}: read failed", path);
  return ss.str();
}

int64_t parse_step_name(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() < prefix.size() + 8 || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

std::string read_checked_text(const std::string& dir, const char* file,
                              const SafetensorsFile& holder, const char* key,
                              std::vector<std::string>* unverified) {
  const std::string path = join(dir, file);
  std::string text = read_text(path);
  auto it = holder.metadata().find(key);
  if (it == holder.metadata().end()) {
    unverified->push_back(file);
    return text;
  }
  const std::string got = st_checksum_hex(text.data(), text.size());
  if (got != it->second)
    throw DamagedFileError(
        fmt::format("{}: damaged (or edited): its checksum is {}, {} says {} "
                    "({})",
                    path, got, holder.path(), it->second, kStChecksumAlgorithm));
  return text;
}

void write_file_synced(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PB_REQUIRE(fd >= 0, "{}: cannot create: {}", path, os_error(errno));
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      ::close(fd);
      PB_THROW("{}: write failed: {}", path, os_error(err));
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    PB_THROW("{}: fsync failed: {}", path, os_error(err));
  }
  PB_REQUIRE(::close(fd) == 0, "{}: close failed: {}", path, os_error(errno));
}

}  // namespace detail

namespace {

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  PB_REQUIRE(fd >= 0, "{}: cannot open directory to fsync: {}", dir, os_error(errno));
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    PB_THROW("{}: fsync of directory failed: {}", dir, os_error(err));
  }
  ::close(fd);
}

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : kFiles)
    if (!fs::is_regular_file(dir / f, ec)) return false;
  return true;
}

// Complete checkpoints under root, ascending step.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  fs::directory_iterator it(root, ec);
  if (ec) return out;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const int64_t step = parse_step_name(it->path().filename().string());
    if (step < 0 || !it->is_directory(ec) || !is_complete(it->path())) continue;
    out.emplace_back(step, it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- tensors -------------------------------------------------------------------------------

std::vector<StTensor> flat_tensors(const ParamTable& table, const float* flat,
                                   const std::string& prefix) {
  std::vector<StTensor> out;
  for (const ParamTensor& t : table.tensors())
    out.push_back({prefix + t.name, StDType::f32, t.shape, flat + t.offset});
  return out;
}

// Reads every table tensor (name prefix + HF name) of `file` into flat; Error on a tensor
// missing, shaped otherwise, or unknown to the table.
void read_flat(const SafetensorsFile& file, const ParamTable& table, const std::string& prefix,
               float* flat) {
  std::vector<SafetensorsFile::Read> reads;
  for (const ParamTensor& t : table.tensors()) {
    const std::string name = prefix + t.name;
    PB_REQUIRE(file.contains(name), "{}: tensor '{}' is missing", file.path(), name);
    reads.push_back({name, flat + t.offset, StDType::f32, t.shape});
  }
  file.read_many(reads);  // several threads: reading and hashing at about memory speed each
  // Alignment gaps between tensors (none in today's table) are zeroed.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const ParamTensor& t : table.tensors()) spans.emplace_back(t.offset, t.offset + t.size);
  std::sort(spans.begin(), spans.end());
  int64_t pos = 0;
  for (const auto& [b, e] : spans) {
    if (b > pos) std::fill(flat + pos, flat + b, 0.f);
    pos = std::max(pos, e);
  }
  if (table.total() > pos) std::fill(flat + pos, flat + table.total(), 0.f);
}

constexpr const char* kFp8History = "fp8.amax_history";
constexpr const char* kFp8Scales = "fp8.scales";
constexpr const char* kFp8Updates = "fp8_updates";

void check_no_extra(const SafetensorsFile& file, const ParamTable& table,
                    const std::vector<std::string>& prefixes,
                    const std::vector<std::string>& others = {}) {
  for (const std::string& name : file.names()) {
    bool known = std::find(others.begin(), others.end(), name) != others.end();
    for (const std::string& p : prefixes)
      if (name.compare(0, p.size(), p) == 0 && table.find(name.substr(p.size())) != nullptr)
        known = true;
    PB_REQUIRE(known, "{}: tensor '{}' is not a tensor of this model", file.path(), name);
  }
}

int64_t metadata_int(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  PB_REQUIRE(it != file.metadata().end(), "{}: metadata '{}' is missing", file.path(), key);
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  PB_THROW("{}: metadata '{}' = '{}' is not a non-negative integer", file.path(), key, it->second);
}

// ---- integrity -----------------------------------------------------------------------------

// The files of a checkpoint directory must all be there: a missing one is damage (the
// directory was complete when it was renamed into place).
void require_files(const std::string& dir, std::initializer_list<const char*> files) {
  std::error_code ec;
  PB_REQUIRE(fs::is_directory(dir, ec), "{}: not a checkpoint directory", dir);
  for (const char* f : files)
    if (!fs::is_regular_file(join(dir, f), ec))
      throw DamagedFileError(
          fmt::format("{}: missing (the checkpoint {} is incomplete)", join(dir, f), dir));
}

void warn_unverified(const std::string& dir, const std::vector<std::string>& unverified) {
  if (unverified.empty()) return;
  spdlog::warn(
      "{}: no checksums for {} (written before checkpoints carried them): loaded "
      "without verifying",
      dir, fmt::join(unverified, ", "));
}

}  // namespace

// ---- writing -------------------------------------------------------------------------------

std::string write_checkpoint(const std::string& root, const CheckpointWrite& w, int keep_last) {
  PB_REQUIRE(keep_last >= 1, "{}: keep_last = {} must be >= 1", root, keep_last);
  PB_REQUIRE(w.table && w.params && w.m && w.v,
             "{}: write_checkpoint needs the table, params, m and v", root);
  PB_REQUIRE(w.step >= 0 && w.lamb_steps_done >= 0, "{}: negative step {} / LAMB steps {}", root,
             w.step, w.lamb_steps_done);
  std::error_code ec;
  fs::create_directories(root, ec);
  PB_REQUIRE(!ec, "{}: cannot create the checkpoint directory: {}", root, ec.message());
  PB_REQUIRE(fs::is_directory(root, ec), "{}: not a directory", root);

  const std::string name = step_name(w.step);
  const std::string final_dir = join(root, name);
  const std::string pid = std::to_string(::getpid());
  const std::string tmp = join(root, "." + name + ".tmp-" + pid);
  const std::string old = join(root, "." + name + ".old-" + pid);

  fs::remove_all(tmp, ec);  // a leftover of this very process id (a reused pid)
  PB_REQUIRE(::mkdir(tmp.c_str(), 0755) == 0, "{}: cannot create directory: {}", tmp,
             os_error(errno));
  bool moved_old = false;
  try {
    const ParamTable& table = *w.table;
    const std::string config_text = hf_config_text(table.config());
    std::map<std::string, std::string> model_md = {{"format", "pt"}};
    std::map<std::string, std::string> opt_md = {{"format", "pt"},
                                                 {"steps_done", std::to_string(w.lamb_steps_done)},
                                                 {"step", std::to_string(w.step)}};
    if (w.checksums) {
      model_md[kConfigChecksumKey] = st_checksum_hex(config_text.data(), config_text.size());
      opt_md[kStateChecksumKey] =
          st_checksum_hex(w.trainer_state_json.data(), w.trainer_state_json.size());
    }
    write_safetensors(join(tmp, kModelFile), flat_tensors(table, w.params, ""), model_md,
                      w.checksums);
    write_file_synced(join(tmp, kConfigFile), config_text);
    std::vector<StTensor> opt = flat_tensors(table, w.m, "exp_avg.");
    const std::vector<StTensor> sq = flat_tensors(table, w.v, "exp_avg_sq.");
    opt.insert(opt.end(), sq.begin(), sq.end());
    if (w.fp8) {
      const Fp8Checkpoint& f = *w.fp8;
      PB_REQUIRE(f.amax_history.size() == static_cast<size_t>(f.operands * f.history) &&
                     f.scales.size() == static_cast<size_t>(2 * f.operands),
                 "{}: an FP8 state of {} history and {} scale values for {} operands x {}", root,
                 f.amax_history.size(), f.scales.size(), f.operands, f.history);
      opt.push_back({kFp8History, StDType::f32, {f.operands, f.history}, f.amax_history.data()});
      opt.push_back({kFp8Scales, StDType::f32, {f.operands, 2}, f.scales.data()});
      opt_md[kFp8Updates] = std::to_string(f.updates);
    }
    write_safetensors(join(tmp, kOptimizerFile), opt, opt_md, w.checksums);
    write_file_synced(join(tmp, kStateFile), w.trainer_state_json);
    fsync_dir(tmp);

    if (fs::exists(fs::symlink_status(final_dir, ec))) {
      fs::remove_all(old, ec);
      PB_REQUIRE(::rename(final_dir.c_str(), old.c_str()) == 0,
                 "{}: cannot move the existing checkpoint aside to {}: {}", final_dir, old,
                 os_error(errno));
      moved_old = true;
    }
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
      const int err = errno;
      if (moved_old && ::rename(old.c_str(), final_dir.c_str()) == 0) moved_old = false;
      PB_THROW("{}: cannot rename {} to it: {}", final_dir, tmp, os_error(err));
    }
    fsync_dir(root);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (moved_old) {
    fs::remove_all(old, ec);
    if (ec) spdlog::warn("{}: cannot remove the replaced checkpoint: {}", old, ec.message());
  }

  // Prune: keep the one just written and the newest keep_last - 1 others.
  auto others = complete_checkpoints(root);
  others.erase(std::remove_if(others.begin(), others.end(),
                              [&](const auto& c) { return c.first == w.step; }),
               others.end());
  const size_t keep_others = static_cast<size_t>(keep_last - 1);
  for (size_t i = 0; i + keep_others < others.size(); ++i) {
    // Renamed away first, so that a crash mid-removal never leaves a partial step_ dir.
    const fs::path& dir = others[i].second;
    const fs::path doomed = dir.parent_path() / ("." + dir.filename().string() + ".old-" + pid);
    fs::remove_all(doomed, ec);
    if (::rename(dir.c_str(), doomed.c_str()) != 0) {
      spdlog::warn("{}: cannot remove old checkpoint: {}", dir.string(), os_error(errno));
      continue;
    }
    fs::remove_all(doomed, ec);
    if (ec) spdlog::warn("{}: cannot remove old checkpoint: {}", doomed.string(), ec.message());
  }
  return final_dir;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  const auto all = complete_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

std::vector<std::string> checkpoint_dirs_newest_first(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  fs::directory_iterator it(root, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const int64_t step = parse_step_name(it->path().filename().string());
    if (step >= 0 && it->is_directory(ec)) found.emplace_back(step, it->path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string set_checkpoint_aside(const std::string& dir) {
  fs::path d = fs::path(dir).lexically_normal();
  if (!d.has_filename()) d = d.parent_path();  // "step_N/"
  std::error_code ec;
  std::string aside = d.string() + kAsideSuffix;
  for (int k = 2; fs::exists(fs::symlink_status(aside, ec)); ++k)
    aside = d.string() + kAsideSuffix + "-" + std::to_string(k);
  PB_REQUIRE(::rename(d.c_str(), aside.c_str()) == 0,
             "{}: cannot move the damaged checkpoint "
             "aside to {}: {}",
             dir, aside, os_error(errno));
  fsync_dir(d.has_parent_path() ? d.parent_path().string() : std::string("."));
  return aside;
}

std::vector<std::string> set_aside_checkpoints(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  fs::directory_iterator it(root, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.find(kAsideSuffix);
    if (at != std::string::npos && parse_step_name(name.substr(0, at)) >= 0) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- reading -------------------------------------------------------------------------------

CheckpointRead read_checkpoint(const std::string& dir, const ParamTable& table, float* params,
                               float* m, float* v) {
  PB_REQUIRE(params, "{}: read_checkpoint needs a parameter buffer", dir);
  require_files(dir, {kModelFile, kConfigFile, kOptimizerFile, kStateFile});
  std::vector<std::string> unverified;
  CheckpointRead r;
  SafetensorsFile model(join(dir, kModelFile));
  if (!model.has_checksums()) unverified.push_back(kModelFile);
  r.config =
      parse_hf_config(join(dir, kConfigFile),
                      read_checked_text(dir, kConfigFile, model, kConfigChecksumKey, &unverified));
  check_config(join(dir, kConfigFile), table.config(), r.config, true);
  check_no_extra(model, table, {""});
  read_flat(model, table, "", params);

  SafetensorsFile opt(join(dir, kOptimizerFile));
  if (!opt.has_checksums()) unverified.push_back(kOptimizerFile);
  check_no_extra(opt, table, {"exp_avg.", "exp_avg_sq."}, {kFp8History, kFp8Scales});
  if (opt.contains(kFp8History) || opt.contains(kFp8Scales)) {
    PB_REQUIRE(opt.contains(kFp8History) && opt.contains(kFp8Scales), "{}: '{}' without '{}'",
               opt.path(), opt.contains(kFp8History) ? kFp8History : kFp8Scales,
               opt.contains(kFp8History) ? kFp8Scales : kFp8History);
    const std::vector<int64_t> hs = opt.info(kFp8History).shape, ss = opt.info(kFp8Scales).shape;
    PB_REQUIRE(hs.size() == 2 && ss.size() == 2 && ss[0] == hs[0] && ss[1] == 2,
               "{}: FP8 state of shapes [{}] and [{}], expected [n, history] and [n, 2]",
               opt.path(), fmt::join(hs, ", "), fmt::join(ss, ", "));
    Fp8Checkpoint f;
    f.operands = hs[0];
    f.history = hs[1];
    f.updates = metadata_int(opt, kFp8Updates);
    f.amax_history.resize(static_cast<size_t>(f.operands * f.history));
    f.scales.resize(static_cast<size_t>(2 * f.operands));
    opt.read(kFp8History, f.amax_history.data(), StDType::f32, hs);
    opt.read(kFp8Scales, f.scales.data(), StDType::f32, ss);
    r.fp8 = std::move(f);
  }
  // All moments must be there even when the caller skips them.
  for (const ParamTensor& t : table.tensors())
    for (const char* p : {"exp_avg.", "exp_avg_sq."})
      PB_REQUIRE(opt.contains(p + t.name), "{}: tensor '{}' is missing", opt.path(), p + t.name);
  if (m) read_flat(opt, table, "exp_avg.", m);
  if (v) read_flat(opt, table, "exp_avg_sq.", v);
  r.lamb_steps_done = metadata_int(opt, "steps_done");
  if (opt.metadata().count("step")) {
    r.step = metadata_int(opt, "step");
  } else {
    r.step = parse_step_name(fs::path(dir).lexically_normal().filename().string());
    if (r.step < 0)
      r.step = parse_step_name(fs::path(dir).lexically_normal().parent_path().filename().string());
    PB_REQUIRE(r.step >= 0, "{}: no 'step' metadata and the directory is not named step_NNNNNNNN",
               opt.path());
  }
  r.trainer_state_json = read_checked_text(dir, kStateFile, opt, kStateChecksumKey, &unverified);
  warn_unverified(dir, unverified);
  return r;
}

void load_model_weights(const std::string& dir, const ParamTable& table, float* params) {
  PB_REQUIRE(params, "{}: load_model_weights needs a parameter buffer", dir);
  require_files(dir, {kModelFile, kConfigFile});
  std::vector<std::string> unverified;
  SafetensorsFile model(join(dir, kModelFile));
  if (!model.has_checksums()) unverified.push_back(kModelFile);
  const BertConfig c =
      parse_hf_config(join(dir, kConfigFile),
                      read_checked_text(dir, kConfigFile, model, kConfigChecksumKey, &unverified));
  check_config(join(dir, kConfigFile), table.config(), c, false);
  check_no_extra(model, table, {""});
  read_flat(model, table, "", params);
  warn_unverified(dir, unverified);
}

}  // namespace packbert
