// GraphCache<Key>: backend work that repeats, recorded once and replayed. run(key, ops) runs
// the ops the first time it sees the key (their first run sizes whatever the backend keeps),
// records them into a graph the second time (and launches it), and replays that graph from then
// on. Entries weigh what the caller says (a whole step's graph may count as many layers'); a new
// key that would take the total beyond the capacity first drops the entries not yet recorded,
// then the oldest, down to half, so that keys seen once never keep a recurring one out.
// Eviction depends only on the sequence of keys, so ranks that see the same keys keep the same
// entries (what graphs holding collectives need).
//
// A key is a struct listing its fields once, `auto fields() const { return std::tie(...); }`:
// equality (key_equal, or `==` defined from it) and key_words (the key as integers, for
// comparing across ranks) both derive from that list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/backend.h"

namespace packbert {

template <class Key>
bool key_equal(const Key& a, const Key& b) {
  return a.fields() == b.fields();
}

// Every field of the key as an int64_t, in field order: integers and bools as they are,
// pointers by address, and each field's words in turn for a field that is itself such a key.
template <class Key>
std::vector<int64_t> key_words(const Key& k) {
  std::vector<int64_t> out;
  auto add = [&out](const auto& f) {
    using F = std::decay_t<decltype(f)>;
    if constexpr (std::is_pointer_v<F>) {
      out.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(f)));
    } else if constexpr (std::is_integral_v<F> || std::is_enum_v<F>) {
      out.push_back(static_cast<int64_t>(f));
    } else {
      const std::vector<int64_t> inner = key_words(f);
      out.insert(out.end(), inner.begin(), inner.end());
    }
  };
  std::apply([&](const auto&... f) { (add(f), ...); }, k.fields());
  return out;
}

template <class Key>
class GraphCache {
 public:
  // What run() did with the ops.
  enum class Use { ran, recorded, replayed };

  // capacity: the most total weight kept (>= 1).
  GraphCache(Backend& backend, size_t capacity) : backend_(backend), capacity_(capacity) {}

  Use run(const Key& key, const std::function<void()>& ops, size_t weight = 1) {
    for (Entry& e : entries_) {
      if (!(e.key == key)) continue;
      if (!e.graph.defined()) {
        e.graph = backend_.record_and_replay(ops);
        return Use::recorded;
      }
      backend_.replay(e.graph);
      return Use::replayed;
    }
    if (total() + weight > capacity_) evict();
    entries_.push_back({key, BackendGraph(), weight});
    ops();
    return Use::ran;
  }

  void clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }
  size_t recorded() const {
    size_t n = 0;
    for (const Entry& e : entries_) n += e.graph.defined() ? 1 : 0;
    return n;
  }

 private:
  struct Entry {
    Key key;
    BackendGraph graph;  // none until the key's second use
    size_t weight = 1;
  };
  size_t total() const {
    size_t n = 0;
    for (const Entry& e : entries_) n += e.weight;
    return n;
  }
  void evict() {
    std::vector<Entry> kept;
    for (Entry& e : entries_)
      if (e.graph.defined()) kept.push_back(std::move(e));
    entries_ = std::move(kept);
    size_t drop = 0;
    for (size_t t = total(); drop < entries_.size() && t > capacity_ / 2; ++drop)
      t -= entries_[drop].weight;
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(drop));
  }

  Backend& backend_;
  size_t capacity_;
  std::vector<Entry> entries_;  // oldest first
};

}  // namespace packbert
