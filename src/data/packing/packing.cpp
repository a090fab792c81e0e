// Length histograms, metrics, checks, the paper's two greedy packers (SPFHP, LPFHP) and turning
// strategies into concrete packs. NNLSHP lives in packing_nnlshp.cpp, exact-fit in
// packing_exact_fit.cpp.
#include "data/packing/packing.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>

#include "kernels/base/error.h"
#include "data/packing/packing_internal.h"

namespace packbert {

// ---- histograms ---------------------------------------------------------------------------

LengthHistogram::LengthHistogram(int max_len) : max_len(max_len), counts(max_len + 1, 0) {
  PB_REQUIRE(max_len >= 1, "histogram: max length must be >= 1, got {}", max_len);
}

int64_t LengthHistogram::num_sequences() const {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

int64_t LengthHistogram::num_tokens() const {
  int64_t t = 0;
  for (size_t l = 0; l < counts.size(); ++l) t += static_cast<int64_t>(l) * counts[l];
  return t;
}

int LengthHistogram::longest() const {
  for (int l = max_len; l >= 1; --l)
    if (counts[l] > 0) return l;
  return 0;
}

LengthHistogram load_histogram(const std::string& path) {
  std::ifstream in(path);
  PB_REQUIRE(in, "{}: cannot open histogram file", path);
  std::vector<int64_t> counts{0};
  std::string line;
  int line_no = 0;
  int pending_blank = 0;  // blank lines are fine only at the very end
  int first_blank = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t b = line.find_first_not_of(" \t");
    if (b == std::string::npos) {
      if (pending_blank++ == 0) first_blank = line_no;
      continue;
    }
    if (line[b] == '#') continue;
    PB_REQUIRE(pending_blank == 0,
               "{}:{}: empty line inside the counts (line i must hold the count of length i)", path,
               first_blank);
    const size_t e = line.find_last_not_of(" \t");
    const char* first = line.data() + b;
    const char* last = line.data() + e + 1;
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(first, last, v);
    PB_REQUIRE(ec == std::errc() && ptr == last,
               "{}:{}: expected a non-negative integer count, got '{}'", path, line_no,
               line.substr(b, e + 1 - b));
    PB_REQUIRE(v >= 0, "{}:{}: negative count {}", path, line_no, v);
    counts.push_back(v);
  }
  PB_REQUIRE(!in.bad(), "{}: read error", path);
  PB_REQUIRE(counts.size() > 1, "{}: no counts (only comments or empty)", path);
  LengthHistogram h;
  h.max_len = static_cast<int>(counts.size()) - 1;
  h.counts = std::move(counts);
  return h;
}

LengthHistogram histogram_from_lengths(const std::vector<int>& lengths, int max_len) {
  LengthHistogram h(max_len);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int l = lengths[i];
    PB_REQUIRE(l >= 1 && l <= max_len, "sequence {} has length {}, outside 1..{}", i, l, max_len);
    ++h.counts[l];
  }
  return h;
}

LengthHistogram resize_histogram(const LengthHistogram& h, int new_max_len) {
  LengthHistogram out(new_max_len);
  for (int l = 1; l <= h.max_len; ++l) {
    if (h.counts[l] == 0) continue;
    PB_REQUIRE(l <= new_max_len, "{} sequences of length {} do not fit max_seq_len {}", h.counts[l],
               l, new_max_len);
    out.counts[l] = h.counts[l];
  }
  return out;
}

// ---- shared helpers -------------------------------------------------------------------------

namespace packing_detail {

std::vector<PackStrategy> canonical(std::vector<PackStrategy> strategies) {
  std::map<std::vector<int>, int64_t, std::greater<>> merged;
  for (auto& s : strategies) {
    if (s.repeat == 0 || s.lengths.empty()) continue;
    std::sort(s.lengths.begin(), s.lengths.end(), std::greater<>());
    merged[s.lengths] += s.repeat;
  }
  std::vector<PackStrategy> out;
  out.reserve(merged.size());
  for (auto& [lengths, repeat] : merged) out.push_back({lengths, repeat});
  return out;
}

void require_packable(const LengthHistogram& h, const PackingLimits& limits) {
  PB_REQUIRE(limits.max_seq_len >= 1, "max_seq_len must be >= 1, got {}", limits.max_seq_len);
  PB_REQUIRE(static_cast<int>(h.counts.size()) == h.max_len + 1,
             "histogram: {} counts for max length {}", h.counts.size(), h.max_len);
  const int longest = h.longest();
  PB_REQUIRE(longest <= limits.max_seq_len, "histogram has sequences of length {} > max_seq_len {}",
             longest, limits.max_seq_len);
  for (int64_t c : h.counts) PB_REQUIRE(c >= 0, "histogram: negative count {}", c);
}

}  // namespace packing_detail

using packing_detail::canonical;
using packing_detail::require_packable;
using packing_detail::Stopwatch;

// ---- SPFHP and LPFHP ------------------------------------------------------------------------
//
// Both walk the lengths from longest to shortest and place the whole count of a length at once
// into open packs, tracked by the space they have left. An open pack is a (count, lengths)
// group; open[s] is a stack of groups with s tokens of space left (the reference code pops the
// most recently added group first, and with a K limit the choice between groups of equal space
// matters, so we keep the same order). A group closes when it is full or holds K sequences.

namespace {

struct Group {
  int64_t count;
  std::vector<int> lengths;
};

class OpenPacks {
 public:
  OpenPacks(int max_len, int k) : max_len_(max_len), k_(k), open_(max_len + 1) {}

  // A group of `count` packs with `space` tokens left goes to the open or the closed list.
  void add(std::vector<int> lengths, int64_t count, int space) {
    PB_CHECK(space >= 0 && space < max_len_, "bad space {}", space);
    if (static_cast<int>(lengths.size()) >= k_ || space == 0)
      closed_.push_back({std::move(lengths), count});
    else
      open_[space].push_back({count, std::move(lengths)});
  }
  bool has(int space) const { return space >= 0 && space <= max_len_ && !open_[space].empty(); }
  Group pop(int space) {
    Group g = std::move(open_[space].back());
    open_[space].pop_back();
    return g;
  }
  void push(int space, Group g) { open_[space].push_back(std::move(g)); }
  std::vector<PackStrategy> finish() {
    for (auto& stack : open_)
      for (auto& g : stack) closed_.push_back({std::move(g.lengths), g.count});
    return canonical(std::move(closed_));
  }

 private:
  int max_len_, k_;
  std::vector<std::vector<Group>> open_;
  std::vector<PackStrategy> closed_;
};

std::vector<int> with(std::vector<int> lengths, int len, int times) {
  lengths.insert(lengths.end(), times, len);
  return lengths;
}

}  // namespace

PackingResult pack_spfhp(const LengthHistogram& h, const PackingLimits& limits) {
  require_packable(h, limits);
  Stopwatch watch;
  const int L = limits.max_seq_len;
  OpenPacks packs(L, limits.effective_k());
  for (int len = std::min(L, h.max_len); len >= 1; --len) {
    int64_t n = h.counts[len];
    // Worst fit: try the pack with the most space first (space L - 1 down to len).
    int space = L;
    while (n > 0) {
      if (space >= len && packs.has(space)) {
        Group g = packs.pop(space);
        const int64_t c = std::min(g.count, n);
        if (g.count > n) packs.push(space, {g.count - n, g.lengths});
        n -= c;
        packs.add(with(std::move(g.lengths), len, 1), c, space - len);
      } else if (--space < len) {
        packs.add({len}, n, L - len);  // fits nowhere: n new packs
        n = 0;
      }
    }
  }
  PackingResult r{"spfhp", limits, packs.finish(), 0};
  r.runtime_ms = watch.ms();
  return r;
}

PackingResult pack_lpfhp(const LengthHistogram& h, const PackingLimits& limits) {
  require_packable(h, limits);
  Stopwatch watch;
  const int L = limits.max_seq_len;
  const int k = limits.effective_k();
  OpenPacks packs(L, k);
  for (int len = std::min(L, h.max_len); len >= 1; --len) {
    int64_t n = h.counts[len];
    // Best fit: try the pack with the least space that still fits first. `extra` is the space
    // beyond len; the reference resets it after every placement but not after opening packs.
    int extra = 0;
    while (n > 0) {
      if (packs.has(len + extra)) {
        Group g = packs.pop(len + extra);
        // Put as many copies of len into each pack as fit, but no more than there are.
        int repeat = std::min<int64_t>(
            {1 + extra / len, static_cast<int64_t>(k - static_cast<int>(g.lengths.size())), n});
        const int64_t c = std::min(g.count, n / repeat);
        if (g.count > c) packs.push(len + extra, {g.count - c, g.lengths});
        n -= c * repeat;
        packs.add(with(std::move(g.lengths), len, repeat), c, extra - (repeat - 1) * len);
        extra = 0;
      } else {
        ++extra;
      }
      if (extra >= L - len + 1) {
        const int repeat = static_cast<int>(std::min<int64_t>({L / len, k, n}));
        const int64_t c = n / repeat;
        packs.add(with({}, len, repeat), c, L - len * repeat);
        n -= c * repeat;
      }
    }
  }
  PackingResult r{"lpfhp", limits, packs.finish(), 0};
  r.runtime_ms = watch.ms();
  return r;
}

// ---- dispatch, metrics, checks ------------------------------------------------------------

const std::vector<std::string>& packing_algorithms() {
  static const std::vector<std::string> names{"spfhp", "lpfhp", "nnlshp", "exact-fit"};
  return names;
}

std::string renamed_packing_algorithm(const std::string& name) {
  if (name == "ours") return "packing algorithm 'ours' was renamed 'exact-fit'";
  return "";
}

PackingResult pack_with(const std::string& algorithm, const LengthHistogram& h,
                        const PackingLimits& limits) {
  if (algorithm == "spfhp") return pack_spfhp(h, limits);
  if (algorithm == "lpfhp") return pack_lpfhp(h, limits);
  if (algorithm == "nnlshp") return pack_nnlshp(h, limits);
  if (algorithm == "exact-fit") return pack_exact_fit(h, limits);
  const std::string renamed = renamed_packing_algorithm(algorithm);
  PB_REQUIRE(renamed.empty(), "{}", renamed);
  PB_THROW("unknown packing algorithm '{}' (spfhp, lpfhp, nnlshp, exact-fit)", algorithm);
}

PackingMetrics packing_metrics(const PackingResult& r) {
  PackingMetrics m;
  for (const auto& s : r.strategies) {
    m.packs += s.repeat;
    m.sequences += s.repeat * static_cast<int64_t>(s.lengths.size());
    int64_t t = 0;
    for (int l : s.lengths) t += l;
    m.tokens += s.repeat * t;
    m.max_seqs_in_pack = std::max(m.max_seqs_in_pack, static_cast<int>(s.lengths.size()));
  }
  const double slots = static_cast<double>(m.packs) * r.limits.max_seq_len;
  m.efficiency = slots > 0 ? m.tokens / slots : 1.0;
  m.speedup = m.packs > 0 ? static_cast<double>(m.sequences) / m.packs : 1.0;
  m.padding_fraction = 1.0 - m.efficiency;
  m.runtime_ms = r.runtime_ms;
  return m;
}

void check_packing(const LengthHistogram& h, const PackingResult& r) {
  const int L = r.limits.max_seq_len;
  const int k = r.limits.effective_k();
  std::vector<int64_t> used(std::max(L, h.max_len) + 1, 0);
  for (size_t i = 0; i < r.strategies.size(); ++i) {
    const auto& s = r.strategies[i];
    PB_REQUIRE(s.repeat > 0, "{}: strategy {} has repeat {}", r.algorithm, i, s.repeat);
    PB_REQUIRE(!s.lengths.empty(), "{}: strategy {} is empty", r.algorithm, i);
    PB_REQUIRE(static_cast<int>(s.lengths.size()) <= k, "{}: strategy {} has {} sequences > K={}",
               r.algorithm, i, s.lengths.size(), k);
    int64_t t = 0;
    for (int l : s.lengths) {
      PB_REQUIRE(l >= 1 && l <= L, "{}: strategy {} holds length {}", r.algorithm, i, l);
      t += l;
      used[l] += s.repeat;
    }
    PB_REQUIRE(t <= L, "{}: strategy {} holds {} tokens > L={}", r.algorithm, i, t, L);
  }
  for (size_t l = 1; l < used.size(); ++l) {
    const int64_t want = static_cast<int>(l) <= h.max_len ? h.counts[l] : 0;
    PB_REQUIRE(used[l] == want, "{}: packs hold {} sequences of length {}, the histogram {}",
               r.algorithm, used[l], l, want);
  }
}

// ---- concrete packs -----------------------------------------------------------------------

std::vector<std::vector<int64_t>> assign_packs(const std::vector<PackStrategy>& strategies,
                                               const std::vector<SeqRef>& samples,
                                               const PackingLimits& limits) {
  const int L = limits.max_seq_len;
  const int k = limits.effective_k();
  // by_length[l]: ids of length l in input order; next[l]: the first one not yet packed.
  std::vector<std::vector<int64_t>> by_length(L + 1);
  for (const auto& s : samples) {
    PB_REQUIRE(s.length >= 1 && s.length <= L, "sample {} has length {}, outside 1..{}", s.id,
               s.length, L);
    by_length[s.length].push_back(s.id);
  }
  std::vector<size_t> next(L + 1, 0);
  std::vector<std::vector<int64_t>> packs;
  for (const auto& st : strategies) {
    int64_t t = 0;
    for (int l : st.lengths) {
      PB_REQUIRE(l >= 1 && l <= L, "strategy holds length {}, outside 1..{}", l, L);
      t += l;
    }
    PB_REQUIRE(t <= L && static_cast<int>(st.lengths.size()) <= k && st.repeat >= 0,
               "strategy of {} sequences, {} tokens breaks L={} / K={}", st.lengths.size(), t, L,
               k);
    std::vector<int> sorted = st.lengths;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (int64_t r = 0; r < st.repeat; ++r) {
      std::vector<int64_t> pack;
      pack.reserve(sorted.size());
      for (int l : sorted) {
        PB_REQUIRE(next[l] < by_length[l].size(),
                   "strategies need more sequences of length {} than the {} given", l,
                   by_length[l].size());
        pack.push_back(by_length[l][next[l]++]);
      }
      packs.push_back(std::move(pack));
    }
  }
  for (int l = 1; l <= L; ++l)
    PB_REQUIRE(next[l] == by_length[l].size(),
               "strategies pack {} of the {} sequences of length {}", next[l], by_length[l].size(),
               l);
  return packs;
}

std::vector<std::vector<int64_t>> pack_online(const std::vector<SeqRef>& samples,
                                              const PackingLimits& limits) {
  LengthHistogram h(limits.max_seq_len);
  for (const auto& s : samples) {
    PB_REQUIRE(s.length >= 1 && s.length <= limits.max_seq_len,
               "sample {} has length {}, outside 1..{}", s.id, s.length, limits.max_seq_len);
    ++h.counts[s.length];
  }
  return assign_packs(pack_exact_fit(h, limits).strategies, samples, limits);
}

}  // namespace packbert
