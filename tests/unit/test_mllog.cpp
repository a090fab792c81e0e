// MlLogger: the :::MLLOG line format (byte for byte as mlperf_logging's mllog writes it) and a
// complete synthetic BERT run log that the MLPerf compliance checker (training 5.0.0) accepts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "train/mllog.h"
#include "config/train_config.h"

#include "test_util.h"

namespace fs = std::filesystem;
using namespace packbert;
using nlohmann::json;

namespace {

using test::read_lines;
using test::TempDir;

// The tests' Python (tests/CMakeLists.txt: the repository's .venv when there is one).
const char* kPython = PACKBERT_PYTHON3;

// Runs a shell command, returns (exit status, stdout+stderr).
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool python_has(const std::string& module) {
  if (!fs::exists(kPython)) return false;
  return run(std::string(kPython) + " -c 'import " + module + "'").first == 0;
}

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST(MlLog, LineFormatIsMllogs) {
  const std::string line = MlLogger::format_line(
      1700000000123, "POINT_IN_TIME", "eval_accuracy", 0.5,
      json{{"epoch_num", 12800}, {"a", json::array({1, 2.5, "x", nullptr, true})}},
      "src/train/run.cpp", 42);
  EXPECT_EQ(line,
            ":::MLLOG {\"namespace\": \"\", \"time_ms\": 1700000000123, \"event_type\": "
            "\"POINT_IN_TIME\", \"key\": \"eval_accuracy\", \"value\": 0.5, \"metadata\": "
            "{\"file\": \"src/train/run.cpp\", \"lineno\": 42, \"a\": [1, 2.5, \"x\", null, "
            "true], \"epoch_num\": 12800}}");
  // Strings escape as Python's json.dumps (ensure_ascii).
  EXPECT_EQ(MlLogger::python_dumps(json("caf\xc3\xa9 \"q\" \\ \n")),
            "\"caf\\u00e9 \\\"q\\\" \\\\ \\n\"");
  EXPECT_EQ(MlLogger::python_dumps(json{{"b", json::object()}, {"a", json::array()}}),
            "{\"a\": [], \"b\": {}}");
  EXPECT_EQ(MlLogger::python_dumps(json(std::nan(""))), "NaN");
  // Reserved metadata keys and non-object metadata are errors.
  EXPECT_THROW(MlLogger::format_line(1, "POINT_IN_TIME", "k", 1, json{{"file", "x"}}, "f", 1),
               Error);
  EXPECT_THROW(MlLogger::format_line(1, "POINT_IN_TIME", "k", 1, json(3), "f", 1), Error);
}

// The same line as mlperf_logging's own encoder produces for the same fields.
TEST(MlLog, MatchesPythonEncoder) {
  if (!python_has("mlperf_logging.mllog"))
    GTEST_SKIP() << "mlperf_logging not installed for " << kPython;
  const json value = {{"x", 1e-06}, {"y", "text"}, {"z", json::array({0.9, 0.999, 13700})}};
  const json metadata = {{"epoch_num", 150000}, {"status", "success"}};
  const std::string ours = MlLogger::format_line(1700000000123, "INTERVAL_END", "run_stop", value,
                                                 metadata, "src/a.cpp", 7);
  const TempDir tmp;
  const fs::path dir = tmp.path();
  std::ofstream(dir / "v.json") << value.dump();
  std::ofstream(dir / "m.json") << json{
      {"file", "src/a.cpp"},
      {"lineno", 7},
      {"epoch_num", 150000},
      {"status", "success"}}.dump();
  const std::string script =
      "import json,sys\n"
      "from mlperf_logging.mllog import mllog\n"
      "v=json.load(open(sys.argv[1])); m=json.load(open(sys.argv[2]))\n"
      "md={'file': m.pop('file'), 'lineno': m.pop('lineno')}; md.update(m)\n"
      "print(mllog._encode_log('', 1700000000123, 'INTERVAL_END', 'run_stop', v, md))\n";
  std::ofstream(dir / "enc.py") << script;
  auto [rc, out] = run(std::string(kPython) + " " + (dir / "enc.py").string() + " " +
                       (dir / "v.json").string() + " " + (dir / "m.json").string());
  ASSERT_EQ(rc, 0) << out;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  EXPECT_EQ(ours, out);
  fs::remove_all(dir);
}

TEST(MlLog, WritesParsableLinesWithCallSite) {
  const TempDir tmp;
  const fs::path dir = tmp.path();
  const fs::path path = dir / "sub" / "mllog.txt";
  const int64_t before = now_ms();
  int line_event = 0, line_start = 0;
  {
    MlLogger log(path.string(), /*enabled=*/true);
    line_event = __LINE__ + 1;
    log.event("seed", 42, json{{"note", "x"}});
    line_start = __LINE__ + 1;
    log.start("block_start", nullptr, json{{"samples_count", 0}});
    log.end("block_stop", nullptr, json{{"samples_count", 256}});
  }
  {
    MlLogger log(path.string(), true);  // appends
    log.event("run_stop", nullptr, json{{"status", "success"}});
  }
  const int64_t after = now_ms();
  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 4u);
  const std::vector<std::string> types = {"POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END",
                                          "POINT_IN_TIME"};
  const std::vector<std::string> keys = {"seed", "block_start", "block_stop", "run_stop"};
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].rfind(":::MLLOG {", 0), 0u) << lines[i];
    const json j = json::parse(lines[i].substr(9));
    EXPECT_EQ(j.at("namespace"), "");
    ASSERT_TRUE(j.at("time_ms").is_number_integer());
    EXPECT_GE(j.at("time_ms").get<int64_t>(), before);
    EXPECT_LE(j.at("time_ms").get<int64_t>(), after);
    EXPECT_EQ(j.at("event_type"), types[i]);
    EXPECT_EQ(j.at("key"), keys[i]);
    const std::string file = j.at("metadata").at("file");
    EXPECT_EQ(file, "tests/unit/test_mllog.cpp");
    EXPECT_TRUE(j.at("metadata").at("lineno").is_number_integer());
  }
  EXPECT_EQ(json::parse(lines[0].substr(9)).at("value"), 42);
  EXPECT_EQ(json::parse(lines[0].substr(9)).at("metadata").at("lineno"), line_event);
  EXPECT_EQ(json::parse(lines[0].substr(9)).at("metadata").at("note"), "x");
  EXPECT_TRUE(json::parse(lines[1].substr(9)).at("value").is_null());
  EXPECT_EQ(json::parse(lines[1].substr(9)).at("metadata").at("lineno"), line_start);
  EXPECT_EQ(json::parse(lines[3].substr(9)).at("metadata").at("status"), "success");
  fs::remove_all(dir);
}

TEST(MlLog, DisabledWritesNothing) {
  const TempDir tmp;
  const fs::path dir = tmp.path();
  const fs::path path = dir / "never" / "mllog.txt";
  {
    MlLogger log(path.string(), /*enabled=*/false);
    EXPECT_FALSE(log.enabled());
    log.event("seed", 1);
  }
  EXPECT_FALSE(fs::exists(path.parent_path()));
  MlLogger none("", true);  // no file, no echo: nothing to do, no error
  none.event("seed", 1);
  fs::remove_all(dir);
}

TEST(MlLog, UnwritablePathNamesIt) {
  const TempDir tmp;
  const fs::path dir = tmp.path();
  std::ofstream(dir / "file") << "x";
  const std::string bad = (dir / "file" / "mllog.txt").string();
  try {
    MlLogger log(bad, true);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// A whole run in the order the trainer logs it (see mllog.h and the lead's notes); the MLPerf
// compliance checker must say SUCCESS.
TEST(MlLog, SyntheticRunPassesComplianceChecker) {
  if (!python_has("mlperf_logging.compliance_checker"))
    GTEST_SKIP() << "mlperf_logging.compliance_checker is not installed for " << kPython;
  const TempDir tmp;
  const fs::path dir = tmp.path();
  const fs::path path = dir / "result_0.txt";
  TrainConfig c =
      load_train_config("", {"model.preset=large", "train.global_batch_size=256",
                             "train.max_steps=13700", "optim.lr=3.5e-4", "train.max_seq_len=512",
                             "train.max_predictions_per_seq=76", "log.submission_org=packbert",
                             "eval.every_samples=150000", "eval.target_accuracy=0.72"});
  {
    MlLogger log(path.string(), true);
    log.event("cache_clear", true);
    log.start("init_start");
    log_bert_constants(log, c, /*world_size=*/8, /*eval_samples=*/10000);
    log.end("init_stop");
    log.start("run_start");
    int64_t samples = 0;
    const double acc[] = {0.65, 0.70, 0.7205};
    for (double a : acc) {
      log.start("block_start", nullptr, json{{"samples_count", samples}});
      samples += 150016;  // whole steps of 256 past the eval point
      log.end("block_stop", nullptr, json{{"samples_count", samples}});
      log.start("eval_start", nullptr, json{{"epoch_num", samples}});
      log.end("eval_stop", nullptr, json{{"epoch_num", samples}});
      log.event("eval_accuracy", a, json{{"epoch_num", samples}});
    }
    log.event("train_samples", samples);
    log.end("run_stop", nullptr, json{{"status", "success"}});
  }
  // (cd: the checker writes compliance_checker.log into its working directory)
  const std::string checker =
      "cd '" + dir.string() + "' && " + kPython +
      " -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 ";
  auto [rc, out] = run(checker + path.string());
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << "rc " << rc << "\n" << out;
  EXPECT_EQ(rc, 0) << out;

  // And without a passing accuracy the checker must not say SUCCESS (the test can fail).
  const fs::path bad = dir / "result_bad.txt";
  {
    std::ifstream in(path);
    std::ofstream o(bad);
    std::string line;
    while (std::getline(in, line))
      if (line.find("\"key\": \"eval_accuracy\", \"value\": 0.7205") == std::string::npos)
        o << line << "\n";
  }
  auto [rc2, out2] = run(checker + bad.string());
  EXPECT_EQ(out2.find("SUCCESS"), std::string::npos) << out2;
  fs::remove_all(dir);
}
