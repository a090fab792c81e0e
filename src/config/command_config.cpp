#include "config/command_config.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "kernels/base/error.h"
#include "data/packing/packing.h"
#include "data/shards/shard.h"

namespace packbert {

namespace {

using config::key;

const config::EnumTable<ShardFormat>& shard_format_table() {
  static const config::EnumTable<ShardFormat> t = {
      {ShardFormat::fixed, to_string(ShardFormat::fixed)},
      {ShardFormat::var_length, to_string(ShardFormat::var_length)}};
  return t;
}

const config::EnumTable<InputFormat>& input_format_table() {
  static const config::EnumTable<InputFormat> t = {
      {InputFormat::auto_detect, input_format_name(InputFormat::auto_detect)},
      {InputFormat::lines, input_format_name(InputFormat::lines)},
      {InputFormat::jsonl, input_format_name(InputFormat::jsonl)}};
  return t;
}

const config::EnumTable<PrepareMasks>& masks_table() {
  static const config::EnumTable<PrepareMasks> t = {{PrepareMasks::static_masks, "static"},
                                                    {PrepareMasks::none, "none"}};
  return t;
}

const config::EnumTable<PrepareSamples>& samples_table() {
  static const config::EnumTable<PrepareSamples> t = {{PrepareSamples::pairs, "pairs"},
                                                      {PrepareSamples::documents, "documents"}};
  return t;
}

std::vector<std::string> pack_algorithm_names() {
  std::vector<std::string> n = packing_algorithms();
  n.push_back("all");
  return n;
}

// pack.algorithm: one of pack_algorithm_names(); a former name of an algorithm says the new one.
config::Key<PackConfig> pack_algorithm_key() {
  config::Key<PackConfig> k =
      config::choice_key("pack.algorithm", &PackConfig::pack, &PackCommandOptions::algorithm,
                         pack_algorithm_names(), "packing algorithm, or all of them");
  k.set = [choose = k.set](PackConfig& c, const toml::node& n) {
    const toml::value<std::string>* s = n.as_string();
    std::string renamed = s ? renamed_packing_algorithm(s->get()) : "";
    return renamed.empty() ? choose(c, n) : renamed;
  };
  return k;
}

// "prepare.max_seq_len (--max-seq-len)"
std::string named(const std::string& key) { return key + " (" + option_of_key(key) + ")"; }

template <class T>
void require_range(const std::string& key, T v, T lo, T hi) {
  PB_REQUIRE(v >= lo && v <= hi, "{} = {}: must be in [{}, {}]", named(key), v, lo, hi);
}
void require_set(const std::string& key, bool set) {
  PB_REQUIRE(set, "{} is not set: give {} or set it in the config file", key, option_of_key(key));
}
void require_file(const std::string& key, const std::string& path) {
  std::error_code ec;
  PB_REQUIRE(std::filesystem::is_regular_file(path, ec), "{} = \"{}\": no such file", named(key),
             path);
}

}  // namespace

std::string option_of_key(const std::string& key) {
  std::string leaf = key.substr(key.find('.') + 1);
  if (key == "inspect.path") return "PATH";  // the positional argument
  std::replace(leaf.begin(), leaf.end(), '_', '-');
  return "--" + leaf;
}

const config::Schema<PrepareConfig>& prepare_config_schema() {
  using C = PrepareConfig;
  using P = PrepareOptions;
  static const config::Schema<C> schema(
      "packbert prepare",
      {key("prepare.input", &C::prepare, &P::inputs,
           "text files (.gz allowed): one sentence per line, a blank line between documents; "
           "or JSONL, one document per line; a directory or a glob (quoted) names several"),
       key("prepare.input_format", &C::prepare, &P::input_format, input_format_table(),
           "auto (JSONL for names ending in .jsonl or .jsonl.gz, else lines), lines or jsonl"),
       key("prepare.text_field", &C::prepare, &P::text_field,
           "JSONL: the string field holding each document's text"),
       key("prepare.skip_bad_lines", &C::prepare, &P::skip_bad_lines,
           "JSONL: count, report and skip a malformed line instead of failing on it"),
       key("prepare.samples", &C::prepare, &P::samples, samples_table(),
           "pairs: NSP sentence pairs (Google's); documents: each document in consecutive "
           "chunks of max_seq_len - 2 tokens, [CLS] chunk [SEP], no segment B, no NSP label "
           "(for model.nsp_head = false)"),
       key("prepare.masks", &C::prepare, &P::masks, masks_table(),
           "training shards' masks: static (drawn here, Google's) or none (for the trainer's "
           "data.masking = dynamic); the eval shard is masked either way"),
       key("prepare.vocab", &C::prepare, &P::vocab,
           "the tokenizer: a WordPiece vocab.txt (one token per line) or a Hugging Face "
           "tokenizer.json (docs/data_pipeline.md#your-own-tokenizer)"),
       key("prepare.output", &C::prepare, &P::output_dir, "output directory for the shards"),
       key("prepare.max_seq_len", &C::prepare, &P::max_seq_len,
           "maximum tokens per sample, in [8, 65536]"),
       key("prepare.max_predictions_per_seq", &C::prepare, &P::max_predictions_per_seq,
           "maximum masked tokens per sample, in [1, 65536]"),
       key("prepare.masked_lm_prob", &C::prepare, &P::masked_lm_prob,
           "fraction of tokens masked, in [0, 1]"),
       key("prepare.dupe_factor", &C::prepare, &P::dupe_factor,
           "times each document is used, masked anew, in [1, 1000]"),
       key("prepare.short_seq_prob", &C::prepare, &P::short_seq_prob,
           "probability of a shorter target length, in [0, 1]"),
       key("prepare.seed", &C::prepare, &P::seed,
           "random seed (the output depends on it, not on threads)"),
       key("prepare.num_shards", &C::prepare, &P::num_shards,
           "number of training shards, in [1, 100000]"),
       key("prepare.eval_samples", &C::prepare, &P::eval_samples,
           "samples written to the eval shard (>= 0)"),
       key("prepare.format", &C::prepare, &P::format, shard_format_table(),
           "shard format: fixed (padded datasets) or varlength"),
       key("prepare.whole_word_masking", &C::prepare, &P::whole_word_masking,
           "mask all WordPieces of a word together"),
       key("prepare.threads", &C::prepare, &P::threads, "worker threads; 0 = all cores")});
  return schema;
}

const config::Schema<InspectConfig>& inspect_config_schema() {
  using C = InspectConfig;
  using I = InspectOptions;
  static const config::Schema<C> schema(
      "packbert inspect",
      {key("inspect.path", &C::inspect, &I::path,
           "a shard file or a directory of shards; or a checkpoint directory or a directory of "
           "them (exit 1 if any is damaged); the positional argument PATH"),
       key("inspect.vocab", &C::inspect, &I::vocab,
           "the tokenizer (vocab.txt or tokenizer.json): sets vocab_size and the special ids, "
           "and shards that record another tokenizer are errors"),
       key("inspect.vocab_size", &C::inspect, &I::vocab_size,
           "token ids must be below this; 0 = the size the shards record (30522 for shards "
           "that record none)"),
       key("inspect.max_seq_len", &C::inspect, &I::max_seq_len,
           "reject samples longer than this; 0 = no limit"),
       key("inspect.skip_bad_samples", &C::inspect, &I::skip_bad_samples,
           "count and report samples that break a rule instead of failing on the first")});
  return schema;
}

const config::Schema<PackConfig>& pack_config_schema() {
  using C = PackConfig;
  using P = PackCommandOptions;
  static const config::Schema<C> schema(
      "packbert pack",
      {key("pack.histogram", &C::pack, &P::histogram_file,
           "length histogram: line i holds the count of length i ('#' comments); or pack.data"),
       key("pack.data", &C::pack, &P::data_dir,
           "shard file or directory: pack the lengths of its samples; or pack.histogram"),
       key("pack.max_seq_len", &C::pack, &P::max_seq_len, "pack length L, in [1, 1048576]"),
       key("pack.max_seqs_per_pack", &C::pack, &P::max_seqs_per_pack,
           "most sequences in one pack; 0 = no limit"),
       pack_algorithm_key(),
       key("pack.json", &C::pack, &P::json,
           "print JSON with every pack strategy and its repeat count")});
  return schema;
}

void validate_prepare_config(const PrepareConfig& c) {
  const PrepareOptions& o = c.prepare;
  require_set("prepare.input", !o.inputs.empty());
  for (const std::string& p : expand_inputs(o.inputs)) require_file("prepare.input", p);
  require_set("prepare.text_field", !o.text_field.empty());
  require_set("prepare.vocab", !o.vocab.empty());
  require_file("prepare.vocab", o.vocab);
  require_set("prepare.output", !o.output_dir.empty());
  require_range("prepare.max_seq_len", o.max_seq_len, 8, 65536);
  require_range("prepare.max_predictions_per_seq", o.max_predictions_per_seq, 1, 65536);
  require_range("prepare.masked_lm_prob", o.masked_lm_prob, 0.0, 1.0);
  require_range("prepare.dupe_factor", o.dupe_factor, 1, 1000);
  require_range("prepare.short_seq_prob", o.short_seq_prob, 0.0, 1.0);
  require_range("prepare.num_shards", o.num_shards, 1, 100000);
  PB_REQUIRE(o.eval_samples >= 0, "{} = {}: must be >= 0", named("prepare.eval_samples"),
             o.eval_samples);
  PB_REQUIRE(o.threads >= 0, "{} = {}: must be >= 0 (0 = all cores)", named("prepare.threads"),
             o.threads);
}

void validate_inspect_config(const InspectConfig& c) {
  const InspectOptions& o = c.inspect;
  require_set("inspect.path", !o.path.empty());
  if (!o.vocab.empty()) require_file("inspect.vocab", o.vocab);
  PB_REQUIRE(o.vocab_size >= 0, "{} = {}: must be >= 0 (0 = the shards' recorded size)",
             named("inspect.vocab_size"), o.vocab_size);
  PB_REQUIRE(o.max_seq_len >= 0, "{} = {}: must be >= 0 (0 = no limit)",
             named("inspect.max_seq_len"), o.max_seq_len);
}

void validate_pack_config(const PackConfig& c) {
  const PackCommandOptions& o = c.pack;
  PB_REQUIRE(!o.histogram_file.empty() || !o.data_dir.empty(),
             "pack: give pack.histogram (--histogram FILE) or pack.data (--data DIR)");
  PB_REQUIRE(o.histogram_file.empty() || o.data_dir.empty(),
             "pack: pack.histogram (--histogram) and pack.data (--data) are both set; give one");
  if (!o.histogram_file.empty()) require_file("pack.histogram", o.histogram_file);
  require_range("pack.max_seq_len", o.max_seq_len, 1, 1 << 20);
  PB_REQUIRE(o.max_seqs_per_pack >= 0, "{} = {}: must be >= 0 (0 = no limit)",
             named("pack.max_seqs_per_pack"), o.max_seqs_per_pack);
}

}  // namespace packbert
