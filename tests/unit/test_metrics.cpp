// Training metrics: the JSONL record, the progress line, the accumulation of a record's
// interval, the writer and its errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "data/loader/loader.h"
#include "model/arena.h"
#include "model/bert.h"
#include "train/metrics.h"
#include "train/trainer.h"

#include "test_util.h"

namespace fs = std::filesystem;
using namespace packbert;
using nlohmann::json;

namespace {

using test::read_lines;
using test::TempDir;

ProgressRecord sample_record() {
  ProgressRecord r;
  r.step = 120;
  r.epoch = 1;
  r.samples = 30720;
  r.tokens = 3932160;
  r.batch_samples = 256;
  r.batch_tokens = 32768;
  r.loss = 6.81234;
  r.mlm_loss = 6.1;
  r.nsp_loss = 0.71;
  r.mlm_accuracy = 0.15234;
  r.nsp_accuracy = 0.55;
  r.lr = 3.5e-4;
  r.grad_norm = 1.25;
  r.samples_per_s = 812.3;
  r.tokens_per_s = 103900;
  r.padding_fraction = 0.125;
  r.graph_padding = 0.0375;
  r.imbalance = 1.02;
  r.data_wait_s = 0.001;
  r.step_time_s = 0.31;
  r.eta_s = 1085;
  r.elapsed_s = 37.2;
  r.peak_rss_bytes = int64_t{1321} << 20;
  r.activation_peak_bytes = 0;
  r.activation_capacity_bytes = int64_t{96} << 20;
  r.arena_allocations = 1;
  r.skipped_steps = 2;
  r.host_syncs_per_step = 0.25;
  r.launches_per_step = 12.5;
  r.graph_launches_per_step = 4;
  return r;
}

using Clock = ProgressAccumulator::Clock;
using std::chrono::milliseconds;

struct Step {
  StepMetrics m;
  StepBatch batch;
};

// Step `index` (0-based) of the run: the record says index + 1.
Step step_of(int64_t index, int64_t epoch, double loss, double mlm_accuracy, int64_t masked,
             int64_t tokens) {
  Step s;
  s.batch.step = index;
  s.batch.epoch = epoch;
  s.m.step = index;
  s.m.loss = loss;
  s.m.mlm_loss = loss - 1;
  s.m.nsp_loss = loss / 8;
  s.m.mlm_accuracy = mlm_accuracy;
  s.m.nsp_accuracy = 1 - mlm_accuracy;
  s.m.samples = 8;
  s.m.masked_tokens = masked;
  s.m.tokens = tokens;
  s.m.rows = 128;
  return s;
}

}  // namespace

TEST(Metrics, JsonHasEveryField) {
  const ProgressRecord r = sample_record();
  const json j = to_json(r);
  EXPECT_EQ(j.at("event"), "train");
  EXPECT_EQ(j.at("step"), 120);
  EXPECT_EQ(j.at("epoch"), 1);
  EXPECT_EQ(j.at("samples"), 30720);
  EXPECT_EQ(j.at("tokens"), 3932160);
  EXPECT_EQ(j.at("batch_samples"), 256);
  EXPECT_EQ(j.at("batch_tokens"), 32768);
  EXPECT_DOUBLE_EQ(j.at("loss").get<double>(), 6.81234);
  EXPECT_DOUBLE_EQ(j.at("mlm_loss").get<double>(), 6.1);
  EXPECT_DOUBLE_EQ(j.at("nsp_loss").get<double>(), 0.71);
  EXPECT_DOUBLE_EQ(j.at("mlm_accuracy").get<double>(), 0.15234);
  EXPECT_DOUBLE_EQ(j.at("nsp_accuracy").get<double>(), 0.55);
  EXPECT_DOUBLE_EQ(j.at("lr").get<double>(), 3.5e-4);
  EXPECT_DOUBLE_EQ(j.at("grad_norm").get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(j.at("loss_scale").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j.at("samples_per_s").get<double>(), 812.3);
  EXPECT_DOUBLE_EQ(j.at("tokens_per_s").get<double>(), 103900);
  EXPECT_DOUBLE_EQ(j.at("padding_fraction").get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(j.at("graph_padding").get<double>(), 0.0375);
  EXPECT_DOUBLE_EQ(j.at("imbalance").get<double>(), 1.02);
  EXPECT_DOUBLE_EQ(j.at("data_wait_s").get<double>(), 0.001);
  EXPECT_DOUBLE_EQ(j.at("step_time_s").get<double>(), 0.31);
  EXPECT_DOUBLE_EQ(j.at("eta_s").get<double>(), 1085);
  EXPECT_DOUBLE_EQ(j.at("elapsed_s").get<double>(), 37.2);
  EXPECT_EQ(j.at("peak_rss_bytes"), int64_t{1321} << 20);
  EXPECT_EQ(j.at("activation_peak_bytes"), 0);
  EXPECT_EQ(j.at("activation_capacity_bytes"), int64_t{96} << 20);
  EXPECT_EQ(j.at("arena_allocations"), 1);
  EXPECT_TRUE(j.at("activation_bytes_by_kind").is_object());
  EXPECT_TRUE(j.at("activation_bytes_by_kind").empty());
  EXPECT_EQ(j.at("mst_chunks"), 0);
  EXPECT_EQ(j.at("skipped_steps"), 2);
  EXPECT_EQ(j.at("optimizer_state_bytes"), 0);
  EXPECT_EQ(j.at("bytes_sent_per_step"), 0);
  EXPECT_EQ(j.at("device_allocated_bytes"), 0);
  EXPECT_EQ(j.at("device_free_bytes"), 0);
  EXPECT_EQ(j.at("device_workspace_bytes"), 0);
  EXPECT_DOUBLE_EQ(j.at("host_syncs_per_step").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j.at("launches_per_step").get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j.at("pageable_copies_per_step").get<double>(), 0);
  EXPECT_DOUBLE_EQ(j.at("graph_launches_per_step").get<double>(), 4);
  EXPECT_EQ(j.size(), 40u);
}

TEST(Metrics, ActivationReportInJsonAndProgressLine) {
  ProgressRecord r = sample_record();
  r.activation_peak_bytes = int64_t{3} << 30;
  r.activation_bytes_by_kind = {{"hidden", int64_t{1} << 30}, {"mlp", int64_t{2} << 30}};
  r.mst_chunks = 8;
  const json j = to_json(r);
  EXPECT_EQ(j.at("activation_peak_bytes"), int64_t{3} << 30);
  EXPECT_EQ(j.at("activation_bytes_by_kind").size(), 2u);
  EXPECT_EQ(j.at("activation_bytes_by_kind").at("hidden"), int64_t{1} << 30);
  EXPECT_EQ(j.at("activation_bytes_by_kind").at("mlp"), int64_t{2} << 30);
  EXPECT_EQ(j.at("mst_chunks"), 8);
  const std::string s = format_progress_line(r, 1000);
  EXPECT_NE(s.find("act 3.00 GiB (mst 8)"), std::string::npos) << s;
  EXPECT_NE(s.find(", nsp "), std::string::npos) << s;
  // Without an NSP head, no NSP figure.
  const std::string mlm_only = format_progress_line(r, 1000, false);
  EXPECT_EQ(mlm_only.find("nsp"), std::string::npos) << mlm_only;
  EXPECT_NE(mlm_only.find("(mlm "), std::string::npos) << mlm_only;
  EXPECT_EQ(format_nsp_accuracy(0.5, false), "");
  EXPECT_EQ(format_nsp_accuracy(0.5, true), ", nsp accuracy 0.5000");
  r.mst_chunks = 1;
  EXPECT_EQ(format_progress_line(r, 1000).find("mst"), std::string::npos);
  r.activation_peak_bytes = 0;
  EXPECT_EQ(format_progress_line(r, 1000).find("act"), std::string::npos);
}

TEST(Metrics, OptimizerStateBytesInJsonAndProgressLine) {
  ProgressRecord r = sample_record();
  EXPECT_EQ(format_progress_line(r, 1000).find("opt "), std::string::npos);  // 0: not shown
  r.optimizer_state_bytes = int64_t{5} << 20;
  r.bytes_sent_per_step = int64_t{7} << 20;
  EXPECT_EQ(to_json(r).at("optimizer_state_bytes"), int64_t{5} << 20);
  EXPECT_EQ(to_json(r).at("bytes_sent_per_step"), int64_t{7} << 20);
  const std::string s = format_progress_line(r, 1000);
  EXPECT_NE(s.find("opt 5.00 MiB"), std::string::npos) << s;
  EXPECT_EQ(s.find("dev "), std::string::npos) << s;  // 0: not shown
  r.device_allocated_bytes = int64_t{9} << 20;
  EXPECT_NE(format_progress_line(r, 1000).find("dev 9.00 MiB"), std::string::npos);
}

TEST(Metrics, ProgressLine) {
  const ProgressRecord r = sample_record();
  const std::string s = format_progress_line(r, 1000);
  for (const char* want :
       {"step 120/1000", "30720 samples", "loss 6.8123 (mlm 6.1000, nsp 0.7100)", "mlm acc 0.1523",
        "lr 3.50e-04", "812.3 samples/s", "103.9k tok/s", "pad 12.5%", "imb 1.02", "wait 0.001s",
        "rss 1.29 GiB", "skipped 2", "eta 18m05s", "gnorm 1.250"})
    EXPECT_NE(s.find(want), std::string::npos) << "missing '" << want << "' in: " << s;
  EXPECT_EQ(s.find('\n'), std::string::npos);
  ProgressRecord q = r;
  q.skipped_steps = 0;
  q.eta_s = -1;
  q.grad_norm = -1;
  const std::string t = format_progress_line(q, 1000);
  EXPECT_EQ(t.find("skipped"), std::string::npos) << t;
  EXPECT_EQ(t.find("gnorm"), std::string::npos) << t;
  EXPECT_NE(t.find("eta ?"), std::string::npos) << t;
  EXPECT_EQ(t.find("scale"), std::string::npos) << t;  // fp32 / bf16: no loss scale
  q.loss_scale = 32768;
  const std::string u = format_progress_line(q, 1000);
  EXPECT_NE(u.find("| scale 32768"), std::string::npos) << u;
}

TEST(Metrics, Formatting) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(int64_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(1085), "18m05s");
  EXPECT_EQ(format_duration(3 * 3600 + 7 * 60 + 5), "3h07m");
  EXPECT_EQ(format_duration(2 * 86400 + 4 * 3600), "2d04h");
  EXPECT_EQ(format_duration(-1), "?");
}

TEST(Metrics, WriterCreatesDirectoriesAndAppends) {
  const TempDir tmp;
  const fs::path dir = tmp.path();
  const fs::path path = dir / "a" / "b" / "metrics.jsonl";
  {
    MetricsWriter w(path.string());
    EXPECT_TRUE(w.enabled());
    EXPECT_EQ(w.path(), path.string());
    w.write(to_json(sample_record()));
    // Flushed at once: readable while the writer is still open.
    EXPECT_EQ(read_lines(path).size(), 1u);
    w.write(json{{"event", "eval"},
                 {"step", 150},
                 {"samples", 38400},
                 {"eval_accuracy", 0.41},
                 {"eval_loss", 3.2}});
  }
  {
    MetricsWriter w(path.string());
    w.write(json{{"event", "note"}});
  }
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(json::parse(lines[0]).at("event"), "train");
  EXPECT_EQ(json::parse(lines[1]).at("eval_accuracy"), 0.41);
  EXPECT_EQ(json::parse(lines[2]).at("event"), "note");
  fs::remove_all(dir);
}

TEST(Metrics, EmptyPathIsOff) {
  MetricsWriter w("");
  EXPECT_FALSE(w.enabled());
  w.write(json{{"event", "train"}});  // no-op
}

TEST(Metrics, UnwritablePathNamesIt) {
  const TempDir tmp;
  const fs::path dir = tmp.path();
  std::ofstream(dir / "regular") << "x";
  const std::string bad = (dir / "regular" / "sub" / "metrics.jsonl").string();
  try {
    MetricsWriter w(bad);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  const std::string bad2 = (dir / "regular" / "metrics.jsonl").string();
  try {
    MetricsWriter w(bad2);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad2), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// log.end_file: one JSON line, replaced whole (nothing left beside it), the checkpoint made
// absolute or null; removing it is fine when there is none, and an unwritable path is named.
TEST(Metrics, EndFileIsReplacedWholeAndRemoved) {
  const TempDir tmp;
  const fs::path path = fs::path(tmp.path()) / "out" / "end.json";
  RunEnd e{"signal", 15, 120, 3840, "ckpt/step_00000120"};
  write_end_file(path.string(), e);
  e = RunEnd{"finished", 0, 400, 12800, ""};
  write_end_file(path.string(), e);
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(json::parse(lines[0]), (json{{"reason", "finished"},
                                         {"signal", 0},
                                         {"step", 400},
                                         {"samples", 12800},
                                         {"checkpoint", nullptr}}));
  EXPECT_EQ(std::distance(fs::directory_iterator(path.parent_path()), fs::directory_iterator()), 1);
  const json j = to_json(RunEnd{"signal", 10, 3, 24, "ckpt/step_00000003"});
  EXPECT_EQ(j.at("checkpoint"), fs::absolute("ckpt/step_00000003").string());
  EXPECT_EQ(j.at("signal"), 10);
  remove_end_file(path.string());
  EXPECT_FALSE(fs::exists(path));
  remove_end_file(path.string());  // absent: nothing to do
  write_end_file("", e);           // off
  std::ofstream(fs::path(tmp.path()) / "regular") << "x";
  const std::string bad = (fs::path(tmp.path()) / "regular" / "end.json").string();
  try {
    write_end_file(bad, e);
    FAIL() << "expected an Error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find(bad), std::string::npos) << err.what();
  }
}

TEST(Metrics, PeakRss) {
  const int64_t a = peak_rss_bytes();
  EXPECT_GT(a, 1 << 20);  // any process has more than a MiB resident
  std::vector<char> big(64 << 20, 1);
  volatile char sink = big[12345];
  (void)sink;
  EXPECT_GE(peak_rss_bytes(), a);
}

TEST(Metrics, ProgressAccumulatorMeansRatesAndLastStep) {
  const Clock::time_point t0{};
  ProgressAccumulator acc(t0);
  Step a = step_of(9, 1, 4.0, 0.25, 10, 100);
  a.m.lr = 1e-3;
  a.m.grad_norm = 2.f;
  a.batch.wait_seconds = 0.1;
  a.batch.imbalance = 1.2;
  Step b = step_of(10, 2, 2.0, 0.75, 30, 120);
  b.m.lr = 5e-4;
  b.m.grad_norm = -1.f;  // not read back
  b.m.loss_scale = 4096.f;
  b.batch.wait_seconds = 0.3;
  b.batch.imbalance = 1.0;
  acc.add(a.m, a.batch);
  acc.add(b.m, b.batch);
  EXPECT_EQ(acc.steps(), 2);
  acc.exclude(1.0);  // an evaluation: 4 s of the 5 were training

  ProgressContext at;
  at.samples = 1000;
  at.tokens = 9000;
  at.skipped_steps = 3;
  at.max_steps = 21;
  at.elapsed_s = 42;
  const ProgressRecord r = acc.close(at, t0 + milliseconds(5000));
  EXPECT_EQ(r.step, 11);
  EXPECT_EQ(r.epoch, 2);
  EXPECT_EQ(r.samples, 1000);
  EXPECT_EQ(r.tokens, 9000);
  EXPECT_EQ(r.skipped_steps, 3);
  EXPECT_DOUBLE_EQ(r.loss, 3.0);
  EXPECT_DOUBLE_EQ(r.mlm_loss, (3.0 * 10 + 1.0 * 30) / 40);  // weighted by masked tokens
  EXPECT_DOUBLE_EQ(r.mlm_accuracy, (0.25 * 10 + 0.75 * 30) / 40);
  EXPECT_DOUBLE_EQ(r.nsp_loss, (0.5 + 0.25) / 2);  // by samples (8 each)
  EXPECT_DOUBLE_EQ(r.nsp_accuracy, 0.5);
  EXPECT_DOUBLE_EQ(r.lr, 5e-4);
  EXPECT_DOUBLE_EQ(r.grad_norm, -1);
  EXPECT_DOUBLE_EQ(r.loss_scale, 4096);
  EXPECT_DOUBLE_EQ(r.samples_per_s, 16.0 / 4);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 220.0 / 4);
  EXPECT_DOUBLE_EQ(r.padding_fraction, 1.0 - 220.0 / 256);
  EXPECT_DOUBLE_EQ(r.imbalance, 1.1);
  EXPECT_DOUBLE_EQ(r.data_wait_s, 0.2);
  EXPECT_DOUBLE_EQ(r.step_time_s, 2.0);
  EXPECT_DOUBLE_EQ(r.eta_s, 2.0 * (21 - 11));
  EXPECT_DOUBLE_EQ(r.elapsed_s, 42);
  EXPECT_GT(r.peak_rss_bytes, 0);
  EXPECT_EQ(r.activation_peak_bytes, 0);  // no activation report
  EXPECT_TRUE(r.activation_bytes_by_kind.empty());
  EXPECT_EQ(r.mst_chunks, 0);
  EXPECT_EQ(r.optimizer_state_bytes, 0);

  // The next interval starts at the close, with nothing carried over.
  EXPECT_EQ(acc.steps(), 0);
  const Step c = step_of(11, 2, 1.0, 0.5, 0, 64);  // no masked token: MLM loss and accuracy 0
  acc.add(c.m, c.batch);
  const ProgressRecord q = acc.close(at, t0 + milliseconds(5500));
  EXPECT_EQ(q.step, 12);
  EXPECT_DOUBLE_EQ(q.loss, 1.0);
  EXPECT_DOUBLE_EQ(q.mlm_loss, 0);
  EXPECT_DOUBLE_EQ(q.mlm_accuracy, 0);
  EXPECT_DOUBLE_EQ(q.step_time_s, 0.5);
  EXPECT_DOUBLE_EQ(q.samples_per_s, 16);
  EXPECT_DOUBLE_EQ(q.imbalance, 1);
  EXPECT_DOUBLE_EQ(q.data_wait_s, 0);
  EXPECT_DOUBLE_EQ(q.lr, 0);
  EXPECT_DOUBLE_EQ(q.loss_scale, 1);
}

// MFU: the interval's model FLOPs per second over the devices' peak, in the record, its JSON
// and the progress line; none without a peak (the CPU).
TEST(Metrics, MfuOnlyWithAPeak) {
  for (const double peak : {4e12, 0.0}) {
    const auto t0 = Clock::now();
    ProgressAccumulator acc(t0);
    for (int64_t k = 0; k < 2; ++k) {
      const Step s = step_of(k, 0, 7.0, 0.1, 20, 1000);
      acc.add(s.m, s.batch);
      acc.add_model_flops(1e12);
    }
    ProgressContext at;
    at.max_steps = 10;
    at.peak_flops = peak;
    const ProgressRecord r = acc.close(at, t0 + milliseconds(2000));  // 2e12 FLOPs in 2 s
    const json j = to_json(r);
    const std::string line = format_progress_line(r, 10);
    if (peak > 0) {
      EXPECT_DOUBLE_EQ(r.mfu, 0.25);
      EXPECT_DOUBLE_EQ(j.at("mfu").get<double>(), 0.25);
      EXPECT_NE(line.find("| mfu 25.0% |"), std::string::npos) << line;
    } else {
      EXPECT_TRUE(std::isnan(r.mfu));
      EXPECT_FALSE(j.contains("mfu"));
      EXPECT_EQ(line.find("mfu"), std::string::npos) << line;
    }
  }
}

TEST(Metrics, ProgressAccumulatorReportsActivationAndOptimizerMemory) {
  const Clock::time_point t0{};
  ProgressAccumulator acc(t0);
  const Step s = step_of(0, 0, 5.0, 0.1, 20, 100);
  acc.add(s.m, s.batch);
  ActivationReport act;
  act.peak_bytes = size_t{3} << 30;
  act.peak_by_kind[static_cast<int>(ActivationKind::hidden)] = size_t{1} << 30;
  act.peak_by_kind[static_cast<int>(ActivationKind::mlp)] = size_t{2} << 30;
  act.mst_chunks = 4;
  act.capacity = size_t{7} << 29;
  act.allocations = 2;
  act.rows = 800;
  act.laid_rows = 830;  // 30 padding rows of graph capacities over 800
  ProgressContext at;
  at.max_steps = 1;
  at.activation = &act;
  at.optimizer_state_bytes = int64_t{5} << 20;
  at.bytes_sent_per_step = 123456789;
  at.device_allocated_bytes = 4242;
  at.device_free_bytes = 777;
  const ProgressRecord r = acc.close(at, t0 + milliseconds(100));
  EXPECT_EQ(r.device_allocated_bytes, 4242);
  EXPECT_EQ(r.device_free_bytes, 777);
  EXPECT_EQ(r.step, 1);
  EXPECT_DOUBLE_EQ(r.eta_s, 0);
  EXPECT_EQ(r.activation_peak_bytes, int64_t{3} << 30);
  EXPECT_EQ(r.mst_chunks, 4);
  EXPECT_EQ(r.activation_capacity_bytes, int64_t{7} << 29);
  EXPECT_EQ(r.arena_allocations, 2);
  EXPECT_DOUBLE_EQ(r.graph_padding, 30.0 / 800);
  EXPECT_EQ(r.optimizer_state_bytes, int64_t{5} << 20);
  EXPECT_EQ(r.bytes_sent_per_step, 123456789);
  // Every kind, in ActivationKind's order, zeros included.
  ASSERT_EQ(r.activation_bytes_by_kind.size(), static_cast<size_t>(kActivationKinds));
  for (int k = 0; k < kActivationKinds; ++k)
    EXPECT_EQ(r.activation_bytes_by_kind[static_cast<size_t>(k)].first,
              activation_kind_name(static_cast<ActivationKind>(k)));
  EXPECT_EQ(to_json(r).at("activation_bytes_by_kind").at("mlp"), int64_t{2} << 30);
  EXPECT_EQ(to_json(r).at("activation_bytes_by_kind").at("grad_scratch"), 0);
}

// Host work per step: the counts at the close less those at the interval's start and those of
// the excluded work (evaluation, checkpoints), over the interval's steps; the next interval
// starts from the close's counts.
TEST(Metrics, ProgressAccumulatorHostWorkPerStep) {
  std::mt19937_64 rng(test::test_seed());
  std::uniform_int_distribution<int64_t> count(0, 1000);
  const Clock::time_point t0{};
  HostWorkCounts start{count(rng), count(rng), count(rng), count(rng)};
  ProgressAccumulator acc(t0, start);
  const int64_t steps = 1 + count(rng) % 7;
  for (int64_t i = 0; i < steps; ++i) {
    const Step s = step_of(i, 0, 5.0, 0.1, 20, 100);
    acc.add(s.m, s.batch);
  }
  const HostWorkCounts side{count(rng), count(rng), count(rng), count(rng)};
  acc.exclude(0.5, side);
  const HostWorkCounts per_step{count(rng), count(rng), count(rng), count(rng)};
  ProgressContext at;
  at.max_steps = 100;
  at.host_work = {start.host_syncs + side.host_syncs + steps * per_step.host_syncs,
                  start.launches + side.launches + steps * per_step.launches,
                  start.pageable_copies + side.pageable_copies + steps * per_step.pageable_copies,
                  start.graph_launches + side.graph_launches + steps * per_step.graph_launches};
  const ProgressRecord r = acc.close(at, t0 + milliseconds(1000));
  EXPECT_DOUBLE_EQ(r.host_syncs_per_step, static_cast<double>(per_step.host_syncs));
  EXPECT_DOUBLE_EQ(r.launches_per_step, static_cast<double>(per_step.launches));
  EXPECT_DOUBLE_EQ(r.pageable_copies_per_step, static_cast<double>(per_step.pageable_copies));
  EXPECT_DOUBLE_EQ(r.graph_launches_per_step, static_cast<double>(per_step.graph_launches));
  // The next interval: one step, one more sync than the close's counts.
  const Step s = step_of(steps, 0, 5.0, 0.1, 20, 100);
  acc.add(s.m, s.batch);
  ProgressContext next = at;
  next.host_work.host_syncs += 1;
  const ProgressRecord q = acc.close(next, t0 + milliseconds(2000));
  EXPECT_DOUBLE_EQ(q.host_syncs_per_step, 1);
  EXPECT_DOUBLE_EQ(q.launches_per_step, 0);
  EXPECT_DOUBLE_EQ(q.pageable_copies_per_step, 0);
  EXPECT_DOUBLE_EQ(q.graph_launches_per_step, 0);
}
