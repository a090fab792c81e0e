// Tokenizer throughput: prints MB/s for the bundled corpus (ASCII) and for a mixed-script text,
// of the BERT vocab.txt tokenizer and of each tokenizer.json given, side by side, one thread.
// A benchmark prints; it never asserts a time (DESIGN.md, Testing).
//
//   bench_tokenizer [DATA_DIR] [TOKENIZER.json...]
// (tests/e2e/tokenizer_check.py leaves a trained bpe.json and wordpiece.json in its work dir.)
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/prepare/corpus_tokenizer.h"
#include "data/prepare/hf_tokenizer.h"
#include "data/prepare/tokenizer.h"

namespace {

std::string read_gz(const std::string& path) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = std::min(s.find('\n', pos), s.size());
    lines.emplace_back(s, pos, nl - pos);
    pos = nl + 1;
  }
  return lines;
}

// Best of `reps` passes, line by line as `packbert prepare` does.
void bench(const std::string& name, const std::function<size_t(const std::string&)>& encode,
           const std::vector<std::string>& lines, int reps) {
  size_t bytes = 0;
  for (const auto& l : lines) bytes += l.size() + 1;
  double best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < reps; ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& l : lines) tokens += encode(l);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("%-50s %10.2f %10zu %10.3f %10.1f %12.2f\n", name.c_str(), bytes / 1e6, tokens, best,
              bytes / best / 1e6, tokens / best / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : PACKBERT_REPO_DATA;
  const packbert::Vocab vocab = packbert::Vocab::load(data + "/vocab.txt");
  const packbert::BertTokenizer tok(vocab);
  const auto corpus = lines_of(read_gz(data + "/kjv-bible.txt.gz"));

  // Mixed scripts and accents: exercises the non-ASCII path (utf8proc lookups, NFD).
  const std::vector<std::string> mixed_src = {
      "Der Straßenverkehr in München ist während der Oktoberfestzeit äußerst dicht.",
      "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
      "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.",
      "北京是中华人民共和国的首都，也是全国的政治和文化中心。",
      "Café naïve résumé — “quotes” and 1,234.56 € in façade Ångström.",
      "日本語の文章とカタカナ、한국어 문장도 섞여 있습니다 😀👍🏽."};
  std::vector<std::string> mixed;
  for (size_t bytes = 0; bytes < 4000000;) {
    for (const auto& s : mixed_src) {
      mixed.push_back(s);
      bytes += s.size() + 1;
    }
  }

  std::printf("%-50s %10s %10s %10s %10s %12s\n", "input, tokenizer", "MB", "tokens", "seconds",
              "MB/s", "Mtokens/s");
  std::vector<std::pair<std::string, std::function<size_t(const std::string&)>>> tokenizers = {
      {"vocab.txt", [&](const std::string& l) { return tok.encode(l).size(); }}};
  // What prepare calls: the same vocab.txt behind CorpusTokenizer, appending to a reused vector.
  const packbert::CorpusTokenizer corpus_tok = packbert::CorpusTokenizer::load(data + "/vocab.txt");
  tokenizers.emplace_back("vocab.txt via CorpusTokenizer", [&](const std::string& l) {
    thread_local std::vector<int32_t> ids;
    ids.clear();
    corpus_tok.encode(l, ids);
    return ids.size();
  });
  std::vector<packbert::HfTokenizer> json;
  for (int i = 2; i < argc; ++i) json.push_back(packbert::HfTokenizer::load(argv[i]));
  for (int i = 2; i < argc; ++i) {
    const packbert::HfTokenizer* t = &json[static_cast<size_t>(i - 2)];
    tokenizers.emplace_back(argv[i],
                            [t](const std::string& l) { return t->encode(l, false).size(); });
  }
  for (const auto& [input, lines] :
       {std::pair<const char*, const std::vector<std::string>*>{"kjv-bible (ASCII)", &corpus},
        {"mixed scripts", &mixed}})
    for (const auto& [name, encode] : tokenizers)
      bench(std::string(input) + ", " + name.substr(name.rfind('/') + 1), encode, *lines, 3);
  return 0;
}
