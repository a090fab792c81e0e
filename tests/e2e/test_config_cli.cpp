// The config errors of every subcommand (prepare, inspect, pack, train, eval) as a user meets
// them through the binary: each names FILE:LINE:COLUMN (or the override) and the key, the old
// forms say the new one, and the exit status is non-zero; --print-config checks as the
// subcommand does; --help lists every key. docs/configuration.md describes them.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "config/command_config.h"
#include "config/key_doc.h"
#include "test_util.h"
#include "config/train_config.h"

namespace {

using packbert::test::run_command;
using packbert::test::TempDir;

const std::string kBin = PACKBERT_BINARY;

struct Command {
  std::string name;     // subcommand
  std::string section;  // its section (train and eval: one of theirs)
  std::string key;      // a 32-bit integer key of that section, with an underscore, valid at 3-6
  std::string other;    // a section of another subcommand
  std::string args;     // arguments it needs before reading the config ("" for most)
  // What makes a config valid besides the file: the paths the subcommand checks.
  std::string valid_args;
  // A file that breaks a rule checked after reading, and the message (its key set on line 2,
  // column 1).
  std::string rule_file, rule_message;
};

void PrintTo(const Command& c, std::ostream* os) { *os << c.name; }

const std::vector<Command>& commands() {
  const std::string vocab = PACKBERT_REPO_DATA "/vocab.txt";
  const std::string data = PACKBERT_TEST_DATA;  // a path that exists
  static const std::vector<Command> c = {
      {"prepare", "prepare", "num_shards", "train", "",
       "--input " + vocab + " --vocab " + vocab + " --output /nonexistent/out",
       "[prepare]\nmax_seq_len = 4\n",
       "prepare.max_seq_len (--max-seq-len) = 4: must be in [8, 65536]"},
      {"inspect", "inspect", "max_seq_len", "prepare", "", vocab, "[inspect]\nvocab_size = -1\n",
       "inspect.vocab_size (--vocab-size) = -1: must be >= 0"},
      {"pack", "pack", "max_seqs_per_pack", "inspect", "",
       "--histogram " + data + "/wikipedia-seqlen-histogram-512.txt",
       "[pack]\nmax_seqs_per_pack = -1\n",
       "pack.max_seqs_per_pack (--max-seqs-per-pack) = -1: must be >= 0"},
      {"train", "train", "max_seqs_per_pack", "pack", "",
       "--data.train_dir=" + data + " --data.vocab=" + vocab + " --data.eval_dir=" + data,
       "[model]\nhidden = 100\nheads = 3\n",
       "model.hidden (100) must be divisible by model.heads (3)"},
      {"eval", "eval", "batch_size", "prepare", "--checkpoint /nonexistent",
       "--data.eval_dir=" + data, "[eval]\nbatch_size = 0\n", "eval.batch_size (0) must be >= 1"},
  };
  return c;
}

// `cmd` with its standard output into `file` (run_command then returns the errors alone).
std::string stdout_to(const std::string& cmd, const std::string& file) {
  return "(" + cmd + " > " + file + ")";
}

std::string kebab(std::string s) {
  for (char& ch : s)
    if (ch == '_') ch = '-';
  return s;
}

class ConfigCli : public ::testing::TestWithParam<Command> {
 protected:
  // Runs `packbert NAME --config FILE ARGS EXTRA` with FILE holding `text`; returns the output
  // and expects a failure.
  std::string fails_with(const std::string& text, const std::string& extra = "") {
    std::ofstream(file()) << text;
    const Command& c = GetParam();
    std::string out;
    const int rc =
        run_command(kBin + " " + c.name + " --config " + file() + " " + c.args + " " + extra, &out);
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("[rank 0] error: "), std::string::npos) << out;
    return out;
  }
  std::string file() const { return tmp_.file("c.toml"); }
  std::string key() const { return GetParam().section + "." + GetParam().key; }

  TempDir tmp_;
};

TEST_P(ConfigCli, WrongTypeNamesFileLineColumnAndKey) {
  const std::string out = fails_with("# a comment\n[" + GetParam().section + "]\n  " +
                                     GetParam().key + " = \"twelve\"\n");
  EXPECT_NE(out.find(file() + ":3:3: " + key() + ": expected an integer, got a string"),
            std::string::npos)
      << out;
}

TEST_P(ConfigCli, OutOfRangeNamesFileLineColumnAndKey) {
  const std::string out =
      fails_with("[" + GetParam().section + "]\n" + GetParam().key + " = 99999999999\n");
  EXPECT_NE(out.find(file() + ":2:1: " + key() + ": 99999999999 is out of range"),
            std::string::npos)
      << out;
}

// A rule checked after reading names the line that set the key too.
TEST_P(ConfigCli, RuleErrorsNameTheLineOfTheKey) {
  const std::string out = fails_with(GetParam().rule_file, GetParam().valid_args);
  EXPECT_NE(out.find(file() + ":2:1: " + GetParam().rule_message), std::string::npos) << out;
}

// --print-config checks the config as the subcommand does: a config the subcommand rejects is
// not printed, the error is the subcommand's, and the exit status is non-zero. A valid one is
// printed.
TEST_P(ConfigCli, PrintConfigRejectsWhatTheSubcommandRejects) {
  const Command& c = GetParam();
  const std::string printed = tmp_.file("printed.toml");
  const std::string cmd = kBin + " " + c.name + " --config " + file() + " " + c.args + " " +
                          c.valid_args + " --print-config";
  std::ofstream(file()) << c.rule_file;
  std::string out;
  EXPECT_NE(run_command(stdout_to(cmd, printed), &out), 0) << out;
  EXPECT_NE(out.find("[rank 0] error: " + file() + ":2:1: " + c.rule_message), std::string::npos)
      << out;
  EXPECT_EQ(packbert::test::read_file(printed), "") << "printed a config it rejects";

  std::ofstream(file()) << "[" << c.section << "]\n" << c.key << " = 4\n";
  ASSERT_EQ(run_command(stdout_to(cmd, printed), &out), 0) << out;
  EXPECT_NE(packbert::test::read_file(printed).find("\n" + c.key + " = 4\n"), std::string::npos)
      << packbert::test::read_file(printed);
}

TEST_P(ConfigCli, UnknownKeyAndSectionAreErrors) {
  std::string out = fails_with("[" + GetParam().section + "]\n\nno_such_key = 1\n");
  EXPECT_NE(out.find(file() + ":3:1: unknown key 'no_such_key' in section [" + GetParam().section +
                     "] (known: "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(GetParam().key), std::string::npos) << "lists the known keys: " << out;
  out = fails_with("[" + GetParam().other + "]\n");
  EXPECT_NE(out.find(file() + ":1:"), std::string::npos) << out;
  const size_t at = out.find("unknown section [" + GetParam().other + "] for packbert ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.find(GetParam().name, at), std::string::npos) << out;
  out = fails_with("", "--" + GetParam().section + ".no_such_key=1");
  EXPECT_NE(out.find("override '" + GetParam().section + ".no_such_key=1': unknown key"),
            std::string::npos)
      << out;
}

TEST_P(ConfigCli, SyntaxErrorNamesFileLineColumnAndKey) {
  const std::string out =
      fails_with("[" + GetParam().section + "]\n" + GetParam().key + " = 12 13\n");
  EXPECT_NE(out.find(file() + ":2:"), std::string::npos) << out;
  EXPECT_NE(out.find(key()), std::string::npos) << out;
}

// The old forms: a kebab-case key, a --config before the subcommand, a top-level log-level.
TEST_P(ConfigCli, OldFormsSayTheNewForm) {
  std::string out = fails_with("[" + GetParam().section + "]\n" + kebab(GetParam().key) + " = 1\n");
  EXPECT_NE(out.find(file() + ":2:1: key '" + kebab(GetParam().key) +
                     "' is kebab-case; config keys are snake_case: " + key()),
            std::string::npos)
      << out;
  out = fails_with("log-level = \"info\"\n");
  EXPECT_NE(out.find(file() + ":1:1: 'log-level': the log level is not a config key; give "
                              "--log-level LEVEL before the subcommand"),
            std::string::npos)
      << out;

  std::ofstream(file()) << "[" << GetParam().section << "]\n";
  const std::string cmd = GetParam().name;
  EXPECT_NE(run_command(kBin + " --config " + file() + " " + cmd + " " + GetParam().args, &out), 0);
  EXPECT_NE(
      out.find("--config goes after the subcommand now: packbert " + cmd + " --config " + file()),
      std::string::npos)
      << out;
}

// A key set in the file and on the command line: the command line wins (--print-config shows
// the effective value).
TEST_P(ConfigCli, CommandLineWinsOverTheFile) {
  std::ofstream(file()) << "[" << GetParam().section << "]\n" << GetParam().key << " = 3\n";
  const std::string cmd = kBin + " " + GetParam().name + " --config " + file() + " " +
                          GetParam().args + " " + GetParam().valid_args + " --print-config";
  std::string out;
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("\n" + GetParam().key + " = 3\n"), std::string::npos) << out;
  ASSERT_EQ(run_command(cmd + " --" + key() + "=5", &out), 0) << out;
  EXPECT_NE(out.find("\n" + GetParam().key + " = 5\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("\n" + GetParam().key + " = 3\n"), std::string::npos) << out;
  if (GetParam().name != "train" && GetParam().name != "eval") {
    // prepare / inspect / pack: the option IS the key.
    ASSERT_EQ(run_command(cmd + " --" + kebab(GetParam().key) + " 6", &out), 0) << out;
    EXPECT_NE(out.find("\n" + GetParam().key + " = 6\n"), std::string::npos) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(EverySubcommand, ConfigCli, ::testing::ValuesIn(commands()),
                         [](const ::testing::TestParamInfo<Command>& info) {
                           return info.param.name;
                         });

// The rules of training that --print-config once let through: a printed config is one that
// training takes, so each of these fails the same way with and without --print-config.
TEST(ConfigCliPrintConfig, TrainRejectsWhatTrainingRejects) {
  TempDir tmp;
  const std::string file = tmp.file("c.toml"), printed = tmp.file("printed.toml");
  const Command& train = commands()[3];
  ASSERT_EQ(train.name, "train");
  struct Case {
    std::string file, args, message;
  };
  const std::vector<Case> cases = {
      {"[optim]\nlr = nan\n", "", file + ":2:1: optim.lr (nan) must be finite and >= 0"},
      {"[optim]\nbeta1 = 2\n", "", file + ":2:1: optim.beta1 (2) must be in [0, 1)"},
      {"", "--optim.beta1=2", "override 'optim.beta1=2': optim.beta1 (2) must be in [0, 1)"},
      {"[train]\nglobal_batch_size = -8\n", "",
       file + ":2:1: train.global_batch_size (-8) must be >= 1"},
  };
  for (const Case& c : cases) {
    std::ofstream(file) << c.file;
    const std::string cmd =
        kBin + " train --config " + file + " " + train.valid_args + " " + c.args;
    std::string out;
    EXPECT_NE(run_command(stdout_to(cmd + " --print-config", printed), &out), 0) << c.message;
    EXPECT_NE(out.find("[rank 0] error: " + c.message), std::string::npos) << out;
    EXPECT_EQ(packbert::test::read_file(printed), "") << c.message;
    // Training itself says the same.
    EXPECT_NE(run_command(cmd, &out), 0) << c.message;
    EXPECT_NE(out.find("[rank 0] error: " + c.message), std::string::npos) << out;
  }
}

// SUBCOMMAND --help lists every key of the subcommand's sections, from its key table: train and
// eval each with its type and default, prepare, inspect and pack as their options (the option
// IS the key, shown in [brackets] with its type and default).
TEST(ConfigCliHelp, ListsEveryKeyOfItsSections) {
  for (const char* command : {"train", "eval"}) {
    std::string help;
    ASSERT_EQ(run_command(kBin + " " + command + " --help", &help), 0) << help;
    for (const packbert::config::KeyDoc& k : packbert::train_config_keys()) {
      std::string def = k.default_value;  // `1000` in the docs table, 1000 in the help
      if (def.size() >= 2 && def.front() == '`' && def.back() == '`')
        def = def.substr(1, def.size() - 2);
      const std::string line = "\n  " + k.name + "  " + k.type + ", default: " + def + "\n";
      EXPECT_NE(help.find(line), std::string::npos) << command << ": " << line << help;
    }
    for (const char* section :
         {"[model]", "[train]", "[optim]", "[data]", "[checkpoint]", "[eval]", "[log]"})
      EXPECT_NE(help.find(std::string("\n") + section + "\n"), std::string::npos)
          << command << ": " << section;
  }
  const std::vector<std::pair<std::string, std::vector<packbert::config::KeyDoc>>> by_option = {
      {"prepare", packbert::prepare_config_schema().docs()},
      {"inspect", packbert::inspect_config_schema().docs()},
      {"pack", packbert::pack_config_schema().docs()}};
  for (const auto& [command, keys] : by_option) {
    std::string help;
    ASSERT_EQ(run_command(kBin + " " + command + " --help", &help), 0) << help;
    for (const packbert::config::KeyDoc& k : keys) {
      EXPECT_NE(help.find(k.doc + " [" + k.name + "]"), std::string::npos)
          << command << ": " << k.name << "\n"
          << help;
      const std::string option = packbert::option_of_key(k.name);
      EXPECT_NE(help.find(option == "PATH" ? "path" : option), std::string::npos)
          << command << ": " << option;
    }
  }
}

// An option's own value is checked as its key's: the error names the option and the key.
TEST(ConfigCliOptions, BadOptionValueNamesOptionAndKey) {
  std::string out;
  EXPECT_NE(run_command(kBin + " pack --max-seq-len lots --histogram x", &out), 0);
  EXPECT_NE(out.find("option --max-seq-len: pack.max_seq_len: malformed value 'lots'"),
            std::string::npos)
      << out;
  EXPECT_NE(run_command(kBin + " prepare --format vl", &out), 0);
  EXPECT_NE(out.find("option --format: prepare.format: unknown value 'vl' (expected one of "
                     "fixed | varlength)"),
            std::string::npos)
      << out;
  EXPECT_NE(run_command(kBin + " prepare --max-seq-len 4", &out), 0);
  EXPECT_NE(out.find("prepare.input is not set: give --input"), std::string::npos) << out;
}

// A former name of a value is not an alias: pack.algorithm "ours" (now exact-fit) is an error
// that says the new name, given as the option, as an override or in the file.
TEST(ConfigCliOptions, FormerAlgorithmNameSaysTheNewName) {
  const std::string pack =
      kBin + " pack --histogram " PACKBERT_TEST_DATA "/wikipedia-seqlen-histogram-512.txt ";
  const std::string said = "pack.algorithm: packing algorithm 'ours' was renamed 'exact-fit'";
  std::string out;
  EXPECT_NE(run_command(pack + "--algorithm ours", &out), 0);
  EXPECT_NE(out.find("option --algorithm: " + said), std::string::npos) << out;
  EXPECT_NE(run_command(pack + "--pack.algorithm=ours", &out), 0);
  EXPECT_NE(out.find("override 'pack.algorithm=ours': " + said), std::string::npos) << out;
  TempDir tmp;
  std::ofstream(tmp.file("c.toml")) << "[pack]\nalgorithm = \"ours\"\n";
  EXPECT_NE(run_command(pack + "--config " + tmp.file("c.toml"), &out), 0);
  EXPECT_NE(out.find(tmp.file("c.toml") + ":2:"), std::string::npos) << out;
  EXPECT_NE(out.find(said), std::string::npos) << out;
  ASSERT_EQ(run_command(pack + "--algorithm exact-fit", &out), 0) << out;
  EXPECT_NE(out.find("exact-fit"), std::string::npos) << out;
}

}  // namespace
