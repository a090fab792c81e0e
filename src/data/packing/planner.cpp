// The step planner: balance the step's candidates over ranks, split each rank's share into
// micro-batches, pack them, count what the loss is normalised by. See planner.h for the contract.
//
// Loads are integers (costs in fixed point, 1/1024 token equivalent): sums are exact and do not
// depend on the order they are taken in, so no floating-point rounding can make two ranks, or two
// candidate orders, take different branches.
#include "data/packing/planner.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>

#include "kernels/base/error.h"

namespace packbert {

namespace {

constexpr double kCostScale = 1024.0;

// ---- orders ---------------------------------------------------------------------------------
//
// by_id: ascending sample id. canonical: (length descending, id ascending). Both are functions
// of the multiset of candidates; with the cost non-decreasing in length, canonical is also cost
// descending, which LPT and the local search need. LSD radix sort: the ids (as offsets from the
// smallest, in as many bytes as their range needs), then a stable counting sort by length. At
// 8192 candidates this is several times faster than std::sort; by_id also gives the duplicate
// check and lets the plan list every micro-batch's samples by id without sorting them.
struct Orders {
  std::vector<int32_t> by_id, canonical;
};

Orders sort_candidates(const std::vector<Candidate>& c, int max_len) {
  const size_t n = c.size();
  Orders o;
  std::vector<int32_t> idx(n), tmp(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (n == 0) return o;
  int64_t lo = c[0].sample_id, hi = c[0].sample_id;
  for (const auto& x : c) {
    lo = std::min(lo, x.sample_id);
    hi = std::max(hi, x.sample_id);
  }
  auto key = [&](int32_t i) {  // unsigned offset: well defined for any int64 range
    return static_cast<uint64_t>(c[i].sample_id) - static_cast<uint64_t>(lo);
  };
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  for (int shift = 0; shift < 64 && (range >> shift) != 0; shift += 8) {
    size_t count[257] = {};
    for (int32_t i : idx) ++count[((key(i) >> shift) & 0xff) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int32_t i : idx) tmp[count[(key(i) >> shift) & 0xff]++] = i;
    idx.swap(tmp);
  }
  for (size_t k = 1; k < n; ++k)
    PB_REQUIRE(c[idx[k]].sample_id != c[idx[k - 1]].sample_id,
               "planner: sample id {} appears twice among the step's candidates",
               c[idx[k]].sample_id);
  // Stable counting sort by length, longest first.
  std::vector<size_t> count(max_len + 2, 0);
  for (int32_t i : idx) ++count[max_len - c[i].length + 1];
  for (int b = 0; b <= max_len; ++b) count[b + 1] += count[b];
  for (int32_t i : idx) tmp[count[max_len - c[i].length]++] = i;
  o.by_id = std::move(idx);
  o.canonical = std::move(tmp);
  return o;
}

// ---- balancing: items (given in the method's order) -> bins ----------------------------------

struct Assignment {
  std::vector<int32_t> bin;  // per item
  int64_t moves = 0;
  int64_t probes = 0;
};

// Equal counts, first n % bins bins one more, in item order.
std::vector<int32_t> contiguous(size_t n, int bins) {
  std::vector<int32_t> bin(n);
  const size_t q = n / bins, rem = n % bins;
  for (size_t i = 0; i < n; ++i)
    bin[i] = static_cast<int32_t>(i < rem * (q + 1) ? i / (q + 1) : rem + (i - rem * (q + 1)) / q);
  return bin;
}

// Item i to bin i mod bins. Plain, not snake: Baidu's sort_bert_inputs_across_devices (MLPerf
// training v2.0) argsorts the lengths descending and reshapes to [batch, devices], so device d
// takes sorted positions d, d + R, d + 2R, ... and device 0 always the longest of each round.
std::vector<int32_t> round_robin(size_t n, int bins) {
  std::vector<int32_t> bin(n);
  for (size_t i = 0; i < n; ++i) bin[i] = static_cast<int32_t>(i % bins);
  return bin;
}

// LPT: items in cost-descending order, each to the least loaded bin (ties: lowest index).
// A binary min-heap of keys load * 2^bin_bits + bin (one integer compare orders by load, then
// bin) updated by replace-top, the smaller child picked without a branch: ~2x faster at 1024
// bins than a heap of (load, bin) pairs or a 4-ary heap. The caller checks that the loads fit.
std::vector<int32_t> lpt(const std::vector<int64_t>& cost, int bins, int bin_bits) {
  std::vector<int32_t> bin(cost.size());
  const size_t size = static_cast<size_t>(bins);
  std::vector<uint64_t> heap(size + 1, ~uint64_t{0});  // one sentinel: a missing right child
  for (size_t b = 0; b < size; ++b) heap[b] = b;       // equal loads, bins ascending: a heap
  const uint64_t mask = (uint64_t{1} << bin_bits) - 1;
  for (size_t i = 0; i < cost.size(); ++i) {
    const uint64_t key = heap[0] + (static_cast<uint64_t>(cost[i]) << bin_bits);
    bin[i] = static_cast<int32_t>(heap[0] & mask);
    size_t p = 0;
    for (;;) {
      size_t c = 2 * p + 1;
      if (c >= size) break;
      c += heap[c + 1] < heap[c];
      if (heap[c] >= key) break;
      heap[p] = heap[c];
      p = c;
    }
    heap[p] = key;
  }
  return bin;
}

// Local search after LPT. Repeatedly take the most loaded bin M and apply one move (an item of M
// to bin r) or swap (x of M with y of r, cost x > cost y). Shifting d = cost(x) - cost(y)
// (cost(y) = 0 for a move) helps when 0 < d < G = load(M) - load(r) and leaves the pair's larger
// load at max(load(M) - d, load(r) + d); its score min(d, G - d) is how far that lies below
// load(M), at most G / 2.
//
// Partners are scanned from the least loaded up, so G shrinks; the scan stops when G / 2 cannot
// beat the best score found, or as soon as the best brings M down to the runner-up's load (more
// does not lower this step's maximum, and stopping early leaves budget for the next bins; it
// measured better than always taking the best partner at every size we tried). Items of a bin
// are sorted by cost (descending), so for each distinct cost x of M the best y is one of the two
// around cost(x) - G / 2, found by binary search: one probe.
//
// Every operation lowers the most loaded bin without making another as loaded, so the sorted
// load vector decreases and the search ends; it ends earlier when nothing helps the most loaded
// bin or the probe budget is spent. Set-up is O(items + bins log bins) with no allocation per
// bin: item lists start as segments of one flat array, and a bin gets its own list only when an
// operation changes it (at 1024 bins, per-bin vectors cost more than the search itself).
class LocalSearch {
 public:
  LocalSearch(const std::vector<int64_t>& cost, int bins, int bin_bits,
              std::vector<int32_t>& bin_of)
      : cost_(cost),
        bin_of_(bin_of),
        bin_bits_(bin_bits),
        load_(bins, 0),
        first_(bins + 1, 0),
        flat_(cost.size()),
        own_(bins),
        dirty_(bins, 0),
        order_(bins) {
    for (size_t i = 0; i < cost.size(); ++i) {
      load_[bin_of[i]] += cost[i];
      ++first_[bin_of[i] + 1];
    }
    for (int b = 0; b < bins; ++b) first_[b + 1] += first_[b];
    std::vector<int32_t> next(first_.begin(), first_.end() - 1);
    for (size_t i = 0; i < cost.size(); ++i)  // ascending item index = cost descending
      flat_[next[bin_of[i]]++] = static_cast<int32_t>(i);
    for (int b = 0; b < bins; ++b) order_[b] = key(b);
    std::sort(order_.begin(), order_.end());
  }

  void run(int64_t budget, int64_t* moves, int64_t* probes) {
    const int bins = static_cast<int>(order_.size());
    const uint64_t mask = (uint64_t{1} << bin_bits_) - 1;
    while (bins > 1 && *probes < budget) {
      const int32_t m = static_cast<int32_t>(order_.back() & mask);
      const int64_t enough = std::max<int64_t>(1, load_[m] - load_[order_[bins - 2] & mask]);
      const List xs = items(m);
      Op best;
      for (int p = 0; p + 1 < bins; ++p) {
        const int32_t r = static_cast<int32_t>(order_[p] & mask);
        const int64_t gap = load_[m] - load_[r];
        if (gap / 2 <= best.score || *probes >= budget) break;
        // Move: the item of M closest to G / 2 from either side.
        const size_t k = first_at_most(xs, gap / 2);
        if (k < xs.size) consider(best, gap, r, k, -1, cost_[xs[k]]);
        if (k > 0) consider(best, gap, r, k - 1, -1, cost_[xs[k - 1]]);
        ++*probes;
        // Swaps: for each distinct cost of M, the partner items around cost(x) - G / 2.
        const List ys = items(r);
        for (size_t i = 0; i < xs.size && ys.size > 0; ++i) {
          const int64_t cx = cost_[xs[i]];
          if (i > 0 && cx == cost_[xs[i - 1]]) continue;
          const size_t j = first_at_most(ys, cx - gap / 2);
          if (j < ys.size) consider(best, gap, r, i, j, cx - cost_[ys[j]]);
          if (j > 0) consider(best, gap, r, i, j - 1, cx - cost_[ys[j - 1]]);
          ++*probes;
        }
        if (best.score >= enough || best.score == gap / 2) break;
      }
      if (best.score <= 0) break;
      apply(m, best);
      ++*moves;
    }
  }

 private:
  struct List {  // a bin's items, ascending index (= cost descending)
    const int32_t* data;
    size_t size;
    int32_t operator[](size_t i) const { return data[i]; }
  };
  struct Op {
    int64_t score = 0;
    int32_t partner = -1;
    int64_t x = -1, y = -1;  // positions in the lists of M and of the partner; y = -1: a move
  };

  uint64_t key(int32_t b) const {
    return (static_cast<uint64_t>(load_[b]) << bin_bits_) | static_cast<uint64_t>(b);
  }
  List items(int32_t b) const {
    if (dirty_[b]) return {own_[b].data(), own_[b].size()};
    return {flat_.data() + first_[b], static_cast<size_t>(first_[b + 1] - first_[b])};
  }
  std::vector<int32_t>& own(int32_t b) {  // copy on first write
    if (!dirty_[b]) {
      own_[b].assign(flat_.begin() + first_[b], flat_.begin() + first_[b + 1]);
      dirty_[b] = 1;
    }
    return own_[b];
  }
  // First position in a list with cost <= c.
  size_t first_at_most(const List& list, int64_t c) const {
    return static_cast<size_t>(std::partition_point(list.data, list.data + list.size,
                                                    [&](int32_t i) { return cost_[i] > c; }) -
                               list.data);
  }
  static void consider(Op& best, int64_t gap, int32_t r, int64_t x, int64_t y, int64_t d) {
    if (d <= 0 || d >= gap) return;
    const int64_t score = std::min(d, gap - d);
    if (score > best.score) best = {score, r, x, y};
  }
  // Moves bin b's key in order_ from old_key to its current one, shifting only the keys in
  // between (M moves a little way down from the top; a partner moves up from near the bottom).
  void reposition(int32_t b, uint64_t old_key) {
    const auto from = std::lower_bound(order_.begin(), order_.end(), old_key);
    const uint64_t k = key(b);
    if (k < old_key) {
      const auto to = std::lower_bound(order_.begin(), from, k);
      std::move_backward(to, from, from + 1);
      *to = k;
    } else {
      const auto to = std::lower_bound(from + 1, order_.end(), k);
      std::move(from + 1, to, from);
      *(to - 1) = k;
    }
  }
  void insert_item(int32_t b, int32_t item) {
    std::vector<int32_t>& list = own(b);
    list.insert(std::lower_bound(list.begin(), list.end(), item), item);
    bin_of_[item] = b;
    load_[b] += cost_[item];
  }
  int32_t take_item(int32_t b, int64_t pos) {
    std::vector<int32_t>& list = own(b);
    const int32_t item = list[pos];
    list.erase(list.begin() + pos);
    load_[b] -= cost_[item];
    return item;
  }
  void apply(int32_t m, const Op& op) {
    const uint64_t old_m = key(m), old_r = key(op.partner);
    const int32_t x = take_item(m, op.x);
    if (op.y >= 0) insert_item(m, take_item(op.partner, op.y));
    insert_item(op.partner, x);
    reposition(m, old_m);  // both new loads lie strictly between the old ones
    reposition(op.partner, old_r);
  }

  const std::vector<int64_t>& cost_;
  std::vector<int32_t>& bin_of_;
  const int bin_bits_;
  std::vector<int64_t> load_;
  std::vector<int32_t> first_, flat_;      // initial lists: bin b's at flat_[first_[b]...]
  std::vector<std::vector<int32_t>> own_;  // lists of the bins an operation changed
  std::vector<char> dirty_;
  std::vector<uint64_t> order_;  // keys load << bin_bits | bin, ascending
};

Assignment assign(const std::vector<int64_t>& cost, int bins, BalanceMethod method,
                  int64_t budget) {
  Assignment a;
  if (bins == 1) {  // nothing to balance (and the common micro_steps = 1 case)
    a.bin.assign(cost.size(), 0);
    return a;
  }
  int bin_bits = 0;
  while ((int64_t{1} << bin_bits) < bins) ++bin_bits;
  int64_t total = 0;
  for (int64_t c : cost) total += c;
  PB_REQUIRE(total < (int64_t{1} << (62 - bin_bits)),
             "planner: total step cost {} is too large to balance over {} ranks",
             total / kCostScale, bins);
  switch (method) {
    case BalanceMethod::none: a.bin = contiguous(cost.size(), bins); break;
    case BalanceMethod::sorted_round_robin: a.bin = round_robin(cost.size(), bins); break;
    case BalanceMethod::lpt: a.bin = lpt(cost, bins, bin_bits); break;
    case BalanceMethod::lpt_search:
      a.bin = lpt(cost, bins, bin_bits);
      if (cost.size() > 1)
        LocalSearch(cost, bins, bin_bits, a.bin).run(budget, &a.moves, &a.probes);
      break;
  }
  return a;
}

// ---- validation -----------------------------------------------------------------------------

// Quantised cost per length 1..L; checks the model keeps the order the balancer relies on.
std::vector<int64_t> cost_table(const CostModel& m, int max_len) {
  for (double v : {m.per_token, m.per_token_pair, m.per_sequence})
    PB_REQUIRE(std::isfinite(v) && v >= 0,
               "planner: cost coefficients must be finite and >= 0 (a={}, b={}, c={})", m.per_token,
               m.per_token_pair, m.per_sequence);
  PB_REQUIRE(m(max_len) <= 1e9, "planner: cost({}) = {} is out of range", max_len, m(max_len));
  std::vector<int64_t> q(max_len + 1, 0);
  for (int l = 1; l <= max_len; ++l) q[l] = std::llround(m(l) * kCostScale);
  PB_REQUIRE(q[1] > 0, "planner: cost(1) must be > 0 (a={}, b={}, c={})", m.per_token,
             m.per_token_pair, m.per_sequence);
  return q;
}

void check_input(const std::vector<Candidate>& candidates, const PlannerConfig& config) {
  PB_REQUIRE(config.num_ranks >= 1, "planner: num_ranks must be >= 1, got {}", config.num_ranks);
  PB_REQUIRE(config.micro_steps >= 1, "planner: micro_steps must be >= 1, got {}",
             config.micro_steps);
  PB_REQUIRE(config.packing.max_seq_len >= 1, "planner: max_seq_len must be >= 1, got {}",
             config.packing.max_seq_len);
  PB_REQUIRE(config.search_budget >= 0, "planner: search_budget must be >= 0, got {}",
             config.search_budget);
  PB_REQUIRE(config.pack_rank == kPackAllRanks || config.pack_rank == kPackNoRanks ||
                 (config.pack_rank >= 0 && config.pack_rank < config.num_ranks),
             "planner: pack_rank {} is not a rank of {} (or kPackAllRanks / kPackNoRanks)",
             config.pack_rank, config.num_ranks);
  PB_REQUIRE(candidates.size() < size_t{1} << 31, "planner: {} candidates are too many",
             candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    PB_REQUIRE(c.length >= 1 && c.length <= config.packing.max_seq_len,
               "planner: candidate {} (sample {}) has length {}, outside 1..{}", i, c.sample_id,
               c.length, config.packing.max_seq_len);
    PB_REQUIRE(c.masked_count >= 0 && c.masked_count <= c.length,
               "planner: candidate {} (sample {}) has {} masked tokens for length {}", i,
               c.sample_id, c.masked_count, c.length);
  }
}

}  // namespace

// ---- public ---------------------------------------------------------------------------------

CostModel CostModel::for_hidden(int hidden) {
  PB_REQUIRE(hidden >= 1, "cost model: hidden size must be >= 1, got {}", hidden);
  CostModel m;
  m.per_token_pair = 1.0 / (6.0 * hidden);
  return m;
}

const char* balance_method_name(BalanceMethod m) {
  switch (m) {
    case BalanceMethod::none: return "none";
    case BalanceMethod::sorted_round_robin: return "round-robin";
    case BalanceMethod::lpt: return "lpt";
    case BalanceMethod::lpt_search: return "lpt-search";
  }
  return "?";
}

BalanceMethod parse_balance_method(const std::string& name) {
  for (BalanceMethod m : {BalanceMethod::none, BalanceMethod::sorted_round_robin,
                          BalanceMethod::lpt, BalanceMethod::lpt_search})
    if (name == balance_method_name(m)) return m;
  PB_REQUIRE(name != "ours", "balance method 'ours' was renamed 'lpt-search'");
  PB_THROW("unknown balance method '{}' (none, round-robin, lpt, lpt-search)", name);
}

StepPlan plan_step(const std::vector<Candidate>& candidates, const PlannerConfig& config) {
  check_input(candidates, config);
  const std::vector<int64_t> unit_cost = cost_table(config.cost, config.packing.max_seq_len);
  const int R = config.num_ranks, M = config.micro_steps;
  const size_t n = candidates.size();

  // The order every method reads the candidates in: BalanceMethod::none as given, the others
  // canonical.
  Orders orders = sort_candidates(candidates, config.packing.max_seq_len);
  std::vector<int32_t>& order = orders.canonical;
  if (config.method == BalanceMethod::none) std::iota(order.begin(), order.end(), 0);

  StepPlan plan;
  std::vector<int64_t> cost(n);
  for (size_t k = 0; k < n; ++k) cost[k] = unit_cost[candidates[order[k]].length];
  const Assignment ranks = assign(cost, R, config.method, config.search_budget);
  plan.search_moves += ranks.moves;
  plan.search_probes += ranks.probes;

  // The micro split: cell = rank * M + micro-step, per candidate. With M > 1 each rank's share,
  // in method order (a sub-sequence of `order`), is balanced over M bins by the same method;
  // the shares come from a bucket sort into one flat array, rank r's at [first[r], first[r+1]).
  std::vector<int32_t> cell_of(n), cell_count(static_cast<size_t>(R) * M, 0);
  std::vector<int64_t> cell_cost(static_cast<size_t>(R) * M, 0);
  if (M == 1) {
    for (size_t k = 0; k < n; ++k) {
      cell_of[order[k]] = ranks.bin[k];
      ++cell_count[ranks.bin[k]];
      cell_cost[ranks.bin[k]] += cost[k];
    }
  } else {
    std::vector<int32_t> first(R + 1, 0), flat(n);
    for (size_t k = 0; k < n; ++k) ++first[ranks.bin[k] + 1];
    for (int r = 0; r < R; ++r) first[r + 1] += first[r];
    std::vector<int32_t> next(first.begin(), first.end() - 1);
    for (size_t k = 0; k < n; ++k) flat[next[ranks.bin[k]]++] = static_cast<int32_t>(k);
    std::vector<int64_t> share_cost;
    // The micro splits share the budget (at least a little each), so the whole plan's search
    // work stays bounded by ~2 budgets however many ranks there are.
    const int64_t micro_budget =
        config.search_budget > 0 ? std::max<int64_t>(64, config.search_budget / R) : 0;
    for (int r = 0; r < R; ++r) {
      const int32_t* share = flat.data() + first[r];  // positions in `order`
      const size_t count = static_cast<size_t>(first[r + 1] - first[r]);
      share_cost.resize(count);
      for (size_t k = 0; k < count; ++k) share_cost[k] = cost[share[k]];
      const Assignment micro = assign(share_cost, M, config.method, micro_budget);
      plan.search_moves += micro.moves;
      plan.search_probes += micro.probes;
      for (size_t k = 0; k < count; ++k) {
        const int32_t cell = r * M + micro.bin[k];
        cell_of[order[share[k]]] = cell;
        ++cell_count[cell];
        cell_cost[cell] += share_cost[k];
      }
    }
  }

  // The plan. Candidates go to their cells in id order through one flat array (a counting sort),
  // so every micro-batch lists its samples by ascending id and is written front to back.
  std::vector<int32_t> by_cell(n), next(static_cast<size_t>(R) * M + 1, 0);
  for (size_t cell = 0; cell + 1 < next.size(); ++cell)
    next[cell + 1] = next[cell] + cell_count[cell];
  for (int32_t i : orders.by_id) by_cell[next[cell_of[i]]++] = i;
  plan.ranks.resize(R);
  int64_t total_cost = 0, max_cost = 0;
  const int32_t* in = by_cell.data();
  for (int r = 0; r < R; ++r) {
    RankPlan& rp = plan.ranks[r];
    rp.micro_batches.resize(M);
    int64_t rank_cost = 0;
    for (int j = 0; j < M; ++j) {
      MicroBatch& mb = rp.micro_batches[j];
      const size_t cell = static_cast<size_t>(r) * M + j;
      mb.samples.resize(cell_count[cell]);
      for (Candidate& s : mb.samples) {
        s = candidates[*in++];
        mb.tokens += s.length;
        mb.masked_tokens += s.masked_count;
      }
      mb.cost = cell_cost[cell] / kCostScale;
      rank_cost += cell_cost[cell];
      rp.samples += static_cast<int64_t>(mb.samples.size());
      rp.tokens += mb.tokens;
      rp.masked_tokens += mb.masked_tokens;
    }
    rp.cost = rank_cost / kCostScale;
    total_cost += rank_cost;
    max_cost = std::max(max_cost, rank_cost);
    plan.global_samples += rp.samples;
    plan.global_tokens += rp.tokens;
    plan.global_masked_tokens += rp.masked_tokens;
    if (config.pack_rank == kPackAllRanks || config.pack_rank == r) {
      for (MicroBatch& mb : rp.micro_batches) {
        std::vector<SeqRef> refs(mb.samples.size());
        for (size_t k = 0; k < refs.size(); ++k)
          refs[k] = {mb.samples[k].sample_id, mb.samples[k].length};
        mb.packs = pack_online(refs, config.packing);
      }
      rp.packed = true;
    }
  }
  plan.max_cost = max_cost / kCostScale;
  plan.mean_cost = static_cast<double>(total_cost) / R / kCostScale;
  return plan;
}

std::vector<int64_t> RankPlan::sample_ids() const {
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(samples));
  for (const MicroBatch& mb : micro_batches)
    for (const Candidate& c : mb.samples) ids.push_back(c.sample_id);
  return ids;
}

std::vector<int32_t> pack_lengths(const MicroBatch& mb, size_t pack_index) {
  PB_REQUIRE(pack_index < mb.packs.size(), "pack {} of a micro-batch with {} packs", pack_index,
             mb.packs.size());
  std::vector<int32_t> lengths;
  lengths.reserve(mb.packs[pack_index].size());
  for (int64_t id : mb.packs[pack_index]) {
    auto it = std::lower_bound(mb.samples.begin(), mb.samples.end(), id,
                               [](const Candidate& c, int64_t v) { return c.sample_id < v; });
    PB_REQUIRE(it != mb.samples.end() && it->sample_id == id,
               "pack {} holds sample {}, which is not in its micro-batch", pack_index, id);
    lengths.push_back(it->length);
  }
  return lengths;
}

SequenceLayout sequence_layout(const std::vector<int32_t>& lengths) {
  SequenceLayout out;
  out.cu_seqlens.resize(lengths.size() + 1);
  int64_t total = 0;
  out.cu_seqlens[0] = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    PB_REQUIRE(lengths[i] >= 1, "sequence {} has length {} (must be >= 1)", i, lengths[i]);
    total += lengths[i];
    PB_REQUIRE(total <= INT32_MAX, "sequences total {} tokens, beyond int32 cu_seqlens", total);
    out.cu_seqlens[i + 1] = static_cast<int32_t>(total);
  }
  out.position_ids.resize(static_cast<size_t>(total));
  for (size_t i = 0; i < lengths.size(); ++i)
    std::iota(out.position_ids.begin() + out.cu_seqlens[i],
              out.position_ids.begin() + out.cu_seqlens[i + 1], 0);
  return out;
}

MicroBatchBound micro_batch_bound(const PlannerConfig& c, int64_t global_batch_size) {
  const int64_t len = c.packing.max_seq_len;
  PB_REQUIRE(global_batch_size >= 1 && c.num_ranks >= 1 && c.micro_steps >= 1 && len >= 1,
             "planner: bound of a micro-batch of {} samples over {} ranks x {} micro-steps, "
             "max_seq_len {}",
             global_batch_size, c.num_ranks, c.micro_steps, len);
  const int64_t per_rank = (global_batch_size + c.num_ranks - 1) / c.num_ranks;
  MicroBatchBound b;
  b.samples = (per_rank + c.micro_steps - 1) / c.micro_steps;
  b.tokens = b.samples * len;
  const bool by_cost = c.method == BalanceMethod::lpt || c.method == BalanceMethod::lpt_search;
  if (by_cost && c.cost.per_token > 0) {
    const double cells = static_cast<double>(c.num_ranks) * c.micro_steps;
    const double most =
        (static_cast<double>(global_batch_size) / cells + 1.0 / c.micro_steps + 1.0) *
        c.cost(static_cast<int>(len));
    b.tokens = static_cast<int64_t>(std::ceil(most / c.cost.per_token));
    b.samples += 2;
    b.samples_bounded = false;
  }
  b.samples = std::min(b.samples, global_batch_size);
  b.tokens = std::min(b.tokens, global_batch_size * len);
  return b;
}

}  // namespace packbert
