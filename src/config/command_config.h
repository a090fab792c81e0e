// The configs of `packbert prepare`, `packbert inspect` and `packbert pack`, on the config
// system of every subcommand (config/config.h). Each has one section named after its
// subcommand, and each of the subcommand's command-line options IS a key of that section:
// --max-seq-len is prepare.max_seq_len, `inspect PATH` is inspect.path. A key comes from the
// file, then from --section.key=VALUE overrides and the options: the command line wins.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/packing/pack_report.h"
#include "data/prepare/prepare.h"

namespace packbert {

struct PrepareConfig {
  PrepareOptions prepare;
};

struct InspectOptions {
  std::string path;        // a shard file or directory; or a checkpoint (root)
  std::string vocab;       // the tokenizer file (sets vocab_size)
  int64_t vocab_size = 0;  // token ids must be below this; 0: the shards' recorded size
  int max_seq_len = 0;     // reject longer samples; 0 = no limit
  bool skip_bad_samples = false;
};
struct InspectConfig {
  InspectOptions inspect;
};

struct PackConfig {
  PackCommandOptions pack;
};

const config::Schema<PrepareConfig>& prepare_config_schema();
const config::Schema<InspectConfig>& inspect_config_schema();
const config::Schema<PackConfig>& pack_config_schema();

// The rules the keys' types do not carry (ranges, required keys, existing files). Every Error
// names the key and its option, e.g. "prepare.max_seq_len (--max-seq-len) = 4: must be in
// [8, 65536]".
void validate_prepare_config(const PrepareConfig& c);
void validate_inspect_config(const InspectConfig& c);
void validate_pack_config(const PackConfig& c);

// "--max-seq-len" for "prepare.max_seq_len": the option of a key.
std::string option_of_key(const std::string& key);

}  // namespace packbert
