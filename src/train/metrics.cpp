#include "train/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "kernels/base/error.h"
#include "core/files.h"
#include "data/loader/loader.h"
#include "model/arena.h"
#include "model/bert.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

namespace packbert {

nlohmann::json to_json(const ProgressRecord& r) {
  nlohmann::json j;
  j["event"] = "train";
  j["step"] = r.step;
  j["epoch"] = r.epoch;
  j["samples"] = r.samples;
  j["tokens"] = r.tokens;
  j["batch_samples"] = r.batch_samples;
  j["batch_tokens"] = r.batch_tokens;
  j["loss"] = r.loss;
  j["mlm_loss"] = r.mlm_loss;
  j["nsp_loss"] = r.nsp_loss;
  j["mlm_accuracy"] = r.mlm_accuracy;
  j["nsp_accuracy"] = r.nsp_accuracy;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["loss_scale"] = r.loss_scale;
  j["samples_per_s"] = r.samples_per_s;
  j["tokens_per_s"] = r.tokens_per_s;
  if (std::isfinite(r.mfu)) j["mfu"] = r.mfu;
  j["padding_fraction"] = r.padding_fraction;
  j["graph_padding"] = r.graph_padding;
  j["imbalance"] = r.imbalance;
  j["data_wait_s"] = r.data_wait_s;
  j["step_time_s"] = r.step_time_s;
  j["eta_s"] = r.eta_s;
  j["elapsed_s"] = r.elapsed_s;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["activation_peak_bytes"] = r.activation_peak_bytes;
  j["activation_capacity_bytes"] = r.activation_capacity_bytes;
  j["arena_allocations"] = r.arena_allocations;
  j["optimizer_state_bytes"] = r.optimizer_state_bytes;
  j["bytes_sent_per_step"] = r.bytes_sent_per_step;
  j["device_allocated_bytes"] = r.device_allocated_bytes;
  j["device_workspace_bytes"] = r.device_workspace_bytes;
  j["device_free_bytes"] = r.device_free_bytes;
  j["host_syncs_per_step"] = r.host_syncs_per_step;
  j["launches_per_step"] = r.launches_per_step;
  j["pageable_copies_per_step"] = r.pageable_copies_per_step;
  j["graph_launches_per_step"] = r.graph_launches_per_step;
  nlohmann::json kinds = nlohmann::json::object();
  for (const auto& [kind, bytes] : r.activation_bytes_by_kind) kinds[kind] = bytes;
  j["activation_bytes_by_kind"] = kinds;
  j["mst_chunks"] = r.mst_chunks;
  j["skipped_steps"] = r.skipped_steps;
  return j;
}

nlohmann::json to_json(const RunEnd& e) {
  nlohmann::json j;
  j["reason"] = e.reason;
  j["signal"] = e.signal;
  j["step"] = e.step;
  j["samples"] = e.samples;
  // Absolute, so that a launcher in another directory finds it.
  j["checkpoint"] = e.checkpoint.empty()
                        ? nlohmann::json()
                        : nlohmann::json(std::filesystem::absolute(e.checkpoint).string());
  return j;
}

void write_end_file(const std::string& path, const RunEnd& e) {
  if (!path.empty()) replace_file(path, to_json(e).dump() + "\n", "end file (log.end_file)");
}

void remove_end_file(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  std::filesystem::remove(path, ec);
  PB_REQUIRE(!ec, "{}: cannot remove the end file of an earlier run (log.end_file): {}", path,
             ec.message());
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02}h", s / 86400, (s % 86400) / 3600);
}

namespace {
std::string format_rate(double per_s) {
  if (per_s >= 1e6) return fmt::format("{:.2f}M", per_s / 1e6);
  if (per_s >= 1e4) return fmt::format("{:.1f}k", per_s / 1e3);
  return fmt::format("{:.1f}", per_s);
}
}  // namespace

std::string format_nsp_accuracy(double accuracy, bool nsp_head) {
  return nsp_head ? fmt::format(", nsp accuracy {:.4f}", accuracy) : std::string();
}

std::string format_progress_line(const ProgressRecord& r, int64_t max_steps, bool nsp_head) {
  const std::string nsp = nsp_head ? fmt::format(", nsp {:.4f}", r.nsp_loss) : std::string();
  std::string s = fmt::format(
      "step {}/{} | {} samples | loss {:.4f} (mlm {:.4f}{}) | mlm acc {:.4f} | lr {:.2e}", r.step,
      max_steps, r.samples, r.loss, r.mlm_loss, nsp, r.mlm_accuracy, r.lr);
  if (r.grad_norm >= 0) s += fmt::format(" | gnorm {:.3f}", r.grad_norm);
  if (r.loss_scale != 1) s += fmt::format(" | scale {}", r.loss_scale);
  s += fmt::format(" | {} samples/s | {} tok/s", format_rate(r.samples_per_s),
                   format_rate(r.tokens_per_s));
  if (std::isfinite(r.mfu)) s += fmt::format(" | mfu {:.1f}%", 100.0 * r.mfu);
  s += fmt::format(" | pad {:.1f}% | imb {:.2f} | wait {:.3f}s", 100.0 * r.padding_fraction,
                   r.imbalance, r.data_wait_s);
  s += fmt::format(" | rss {}", format_bytes(r.peak_rss_bytes));
  if (r.activation_peak_bytes > 0)
    s += fmt::format(" | act {}", format_bytes(r.activation_peak_bytes));
  if (r.mst_chunks > 1) s += fmt::format(" (mst {})", r.mst_chunks);
  if (r.optimizer_state_bytes > 0)
    s += fmt::format(" | opt {}", format_bytes(r.optimizer_state_bytes));
  if (r.device_allocated_bytes > 0)
    s += fmt::format(" | dev {}", format_bytes(r.device_allocated_bytes));
  if (r.skipped_steps > 0) s += fmt::format(" | skipped {}", r.skipped_steps);
  s += fmt::format(" | eta {}", format_duration(r.eta_s));
  return s;
}

ProgressAccumulator::ProgressAccumulator(Clock::time_point start, const HostWorkCounts& work)
    : start_(start), work_start_(work) {}

void ProgressAccumulator::exclude(double seconds, const HostWorkCounts& work) {
  excluded_s_ += seconds;
  work_excluded_.host_syncs += work.host_syncs;
  work_excluded_.launches += work.launches;
  work_excluded_.pageable_copies += work.pageable_copies;
  work_excluded_.graph_launches += work.graph_launches;
}

void ProgressAccumulator::add_losses(const StepLosses& l) {
  ++loss_steps_;
  loss_ += l.loss;
  masked_ += l.masked_tokens;
  loss_samples_ += l.samples;
  mlm_loss_ += l.mlm_loss * static_cast<double>(l.masked_tokens);
  nsp_loss_ += l.nsp_loss * static_cast<double>(l.samples);
  mlm_ok_ += l.mlm_accuracy * static_cast<double>(l.masked_tokens);
  nsp_ok_ += l.nsp_accuracy * static_cast<double>(l.samples);
}

void ProgressAccumulator::add(const StepMetrics& m, const StepBatch& batch) {
  ++steps_;
  samples_ += m.samples;
  tokens_ += m.tokens;
  rows_ += m.rows;
  for (const StepLosses& l : m.earlier_losses) add_losses(l);
  if (m.read.losses) {
    StepLosses l;
    l.loss = m.loss;
    l.mlm_loss = m.mlm_loss;
    l.nsp_loss = m.nsp_loss;
    l.mlm_accuracy = m.mlm_accuracy;
    l.nsp_accuracy = m.nsp_accuracy;
    l.masked_tokens = m.masked_tokens;
    l.samples = m.samples;
    add_losses(l);
  }
  wait_ += batch.wait_seconds;
  imbalance_ += batch.imbalance;
  step_ = batch.step + 1;
  epoch_ = batch.epoch;
  batch_ = m.samples;
  batch_tokens_ = m.tokens;
  lr_ = m.lr;
  grad_norm_ = m.grad_norm;
  loss_scale_ = m.loss_scale;
}

ProgressRecord ProgressAccumulator::close(const ProgressContext& context, Clock::time_point now) {
  const double steps = static_cast<double>(steps_);
  const double dt =
      std::max(std::chrono::duration<double>(now - start_).count() - excluded_s_, 1e-9);
  ProgressRecord r;
  r.step = step_;
  r.epoch = epoch_;
  r.samples = context.samples;
  r.tokens = context.tokens;
  r.batch_samples = batch_;
  r.batch_tokens = batch_tokens_;
  // The losses of the steps read (all of them, unless the run stopped on an unread step and
  // nobody called add_losses for it); NaN when none was.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.loss = loss_steps_ > 0 ? loss_ / static_cast<double>(loss_steps_) : nan;
  r.mlm_loss = masked_ > 0 ? mlm_loss_ / static_cast<double>(masked_) : loss_steps_ > 0 ? 0 : nan;
  r.nsp_loss = loss_samples_ > 0 ? nsp_loss_ / static_cast<double>(loss_samples_) : nan;
  r.mlm_accuracy = masked_ > 0 ? mlm_ok_ / static_cast<double>(masked_) : loss_steps_ > 0 ? 0 : nan;
  r.nsp_accuracy = loss_samples_ > 0 ? nsp_ok_ / static_cast<double>(loss_samples_) : nan;
  r.lr = lr_;
  r.grad_norm = grad_norm_;
  r.loss_scale = loss_scale_;
  r.samples_per_s = static_cast<double>(samples_) / dt;
  r.tokens_per_s = static_cast<double>(tokens_) / dt;
  r.mfu = context.peak_flops > 0 ? model_flops_ / dt / context.peak_flops : nan;
  r.padding_fraction =
      rows_ > 0 ? 1.0 - static_cast<double>(tokens_) / static_cast<double>(rows_) : 0.0;
  r.imbalance = imbalance_ / steps;
  r.data_wait_s = wait_ / steps;
  r.step_time_s = dt / steps;
  r.eta_s = r.step_time_s * static_cast<double>(context.max_steps - step_);
  r.elapsed_s = context.elapsed_s;
  r.peak_rss_bytes = peak_rss_bytes();
  if (const ActivationReport* act = context.activation) {
    r.activation_peak_bytes = static_cast<int64_t>(act->peak_bytes);
    r.activation_capacity_bytes = static_cast<int64_t>(act->capacity);
    r.arena_allocations = act->allocations;
    for (int k = 0; k < kActivationKinds; ++k)
      r.activation_bytes_by_kind.emplace_back(activation_kind_name(static_cast<ActivationKind>(k)),
                                              static_cast<int64_t>(act->peak_by_kind[k]));
    r.mst_chunks = act->mst_chunks;
    if (act->rows > 0)
      r.graph_padding =
          static_cast<double>(act->laid_rows - act->rows) / static_cast<double>(act->rows);
  }
  r.optimizer_state_bytes = context.optimizer_state_bytes;
  r.bytes_sent_per_step = context.bytes_sent_per_step;
  r.device_allocated_bytes = context.device_allocated_bytes;
  r.device_workspace_bytes = context.device_workspace_bytes;
  r.device_free_bytes = context.device_free_bytes;
  const HostWorkCounts& w = context.host_work;
  auto per_step = [&](int64_t now_count, int64_t start_count, int64_t excluded) {
    return static_cast<double>(now_count - start_count - excluded) / steps;
  };
  r.host_syncs_per_step = per_step(w.host_syncs, work_start_.host_syncs, work_excluded_.host_syncs);
  r.launches_per_step = per_step(w.launches, work_start_.launches, work_excluded_.launches);
  r.pageable_copies_per_step =
      per_step(w.pageable_copies, work_start_.pageable_copies, work_excluded_.pageable_copies);
  r.graph_launches_per_step =
      per_step(w.graph_launches, work_start_.graph_launches, work_excluded_.graph_launches);
  r.skipped_steps = context.skipped_steps;
  *this = ProgressAccumulator(now, context.host_work);
  return r;
}

MetricsWriter::MetricsWriter(const std::string& path) : MetricsWriter(path, nullptr) {}

MetricsWriter::MetricsWriter(const std::string& path,
                             std::unique_ptr<TensorBoardWriter> tensorboard)
    : path_(path), tensorboard_(std::move(tensorboard)) {
  if (path_.empty()) return;
  file_ = open_for_append(path_, "metrics file");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (tensorboard_) tensorboard_->write(record);
  if (!file_) return;
  // NaN / inf are not JSON: nlohmann writes null, which plot_metrics.py skips.
  const std::string line =
      record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  PB_REQUIRE(
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
      "{}: cannot write the metrics file: {}", path_, std::strerror(errno));
}

int64_t peak_rss_bytes() {
  struct rusage u;
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux: kilobytes
}

}  // namespace packbert
