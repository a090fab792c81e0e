#include "train/mllog.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "train/train_options.h"
#include "kernels/base/error.h"
#include "core/files.h"
#include "optim/lr_schedule.h"

namespace packbert {

namespace {

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

void dump_to(const nlohmann::json& v, std::string& out) {
  using nlohmann::json;
  switch (v.type()) {
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_to(json(it.key()), out);
        out += ": ";
        dump_to(it.value(), out);
      }
      out += '}';
      return;
    }
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump_to(e, out);
      }
      out += ']';
      return;
    }
    case json::value_t::number_float: {
      const double f = v.get<double>();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += v.dump();
      }
      return;
    }
    default:
      // Strings: escaped as Python's ensure_ascii does (\uXXXX for non-ASCII); invalid UTF-8
      // is replaced rather than thrown.
      out += v.dump(-1, ' ', true, json::error_handler_t::replace);
      return;
  }
}

}  // namespace

std::string MlLogger::python_dumps(const nlohmann::json& v) {
  std::string out;
  dump_to(v, out);
  return out;
}

std::string MlLogger::format_line(int64_t time_ms, const std::string& event_type,
                                  const std::string& key, const nlohmann::json& value,
                                  const nlohmann::json& metadata, const std::string& file,
                                  int line) {
  PB_REQUIRE(metadata.is_null() || metadata.is_object(),
             "mllog: metadata of '{}' must be an object, got {}", key, metadata.dump());
  // metadata: file and lineno first (mllog's get_caller), then the caller's keys.
  std::string md = "{\"file\": " + python_dumps(file) + ", \"lineno\": " + std::to_string(line);
  if (metadata.is_object()) {
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      PB_REQUIRE(it.key() != "file" && it.key() != "lineno",
                 "mllog: metadata key '{}' of '{}' is reserved", it.key(), key);
      md += ", " + python_dumps(it.key()) + ": " + python_dumps(it.value());
    }
  }
  md += "}";
  return fmt::format(
      ":::MLLOG {{\"namespace\": \"\", \"time_ms\": {}, \"event_type\": {}, \"key\": {}, "
      "\"value\": {}, \"metadata\": {}}}",
      time_ms, python_dumps(event_type), python_dumps(key), python_dumps(value), md);
}

std::string mllog_source_name(const char* file) {
  std::string f = file ? file : "";
  for (const char* root : {"/src/", "/tests/", "/kernels/"}) {
    size_t p = f.rfind(root);
    if (p != std::string::npos) return f.substr(p + 1);
  }
  return f;
}

MlLogger::MlLogger(const std::string& path, bool enabled, bool echo)
    : enabled_(enabled), echo_(echo), path_(path) {
  if (!enabled_ || path_.empty()) return;
  file_ = open_for_append(path_, "MLPerf log");
}

MlLogger::~MlLogger() {
  if (file_) std::fclose(file_);
}

void MlLogger::log(const char* event_type, const std::string& key, const nlohmann::json& value,
                   const nlohmann::json& metadata, const char* file, int line) {
  if (!enabled_) return;
  const std::string text =
      format_line(now_ms(), event_type, key, value, metadata, mllog_source_name(file), line) + "\n";
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_) {
    PB_REQUIRE(
        std::fwrite(text.data(), 1, text.size(), file_) == text.size() && std::fflush(file_) == 0,
        "{}: cannot write the MLPerf log: {}", path_, std::strerror(errno));
  }
  if (echo_) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
}

void MlLogger::event(const std::string& key, const nlohmann::json& value,
                     const nlohmann::json& metadata, const char* file, int line) {
  log("POINT_IN_TIME", key, value, metadata, file, line);
}
void MlLogger::start(const std::string& key, const nlohmann::json& value,
                     const nlohmann::json& metadata, const char* file, int line) {
  log("INTERVAL_START", key, value, metadata, file, line);
}
void MlLogger::end(const std::string& key, const nlohmann::json& value,
                   const nlohmann::json& metadata, const char* file, int line) {
  log("INTERVAL_END", key, value, metadata, file, line);
}

void log_bert_constants(MlLogger& logger, const TrainConfig& c, int world_size,
                        int64_t eval_samples, const char* file, int line) {
  if (!logger.enabled()) return;
  const LrSchedule schedule(lr_schedule_config(c));
  auto ev = [&](const char* key, const nlohmann::json& value) {
    logger.event(key, value, nullptr, file, line);
  };
  ev("submission_benchmark", "bert");
  ev("submission_org", c.log.submission_org);
  ev("submission_division", config_name(c.log.submission_division));
  ev("submission_status", config_name(c.log.submission_status));
  ev("submission_platform", c.log.submission_platform.empty() ? fmt::format("{}xCPU", world_size)
                                                              : c.log.submission_platform);
  ev("seed", c.train.seed);
  ev("global_batch_size", c.train.global_batch_size);
  ev("gradient_accumulation_steps", c.train.gradient_accumulation_steps);
  ev("max_sequence_length", c.train.max_seq_len);
  ev("max_predictions_per_seq", c.train.max_predictions_per_seq);
  ev("opt_base_learning_rate", c.optim.lr);
  ev("opt_lamb_epsilon", c.optim.epsilon);
  ev("opt_learning_rate_training_steps", c.train.max_steps);
  ev("opt_learning_rate_warmup_steps", schedule.warmup_steps());
  ev("num_warmup_steps", schedule.warmup_steps());
  ev("start_warmup_step", schedule.warmup_start());
  ev("opt_lamb_beta_1", c.optim.beta1);
  ev("opt_lamb_beta_2", c.optim.beta2);
  ev("opt_lamb_weight_decay_rate", c.optim.weight_decay);
  ev("opt_lamb_learning_rate_decay_poly_power", c.optim.poly_power);
  ev("opt_lamb_learning_rate_min", c.optim.end_lr);
  ev("eval_samples", eval_samples);
}

}  // namespace packbert
