// `packbert inspect`: reads every sample of every shard with full validation (so a clean report
// means the shards are usable for training) and summarises lengths, masking, NSP and padding.
#include "data/shards/inspect.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "data/shards/shard.h"

namespace packbert {

namespace {

// The value at 0-based rank k of the samples counted by a length histogram.
int length_at_rank(const std::vector<int64_t>& histogram, int64_t k) {
  int64_t seen = 0;
  for (size_t len = 0; len < histogram.size(); ++len) {
    seen += histogram[len];
    if (seen > k) return static_cast<int>(len);
  }
  return static_cast<int>(histogram.size()) - 1;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

void count_meta(InspectReport& r, const ShardMeta& m) {
  for (auto& [seen, count] : r.made_with)
    if (seen == m) {
      ++count;
      return;
    }
  r.made_with.emplace_back(m, 1);
}

std::string describe_meta(const ShardMeta& m) {
  if (!m.recorded) return "not recorded (MLPerf's and NVIDIA's shards record none)";
  return fmt::format(
      "{} (sha256 {}), {} tokens, [CLS] {} [SEP] {} [MASK] {} [PAD] {}; masks {}, samples {}",
      m.tokenizer, m.tokenizer_sha256, m.vocab_size, m.cls_id, m.sep_id, m.mask_id, m.pad_id,
      m.masks, m.samples);
}

void grow_and_count(std::vector<int64_t>& histogram, size_t index) {
  if (histogram.size() <= index) histogram.resize(index + 1, 0);
  ++histogram[index];
}

}  // namespace

InspectReport inspect_shards(const std::string& path, const SampleRules& rules,
                             bool skip_bad_samples) {
  constexpr size_t kBadExamples = 5;
  InspectReport r;
  const std::vector<std::string> shards = list_shards(path);
  r.shards = static_cast<int64_t>(shards.size());
  int fixed_len = 0;
  Sample s;
  for (const std::string& shard : shards) {
    ShardReader reader(shard, rules);
    count_meta(r, reader.info().meta);
    if (reader.info().format == ShardFormat::fixed)
      fixed_len = std::max(fixed_len, reader.info().max_seq_len);
    for (;;) {
      try {
        if (!reader.next(s)) break;
      } catch (const BadSampleError& e) {
        if (!skip_bad_samples) throw;
        ++r.bad_samples;
        if (r.bad_examples.size() < kBadExamples) r.bad_examples.push_back(e.what());
        continue;
      }
      ++r.samples;
      r.tokens += s.length();
      r.masked_tokens += s.num_masked();
      r.next_random += s.next_sentence_label == 1 ? 1 : 0;
      grow_and_count(r.length_histogram, static_cast<size_t>(s.length()));
      grow_and_count(r.masked_histogram, static_cast<size_t>(s.num_masked()));
    }
  }
  const int longest =
      r.length_histogram.empty() ? 0 : static_cast<int>(r.length_histogram.size()) - 1;
  r.file_max_len = std::max(fixed_len, longest);
  r.length_histogram.resize(static_cast<size_t>(r.file_max_len) + 1, 0);
  if (r.samples == 0) return r;

  const auto& h = r.length_histogram;
  r.min_len = static_cast<int>(std::find_if(h.begin(), h.end(), [](int64_t c) { return c > 0; }) -
                               h.begin());
  r.max_len = longest;
  r.mean_len = static_cast<double>(r.tokens) / static_cast<double>(r.samples);
  const int lower = length_at_rank(h, (r.samples - 1) / 2);
  const int upper = length_at_rank(h, r.samples / 2);
  r.median_len = 0.5 * (lower + upper);
  if (r.file_max_len > 0)
    r.padding_fraction =
        1.0 - static_cast<double>(r.tokens) / (static_cast<double>(r.samples) * r.file_max_len);
  return r;
}

void print_inspect_report(const InspectReport& r, std::ostream& os) {
  auto line = [&os](const char* label, const std::string& value) {
    os << fmt::format("  {:<22}{}\n", label, value);
  };
  auto percent = [](int64_t part, int64_t whole) {
    return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  };
  os << "shard summary (every sample validated)\n";
  line("shards", with_commas(r.shards));
  line("samples", with_commas(r.samples));
  for (const auto& [m, count] : r.made_with)
    line("made with", r.made_with.size() == 1
                          ? describe_meta(m)
                          : fmt::format("{} shard(s): {}", count, describe_meta(m)));
  if (r.bad_samples > 0) {
    line("bad samples skipped", with_commas(r.bad_samples));
    for (const std::string& e : r.bad_examples) os << "    " << e << "\n";
    if (r.bad_samples > static_cast<int64_t>(r.bad_examples.size())) os << "    ...\n";
  }
  if (r.samples == 0) return;
  line("tokens", with_commas(r.tokens));
  line("sequence length",
       fmt::format("min {}, median {:g}, mean {:.1f}, max {} (rows of {})", r.min_len, r.median_len,
                   r.mean_len, r.max_len, r.file_max_len));
  line("padding", fmt::format("{:.1f}% of {} token slots at length {}", 100.0 * r.padding_fraction,
                              with_commas(r.samples * r.file_max_len), r.file_max_len));
  const int max_masked =
      r.masked_histogram.empty() ? 0 : static_cast<int>(r.masked_histogram.size()) - 1;
  line("masked tokens",
       fmt::format("{} (mean {:.2f}, max {} per sample)", with_commas(r.masked_tokens),
                   static_cast<double>(r.masked_tokens) / r.samples, max_masked));
  line("NSP random next",
       fmt::format("{} ({:.1f}%)", with_commas(r.next_random), percent(r.next_random, r.samples)));

  // Up to 8 equal-width length buckets over 1 .. file_max_len, each with a bar scaled to the
  // fullest bucket.
  const int max_len = std::max(r.file_max_len, 1);
  const int buckets = std::min(8, max_len);
  const int width = (max_len + buckets - 1) / buckets;
  std::vector<int64_t> counts(static_cast<size_t>(buckets), 0);
  for (size_t len = 1; len < r.length_histogram.size(); ++len)
    counts[std::min<size_t>((len - 1) / width, buckets - 1)] += r.length_histogram[len];
  const int64_t fullest = *std::max_element(counts.begin(), counts.end());
  constexpr int kBarWidth = 40;
  os << "  length histogram\n";
  for (int b = 0; b < buckets; ++b) {
    const int lo = b * width + 1;
    const int hi = b == buckets - 1 ? max_len : std::min(max_len, (b + 1) * width);
    if (lo > hi) break;
    const int bar =
        fullest > 0 ? static_cast<int>((counts[b] * kBarWidth + fullest - 1) / fullest) : 0;
    os << fmt::format("    {:>6} .. {:<6}{:>14} {:>6.1f}%  {}\n", lo, hi, with_commas(counts[b]),
                      percent(counts[b], r.samples), std::string(static_cast<size_t>(bar), '#'));
  }
}

}  // namespace packbert
