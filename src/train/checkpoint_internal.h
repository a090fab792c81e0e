// Inside checkpoints: the layout's names and the helpers that checkpoint.cpp (writing, loading),
// checkpoint_config.cpp (config.json) and checkpoint_verify.cpp (verify_checkpoint) share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/safetensors.h"

namespace packbert::detail {

inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kStateFile = "trainer_state.json";
inline constexpr const char* kFiles[] = {kModelFile, kConfigFile, kOptimizerFile, kStateFile};
// Checksums of the JSON files, each in the metadata of the file always read with it.
inline constexpr const char* kConfigChecksumKey = "config_json_checksum";  // model.safetensors
inline constexpr const char* kStateChecksumKey =
    "trainer_state_json_checksum";  // optimizer.safetensors

inline std::string join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

// The whole file; Error naming the path when it cannot be read.
std::string read_text(const std::string& path);
// Writes text to path and fsyncs it; Error naming the path and the OS reason on failure.
void write_file_synced(const std::string& path, const std::string& text);
// step_NNNNNNNN (8+ digits) -> the step; -1 for any other name.
int64_t parse_step_name(const std::string& name);
// config.json's text (read from path) as read_hf_config() reads it.
BertConfig parse_hf_config(const std::string& path, const std::string& text);
// config.json's text for config, as write_hf_config() and write_checkpoint() write it.
std::string hf_config_text(const BertConfig& config);
// Error naming path when c (a checkpoint's config.json) differs from the model's `expected` in
// the model's shape, or, with `dropout`, also in the dropout rates and the GELU: each differing
// field with both values.
void check_config(const std::string& path, const BertConfig& expected, const BertConfig& c,
                  bool dropout);
// dir/file's text, checked against the checksum under `key` in `holder`'s metadata: a
// DamagedFileError naming both files on a mismatch. Without that key the file is unverified
// (its name appended to *unverified).
std::string read_checked_text(const std::string& dir, const char* file,
                              const SafetensorsFile& holder, const char* key,
                              std::vector<std::string>* unverified);

}  // namespace packbert::detail
