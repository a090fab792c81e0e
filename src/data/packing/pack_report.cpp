#include "data/packing/pack_report.h"

#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "kernels/base/error.h"
#include "data/packing/packing.h"

namespace packbert {

namespace {

struct Row {
  PackingResult result;
  PackingMetrics metrics;
};

std::string k_text(int k) { return k > 0 ? std::to_string(k) : "none"; }

void print_table(const PackCommandOptions& o, const std::string& source, const LengthHistogram& h,
                 const std::vector<Row>& rows, const std::vector<std::string>& skipped,
                 std::ostream& out) {
  const int64_t n = h.num_sequences();
  const int64_t t = h.num_tokens();
  out << fmt::format("histogram: {}\n", source);
  out << fmt::format(
      "sequences {}, tokens {}, mean length {:.2f}, max_seq_len {}, "
      "max_seqs_per_pack {}\n",
      n, t, n ? double(t) / n : 0.0, o.max_seq_len, k_text(o.max_seqs_per_pack));
  // The best any packer can do: every pack full, packs = tokens / L.
  out << fmt::format("speed-up limit over padding (all packs full): {:.4f}\n\n",
                     t ? double(n) * o.max_seq_len / t : 1.0);
  out << fmt::format("{:<9} {:>4} {:>9} {:>12} {:>14} {:>9} {:>10} {:>12}\n", "algorithm", "K",
                     "max/pack", "packs", "efficiency %", "speed-up", "padding %", "runtime ms");
  for (const Row& r : rows)
    out << fmt::format("{:<9} {:>4} {:>9} {:>12} {:>14.4f} {:>9.5f} {:>10.4f} {:>12.2f}\n",
                       r.result.algorithm, k_text(o.max_seqs_per_pack), r.metrics.max_seqs_in_pack,
                       r.metrics.packs, 100 * r.metrics.efficiency, r.metrics.speedup,
                       100 * r.metrics.padding_fraction, r.metrics.runtime_ms);
  for (const std::string& s : skipped) out << "skipped " << s << "\n";
}

void print_json(const PackCommandOptions& o, const std::string& source, const LengthHistogram& h,
                const std::vector<Row>& rows, const std::vector<std::string>& skipped,
                std::ostream& out) {
  using nlohmann::json;
  json j;
  j["source"] = source;
  j["max_seq_len"] = o.max_seq_len;
  j["max_seqs_per_pack"] = o.max_seqs_per_pack > 0 ? json(o.max_seqs_per_pack) : json(nullptr);
  j["sequences"] = h.num_sequences();
  j["tokens"] = h.num_tokens();
  // counts[i] = sequences of length i + 1, so a checker can verify the strategies against it.
  j["histogram"] = std::vector<int64_t>(h.counts.begin() + 1, h.counts.end());
  json results = json::array();
  for (const Row& r : rows) {
    json strategies = json::array();
    for (const PackStrategy& s : r.result.strategies)
      strategies.push_back({{"lengths", s.lengths}, {"repeat", s.repeat}});
    results.push_back({{"algorithm", r.result.algorithm},
                       {"packs", r.metrics.packs},
                       {"max_seqs_in_pack", r.metrics.max_seqs_in_pack},
                       {"efficiency", r.metrics.efficiency},
                       {"speedup_over_padding", r.metrics.speedup},
                       {"padding_fraction", r.metrics.padding_fraction},
                       {"runtime_ms", r.metrics.runtime_ms},
                       {"strategies", std::move(strategies)}});
  }
  j["results"] = std::move(results);
  j["skipped"] = skipped;
  out << j.dump(1) << "\n";
}

}  // namespace

int run_pack_command(const PackCommandOptions& o, std::ostream& out,
                     const SampleLengthReader& read_lengths) {
  PB_REQUIRE(o.histogram_file.empty() != o.data_dir.empty(),
             "pack: give exactly one of --histogram FILE and --data DIR");
  PB_REQUIRE(o.max_seq_len >= 1, "pack: --max-seq-len must be >= 1, got {}", o.max_seq_len);
  PB_REQUIRE(o.max_seqs_per_pack >= 0,
             "pack: --max-seqs-per-pack must be >= 0 (0: no limit), got {}", o.max_seqs_per_pack);
  std::vector<std::string> algorithms;
  if (o.algorithm == "all") {
    algorithms = packing_algorithms();
  } else {
    const auto& known = packing_algorithms();
    const std::string renamed = renamed_packing_algorithm(o.algorithm);
    PB_REQUIRE(renamed.empty(), "pack: {}", renamed);
    PB_REQUIRE(std::find(known.begin(), known.end(), o.algorithm) != known.end(),
               "pack: unknown --algorithm '{}' (spfhp, lpfhp, nnlshp, exact-fit, all)",
               o.algorithm);
    algorithms = {o.algorithm};
  }

  LengthHistogram h;
  std::string source;
  if (!o.histogram_file.empty()) {
    const LengthHistogram file = load_histogram(o.histogram_file);
    try {
      h = resize_histogram(file, o.max_seq_len);
    } catch (const Error& e) {
      PB_THROW("{}: {}", o.histogram_file, e.what());
    }
    source = o.histogram_file;
  } else {
    PB_REQUIRE(static_cast<bool>(read_lengths),
               "pack: --data is not available in this build (no shard length reader)");
    try {
      h = histogram_from_lengths(read_lengths(o.data_dir), o.max_seq_len);
    } catch (const Error& e) {
      PB_THROW("{}: {}", o.data_dir, e.what());
    }
    source = o.data_dir;
  }
  PB_REQUIRE(h.num_sequences() > 0, "{}: no sequences to pack", source);

  const PackingLimits limits{o.max_seq_len, o.max_seqs_per_pack};
  std::vector<Row> rows;
  std::vector<std::string> skipped;
  for (const std::string& name : algorithms) {
    // In "all", NNLSHP without a small K would enumerate astronomically many strategies: skip it
    // with a note instead of failing the whole report. Asked for by name, it is an Error.
    if (name == "nnlshp" && o.algorithm == "all" &&
        nnlshp_strategy_count(o.max_seq_len, o.max_seqs_per_pack) > kNnlshpMaxStrategies) {
      skipped.push_back(fmt::format("nnlshp: K={} gives more than {} strategies",
                                    k_text(o.max_seqs_per_pack), kNnlshpMaxStrategies));
      continue;
    }
    Row row{pack_with(name, h, limits), {}};
    check_packing(h, row.result);  // never report a packing that loses or breaks anything
    row.metrics = packing_metrics(row.result);
    rows.push_back(std::move(row));
  }
  if (o.json)
    print_json(o, source, h, rows, skipped, out);
  else
    print_table(o, source, h, rows, skipped, out);
  return 0;
}

int run_pack_command(const PackCommandOptions& options, std::ostream& out) {
  return run_pack_command(options, out, SampleLengthReader{});
}

}  // namespace packbert
