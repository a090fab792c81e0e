// packbert: one executable, subcommands prepare | inspect | pack | plan | train | eval, each
// `packbert SUBCOMMAND [--config FILE.toml] [--section.key=VALUE ...] [options]` on one config
// system (config/config.h).
// Every error is a packbert::Error (or another exception) caught once here: logged with its
// context, then every rank exits non-zero (MPI_Abort when there are several ranks).
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/mpi_check.h"
#include "config/command_config.h"
#include "config/config.h"
#include "kernels/base/error.h"
#include "core/log.h"
#include "data/shards/inspect.h"
#include "data/shards/shard.h"
#include "data/prepare/tokenize_command.h"
#include "data/prepare/corpus_tokenizer.h"
#include "kernels/device.h"
#include "train/checkpoint.h"
#include "train/memory_plan.h"
#include "train/run_train.h"
#include "config/train_config.h"

namespace {

using namespace packbert;

struct Mpi {
  int rank = 0, size = 1;
  // MPI_THREAD_MULTIPLE because the data loader's threads call MPI while the trainer does; the
  // loader refuses a lower level (data/loader/exchange.cpp), the other subcommands run on any.
  Mpi(int* argc, char*** argv) {
    int provided = 0;
    PB_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    PB_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    PB_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  }
  // Unchecked: nothing is left to report to once the process is on its way out.
  ~Mpi() { MPI_Finalize(); }
  [[noreturn]] void fail(int code) {
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, code);  // no rank waits on one that failed
    MPI_Finalize();
    std::exit(code);
  }
};

// What every subcommand takes besides its keys: the config file and --print-config.
struct CommandArgs {
  std::string config;
  bool print_config = false;
};

// The help's footer of prepare, inspect and pack: their options are their keys.
const char* kOptionKeysHelp =
    "Each option above is the config key in [brackets]: set it with the option, in the --config "
    "file, or as --section.key=VALUE (the command line wins). docs/configuration.md has every "
    "key.";

// The help's footer of train and eval: every key of their config, from its key table.
std::string train_keys_help() {
  return "Config keys: set each in the --config file or as --section.key=VALUE (the command "
         "line wins); docs/configuration.md has them too.\n\n" +
         config::keys_text(train_config_keys());
}

CLI::App* add_command(CLI::App& app, const char* name, const char* description,
                      const std::string& footer, CommandArgs& args) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->footer(footer);
  cmd->add_option("--config", args.config, "TOML config file (configs/*.toml)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--print-config", args.print_config,
                "Check the config as the subcommand would, then print it (every key, "
                "resolved) as TOML and exit; an invalid config prints nothing and fails");
  cmd->allow_extras();  // --section.key=VALUE
  return cmd;
}

// The options of prepare, inspect and pack, made from their section's keys: the option
// --max-seq-len IS the key prepare.max_seq_len (bool keys are flags, list keys take several
// values, inspect.path is the positional PATH). The ones given become settings applied after
// the file's, so the command line wins.
class KeyOptions {
 public:
  template <class Root>
  KeyOptions(CLI::App* cmd, const config::Schema<Root>& schema) {
    for (const config::Key<Root>& k : schema.keys()) {
      auto e = std::make_unique<Entry>();
      e->key = k.name;
      e->spec = k.spec;
      const std::string option = option_of_key(k.name);
      const std::string doc = k.doc + " [" + k.name + "]";
      if (option == "PATH") {
        e->option = cmd->add_option("path", e->value, doc);
      } else if (k.type == "bool") {
        e->flag_key = true;
        e->option = cmd->add_flag(option, e->flag, doc);
      } else if (k.spec.list) {
        e->option = cmd->add_option(option, e->values, doc)->type_name("TEXT");
      } else {
        const std::string type = k.type.rfind("enum(", 0) == 0 ? k.type.substr(5, k.type.size() - 6)
                                 : k.type == "int"             ? "INT"
                                 : k.type == "float"           ? "FLOAT"
                                                               : "TEXT";
        e->option =
            cmd->add_option(option, e->value, doc)->type_name(type)->default_str(k.default_value);
      }
      entries_.push_back(std::move(e));
    }
  }

  // "section.key=VALUE" of each option given, with the option's name for messages.
  template <class Root>
  std::vector<config::Setting> settings(const config::Schema<Root>& schema) const {
    std::vector<config::Setting> out;
    for (const auto& e : entries_) {
      if (e->option->count() == 0) continue;
      std::string value = e->value;
      if (e->flag_key)
        value = e->flag ? "true" : "false";
      else if (e->spec.list)
        value = config::toml_string_list(e->values);
      else if (e->spec.bare_string)
        value = config::toml_string(e->value);
      out.push_back(
          schema.read_override(e->key + "=" + value, "option " + e->option->get_name(false, true)));
    }
    return out;
  }

 private:
  struct Entry {
    std::string key;
    config::KeySpec spec;
    CLI::Option* option = nullptr;
    std::string value;
    std::vector<std::string> values;
    bool flag = false, flag_key = false;
  };
  std::vector<std::unique_ptr<Entry>> entries_;
};

// The subcommand's extra arguments as config overrides: --section.key=VALUE or
// --section.key VALUE.
std::vector<std::string> config_overrides(const CLI::App& cmd) {
  const std::vector<std::string> extra = cmd.remaining();
  std::vector<std::string> out;
  for (size_t i = 0; i < extra.size(); ++i) {
    const std::string& a = extra[i];
    const bool key_like =
        a.rfind("--", 0) == 0 && a.find('.') != std::string::npos && a.find('.') < a.find('=');
    PB_REQUIRE(key_like,
               "{}: unexpected argument '{}' (config overrides are "
               "--section.key=VALUE)",
               cmd.get_name(), a);
    if (a.find('=') != std::string::npos) {
      out.push_back(a.substr(2));
    } else {
      PB_REQUIRE(i + 1 < extra.size(), "{}: override {} has no value", cmd.get_name(), a);
      out.push_back(a.substr(2) + "=" + extra[++i]);
    }
  }
  return out;
}

// A subcommand's config: the file, then the --section.key overrides, then its options; `where`
// receives where each key was set.
template <class Root>
Root load_command_config(const config::Schema<Root>& schema, const CommandArgs& args,
                         const CLI::App& cmd, const KeyOptions& options,
                         config::KeyLocations& where) {
  std::vector<config::Setting> settings = schema.read(args.config, config_overrides(cmd));
  for (config::Setting& s : options.settings(schema)) settings.push_back(std::move(s));
  Root c;
  schema.apply(settings, c);
  where = config::locations(settings);
  return c;
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
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error | critical | off")
      ->capture_default_str();
  app.add_flag_callback(
      "--devices",
      [] {
        std::cout << describe_devices() << "\n";
        std::exit(0);
      },
      "Print the compute devices this build and machine offer, then exit");
  // The old place of --config (before the subcommand): an error that shows the new one.
  std::string misplaced_config;
  app.add_option("--config", misplaced_config)->group("");

  CommandArgs prepare_args, inspect_args, pack_args, plan_args, train_args, eval_args;
  CLI::App* prepare_cmd =
      add_command(app, "prepare",
                  "Make pretraining shards from raw text (WordPiece, NSP pairs, "
                  "MLM masking)",
                  kOptionKeysHelp, prepare_args);
  const KeyOptions prepare_options(prepare_cmd, prepare_config_schema());
  CLI::App* inspect_cmd = add_command(app, "inspect",
                                      "Validate shards and print counts, length distribution, "
                                      "masked counts and padding; or verify checkpoints (every "
                                      "checksum) and summarise them",
                                      kOptionKeysHelp, inspect_args);
  const KeyOptions inspect_options(inspect_cmd, inspect_config_schema());
  CLI::App* pack_cmd = add_command(app, "pack",
                                   "Pack a length histogram (or a dataset) with each algorithm and "
                                   "report the efficiency",
                                   kOptionKeysHelp, pack_args);
  const KeyOptions pack_options(pack_cmd, pack_config_schema());
  const std::string train_keys = train_keys_help();
  CLI::App* train_cmd =
      add_command(app, "train", "Pretrain BERT from a TOML config", train_keys, train_args);
  std::string resume, init_checkpoint;
  train_cmd->add_option("--resume", resume,
                        "auto (newest valid checkpoint under checkpoint.dir, damaged ones moved "
                        "aside; fresh if there is none) or a checkpoint directory; same as "
                        "--checkpoint.resume");
  train_cmd->add_option("--init-checkpoint", init_checkpoint,
                        "Start from these model weights only; same as "
                        "--checkpoint.init_checkpoint");
  CLI::App* plan_cmd = add_command(app, "plan",
                                   "Device memory per rank of a train config, item by item and to "
                                   "the byte, before anything is allocated: whether it fits, the "
                                   "largest micro-batch that does, and what each knob saves",
                                   train_keys, plan_args);
  int plan_ranks = 1;
  std::string plan_gpu;
  bool plan_json = false;
  int plan_rank = -1;
  plan_cmd->add_option("--ranks", plan_ranks, "Ranks (GPUs) the run would have")
      ->capture_default_str();
  plan_cmd->add_option("--gpu", plan_gpu,
                       "The devices to plan against, comma-separated: a100-40, a100-80, "
                       "h100-80, h200-141, b200-180, or a size (bytes, or with MiB / GiB / MB / "
                       "GB); default: this machine's cuda:0 for a cuda config, its available "
                       "RAM for a cpu one");
  plan_cmd->add_flag("--json", plan_json, "Print the plan as JSON (for scripts)");
  plan_cmd->add_option("--rank", plan_rank,
                       "Plan this rank (0-based) instead of the one that holds most");
  CLI::App* eval_cmd = add_command(app, "eval",
                                   "Masked-LM accuracy and loss of a checkpoint on "
                                   "data.eval_dir (the config's [data] and [eval])",
                                   train_keys, eval_args);
  std::string eval_checkpoint;
  eval_cmd
      ->add_option("--checkpoint", eval_checkpoint,
                   "Checkpoint directory (model.safetensors "
                   "and config.json)")
      ->required();
  // tokenize: a tool, not a config-driven command (data/prepare/tokenize_command.h).
  CLI::App* tokenize_cmd = app.add_subcommand(
      "tokenize",
      "Print each input line's token ids (one line of space-separated ids per line) as the "
      "tokenizer gives them: a Hugging Face tokenizer.json or a BERT vocab.txt");
  std::string tokenize_tokenizer, tokenize_input;
  bool tokenize_special = false;
  tokenize_cmd->add_option("--tokenizer", tokenize_tokenizer, "tokenizer.json or vocab.txt")
      ->required()
      ->check(CLI::ExistingFile);
  tokenize_cmd->add_option("--input", tokenize_input, "Text file; default: standard input");
  tokenize_cmd->add_flag("--special", tokenize_special,
                         "Add the tokenizer's special tokens around each line (its "
                         "post-processor's template; [CLS] ... [SEP] for a vocab.txt)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::string command = app.get_subcommands().front()->get_name();
  PB_REQUIRE(misplaced_config.empty(),
             "--config goes after the subcommand now: packbert {} --config {} [...]", command,
             misplaced_config);
  init_logging(mpi.rank, log_level);
  // Where each key was set: the rules checked after reading name it too.
  config::KeyLocations where;
  // --print-config: the effective config as TOML, then exit. Called after the subcommand's own
  // checks, so a config it prints is one the subcommand accepts, and an invalid one prints
  // nothing (a config redirected to a file is never a broken one) and fails with the
  // subcommand's error.
  auto printed = [&](const CommandArgs& args, const std::string& toml) {
    if (args.print_config && mpi.rank == 0) std::cout << toml;
    return args.print_config;
  };

  if (command == "prepare") {
    const auto& schema = prepare_config_schema();
    const PrepareConfig c =
        load_command_config(schema, prepare_args, *prepare_cmd, prepare_options, where);
    config::check_located(where, [&] { validate_prepare_config(c); });
    if (printed(prepare_args, schema.to_toml(c))) return 0;
    const PrepareStats st = run_prepare(c.prepare);
    spdlog::info(
        "prepare: {} documents, {} training samples in {} shards, {} eval samples, "
        "{:.1f} MB of text in {:.2f} s ({:.2f} MB/s)",
        st.documents, st.train_samples, st.train_shards.size(), st.eval_samples,
        st.input_bytes / 1e6, st.seconds, st.input_bytes / 1e6 / std::max(st.seconds, 1e-9));
    if (st.bad_lines > 0)
      spdlog::warn("prepare: {} malformed JSONL line(s) skipped (--skip-bad-lines)", st.bad_lines);
  } else if (command == "inspect") {
    const auto& schema = inspect_config_schema();
    const InspectConfig c =
        load_command_config(schema, inspect_args, *inspect_cmd, inspect_options, where);
    config::check_located(where, [&] { validate_inspect_config(c); });
    if (printed(inspect_args, schema.to_toml(c))) return 0;
    const InspectOptions& inspect = c.inspect;
    if (is_checkpoint_path(inspect.path)) {
      const int damaged = inspect_checkpoints(inspect.path, std::cout);
      if (damaged > 0) {
        spdlog::error("inspect: {} damaged checkpoint(s) under {}", damaged, inspect.path);
        return 1;
      }
      return 0;
    }
    SampleRules rules;
    rules.vocab_size = inspect.vocab_size;
    rules.max_seq_len = inspect.max_seq_len;
    if (!inspect.vocab.empty())
      rules = CorpusTokenizer::load(inspect.vocab).sample_rules(inspect.max_seq_len);
    const InspectReport report = inspect_shards(inspect.path, rules, inspect.skip_bad_samples);
    print_inspect_report(report, std::cout);
    if (report.bad_samples > 0)
      spdlog::warn("inspect: {} sample(s) break the rules and were skipped", report.bad_samples);
  } else if (command == "pack") {
    const auto& schema = pack_config_schema();
    const PackConfig c = load_command_config(schema, pack_args, *pack_cmd, pack_options, where);
    config::check_located(where, [&] { validate_pack_config(c); });
    if (printed(pack_args, schema.to_toml(c))) return 0;
    return run_pack_command(c.pack, std::cout, read_sample_lengths);
  } else if (command == "plan") {
    const TrainConfig config =
        load_train_config(plan_args.config, config_overrides(*plan_cmd), &where);
    // A plan needs no data, and plans a GPU run on any machine: no path or device checks.
    config::check_located(where, [&] {
      validate_train_config(config, plan_ranks, ConfigPurpose::train, /*check_paths=*/false);
    });
    if (printed(plan_args, train_config_to_toml(config))) return 0;
    std::vector<DeviceMemory> targets;
    for (size_t at = 0; at < plan_gpu.size();) {
      const size_t comma = std::min(plan_gpu.find(',', at), plan_gpu.size());
      targets.push_back(parse_device_memory(plan_gpu.substr(at, comma - at)));
      at = comma + 1;
    }
    if (targets.empty()) targets.push_back(this_machine_memory(config.train.device));
    const MemoryPlan plan = plan_memory(config, plan_ranks, targets, /*knobs=*/true, plan_rank);
    if (mpi.rank == 0) {
      if (plan_json)
        std::cout << memory_plan_json(plan).dump(2) << "\n";
      else
        std::cout << format_memory_plan(plan);
    }
    return 0;
  } else if (command == "train") {
    std::vector<std::string> overrides = config_overrides(*train_cmd);
    if (!resume.empty()) overrides.push_back("checkpoint.resume=" + resume);
    if (!init_checkpoint.empty())
      overrides.push_back("checkpoint.init_checkpoint=" + init_checkpoint);
    const TrainConfig config = load_train_config(train_args.config, overrides, &where);
    // run_train checks again (its callers need not be this one); here the error names the line.
    config::check_located(where,
                          [&] { validate_train_config(config, mpi.size, ConfigPurpose::train); });
    if (printed(train_args, train_config_to_toml(config))) return 0;
    return run_train(MPI_COMM_WORLD, config);
  } else if (command == "tokenize") {
    if (mpi.rank == 0)
      run_tokenize(tokenize_tokenizer, tokenize_input, tokenize_special, std::cout);
    return 0;
  } else if (command == "eval") {
    const TrainConfig config =
        load_train_config(eval_args.config, config_overrides(*eval_cmd), &where);
    config::check_located(where,
                          [&] { validate_train_config(config, mpi.size, ConfigPurpose::eval); });
    if (printed(eval_args, train_config_to_toml(config))) return 0;
    return run_eval(MPI_COMM_WORLD, config, eval_checkpoint);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Mpi> started;
  try {
    started.emplace(&argc, &argv);
  } catch (const std::exception& e) {  // MPI did not start: there is no rank to abort
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  Mpi& mpi = *started;
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
