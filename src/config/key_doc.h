// One key of a config as the docs show it, and the markdown table of a list of them
// (docs/configuration.md). No toml++ here: the headers of the config types include this one.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace packbert::config {

struct KeyDoc {
  std::string name;           // "section.key"
  std::string type;           // int | float | bool | string | list of strings | enum(a|b)
  std::string default_value;  // `TOML literal`, or words ("preset's")
  std::string doc;            // one line
};

// | key | type | default | meaning |, one row per key.
std::string keys_markdown(const std::vector<KeyDoc>& keys);

// The same keys as plain text for a subcommand's --help, a block per section, each key's doc
// wrapped to `width` columns:
//   [train]
//     train.max_steps  int, default: 1000
//         optimizer steps of the run (also where the LR reaches end_lr)
std::string keys_text(const std::vector<KeyDoc>& keys, size_t width = 100);

}  // namespace packbert::config
