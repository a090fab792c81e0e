// MLPerf logging: lines exactly as the mlperf_logging library's mllog writes them, so the
// compliance checker (python3 -m mlperf_logging.compliance_checker --usage training --ruleset
// 5.0.0 LOG) and the result summarizer read our logs:
//
//   :::MLLOG {"namespace": "", "time_ms": 1700000000123, "event_type": "POINT_IN_TIME",
//             "key": "eval_accuracy", "value": 0.7215, "metadata": {"file": "src/train/x.cpp",
//             "lineno": 42, "epoch_num": 3400000}}
//
// (one line; Python json.dumps separators ", " and ": ", non-ASCII escaped as \uXXXX, keys of
// the outer object in mllog's order, "file" and "lineno" first in metadata, then the caller's
// metadata keys in sorted order). time_ms is integer milliseconds since the Unix epoch. A NaN or
// infinite float is written as NaN / Infinity / -Infinity, as Python's json.dumps does.
//
// The call site goes into metadata through GCC/Clang's __builtin_FILE()/__builtin_LINE()
// default arguments: logger.event("seed", 42) records the file and line of that call.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "config/train_config.h"

namespace packbert {

class MlLogger {
 public:
  // enabled: true on rank 0 only; a disabled logger does nothing (no file is opened). path: the
  // log file, opened for append (parent directories created), every line flushed; "" = no file.
  // echo: also print each line to stdout. I/O errors are Errors naming the path.
  MlLogger(const std::string& path, bool enabled, bool echo = false);
  ~MlLogger();
  MlLogger(const MlLogger&) = delete;
  MlLogger& operator=(const MlLogger&) = delete;

  bool enabled() const { return enabled_; }

  // POINT_IN_TIME, INTERVAL_START, INTERVAL_END. metadata: an object (or null) of extra keys;
  // "file" and "lineno" are reserved. value null = Python's None.
  void event(const std::string& key, const nlohmann::json& value = nullptr,
             const nlohmann::json& metadata = nullptr, const char* file = __builtin_FILE(),
             int line = __builtin_LINE());
  void start(const std::string& key, const nlohmann::json& value = nullptr,
             const nlohmann::json& metadata = nullptr, const char* file = __builtin_FILE(),
             int line = __builtin_LINE());
  void end(const std::string& key, const nlohmann::json& value = nullptr,
           const nlohmann::json& metadata = nullptr, const char* file = __builtin_FILE(),
           int line = __builtin_LINE());

  // The line (without newline) for these fields; what every call above writes. Thread-safe.
  static std::string format_line(int64_t time_ms, const std::string& event_type,
                                 const std::string& key, const nlohmann::json& value,
                                 const nlohmann::json& metadata, const std::string& file, int line);
  // json.dumps(v) of Python for a JSON value (separators ", " and ": ", ensure_ascii).
  static std::string python_dumps(const nlohmann::json& v);

 private:
  void log(const char* event_type, const std::string& key, const nlohmann::json& value,
           const nlohmann::json& metadata, const char* file, int line);

  bool enabled_;
  bool echo_;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

// File names in metadata: __builtin_FILE() gives the path the compiler saw; this strips
// everything up to and including "/src/" (or the repo root) so logs do not leak build paths.
std::string mllog_source_name(const char* file);

// Logs (POINT_IN_TIME) every constant the training 5.0.0 ruleset requires for closed BERT, and
// the submission keys, in this order:
//   submission_benchmark "bert", submission_org, submission_division, submission_status,
//   submission_platform (log.*; an empty platform is logged as "<world_size>xCPU"),
//   seed, global_batch_size, gradient_accumulation_steps, max_sequence_length,
//   max_predictions_per_seq, opt_base_learning_rate, opt_lamb_epsilon,
//   opt_learning_rate_training_steps, opt_learning_rate_warmup_steps, num_warmup_steps,
//   start_warmup_step, opt_lamb_beta_1, opt_lamb_beta_2, opt_lamb_weight_decay_rate,
//   opt_lamb_learning_rate_decay_poly_power, opt_lamb_learning_rate_min, eval_samples
// (eval_samples = the samples one evaluation covers). The warmup keys log the resolved warmup
// (LrSchedule: warmup_proportion turned into steps). train_samples is NOT logged here: the
// ruleset wants it once, and its value (samples trained) is known only at the end of the run.
// Call between init_start and init_stop (after cache_clear), on every rank (disabled loggers
// ignore it).
void log_bert_constants(MlLogger& logger, const TrainConfig& config, int world_size,
                        int64_t eval_samples, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE());

}  // namespace packbert
