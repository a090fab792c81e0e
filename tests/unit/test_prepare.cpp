// run_prepare (`packbert prepare`) against the semantics of Google's create_pretraining_data.py.
//
// Most checks use a controlled corpus in which every token occurs once, so any token of a
// sample (after undoing the masking with masked_lm_ids) tells which document and which position
// it came from: A and B must be contiguous runs of a document, B must follow A for
// next_sentence_label 0, eval and train documents can be told apart. The demo corpus (a slice
// of the King James Bible) checks the same on real text with multi-piece words.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <unordered_map>

#include "kernels/base/error.h"
#include "data/prepare/prepare.h"
#include "data/shards/shard.h"
#include "data/prepare/text_input.h"
#include "data/prepare/tokenizer.h"
#include "measure.h"
#include "shard_test_util.h"
#include "test_util.h"

namespace packbert {
namespace {

namespace fs = std::filesystem;
using test::error_of;
const std::string kVocab = std::string(PACKBERT_REPO_DATA) + "/vocab.txt";
const std::string kDemo = std::string(PACKBERT_REPO_DATA) + "/kjv-bible-docs.txt.gz";
const std::string kBin = PACKBERT_BINARY;

const Vocab& vocab() {
  static const Vocab v = Vocab::load(kVocab);
  return v;
}
const BertTokenizer& tokenizer() {
  static const BertTokenizer t(vocab());
  return t;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  ASSERT_TRUE(f.good()) << path;
}

void write_gz(const std::string& path, const std::string& text) {
  write_text(path + ".plain", text);
  ASSERT_EQ(test::run_command("gzip -n -c '" + path + ".plain' > '" + path + "'"), 0);
  fs::remove(path + ".plain");
}

// The message of the packbert::Error f throws ("" when none).
SampleRules rules_for(int max_seq_len) {
  SampleRules r;
  r.vocab_size = vocab().size();
  r.max_seq_len = max_seq_len;
  r.cls_id = vocab().cls_id();
  r.sep_id = vocab().sep_id();
  return r;
}

std::vector<Sample> read_samples(const std::vector<std::string>& shards, int max_seq_len) {
  return test::read_shards(shards, rules_for(max_seq_len));
}

std::vector<Sample> read_train(const PrepareStats& st, int max_seq_len) {
  return read_samples(st.train_shards, max_seq_len);
}

PrepareOptions base_options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions o;
  o.inputs = inputs;
  o.vocab = kVocab;
  o.output_dir = out;
  o.max_seq_len = 64;
  o.max_predictions_per_seq = 10;
  o.dupe_factor = 3;
  o.seed = test::test_seed();
  o.threads = 2;
  return o;
}

// A sample split into its parts, with the masking undone.
struct Parts {
  std::vector<int32_t> original;  // input_ids with masked_lm_ids put back
  std::vector<int32_t> a, b;
};

// Checks the [CLS] A [SEP] B [SEP] structure, segment ids and masked positions; returns parts.
Parts split(const Sample& s, int max_seq_len) {
  Parts p;
  const int len = s.length();
  EXPECT_LE(len, max_seq_len);
  EXPECT_EQ(check_sample(s, rules_for(max_seq_len)), "");
  const int len_a = static_cast<int>(std::count(s.segment_ids.begin(), s.segment_ids.end(), 0)) - 2;
  const int len_b = len - len_a - 3;
  EXPECT_GE(len_a, 1);
  EXPECT_GE(len_b, 1);
  if (len_a < 1 || len_b < 1) return p;
  EXPECT_EQ(s.input_ids[0], vocab().cls_id());
  EXPECT_EQ(s.input_ids[len_a + 1], vocab().sep_id());
  EXPECT_EQ(s.input_ids[len - 1], vocab().sep_id());
  for (int i = 0; i < len; ++i) {
    EXPECT_EQ(s.segment_ids[i], i <= len_a + 1 ? 0 : 1) << "position " << i;
    if (i != 0 && i != len_a + 1 && i != len - 1) {
      EXPECT_NE(s.input_ids[i], vocab().cls_id());
      EXPECT_NE(s.input_ids[i], vocab().sep_id());
    }
  }
  p.original = s.input_ids;
  for (int k = 0; k < s.num_masked(); ++k)
    p.original[s.masked_lm_positions[k]] = s.masked_lm_ids[k];
  p.a.assign(p.original.begin() + 1, p.original.begin() + 1 + len_a);
  p.b.assign(p.original.begin() + 2 + len_a, p.original.end() - 1);
  return p;
}

// Google's num_to_predict for a sample of this length.
int num_to_predict(int len, const PrepareOptions& o) {
  return std::min(o.max_predictions_per_seq,
                  std::max(1, static_cast<int>(std::nearbyint(len * o.masked_lm_prob))));
}

// ---- the controlled corpus: every token once ---------------------------------------------

struct Where {
  int doc = -1;       // global document number (over all files)
  int sentence = -1;  // in the document
  int pos = -1;       // in the document's token stream
  bool sentence_start = false, sentence_end = false;
};

struct Corpus {
  std::vector<std::string> files;
  std::unordered_map<int32_t, Where> where;
  int docs = 0;
  std::vector<int> doc_sentences;  // sentences per document
};

// Whole words that the tokenizer maps to one token, in random order.
std::vector<std::string> single_token_words(std::mt19937_64& rng) {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> w;
    for (int32_t id = 0; id < vocab().size(); ++id) {
      const std::string& t = vocab().token(id);
      if (t.size() < 2 ||
          !std::all_of(t.begin(), t.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        continue;
      if (tokenizer().encode(t) == std::vector<int32_t>{id}) w.push_back(t);
    }
    return w;
  }();
  std::vector<std::string> out = words;
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

// docs_per_file[f] documents in file f, each with sentences in [min_s, max_s] of words in
// [min_w, max_w]. Separators vary (several blank lines, whitespace-only lines, lines that give
// no token) to check that only blank lines end documents and that nothing makes empty ones.
Corpus make_corpus(const test::TempDir& dir, std::mt19937_64& rng,
                   const std::vector<int>& docs_per_file, int min_s, int max_s, int min_w,
                   int max_w, bool gzip_second = true) {
  Corpus c;
  const std::vector<std::string> words = single_token_words(rng);
  size_t next_word = 0;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (size_t f = 0; f < docs_per_file.size(); ++f) {
    std::string text = pick(0, 1) ? "\n \n" : "";  // leading blank lines make no document
    for (int d = 0; d < docs_per_file[f]; ++d) {
      const int doc = c.docs++;
      const int sentences = pick(min_s, max_s);
      c.doc_sentences.push_back(sentences);
      int pos = 0;
      for (int s = 0; s < sentences; ++s) {
        const int n = pick(min_w, max_w);
        for (int w = 0; w < n; ++w) {
          if (next_word >= words.size()) throw std::runtime_error("corpus needs more words");
          const std::string& word = words[next_word++];
          text += (w ? " " : "") + word;
          c.where[vocab().id(word)] = Where{doc, s, pos++, w == 0, w == n - 1};
        }
        text += pick(0, 3) == 0 ? " \r\n" : "\n";
        if (pick(0, 9) == 0) text += "\x01\x02\n";  // tokenizes to nothing: skipped
      }
      text += pick(0, 2) == 0 ? "\n\t \n\n" : "\n";
    }
    const std::string path =
        dir.file("corpus" + std::to_string(f) + (f == 1 && gzip_second ? ".txt.gz" : ".txt"));
    if (f == 1 && gzip_second)
      write_gz(path, text);
    else
      write_text(path, text);
    c.files.push_back(path);
  }
  return c;
}

struct Tally {
  int64_t samples = 0, random_next = 0, masked = 0, as_mask = 0, as_original = 0, as_other = 0;
  int64_t tokens = 0;
  int64_t front_cuts = 0, back_cuts = 0;  // segments truncated at their front / back
  int64_t one_sentence_a = 0;             // samples whose A lies within one sentence
};

// Every check that the unique-token corpus makes possible, on one sample. Returns the
// documents it drew from. A random next comes from another document unless the file's pool of
// documents is tiny (Google's 10 tries fail only then): small_pools relaxes that check.
std::set<int> check_controlled(const Sample& s, const Corpus& c, const PrepareOptions& o, Tally& t,
                               bool small_pools = false) {
  const Parts p = split(s, o.max_seq_len);
  std::set<int> docs;
  if (p.a.empty() || p.b.empty()) return docs;
  auto contiguous = [&](const std::vector<int32_t>& seg, const char* name) -> const Where* {
    for (int32_t id : seg) {
      if (!c.where.count(id)) {
        ADD_FAILURE() << name << " holds token " << id << " that is not in the corpus";
        return nullptr;
      }
    }
    for (size_t k = 1; k < seg.size(); ++k) {
      const Where& prev = c.where.at(seg[k - 1]);
      const Where& cur = c.where.at(seg[k]);
      if (cur.doc != prev.doc || cur.pos != prev.pos + 1) {
        ADD_FAILURE() << name << " is not a contiguous run of one document at " << k;
        return nullptr;
      }
    }
    return &c.where.at(seg.front());
  };
  const Where* a0 = contiguous(p.a, "A");
  const Where* b0 = contiguous(p.b, "B");
  if (!a0 || !b0) return docs;
  const Where& a_last = c.where.at(p.a.back());
  const Where& b_last = c.where.at(p.b.back());
  docs = {a0->doc, b0->doc};
  // Without truncation (total below max_num_tokens) segments start and end on sentences.
  const bool untruncated = static_cast<int>(p.a.size() + p.b.size()) < o.max_seq_len - 3;
  if (untruncated) {
    EXPECT_TRUE(a0->sentence_start && a_last.sentence_end && b0->sentence_start &&
                b_last.sentence_end);
  }
  t.front_cuts += !a0->sentence_start + !b0->sentence_start;
  t.one_sentence_a += a0->doc == a_last.doc && a0->sentence == a_last.sentence;
  t.back_cuts += !a_last.sentence_end + !b_last.sentence_end;
  if (s.next_sentence_label == 0) {
    EXPECT_EQ(b0->doc, a0->doc) << "actual next from another document";
    EXPECT_GT(b0->pos, a_last.pos) << "B does not follow A";
    if (untruncated) {
      EXPECT_EQ(b0->pos, a_last.pos + 1) << "B does not directly follow A";
    }
  } else if (!small_pools) {
    EXPECT_NE(b0->doc, a0->doc) << "random next from the same document";
  }
  // Masking: the count Google's formula gives, and the 80/10/10 replacement.
  EXPECT_EQ(s.num_masked(), num_to_predict(s.length(), o));
  for (int k = 0; k < s.num_masked(); ++k) {
    const int32_t in = s.input_ids[s.masked_lm_positions[k]];
    if (in == vocab().mask_id())
      ++t.as_mask;
    else if (in == s.masked_lm_ids[k])
      ++t.as_original;
    else
      ++t.as_other;
  }
  ++t.samples;
  t.random_next += s.next_sentence_label;
  t.masked += s.num_masked();
  t.tokens += s.length();
  return docs;
}

// |observed - expected| within 5 standard deviations of a binomial proportion (plus slack): a
// false alarm once in 1.7 million runs where the slack is 0. Measured in units of that bar.
void expect_fraction(double count, double n, double p, double slack, const char* what) {
  ASSERT_GT(n, 0) << what;
  const double tol = 5 * std::sqrt(p * (1 - p) / n) + slack;
  std::printf("%s: %g of %g\n", what, count, n);
  test::expect_bound(std::string(what) + " fraction: |observed - expected| / (5 sigma + slack)",
                     std::abs(count / n - p) / tol, 1.0);
}

TEST(Prepare, ControlledCorpusFollowsGooglesSemantics) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  // Documents of 20+ sentences: chunks of one sentence (always a random next, mostly at the end
  // of a document) are rare, so the random-next share is near 0.5, a little above it.
  const Corpus c = make_corpus(dir, rng, {40, 30}, 20, 40, 3, 6);
  PrepareOptions o = base_options(c.files, dir.file("out"));
  o.dupe_factor = 3;
  const PrepareStats st = run_prepare(o);
  EXPECT_EQ(st.documents, c.docs);
  EXPECT_EQ(st.eval_samples, 0);
  EXPECT_TRUE(st.eval_shard.empty());
  ASSERT_EQ(st.train_shards.size(), 1u);
  EXPECT_EQ(st.train_shards[0], dir.file("out") + "/train/part-00000-of-00001.h5");
  EXPECT_FALSE(fs::exists(dir.file("out") + "/eval"));
  EXPECT_FALSE(fs::exists(dir.file("out") + "/train.incomplete"));

  const std::vector<Sample> samples = read_train(st, o.max_seq_len);
  ASSERT_EQ(static_cast<int64_t>(samples.size()), st.train_samples);
  ASSERT_GT(samples.size(), 300u);
  Tally t;
  int64_t masked = 0;
  for (const Sample& s : samples) {
    check_controlled(s, c, o, t);
    masked += s.num_masked();
  }
  EXPECT_EQ(masked, st.masked_tokens);
  // Google's rule: a chunk of one sentence always takes a random next, any other one with
  // probability 1/2. Such a chunk's A is that one sentence, so with n1 samples whose A lies
  // within one sentence, the expected random-next count lies in [N / 2, (N + n1) / 2]: held to
  // that interval widened by 5 standard deviations (a fixed 0.06 of slack above 1/2 reached
  // 0.88 of its bar in 1000 seeds: a corpus with many short documents has many such chunks).
  {
    const double n = static_cast<double>(t.samples), r = static_cast<double>(t.random_next);
    const double lo = n / 2, hi = (n + static_cast<double>(t.one_sentence_a)) / 2;
    const double five_sigma = 5 * std::sqrt(n / 4);
    std::printf("random next: %g of %g, %lld with A inside one sentence\n", r, n,
                static_cast<long long>(t.one_sentence_a));
    test::expect_bound("random next count: distance outside [N/2, (N + n1)/2] / (5 sigma)",
                       std::max({0.0, lo - r, r - hi}) / five_sigma, 1.0);
  }
  // truncate_seq_pair cuts the front or the back with probability 0.5 each.
  expect_fraction(t.front_cuts, t.front_cuts + t.back_cuts, 0.5, 0.02, "front cuts");
  expect_fraction(t.as_mask, t.masked, 0.8, 0, "[MASK]");
  expect_fraction(t.as_original, t.masked, 0.1, 0, "kept");
  expect_fraction(t.as_other, t.masked, 0.1, 0, "random word");
  test::expect_measure("masked fraction of tokens - masked_lm_prob",
                       std::abs(static_cast<double>(t.masked) / t.tokens - o.masked_lm_prob), 0.02);
}

TEST(Prepare, OutputIndependentOfThreadsAndDependentOnSeed) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  const Corpus c = make_corpus(dir, rng, {25, 12, 30}, 1, 15, 1, 12);
  std::vector<std::vector<Sample>> runs;
  for (int threads : {1, 2, 3}) {
    PrepareOptions o = base_options(c.files, dir.file("t" + std::to_string(threads)));
    o.threads = threads;
    o.num_shards = 3;
    o.eval_samples = 40;
    o.short_seq_prob = 0.3;
    const PrepareStats st = run_prepare(o);
    EXPECT_EQ(st.eval_samples, 40);
    std::vector<Sample> all = read_train(st, o.max_seq_len);
    const std::vector<Sample> eval = read_samples({st.eval_shard}, o.max_seq_len);
    all.insert(all.end(), eval.begin(), eval.end());
    runs.push_back(all);
  }
  ASSERT_FALSE(runs[0].empty());
  EXPECT_TRUE(runs[0] == runs[1]) << "threads 1 and 2 differ";
  EXPECT_TRUE(runs[0] == runs[2]) << "threads 1 and 3 differ";

  PrepareOptions o = base_options(c.files, dir.file("seed"));
  o.num_shards = 3;
  o.eval_samples = 40;
  o.short_seq_prob = 0.3;
  o.seed ^= 0x5eed;
  const PrepareStats st = run_prepare(o);
  std::vector<Sample> other = read_train(st, o.max_seq_len);
  size_t same = 0;
  for (size_t i = 0; i < std::min(other.size(), runs[0].size()); ++i)
    same += other[i] == runs[0][i];
  // another seed gives other samples
  test::expect_measure("share of samples equal under another seed",
                       static_cast<double>(same) / static_cast<double>(runs[0].size()), 0.1);
}

TEST(Prepare, EvalDocumentsAreDisjointFromTrainAndSpanFiles) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  // Small files, so the eval samples need documents of more than one file.
  const Corpus c = make_corpus(dir, rng, {6, 6, 30}, 4, 10, 3, 8);
  PrepareOptions o = base_options(c.files, dir.file("out"));
  o.eval_samples = 30;
  o.num_shards = 2;
  const PrepareStats st = run_prepare(o);
  ASSERT_EQ(st.eval_samples, 30);
  EXPECT_EQ(st.eval_shard, dir.file("out") + "/eval/eval.h5");
  const std::vector<Sample> eval = read_samples({st.eval_shard}, o.max_seq_len);
  ASSERT_EQ(eval.size(), 30u);
  Tally t;
  std::set<int> eval_docs, train_docs;
  for (const Sample& s : eval)
    for (int d : check_controlled(s, c, o, t, true)) eval_docs.insert(d);
  for (const Sample& s : read_train(st, o.max_seq_len))
    for (int d : check_controlled(s, c, o, t, true)) train_docs.insert(d);
  for (int d : eval_docs) EXPECT_EQ(train_docs.count(d), 0u) << "document " << d << " in both";
  EXPECT_GT(*eval_docs.rbegin(), 5) << "eval should need documents beyond the first file";
  EXPECT_FALSE(train_docs.empty());

  // More than the corpus can give: an error that says so, and no output left behind.
  o.output_dir = dir.file("too-many");
  o.eval_samples = 100000;
  const std::string err = error_of([&] { run_prepare(o); });
  EXPECT_NE(err.find("--eval-samples 100000"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir.file("too-many/train")));
  EXPECT_FALSE(fs::exists(dir.file("too-many/train.incomplete")));
}

TEST(Prepare, ShortSeqProbShortensSamples) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  const Corpus c = make_corpus(dir, rng, {40}, 30, 40, 4, 10);  // documents of ~250 tokens
  auto lengths = [&](double short_seq_prob, const std::string& name) {
    PrepareOptions o = base_options(c.files, dir.file(name));
    o.short_seq_prob = short_seq_prob;
    o.max_seq_len = 64;
    std::vector<int> len;
    for (const Sample& s : read_train(run_prepare(o), o.max_seq_len)) len.push_back(s.length());
    return len;
  };
  auto share = [](const std::vector<int>& v, const std::function<bool(int)>& pred) {
    return static_cast<double>(std::count_if(v.begin(), v.end(), pred)) / v.size();
  };
  const std::vector<int> never = lengths(0.0, "never"), always = lengths(1.0, "always");
  // Target = max: every chunk but a document's last fills the sample, so short samples come
  // from documents' ends and from random nexts that run out of document; targets uniform in
  // [2, 61] put half of them below 32. Held: short_seq_prob 0 makes at most half as large a
  // share of samples below 32 tokens as short_seq_prob 1 (an ignored short_seq_prob gives ~1;
  // the worst over 1000 seeds: docs/testing.md), and short_seq_prob 1 puts at least 0.4 of the
  // samples below 32 tokens (the lowest share in 1000 seeds was 0.48).
  const double short_never = share(never, [](int l) { return l < 32; });
  const double short_always = share(always, [](int l) { return l < 32; });
  std::printf("share of samples below 32 tokens: %.3f with short_seq_prob 0, %.3f with 1\n",
              short_never, short_always);
  test::expect_measure("share of samples < 32 tokens: short_seq_prob 0 / short_seq_prob 1",
                       short_never / short_always, 0.5);
  test::expect_measure("short_seq_prob 1: 1/2 - share of samples < 32 tokens",
                       std::max(0.0, 0.5 - short_always), 0.1);
  EXPECT_GT(always.size(), never.size());
}

TEST(Prepare, MaxPredictionsCapsTheMaskedCount) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  const Corpus c = make_corpus(dir, rng, {30}, 8, 20, 3, 9);
  PrepareOptions o = base_options(c.files, dir.file("out"));
  o.max_seq_len = 128;
  o.max_predictions_per_seq = 5;
  o.masked_lm_prob = 0.3;
  Tally t;
  for (const Sample& s : read_train(run_prepare(o), o.max_seq_len)) {
    check_controlled(s, c, o, t);
    EXPECT_LE(s.num_masked(), 5);
  }
  EXPECT_GT(t.samples, 50);
}

// ---- the demo corpus -------------------------------------------------------------------

// The first `docs` documents of the demo corpus, as a file of its own.
std::string demo_slice(const test::TempDir& dir, int docs) {
  TextReader reader(kDemo);
  std::string chunk, out;
  int blank = 0;
  while (blank < docs && reader.next_chunk(chunk, 1 << 16)) {
    size_t pos = 0;
    while (pos < chunk.size() && blank < docs) {
      const size_t nl = chunk.find('\n', pos);
      const size_t end = nl == std::string::npos ? chunk.size() : nl + 1;
      out.append(chunk, pos, end - pos);
      if (end - pos == 1) ++blank;
      pos = end;
    }
  }
  const std::string path = dir.file("demo-slice.txt");
  write_text(path, out);
  return path;
}

TEST(Prepare, DemoCorpusSamplesAreTextRunsAndWholeWordsMaskTogether) {
  test::TempDir dir;
  const std::string slice = demo_slice(dir, 120);
  // The tokens of every document of the slice, concatenated, to find A and B in.
  std::vector<int32_t> corpus;
  {
    TextReader reader(slice);
    std::string chunk;
    const CorpusTokenizer corpus_tokenizer = CorpusTokenizer::load(kVocab);
    while (reader.next_chunk(chunk, 1 << 20)) {
      TokenizedLines lines;
      tokenize_lines(corpus_tokenizer, chunk, lines);
      corpus.insert(corpus.end(), lines.tokens.begin(), lines.tokens.end());
    }
  }
  auto is_piece = [](int32_t id) { return vocab().token(id).rfind("##", 0) == 0; };

  int64_t partial_words[2] = {0, 0};
  for (bool wwm : {false, true}) {
    PrepareOptions o = base_options({slice}, dir.file(wwm ? "wwm" : "plain"));
    o.max_seq_len = 128;
    o.max_predictions_per_seq = 20;
    o.whole_word_masking = wwm;
    o.dupe_factor = 2;
    const PrepareStats st = run_prepare(o);
    EXPECT_EQ(st.documents, 120);
    const std::vector<Sample> samples = read_train(st, o.max_seq_len);
    ASSERT_GT(samples.size(), 500u);
    int64_t masked = 0, tokens = 0, as_mask = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      const Sample& s = samples[i];
      const Parts p = split(s, o.max_seq_len);
      EXPECT_LE(s.num_masked(), num_to_predict(s.length(), o));
      if (!wwm) {
        EXPECT_EQ(s.num_masked(), num_to_predict(s.length(), o));
      }
      masked += s.num_masked();
      tokens += s.length();
      for (int k = 0; k < s.num_masked(); ++k)
        as_mask += s.input_ids[s.masked_lm_positions[k]] == vocab().mask_id();
      // masked_lm_ids are the original text: A and B (masking undone) occur in the corpus.
      if (i < 200) {
        for (const auto* seg : {&p.a, &p.b}) {
          const bool found =
              std::search(corpus.begin(), corpus.end(), seg->begin(), seg->end()) != corpus.end();
          ASSERT_TRUE(found) << "sample " << i << ": a segment is not a run of the source text";
        }
      }
      // Words: a piece that is not "##" starts one, "##" pieces directly after extend it.
      std::vector<char> is_masked(s.length(), 0);
      for (int32_t pos : s.masked_lm_positions) is_masked[pos] = 1;
      const int len_a = static_cast<int>(p.a.size());
      auto segment_of = [&](int i2) { return i2 <= len_a + 1 ? 0 : 1; };
      for (int j = 2; j < s.length() - 1; ++j) {
        if (j == len_a + 1 || j == len_a + 2) continue;  // [SEP] and the first token of B
        if (is_piece(p.original[j]) && segment_of(j) == segment_of(j - 1) &&
            is_masked[j] != is_masked[j - 1])
          ++partial_words[wwm];
      }
    }
    test::expect_measure(std::string(wwm ? "whole-word" : "per-piece") +
                             " masking: masked fraction of tokens - masked_lm_prob",
                         std::abs(static_cast<double>(masked) / tokens - o.masked_lm_prob), 0.02);
    expect_fraction(as_mask, masked, 0.8, 0, wwm ? "whole-word [MASK]" : "per-piece [MASK]");
  }
  EXPECT_EQ(partial_words[1], 0) << "whole-word masking split a word";
  EXPECT_GT(partial_words[0], 0) << "without whole-word masking some words should be split "
                                    "(otherwise this test checks nothing)";
}

TEST(TextReader, ChunksAreWholeLinesAndCoverTheFile) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  ASSERT_EQ(test::run_command("gzip -dc '" + kDemo + "' > '" + dir.file("demo.txt") + "'"), 0);
  const std::string demo = test::read_file(dir.file("demo.txt"));
  // A line longer than a chunk, and no '\n' at the end of the file.
  const std::string expected = demo + std::string(5000, 'x') + "\nlast line without newline";
  write_text(dir.file("demo.txt"), expected);
  for (const std::string& path : {dir.file("demo.txt"), kDemo}) {
    const bool gz = path == kDemo;
    TextReader reader(path);
    const size_t max_bytes = std::uniform_int_distribution<size_t>(100, 4000)(rng);
    std::string chunk, all;
    int chunks = 0;
    while (reader.next_chunk(chunk, max_bytes)) {
      ++chunks;
      ASSERT_FALSE(chunk.empty());
      all += chunk;
      if (chunk.back() != '\n') {
        EXPECT_FALSE(reader.next_chunk(chunk, max_bytes)) << "a chunk ended inside a line";
        break;
      }
    }
    EXPECT_TRUE(all == (gz ? demo : expected)) << "the chunks differ from the file";  // no diff
    EXPECT_EQ(reader.bytes_read(), static_cast<int64_t>(all.size()));
    EXPECT_GT(chunks, 1000);
  }
}

TEST(Prepare, WholeDemoCorpusInManyChunksIsThreadIndependent) {
  test::TempDir dir;
  std::vector<Sample> runs[2];
  for (int threads : {1, 2}) {
    PrepareOptions o = base_options({kDemo}, dir.file("t" + std::to_string(threads)));
    o.max_seq_len = 128;
    o.dupe_factor = 1;
    o.eval_samples = 100;
    o.threads = threads;
    const PrepareStats st = run_prepare(o);
    EXPECT_EQ(st.documents, 1189);  // chapters; documents cross the 1 MB reading chunks
    EXPECT_GT(st.input_bytes, 4000000);
    runs[threads - 1] = read_train(st, o.max_seq_len);
    const std::vector<Sample> eval = read_samples({st.eval_shard}, o.max_seq_len);
    runs[threads - 1].insert(runs[threads - 1].end(), eval.begin(), eval.end());
  }
  ASSERT_GT(runs[0].size(), 10000u);
  EXPECT_TRUE(runs[0] == runs[1]);
}

TEST(Prepare, BothFormatsHoldTheSameSamples) {
  test::TempDir dir;
  const std::string slice = demo_slice(dir, 30);
  std::vector<Sample> by_format[2];
  for (ShardFormat format : {ShardFormat::fixed, ShardFormat::var_length}) {
    PrepareOptions o = base_options({slice}, dir.file(to_string(format)));
    o.format = format;
    o.num_shards = 2;
    o.eval_samples = 20;
    const PrepareStats st = run_prepare(o);
    ShardReader reader(st.train_shards[0], rules_for(o.max_seq_len));
    EXPECT_EQ(reader.info().format, format);
    std::vector<Sample>& all = by_format[format == ShardFormat::var_length];
    all = read_train(st, o.max_seq_len);
    const std::vector<Sample> eval = read_samples({st.eval_shard}, o.max_seq_len);
    EXPECT_EQ(eval.size(), 20u);
    all.insert(all.end(), eval.begin(), eval.end());
  }
  ASSERT_FALSE(by_format[0].empty());
  EXPECT_TRUE(by_format[0] == by_format[1]);
}

// ---- errors -------------------------------------------------------------------------------

TEST(Prepare, ErrorsNameTheFileOrOption) {
  std::mt19937_64 rng(test::test_seed());
  test::TempDir dir;
  const Corpus c = make_corpus(dir, rng, {5}, 3, 5, 3, 5, false);
  auto err = [&](const std::function<void(PrepareOptions&)>& edit) {
    static int n = 0;
    PrepareOptions o = base_options(c.files, dir.file("out" + std::to_string(n++)));
    edit(o);
    return error_of([&] { run_prepare(o); });
  };
  auto expect_has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "message: \"" << msg << "\" lacks " << part;
  };

  const std::string missing = dir.file("missing.txt");
  expect_has(err([&](PrepareOptions& o) { o.inputs.push_back(missing); }), missing);

  std::string text = test::read_file(c.files[0]);
  const std::string gz = dir.file("good.txt.gz");
  write_gz(gz, text + text + text);
  const std::string gz_bytes = test::read_file(gz);
  const std::string truncated = dir.file("truncated.txt.gz");
  write_text(truncated, gz_bytes.substr(0, gz_bytes.size() / 2));
  expect_has(err([&](PrepareOptions& o) { o.inputs = {c.files[0], truncated}; }), truncated);
  std::string flipped = gz_bytes;
  for (size_t i = 20; i < flipped.size() - 10; i += 7)
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
  const std::string corrupt = dir.file("corrupt.txt.gz");
  write_text(corrupt, flipped);
  expect_has(err([&](PrepareOptions& o) { o.inputs = {corrupt}; }), corrupt);
  // Failing while other files are in flight: the first error is the one reported.
  expect_has(err([&](PrepareOptions& o) {
               o.inputs = {kDemo, corrupt, kDemo, c.files[0]};
             }),
             corrupt);
  const std::string not_gz = dir.file("plain.txt.gz");
  write_text(not_gz, text);
  expect_has(err([&](PrepareOptions& o) { o.inputs = {not_gz}; }), not_gz);
  expect_has(err([&](PrepareOptions& o) { o.inputs = {dir.path()}; }), dir.path());

  const std::string empty = dir.file("empty.txt");
  write_text(empty, "\n\n  \n");
  expect_has(err([&](PrepareOptions& o) { o.inputs = {empty}; }), "no text");

  const std::string bad_vocab = dir.file("missing-vocab.txt");
  expect_has(err([&](PrepareOptions& o) { o.vocab = bad_vocab; }), bad_vocab);

  expect_has(err([](PrepareOptions& o) { o.max_seq_len = 4; }), "--max-seq-len 4");
  expect_has(err([](PrepareOptions& o) { o.num_shards = 0; }), "--num-shards");
  expect_has(err([](PrepareOptions& o) { o.dupe_factor = 0; }), "--dupe-factor");
  expect_has(err([](PrepareOptions& o) { o.masked_lm_prob = 1.5; }), "--masked-lm-prob");
  expect_has(err([](PrepareOptions& o) { o.inputs.clear(); }), "--input");

  // A failed run leaves nothing that looks like shards.
  EXPECT_FALSE(fs::exists(dir.file("out1/train")));
  EXPECT_FALSE(fs::exists(dir.file("out1/train.incomplete")));

  // An earlier run's shards are never overwritten or mixed with new ones.
  PrepareOptions o = base_options(c.files, dir.file("twice"));
  run_prepare(o);
  const std::string again = error_of([&] { run_prepare(o); });
  expect_has(again, dir.file("twice") + "/train");
  expect_has(again, "earlier run");
}

TEST(Prepare, BinaryPreparesShardsThatInspectAccepts) {
  test::TempDir dir;
  const std::string slice = demo_slice(dir, 40);
  const std::string out = dir.file("out");
  std::string log;
  const std::string prepare = kBin + " prepare --input " + slice + " --vocab " + kVocab +
                              " --output " + out +
                              " --max-seq-len 128 --dupe-factor 2 "
                              "--num-shards 2 --eval-samples 25 --format varlength --threads 2";
  ASSERT_EQ(test::run_command(prepare, &log), 0) << log;
  EXPECT_NE(log.find("40 documents"), std::string::npos) << log;
  ASSERT_EQ(test::run_command(kBin + " inspect " + out + "/train --vocab " + kVocab, &log), 0)
      << log;
  ASSERT_EQ(test::run_command(kBin + " inspect " + out + "/eval --vocab " + kVocab, &log), 0)
      << log;
  EXPECT_NE(log.find("25"), std::string::npos) << log;
  // A second run into the same directory is refused with a non-zero exit status.
  EXPECT_NE(test::run_command(prepare, &log), 0);
  EXPECT_NE(log.find("earlier run"), std::string::npos) << log;
}

}  // namespace
}  // namespace packbert
