// `packbert pack`: run the histogram packers on a dataset's length histogram and report how well
// each one packs (a table, or JSON with every pack strategy so another tool can check it).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace packbert {

struct PackCommandOptions {
  std::string histogram_file;     // --histogram FILE (format: see load_histogram)
  std::string data_dir;           // --data DIR: lengths of the samples in the shards there
  int max_seq_len = 512;          // --max-seq-len L
  int max_seqs_per_pack = 3;      // --max-seqs-per-pack K; 0 = no limit
  std::string algorithm = "all";  // spfhp | lpfhp | nnlshp | exact-fit | all
  bool json = false;
};

// Returns the length of every sample under a data directory (the shard reader provides it;
// kept a parameter so this module does not depend on the shard format).
using SampleLengthReader = std::function<std::vector<int>(const std::string& data_dir)>;

// Runs the command, writing the report to `out`; returns the process exit code (0). Bad options
// and bad input are packbert::Error. --data needs `read_lengths`.
int run_pack_command(const PackCommandOptions& options, std::ostream& out,
                     const SampleLengthReader& read_lengths);
// Same, without a length reader: --data is an Error.
int run_pack_command(const PackCommandOptions& options, std::ostream& out);

}  // namespace packbert
