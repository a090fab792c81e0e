// packbert: one executable, subcommands prepare | inspect | pack | train | eval.
// Every error is a packbert::Error (or another exception) caught once here: logged with its
// context, then every rank exits non-zero (MPI_Abort when there are several ranks).
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/log.h"
#include "data/inspect.h"
#include "data/pack_report.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "device.h"
#include "train/checkpoint.h"
#include "train/run_train.h"
#include "train/train_config.h"

namespace {

using namespace packbert;

struct Mpi {
  int rank = 0, size = 1;
  Mpi(int* argc, char*** argv) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  ~Mpi() { MPI_Finalize(); }
  [[noreturn]] void fail(int code) {
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);  // no rank waits on one that failed
    MPI_Finalize();
    std::exit(code);
  }
};

void add_prepare(CLI::App& app, PrepareOptions& o, std::string& format) {
  auto* cmd = app.add_subcommand("prepare", "Make pretraining shards from raw text (WordPiece, "
                                            "NSP pairs, MLM masking)");
  cmd->add_option("--input", o.inputs,
                  "Text files (.gz allowed): one sentence per line, blank line between documents")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--vocab", o.vocab, "WordPiece vocabulary, one token per line")
      ->required()->check(CLI::ExistingFile);
  cmd->add_option("--output", o.output_dir, "Output directory for the shards")->required();
  cmd->add_option("--max-seq-len", o.max_seq_len, "Maximum tokens per sample")
      ->capture_default_str()->check(CLI::Range(8, 65536));
  cmd->add_option("--max-predictions-per-seq", o.max_predictions_per_seq,
                  "Maximum masked tokens per sample")->capture_default_str()->check(CLI::Range(1, 65536));
  cmd->add_option("--masked-lm-prob", o.masked_lm_prob, "Fraction of tokens masked")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--dupe-factor", o.dupe_factor, "Times each document is used, masked anew")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--short-seq-prob", o.short_seq_prob,
                  "Probability of a shorter target length")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", o.seed, "Random seed (output depends on it, not on --threads)")
      ->capture_default_str();
  cmd->add_option("--num-shards", o.num_shards, "Number of training shards")
      ->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--eval-samples", o.eval_samples, "Samples written to the eval shard")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--format", format, "Shard format: fixed | varlength")
      ->capture_default_str()->check(CLI::IsMember({"fixed", "varlength"}));
  cmd->add_flag("--whole-word-masking", o.whole_word_masking,
                "Mask all WordPieces of a word together");
  cmd->add_option("--threads", o.threads, "Worker threads (0: all cores)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
}

struct InspectArgs {
  std::string path;
  std::string vocab;
  int64_t vocab_size = 30522;
  int max_seq_len = 0;
  bool skip_bad_samples = false;
};

void add_inspect(CLI::App& app, InspectArgs& a) {
  auto* cmd = app.add_subcommand("inspect", "Validate shards and print counts, length "
                                            "distribution, masked counts and padding; or verify "
                                            "checkpoints (every checksum) and summarise them");
  cmd->add_option("path", a.path, "A shard file or a directory of shards; or a checkpoint "
                                  "directory or a directory of them (exit 1 if any is damaged)")
      ->required();
  cmd->add_option("--vocab", a.vocab, "Vocabulary file (sets --vocab-size)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--vocab-size", a.vocab_size, "Token ids must be below this")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--max-seq-len", a.max_seq_len, "Reject samples longer than this (0: no limit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_flag("--skip-bad-samples", a.skip_bad_samples,
                "Count and report samples that break a rule instead of failing on the first");
}

void add_pack(CLI::App& app, PackCommandOptions& o) {
  auto* cmd = app.add_subcommand("pack", "Pack a length histogram (or a dataset) with each "
                                         "algorithm and report the efficiency");
  auto* hist = cmd->add_option("--histogram", o.histogram_file,
                               "Length histogram: line i holds the count of length i ('#' "
                               "comments)")->check(CLI::ExistingFile);
  auto* data = cmd->add_option("--data", o.data_dir, "Shard file or directory: pack its lengths");
  hist->excludes(data);
  cmd->add_option("--max-seq-len", o.max_seq_len, "Pack length L")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-seqs-per-pack", o.max_seqs_per_pack,
                  "Most sequences in one pack (0: no limit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd->add_option("--algorithm", o.algorithm, "spfhp | lpfhp | nnlshp | ours | all")
      ->capture_default_str()->check(CLI::IsMember({"spfhp", "lpfhp", "nnlshp", "ours", "all"}));
  cmd->add_flag("--json", o.json, "Print JSON with every pack strategy and its repeat count");
}

struct TrainArgs {
  std::string config;
  std::string resume;
  std::string init_checkpoint;
  std::string checkpoint;  // eval
  bool print_config = false;
};

const char* kOverrideHelp =
    "Any config key can be overridden as --section.key=VALUE (e.g. --train.max_steps=20); "
    "README.md lists every key.";

CLI::App* add_train(CLI::App& app, TrainArgs& a) {
  auto* cmd = app.add_subcommand("train", "Pretrain BERT from a TOML config");
  cmd->footer(kOverrideHelp);
  cmd->add_option("--config", a.config, "TOML config (configs/*.toml)")->check(CLI::ExistingFile);
  cmd->add_option("--resume", a.resume,
                  "auto (newest valid checkpoint under checkpoint.dir, damaged ones moved "
                  "aside; fresh if there is none) or a checkpoint directory; same as "
                  "--checkpoint.resume");
  cmd->add_option("--init-checkpoint", a.init_checkpoint,
                  "Start from these model weights only; same as --checkpoint.init_checkpoint");
  cmd->add_flag("--print-config", a.print_config,
                "Print the effective config (every key, resolved) as TOML and exit");
  cmd->allow_extras();
  return cmd;
}

CLI::App* add_eval(CLI::App& app, TrainArgs& a) {
  auto* cmd = app.add_subcommand("eval", "Masked-LM accuracy and loss of a checkpoint on "
                                         "data.eval_dir");
  cmd->footer(kOverrideHelp);
  cmd->add_option("--config", a.config, "TOML config (its [data] and [eval] sections are used)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", a.checkpoint, "Checkpoint directory (model.safetensors and "
                                                "config.json)")->required();
  cmd->allow_extras();
  return cmd;
}

// The subcommand's extra arguments as config overrides: --section.key=VALUE or
// --section.key VALUE.
std::vector<std::string> config_overrides(const CLI::App& cmd) {
  const std::vector<std::string> extra = cmd.remaining();
  std::vector<std::string> out;
  for (size_t i = 0; i < extra.size(); ++i) {
    const std::string& a = extra[i];
    const bool key_like = a.rfind("--", 0) == 0 && a.find('.') != std::string::npos &&
                          a.find('.') < a.find('=');
    PB_REQUIRE(key_like, "{}: unexpected argument '{}' (config overrides are "
                         "--section.key=VALUE)", cmd.get_name(), a);
    if (a.find('=') != std::string::npos) {
      out.push_back(a.substr(2));
    } else {
      PB_REQUIRE(i + 1 < extra.size(), "{}: override {} has no value", cmd.get_name(), a);
      out.push_back(a.substr(2) + "=" + extra[++i]);
    }
  }
  return out;
}

// Lengths of every sample under a shard path, read (and validated) with the shard reader.
std::vector<int> read_sample_lengths(const std::string& path) {
  std::vector<int> lengths;
  SampleRules rules;
  rules.vocab_size = INT32_MAX;  // the lengths are what matters here
  Sample s;
  for (const std::string& shard : list_shards(path)) {
    ShardReader reader(shard, rules);
    while (reader.next(s)) lengths.push_back(s.length());
  }
  return lengths;
}

int run(int argc, char** argv, Mpi& mpi) {
  CLI::App app{"packbert: BERT pretraining without padding, on CPUs and GPUs"};
  app.set_version_flag("--version", "packbert " PACKBERT_VERSION);
  app.set_config("--config", "", "TOML config file (sections named after subcommands)");
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | critical | off")
      ->capture_default_str();
  app.add_flag_callback("--devices", [] { std::cout << describe_devices() << "\n"; std::exit(0); },
                        "Print the compute devices this build and machine offer, then exit");

  PrepareOptions prepare;
  std::string format = "fixed";
  add_prepare(app, prepare, format);
  InspectArgs inspect;
  add_inspect(app, inspect);
  PackCommandOptions pack;
  add_pack(app, pack);
  TrainArgs train_args, eval_args;
  CLI::App* train_cmd = add_train(app, train_args);
  CLI::App* eval_cmd = add_eval(app, eval_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  init_logging(mpi.rank, log_level);

  if (app.got_subcommand("prepare")) {
    prepare.format = parse_shard_format(format);
    const PrepareStats st = run_prepare(prepare);
    spdlog::info("prepare: {} documents, {} training samples in {} shards, {} eval samples, "
                 "{:.1f} MB of text in {:.2f} s ({:.2f} MB/s)",
                 st.documents, st.train_samples, st.train_shards.size(), st.eval_samples,
                 st.input_bytes / 1e6, st.seconds, st.input_bytes / 1e6 / std::max(st.seconds, 1e-9));
  } else if (app.got_subcommand("inspect") && is_checkpoint_path(inspect.path)) {
    const int damaged = inspect_checkpoints(inspect.path, std::cout);
    if (damaged > 0) {
      spdlog::error("inspect: {} damaged checkpoint(s) under {}", damaged, inspect.path);
      return 1;
    }
  } else if (app.got_subcommand("inspect")) {
    SampleRules rules;
    rules.vocab_size = inspect.vocab_size;
    rules.max_seq_len = inspect.max_seq_len;
    if (!inspect.vocab.empty()) {
      const Vocab v = Vocab::load(inspect.vocab);
      rules.vocab_size = v.size();
      rules.cls_id = v.cls_id();
      rules.sep_id = v.sep_id();
    }
    const InspectReport report = inspect_shards(inspect.path, rules, inspect.skip_bad_samples);
    print_inspect_report(report, std::cout);
    if (report.bad_samples > 0)
      spdlog::warn("inspect: {} sample(s) break the rules and were skipped", report.bad_samples);
  } else if (app.got_subcommand("pack")) {
    PB_REQUIRE(!pack.histogram_file.empty() || !pack.data_dir.empty(),
               "pack: give --histogram FILE or --data DIR");
    return run_pack_command(pack, std::cout, read_sample_lengths);
  } else if (app.got_subcommand("train") || app.got_subcommand("eval")) {
    // The file before the subcommand configures prepare / inspect / pack only; its [model],
    // [train], ... sections would be dropped without a word.
    PB_REQUIRE(app.get_option("--config")->count() == 0,
               "{}: the --config before the subcommand is for prepare, inspect and pack; give "
               "the training config after it: packbert {} --config FILE.toml",
               app.got_subcommand("train") ? "train" : "eval",
               app.got_subcommand("train") ? "train" : "eval");
  }
  if (app.got_subcommand("train")) {
    std::vector<std::string> overrides = config_overrides(*train_cmd);
    if (!train_args.resume.empty()) overrides.push_back("checkpoint.resume=" + train_args.resume);
    if (!train_args.init_checkpoint.empty())
      overrides.push_back("checkpoint.init_checkpoint=" + train_args.init_checkpoint);
    const TrainConfig config = load_train_config(train_args.config, overrides);
    if (train_args.print_config) {
      if (mpi.rank == 0) std::cout << train_config_to_toml(config);
      return 0;
    }
    return run_train(MPI_COMM_WORLD, config);
  } else if (app.got_subcommand("eval")) {
    const TrainConfig config = load_train_config(eval_args.config, config_overrides(*eval_cmd));
    return run_eval(MPI_COMM_WORLD, config, eval_args.checkpoint);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Mpi mpi(&argc, &argv);
  try {
    const int rc = run(argc, argv, mpi);
    if (rc != 0) mpi.fail(rc);
    return 0;
  } catch (const std::exception& e) {
    // The logger may not exist yet (errors while parsing); stderr always does.
    std::cerr << "[rank " << mpi.rank << "] error: " << e.what() << std::endl;
    mpi.fail(1);
  }
}
