#include "data/prepare/hf_bpe.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <queue>
#include <tuple>

#include "data/prepare/hf_pretokenize.h"
#include "kernels/base/error.h"

namespace packbert {
namespace {

// The byte length of the UTF-8 character starting with byte b (1 for a stray byte).
size_t char_len(unsigned char b) {
  if (b >= 0xF0) return 4;
  if (b >= 0xE0) return 3;
  if (b >= 0xC0) return 2;
  return 1;
}

bool empty_or_null(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, const std::string& source) {
  // A number no other model of the process has (an address may be reused after a model is
  // gone), for the threads' caches.
  static std::atomic<uint64_t> models{0};
  serial_ = ++models;
  const auto fail = [&](const std::string& what) { PB_THROW("{}: model (BPE): {}", source, what); };
  if (!empty_or_null(model, "dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() != 0.0)
    fail("dropout is not supported (give null)");
  if (model.value("byte_fallback", false)) fail("byte_fallback is not supported");
  if (!empty_or_null(model, "continuing_subword_prefix"))
    fail("continuing_subword_prefix is not supported (byte-level BPE has none)");
  if (!empty_or_null(model, "end_of_word_suffix"))
    fail("end_of_word_suffix is not supported (byte-level BPE has none)");
  ignore_merges_ = model.value("ignore_merges", false);
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) fail("no \"vocab\" object");
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX)
      fail("vocab entry \"" + it.key() + "\" is not an id in [0, 2^31)");
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    vocab_.emplace(it.key(), id);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  }
  if (!empty_or_null(model, "unk_token")) {
    unk_ = id(model["unk_token"].get<std::string>());
    if (unk_ < 0) fail("unk_token is not in the vocabulary");
  }
  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) fail("no \"merges\" array");
  int32_t rank = 0;
  for (const auto& m : *merges) {
    // "a b" (tokenizers before 0.20) or ["a", "b"].
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) fail("merge " + std::to_string(rank) + " is not \"a b\"");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      fail("merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const int32_t ia = id(a), ib = id(b), ir = id(a + b);
    if (ia < 0 || ib < 0 || ir < 0)
      fail("merge " + std::to_string(rank) + " (\"" + a + "\", \"" + b +
           "\") has a token not in the vocabulary");
    merges_[pair_key(ia, ib)] = Merge{rank, ir};  // a repeated pair: the last wins, as there
    ++rank;
  }
}

int32_t BpeModel::id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  // A word's ids depend on the word alone: each thread keeps those of the words it met (as
  // tokenizers' cache does), cleared when it grows past kCacheWords or another model uses it.
  constexpr size_t kCacheWords = 1 << 16;
  struct Cache {
    uint64_t model = 0;            // BpeModel::serial_
    std::deque<std::string> keys;  // the words the map's views point into
    std::unordered_map<std::string_view, std::vector<int32_t>> words;
  };
  thread_local Cache cache;
  if (cache.model != serial_ || cache.words.size() >= kCacheWords) {
    cache.words.clear();
    cache.keys.clear();
    cache.model = serial_;
  }
  const auto hit = cache.words.find(word);
  if (hit != cache.words.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  const size_t first = out.size();
  thread_local std::string mapped;
  mapped.clear();
  const auto& chars = byte_level_chars();
  for (const char b : word) mapped += chars[static_cast<unsigned char>(b)];
  encode_uncached(mapped, out);
  cache.keys.emplace_back(word);
  cache.words.emplace(
      cache.keys.back(),
      std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
}

void BpeModel::encode_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    const int32_t whole = id(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  std::vector<int32_t> symbols;
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(char_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const int32_t c = id(word.substr(i, len));
    if (c >= 0) {
      symbols.push_back(c);
    } else if (unk_ >= 0) {
      symbols.push_back(unk_);
    }
    i += len;
  }
  merge_word(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

// tokenizers' Word::merge_all: a queue of (rank, position) of the pairs that have a merge;
// the lowest rank first, the leftmost of equal ranks; a popped pair that no longer stands at
// its position (one of its symbols was merged away) is skipped.
void BpeModel::merge_word(std::vector<int32_t>& symbols) const {
  const auto n = static_cast<int32_t>(symbols.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  using Item = std::tuple<int32_t, int32_t, int32_t>;  // rank, position, merged id
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto it = merges_.find(pair_key(symbols[pos], symbols[next[pos]]));
    if (it != merges_.end()) queue.emplace(it->second.rank, pos, it->second.id);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const auto [rank, pos, merged] = queue.top();
    queue.pop();
    if (!alive[pos] || next[pos] < 0) continue;
    const auto it = merges_.find(pair_key(symbols[pos], symbols[next[pos]]));
    if (it == merges_.end() || it->second.rank != rank || it->second.id != merged) continue;
    const int32_t gone = next[pos];
    symbols[pos] = merged;
    alive[gone] = 0;
    next[pos] = next[gone];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    push(prev[pos]);
    push(pos);
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) symbols[k++] = symbols[i];
  symbols.resize(k);
}

}  // namespace packbert
