// `packbert prepare`: Google's create_pretraining_data.py, streamed per input file.
//
// Pipeline. Each input file is a background task on the pool: it reads the text in 1 MB chunks
// of whole lines, tokenizes the chunks in parallel (foreground tasks), keeps the documents as
// uint16 token ids, holds out eval documents, plans the instances of every dupe round and
// shuffles the plans. The calling thread writes the files strictly in input order: it
// materializes each file's plans in parallel blocks (truncation, masking) and appends the
// samples round-robin to the training shards. At most `threads` files are in flight, so memory
// stays near `threads` tokenized files (plus 20 bytes per planned instance).
//
// Determinism. Every random choice is keyed by (seed, file index, round, document or instance
// index), shards are written in file order, and chunk/block sizes do not depend on the thread
// count: every shard holds the same samples in the same order for any --threads (the .h5 bytes
// differ only where HDF5 records object modification times). `threads` counts the pool's
// workers; the calling thread only writes shards (HDF5 is not thread-safe here) and waits.
//
// Deviations from Google's script:
//  - the random next sentence comes from a document of the same input file, not of the whole
//    corpus (a global pool would need the whole corpus in memory);
//  - instances are shuffled within their input file (all rounds together), not globally;
//    consecutive samples of a shard come from the same file, as with NVIDIA's per-file shards;
//  - a random replacement token is never [PAD], [CLS], [SEP] or [MASK];
//  - with whole-word masking a "##" piece joins the previous candidate only when it directly
//    follows it (Google also joins a "##" that starts B to the last word of A).
#include "data/prepare/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <memory>
#include <numeric>
#include <thread>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "kernels/base/error.h"
#include "data/prepare/instances.h"
#include "data/prepare/task_pool.h"
#include "data/prepare/text_input.h"
#include "data/prepare/corpus_tokenizer.h"

namespace packbert {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunkBytes = 1 << 20;  // text per tokenization task
constexpr size_t kBlockSamples = 2048;   // instances per materialization task

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

template <typename T>
void shuffle_with(std::vector<T>& v, Rng rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// Everything about one input file, from its text to its shuffled instance plans.
struct FileJob {
  int index = 0;
  std::string path;
  TaskPool::Group group;  // the file's background task
  Clock::time_point start;
  int64_t text_bytes = 0;
  std::atomic<int64_t> bad_lines{0};  // JSONL lines skipped
  DocumentStore docs;
  uint32_t eval_docs = 0;
  std::vector<Sample> eval_samples;
  std::vector<InstancePlan> train_plans;
};

struct Context {
  Context(const PrepareOptions& o, const InstanceConfig& c, const CorpusTokenizer& t)
      : opts(o), cfg(c), tokenizer(t) {
    eval_cfg = cfg;
    eval_cfg.masks = true;  // evaluation reads fixed masks, with or without training's
  }
  const PrepareOptions& opts;
  const InstanceConfig& cfg;
  InstanceConfig eval_cfg;
  const CorpusTokenizer& tokenizer;
  TaskPool* pool = nullptr;
  int num_files = 0;
  size_t chunks_in_flight = 2;  // per file
  // eval_left_after[f]: eval samples still needed after file f held out its documents; -1
  // until file f has decided. File f waits for f - 1, so the held-out documents do not depend
  // on which file finishes reading first.
  std::unique_ptr<std::atomic<int64_t>[]> eval_left_after;
  std::atomic<int64_t> documents_so_far{0};
};

void read_documents(Context& ctx, FileJob& job) {
  struct Chunk {
    std::string text;
    TokenizedLines lines;
    TaskPool::Group group;
  };
  TextReader reader(job.path);
  const bool jsonl = reads_as_jsonl(ctx.opts.input_format, job.path);
  const JsonlOptions jsonl_options{ctx.opts.text_field, ctx.opts.skip_bad_lines};
  int64_t next_line = 1;  // of the file, at the start of the next chunk (JSONL errors name it)
  std::deque<std::unique_ptr<Chunk>> in_flight;
  DrainOnExit<decltype(in_flight)> guard(*ctx.pool, in_flight);
  DocumentStore& docs = job.docs;
  Clock::time_point last_log = Clock::now();

  bool more = true;
  while (more || !in_flight.empty()) {
    if (more && in_flight.size() < ctx.chunks_in_flight) {
      auto c = std::make_unique<Chunk>();
      more = reader.next_chunk(c->text, kChunkBytes);
      if (!more) continue;
      Chunk* p = c.get();
      const int64_t first_line = next_line;
      next_line += std::count(p->text.begin(), p->text.end(), '\n');
      ctx.pool->submit(p->group, [&ctx, &job, &jsonl_options, p, jsonl, first_line] {
        if (jsonl) {  // into the lines format first: a document's lines, then a blank line
          std::string lines;
          job.bad_lines += jsonl_to_lines(p->text, job.path, first_line, jsonl_options, lines);
          p->text.swap(lines);
        }
        tokenize_lines(ctx.tokenizer, p->text, p->lines);
        std::string().swap(p->text);
      });
      in_flight.push_back(std::move(c));
      continue;
    }
    // Chunks are absorbed in file order: sentence and document boundaries cross chunks.
    Chunk& c = *in_flight.front();
    ctx.pool->wait(c.group, true);
    size_t offset = 0;
    for (int32_t n : c.lines.line_tokens) {
      if (n == TokenizedLines::kBlankLine) {
        docs.end_document();
      } else if (n > 0) {
        docs.add_sentence(c.lines.tokens.data() + offset, static_cast<size_t>(n));
        offset += static_cast<size_t>(n);
      }
    }
    in_flight.pop_front();
    if (seconds_since(last_log) > 30) {  // big files take minutes; say that work goes on
      spdlog::info("{}: {:.0f} MB read, {} documents so far", job.path, reader.bytes_read() / 1e6,
                   docs.num_docs());
      last_log = Clock::now();
    }
  }
  docs.end_document();
  job.text_bytes = reader.bytes_read();
}

// Holds out documents of this file for eval while samples are still needed, in a shuffled
// order, and returns which documents were held out. Runs after file index - 1 decided.
std::vector<uint8_t> hold_out_eval(Context& ctx, FileJob& job) {
  const PrepareOptions& o = ctx.opts;
  const int f = job.index;
  const uint32_t num_docs = job.docs.num_docs();
  std::vector<uint8_t> held_out(num_docs, 0);
  int64_t need = o.eval_samples;
  if (f > 0) {
    std::atomic<int64_t>& prev = ctx.eval_left_after[f - 1];
    ctx.pool->wait_for([&] { return prev.load() >= 0; }, true);
    need = prev.load();
  }
  int64_t taken = 0;
  if (need > 0 && num_docs > 0) {
    std::vector<uint32_t> order(num_docs);
    std::iota(order.begin(), order.end(), 0u);
    shuffle_with(order, Rng(o.seed, {kRngDocShuffle, uint64_t(f)}));
    auto structure = [&](uint32_t d) {
      return Rng(o.seed, {kRngStructure, uint64_t(f), kEvalRound, d});
    };
    auto random_doc = [&](uint32_t d) {
      return Rng(o.seed, {kRngRandomDoc, uint64_t(f), kEvalRound, d});
    };
    // Counting needs no pool, so documents are held out until their instances cover `need`.
    std::vector<uint32_t> reserved;
    int64_t available = 0;
    for (uint32_t d : order) {
      if (available >= need) break;
      reserved.push_back(d);
      available += static_cast<int64_t>(plan_document(job.docs, d, nullptr, 0, ctx.eval_cfg,
                                                      structure(d), random_doc(d), nullptr));
    }
    std::vector<InstancePlan> plans;
    for (uint32_t d : reserved) {
      plan_document(job.docs, d, reserved.data(), reserved.size(), ctx.eval_cfg, structure(d),
                    random_doc(d), &plans);
      held_out[d] = 1;
    }
    shuffle_with(plans, Rng(o.seed, {kRngPlanShuffle, uint64_t(f), kSplitEval}));
    plans.resize(static_cast<size_t>(std::min<int64_t>(need, static_cast<int64_t>(plans.size()))));
    job.eval_samples.resize(plans.size());
    MaskScratch scratch;
    for (size_t k = 0; k < plans.size(); ++k)
      materialize(job.docs, plans[k], ctx.eval_cfg,
                  Rng(o.seed, {kRngMaterialize, uint64_t(f), kSplitEval, k}), job.eval_samples[k],
                  scratch);
    job.eval_docs = static_cast<uint32_t>(reserved.size());
    taken = static_cast<int64_t>(plans.size());
  }
  const int64_t docs_total = ctx.documents_so_far.fetch_add(num_docs) + num_docs;
  ctx.eval_left_after[f].store(std::max<int64_t>(need, 0) - taken);
  ctx.pool->notify();
  if (f == ctx.num_files - 1 && need - taken > 0)
    PB_THROW(
        "--eval-samples {}: the inputs cannot supply that many eval samples (holding out "
        "all {} documents gives {}); lower --eval-samples or add text",
        o.eval_samples, docs_total, o.eval_samples - (need - taken));
  return held_out;
}

void process_file(Context& ctx, FileJob& job) {
  job.start = Clock::now();
  read_documents(ctx, job);
  spdlog::debug("{}: {:.1f} MB of text, {} documents, {} sentences, {} tokens, read in {:.1f} s",
                job.path, job.text_bytes / 1e6, job.docs.num_docs(), job.docs.num_sentences(),
                job.docs.tokens.size(), seconds_since(job.start));

  const Clock::time_point planning = Clock::now();
  const std::vector<uint8_t> held_out = hold_out_eval(ctx, job);
  std::vector<uint32_t> train_docs;  // also the pool random next sentences come from
  for (uint32_t d = 0; d < job.docs.num_docs(); ++d)
    if (!held_out[d]) train_docs.push_back(d);

  const PrepareOptions& o = ctx.opts;
  const uint64_t f = static_cast<uint64_t>(job.index);
  auto& plans = job.train_plans;
  for (int r = 0; r < o.dupe_factor; ++r) {
    if (ctx.pool->cancelled()) throw TaskPool::Cancelled();
    for (uint32_t d : train_docs)
      plan_document(job.docs, d, train_docs.data(), train_docs.size(), ctx.cfg,
                    Rng(o.seed, {kRngStructure, f, uint64_t(r), d}),
                    Rng(o.seed, {kRngRandomDoc, f, uint64_t(r), d}), &plans);
    // Every round gives about as many instances as the first: reserve once, not by doubling,
    // which would briefly need twice the memory for a large file.
    if (r == 0) plans.reserve(plans.size() * o.dupe_factor + plans.size() / 8 + 16);
  }
  plans.shrink_to_fit();
  shuffle_with(plans, Rng(o.seed, {kRngPlanShuffle, f, kSplitTrain}));
  spdlog::debug("{}: {} training instances planned in {:.1f} s", job.path, plans.size(),
                seconds_since(planning));
}

InstanceConfig make_instance_config(const PrepareOptions& o, const CorpusTokenizer& tokenizer) {
  InstanceConfig c;
  c.masks = o.masks == PrepareMasks::static_masks;
  c.documents = o.samples == PrepareSamples::documents;
  c.max_seq_len = o.max_seq_len;
  c.max_predictions = o.max_predictions_per_seq;
  c.masked_lm_prob = o.masked_lm_prob;
  c.short_seq_prob = o.short_seq_prob;
  c.whole_word_masking = o.whole_word_masking;
  c.cls_id = tokenizer.meta().cls_id;
  c.sep_id = tokenizer.meta().sep_id;
  // Google draws random words from the whole vocabulary; [CLS]/[SEP] in the middle of a sample
  // would break the [CLS] A [SEP] B [SEP] structure the shard rules check, [PAD]/[MASK] are
  // noise: mask_vocab leaves them (and a tokenizer.json's other special tokens) out.
  c.mask_vocab = tokenizer.mask_vocab();
  return c;
}

void validate(const PrepareOptions& o) {
  PB_REQUIRE(!o.inputs.empty(), "prepare: no --input file given");
  PB_REQUIRE(!o.output_dir.empty(), "prepare: --output is empty");
  PB_REQUIRE(
      o.max_seq_len >= 5,
      "--max-seq-len {}: too small, a sample needs at least 5 tokens ([CLS] A [SEP] B [SEP])",
      o.max_seq_len);
  PB_REQUIRE(o.max_predictions_per_seq >= 1, "--max-predictions-per-seq {}: must be at least 1",
             o.max_predictions_per_seq);
  PB_REQUIRE(o.masked_lm_prob >= 0 && o.masked_lm_prob <= 1,
             "--masked-lm-prob {}: must be in [0, 1]", o.masked_lm_prob);
  PB_REQUIRE(o.short_seq_prob >= 0 && o.short_seq_prob <= 1,
             "--short-seq-prob {}: must be in [0, 1]", o.short_seq_prob);
  PB_REQUIRE(o.dupe_factor >= 1, "--dupe-factor {}: must be at least 1", o.dupe_factor);
  PB_REQUIRE(o.dupe_factor == 1 || o.samples == PrepareSamples::pairs ||
                 o.masks == PrepareMasks::static_masks,
             "--dupe-factor {}: with --samples documents and --masks none every copy of a "
             "document is the same samples; use --dupe-factor 1 (the trainer's dynamic masking "
             "masks each epoch anew)",
             o.dupe_factor);
  PB_REQUIRE(o.num_shards >= 1, "--num-shards {}: must be at least 1", o.num_shards);
  PB_REQUIRE(o.eval_samples >= 0, "--eval-samples {}: must not be negative", o.eval_samples);
  PB_REQUIRE(o.threads >= 0, "--threads {}: must not be negative", o.threads);
  for (const std::string& path : o.inputs) check_input_file(path);
}

bool non_empty_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && !fs::is_empty(p, ec);
}

// Output layout: DIR/train/part-00000-of-0000N.h5 and DIR/eval/eval.h5. They are written to
// DIR/train.incomplete and DIR/eval.incomplete and renamed at the end, so a failed or killed
// run never leaves shards that look finished. Existing non-empty train/ or eval/ directories
// are never overwritten: stale shards (say, of a run with more --num-shards) would otherwise
// be read together with the new ones.
struct OutputDirs {
  fs::path train, eval, train_tmp, eval_tmp;
  bool has_eval = false;

  explicit OutputDirs(const PrepareOptions& o) {
    const fs::path root(o.output_dir);
    train = root / "train";
    eval = root / "eval";
    train_tmp = root / "train.incomplete";
    eval_tmp = root / "eval.incomplete";
    has_eval = o.eval_samples > 0;
    for (const fs::path& p : {train, eval})
      PB_REQUIRE(!non_empty_dir(p),
                 "--output {}: {} already holds files from an earlier run; remove it or choose "
                 "another --output directory",
                 o.output_dir, p.string());
    std::error_code ec;
    fs::create_directories(root, ec);
    PB_REQUIRE(!ec && fs::is_directory(root), "--output {}: cannot create the directory: {}",
               o.output_dir, ec.message());
    for (const fs::path& p : {train_tmp, eval_tmp}) fs::remove_all(p, ec);  // a crashed run's
    fs::create_directories(train_tmp, ec);
    PB_REQUIRE(!ec, "--output {}: cannot create {}: {}", o.output_dir, train_tmp.string(),
               ec.message());
    if (has_eval) {
      fs::create_directories(eval_tmp, ec);
      PB_REQUIRE(!ec, "--output {}: cannot create {}: {}", o.output_dir, eval_tmp.string(),
                 ec.message());
    }
  }
  void abandon() noexcept {
    std::error_code ec;
    fs::remove_all(train_tmp, ec);
    fs::remove_all(eval_tmp, ec);
  }
  void commit() {
    auto move = [](const fs::path& from, const fs::path& to) {
      std::error_code ec;
      fs::remove(to, ec);  // an empty directory left by hand; non-empty ones were refused
      fs::rename(from, to, ec);
      PB_REQUIRE(!ec, "cannot rename {} to {}: {}", from.string(), to.string(), ec.message());
    };
    move(train_tmp, train);
    if (has_eval) move(eval_tmp, eval);
  }
};

std::string shard_name(int i, int n) { return fmt::format("part-{:05d}-of-{:05d}.h5", i, n); }

void run_pipeline(const PrepareOptions& o, const InstanceConfig& cfg, const CorpusTokenizer& tok,
                  const OutputDirs& dirs, int threads, PrepareStats& stats) {
  // Every shard stays open (round-robin), each buffering chunk_samples rows: keep the buffers
  // of all shards together near 256 MB when there are many shards.
  ShardWriteOptions wo;
  wo.format = o.format;
  wo.max_seq_len = o.max_seq_len;
  wo.max_predictions = o.max_predictions_per_seq;
  wo.meta = tok.meta();
  wo.meta.samples = o.samples == PrepareSamples::documents ? "documents" : "pairs";
  ShardWriteOptions eval_wo = wo;
  eval_wo.meta.masks = "static";
  wo.meta.masks = cfg.masks ? "static" : "none";
  const double row_bytes = 6.0 * o.max_seq_len + 8.0 * o.max_predictions_per_seq + 16;
  wo.chunk_samples = static_cast<int>(
      std::clamp(256e6 / (row_bytes * o.num_shards), 64.0, static_cast<double>(wo.chunk_samples)));

  std::vector<std::unique_ptr<ShardWriter>> train;
  for (int i = 0; i < o.num_shards; ++i) {
    stats.train_shards.push_back((dirs.train / shard_name(i, o.num_shards)).string());
    train.push_back(
        std::make_unique<ShardWriter>((dirs.train_tmp / shard_name(i, o.num_shards)).string(), wo));
  }
  std::unique_ptr<ShardWriter> eval;
  if (dirs.has_eval) {
    stats.eval_shard = (dirs.eval / "eval.h5").string();
    eval = std::make_unique<ShardWriter>((dirs.eval_tmp / "eval.h5").string(), eval_wo);
  }

  const int num_files = static_cast<int>(o.inputs.size());
  std::vector<std::unique_ptr<FileJob>> jobs(num_files);
  Context ctx(o, cfg, tok);
  TaskPool pool(threads);  // declared last: joined before the jobs and ctx its tasks use go
  ctx.pool = &pool;
  ctx.num_files = num_files;
  const int files_in_flight = std::min(threads, num_files);
  ctx.chunks_in_flight =
      std::max<size_t>(2, (2 * threads + files_in_flight - 1) / files_in_flight + 1);
  ctx.eval_left_after = std::make_unique<std::atomic<int64_t>[]>(num_files);
  for (int f = 0; f < num_files; ++f) ctx.eval_left_after[f].store(-1);

  auto start_file = [&](int f) {
    jobs[f] = std::make_unique<FileJob>();
    FileJob* job = jobs[f].get();
    job->index = f;
    job->path = o.inputs[f];
    pool.submit(
        job->group, [&ctx, job] { process_file(ctx, *job); }, /*background=*/true);
  };

  try {
    for (int f = 0; f < files_in_flight; ++f) start_file(f);
    int64_t written = 0;  // training samples so far: the round-robin position
    for (int f = 0; f < num_files; ++f) {
      FileJob& job = *jobs[f];
      pool.wait(job.group, /*help=*/false);
      const Clock::time_point writing = Clock::now();
      for (const Sample& s : job.eval_samples) {
        eval->append(s);
        stats.masked_tokens += s.num_masked();
      }
      stats.eval_samples += static_cast<int64_t>(job.eval_samples.size());

      struct Block {
        std::vector<Sample> samples;
        TaskPool::Group group;
      };
      const size_t n = job.train_plans.size();
      std::deque<std::unique_ptr<Block>> blocks;
      DrainOnExit<decltype(blocks)> guard(pool, blocks);
      // Written blocks are reused: their samples keep their vectors' memory, which saves an
      // allocation and a free per vector and sample.
      std::vector<std::unique_ptr<Block>> spare;
      size_t next = 0;  // first plan not yet given to a block
      auto submit_block = [&] {
        std::unique_ptr<Block> b;
        if (spare.empty()) {
          b = std::make_unique<Block>();
        } else {
          b = std::move(spare.back());
          spare.pop_back();
        }
        Block* p = b.get();
        const size_t begin = next, end = std::min(n, next + kBlockSamples);
        next = end;
        pool.submit(p->group, [&o, &cfg, &job, p, begin, end] {
          p->samples.resize(end - begin);
          MaskScratch scratch;
          const DocumentStore& docs = job.docs;
          const std::vector<InstancePlan>& plans = job.train_plans;
          for (size_t k = begin; k < end; ++k) {
            if (k + 16 < end) prefetch_offsets(docs, plans[k + 16]);
            if (k + 8 < end) prefetch_tokens(docs, plans[k + 8]);
            materialize(docs, plans[k], cfg,
                        Rng(o.seed, {kRngMaterialize, uint64_t(job.index), kSplitTrain, k}),
                        p->samples[k - begin], scratch);
          }
        });
        blocks.push_back(std::move(b));
      };
      const size_t max_blocks = 2 * static_cast<size_t>(threads) + 2;
      while (next < n || !blocks.empty()) {
        while (next < n && blocks.size() < max_blocks) submit_block();
        Block& b = *blocks.front();
        pool.wait(b.group, /*help=*/false);
        for (const Sample& s : b.samples) {
          train[written % o.num_shards]->append(s);
          stats.masked_tokens += s.num_masked();
          ++written;
        }
        spare.push_back(std::move(blocks.front()));
        blocks.pop_front();
      }

      spdlog::debug("{}: samples written in {:.1f} s", job.path, seconds_since(writing));
      stats.input_bytes += job.text_bytes;
      stats.documents += job.docs.num_docs();
      stats.bad_lines += job.bad_lines;
      if (job.bad_lines > 0)
        spdlog::warn("{}: {} malformed JSONL line(s) skipped (--skip-bad-lines)", job.path,
                     job.bad_lines.load());
      const double secs = seconds_since(job.start);
      spdlog::info(
          "{} [{}/{}]: {:.1f} MB, {} documents ({} held out for eval), {} training + "
          "{} eval samples, {:.1f} MB/s",
          job.path, f + 1, num_files, job.text_bytes / 1e6, job.docs.num_docs(), job.eval_docs, n,
          job.eval_samples.size(), job.text_bytes / 1e6 / std::max(secs, 1e-9));
      jobs[f].reset();  // frees the file's tokens and plans
      if (f + files_in_flight < num_files) start_file(f + files_in_flight);
    }
    stats.train_samples = written;
  } catch (...) {
    // Report the error that started the failure, not a Cancelled seen by a later wait.
    std::exception_ptr first = pool.first_error();
    pool.cancel();
    if (first) std::rethrow_exception(first);
    throw;
  }

  for (auto& w : train) w->close();
  if (eval) eval->close();
}

}  // namespace

PrepareStats run_prepare(const PrepareOptions& given) {
  const Clock::time_point start = Clock::now();
  PrepareOptions opts = given;
  opts.inputs = expand_inputs(given.inputs);  // directories and globs: their files
  validate(opts);
  const CorpusTokenizer tokenizer = CorpusTokenizer::load(opts.vocab);
  const int64_t vocab_size = tokenizer.meta().vocab_size;
  // Documents keep their ids as uint16 to fit one tokenized input file per thread in memory.
  PB_REQUIRE(vocab_size <= 65536, "tokenizer {}: {} tokens; prepare supports at most 65536",
             opts.vocab, vocab_size);
  PB_REQUIRE(!opts.whole_word_masking || tokenizer.word_pieces(),
             "--whole-word-masking: tokenizer {} is {}; whole words are WordPiece's (\"##\" "
             "pieces)",
             opts.vocab, tokenizer.kind());
  const InstanceConfig cfg = make_instance_config(opts, tokenizer);
  const int threads = opts.threads > 0
                          ? opts.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  spdlog::info(
      "prepare: {} input file(s), tokenizer {} ({}, {} tokens), max_seq_len {}, dupe_factor {}, "
      "{} {} shard(s), {} eval samples, seed {}, {} threads",
      opts.inputs.size(), opts.vocab, tokenizer.kind(), vocab_size, opts.max_seq_len,
      opts.dupe_factor, opts.num_shards, to_string(opts.format), opts.eval_samples, opts.seed,
      threads);

  OutputDirs dirs(opts);
  PrepareStats stats;
  try {
    run_pipeline(opts, cfg, tokenizer, dirs, threads, stats);
    PB_REQUIRE(stats.documents > 0, "prepare: the inputs hold no text (no non-empty line): {}",
               fmt::join(opts.inputs, ", "));
    PB_REQUIRE(stats.train_samples > 0,
               "prepare: no training samples: every document was held out for the {} eval samples",
               opts.eval_samples);
    dirs.commit();
  } catch (...) {
    dirs.abandon();
    throw;
  }
  if (stats.train_samples < opts.num_shards)
    spdlog::warn("prepare: only {} training samples for {} shards: {} shards are empty",
                 stats.train_samples, opts.num_shards, opts.num_shards - stats.train_samples);
  stats.seconds = seconds_since(start);
  return stats;
}

}  // namespace packbert
