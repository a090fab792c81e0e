// verify_checkpoint and inspect_checkpoints (checkpoint.h): every byte of a checkpoint directory
// read and checked, every failure collected, for `packbert inspect`.
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "train/checkpoint.h"
#include "train/checkpoint_internal.h"
#include "train/safetensors.h"

namespace packbert {

namespace fs = std::filesystem;
using namespace detail;

namespace {

// Opens a safetensors file of the checkpoint and checks every tensor's checksum; false when it
// could not be opened (the reason is in c.damage).
bool check_tensors(CheckpointCheck& c, CheckpointFileInfo& info, SafetensorsFile& f) {
  if (!info.present) return false;
  try {
    f.open(join(c.dir, info.name));
  } catch (const std::exception& e) {
    c.damage.push_back(e.what());
    return false;
  }
  info.tensors = static_cast<int64_t>(f.names().size());
  info.checksummed = f.has_checksums();
  if (!f.has_checksums()) c.unverified.push_back(info.name);
  for (const std::string& name : f.names()) {
    try {
      f.verify(name);
    } catch (const std::exception& e) {
      c.damage.push_back(e.what());
    }
  }
  return true;
}

// A JSON file's text, checked against its checksum in `holder` when that file could be opened;
// nullopt (and the reason in c.damage) when it cannot be read or does not match.
std::optional<std::string> check_text(CheckpointCheck& c, CheckpointFileInfo& info,
                                      const SafetensorsFile* holder, const char* key) {
  if (!info.present) return std::nullopt;
  try {
    if (holder == nullptr) return read_text(join(c.dir, info.name));  // holder is damaged
    const size_t before = c.unverified.size();
    std::string text = read_checked_text(c.dir, info.name.c_str(), *holder, key, &c.unverified);
    info.checksummed = c.unverified.size() == before;
    return text;
  } catch (const std::exception& e) {
    c.damage.push_back(e.what());
    return std::nullopt;
  }
}

std::string human_bytes(uint64_t b) {
  if (b < 10'000) return fmt::format("{} B", b);
  if (b < 10'000'000) return fmt::format("{:.1f} kB", static_cast<double>(b) / 1e3);
  if (b < 10'000'000'000ull) return fmt::format("{:.1f} MB", static_cast<double>(b) / 1e6);
  return fmt::format("{:.2f} GB", static_cast<double>(b) / 1e9);
}

void print_check(const CheckpointCheck& c, std::ostream& os) {
  auto known = [](int64_t v) { return v >= 0 ? std::to_string(v) : std::string("?"); };
  fmt::print(os, "checkpoint {}\n", c.dir);
  fmt::print(os, "  step {}, samples {}, tokens {}\n", known(c.step), known(c.samples),
             known(c.tokens));
  fmt::print(os, "  config: {}\n", c.config.empty() ? std::string("?") : c.config);
  for (const CheckpointFileInfo& f : c.files) {
    if (!f.present) {
      fmt::print(os, "  {:<22} missing\n", f.name);
      continue;
    }
    const std::string tensors = f.tensors > 0 ? fmt::format("{} tensors", f.tensors) : "";
    fmt::print(os, "  {:<22} {:>10}  {:<12} {}\n", f.name, human_bytes(f.bytes), tensors,
               f.checksummed ? "checksummed" : "no checksum");
  }
  if (c.damaged()) {
    fmt::print(os, "  verdict: DAMAGED ({} problem(s))\n", c.damage.size());
    for (const std::string& d : c.damage) fmt::print(os, "    {}\n", d);
  } else if (!c.unverified.empty()) {
    fmt::print(os,
               "  verdict: readable, not verified: no checksums for {} (written before "
               "checkpoints carried them)\n",
               fmt::join(c.unverified, ", "));
  } else {
    fmt::print(os, "  verdict: ok (every checksum matches, {})\n", kStChecksumAlgorithm);
  }
}

bool holds_checkpoint_file(const std::string& dir) {
  std::error_code ec;
  return std::any_of(std::begin(kFiles), std::end(kFiles),
                     [&](const char* f) { return fs::exists(join(dir, f), ec); });
}

}  // namespace

CheckpointCheck verify_checkpoint(const std::string& dir) {
  CheckpointCheck c;
  c.dir = dir;
  std::error_code ec;
  for (const char* name : kFiles) {
    CheckpointFileInfo info;
    info.name = name;
    const std::string path = join(dir, name);
    info.present = fs::is_regular_file(path, ec);
    if (info.present) info.bytes = fs::file_size(path, ec);
    if (!info.present) c.damage.push_back(path + ": missing");
    c.files.push_back(info);
  }
  CheckpointFileInfo& model_info = c.files[0];
  CheckpointFileInfo& config_info = c.files[1];
  CheckpointFileInfo& opt_info = c.files[2];
  CheckpointFileInfo& state_info = c.files[3];

  SafetensorsFile model, opt;
  const bool model_ok = check_tensors(c, model_info, model);
  if (auto text = check_text(c, config_info, model_ok ? &model : nullptr, kConfigChecksumKey)) {
    try {
      c.config = describe(parse_hf_config(join(dir, kConfigFile), *text));
    } catch (const std::exception& e) {
      c.damage.push_back(e.what());
    }
  }
  const bool opt_ok = check_tensors(c, opt_info, opt);
  if (auto text = check_text(c, state_info, opt_ok ? &opt : nullptr, kStateChecksumKey)) {
    const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      auto int_or = [&](const char* key) {
        return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : -1;
      };
      c.step = int_or("step");
      c.samples = int_or("samples");
      c.tokens = int_or("tokens");
    } else {
      c.damage.push_back(join(dir, kStateFile) + ": not a JSON object");
    }
  }
  if (c.step < 0) c.step = parse_step_name(fs::path(dir).lexically_normal().filename().string());
  return c;
}

bool is_checkpoint_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  return holds_checkpoint_file(path) ||
         parse_step_name(fs::path(path).lexically_normal().filename().string()) >= 0 ||
         !checkpoint_dirs_newest_first(path).empty() || !set_aside_checkpoints(path).empty();
}

int inspect_checkpoints(const std::string& path, std::ostream& os) {
  const bool single = holds_checkpoint_file(path) ||
                      parse_step_name(fs::path(path).lexically_normal().filename().string()) >= 0;
  std::vector<std::string> dirs =
      single ? std::vector<std::string>{path} : checkpoint_dirs_newest_first(path);
  std::reverse(dirs.begin(), dirs.end());
  int damaged = 0;
  for (const std::string& dir : dirs) {
    const CheckpointCheck c = verify_checkpoint(dir);
    print_check(c, os);
    damaged += c.damaged() ? 1 : 0;
  }
  if (!single) {
    const std::vector<std::string> aside = set_aside_checkpoints(path);
    fmt::print(os, "{}: {} checkpoint(s), {} ok, {} damaged{}\n", path, dirs.size(),
               dirs.size() - static_cast<size_t>(damaged), damaged,
               aside.empty()
                   ? std::string()
                   : fmt::format("; set aside earlier (not checked): {}", fmt::join(aside, ", ")));
  }
  return damaged;
}

}  // namespace packbert
