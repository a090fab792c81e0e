// Multi-rank driver of the DataLoader tests (tests/CMakeLists.txt runs it under mpirun,
// check_loader.py judges what it wrote).
//
//   mpi_loader_driver write DIR [--shards S] [--min-rows A] [--max-rows B] [--max-len L]
//                               [--garbage I] [--bad-sample I:ROW]
//     Writes S shards of random sizes in [A, B] and DIR/manifest.txt (seed, sizes). The seed is
//     PACKBERT_TEST_SEED or fresh; every sample is a function of (seed, shard, row), so a run
//     can check the payload it receives without reading the files. --garbage replaces shard I
//     by text; --bad-sample puts a token outside the vocabulary into row ROW of shard I.
//
//   mpi_loader_driver run DIR --out PREFIX [--epochs E | --steps N] [--batch B] [--micro M]
//                             [--prefetch K] [--jitter] [--resume FILE] [--save FILE]
//                             [--policy partial|drop] [--fail-rank R --fail-step S]
//                             [--dynamic-masking]
//     Every rank trains (pretends to) until the global step reaches E epochs or N steps and
//     writes PREFIX.rank<r>.txt: per step a header line and one line of sample ids per
//     micro-batch. Each step also all-reduces the sample counts over MPI_COMM_WORLD (as the
//     gradient all-reduce would, concurrently with the loader's own communicator) and checks
//     payloads, packs and global counts. --save writes the position after the last step;
//     --resume starts from one. --jitter sleeps randomly between steps; --fail-rank makes one
//     rank's "trainer" throw at a step (the others must not hang). --dynamic-masking masks
//     every sample again as it is read (LoaderOptions::masking: 30%, Bernoulli, whole words,
//     data/vocab.txt); each sample id is then written "ID:HASH", HASH over its masked tokens,
//     positions and labels, so that check_loader.py compares the masks themselves.
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/base/error.h"
#include "driver_args.h"
#include "data/loader/epoch_order.h"
#include "data/loader/loader.h"
#include "data/masking/masking.h"
#include "data/prepare/tokenizer.h"
#include "data/shards/shard.h"
#include "shard_test_util.h"

namespace {

using namespace packbert;

constexpr int kMaxPredictions = 12;

using Args = test::DriverArgs;

// The sample at (shard, row): a function of the seed alone.
Sample make_sample(uint64_t seed, int64_t shard, int64_t row, int max_len) {
  std::mt19937_64 rng(
      OrderRng(seed, 0x73616d706c65, static_cast<uint64_t>(shard), static_cast<uint64_t>(row))
          .next());
  return test::random_sample(rng, 5, max_len, kMaxPredictions);
}

std::string shard_path(const std::string& dir, int64_t i) {
  return fmt::format("{}/shard_{:03d}.h5", dir, i);
}

void write_mode(const Args& a) {
  const uint64_t seed = test::test_seed();
  const int64_t shards = a.num("shards", 7), lo = a.num("min-rows", 40),
                hi = a.num("max-rows", 260);
  const int max_len = static_cast<int>(a.num("max-len", 64));
  std::filesystem::remove_all(a.dir);
  std::filesystem::create_directories(a.dir);
  std::mt19937_64 rng(seed);
  std::ofstream manifest(a.dir + "/manifest.txt");
  manifest << "seed " << seed << "\nmax_len " << max_len << "\nrow_bits " << kSampleRowBits
           << "\nsizes";
  int64_t bad_shard = -1, bad_row = -1;
  if (a.has("bad-sample")) {
    const std::string v = a.str("bad-sample", "");
    bad_shard = std::stoll(v.substr(0, v.find(':')));
    bad_row = std::stoll(v.substr(v.find(':') + 1));
  }
  for (int64_t i = 0; i < shards; ++i) {
    const int64_t n = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
    manifest << " " << n;
    std::vector<Sample> samples;
    for (int64_t r = 0; r < n; ++r) samples.push_back(make_sample(seed, i, r, max_len));
    if (i == a.num("garbage", -1)) {
      std::ofstream(shard_path(a.dir, i)) << "this is not an HDF5 file\n";
    } else if (i == bad_shard) {
      std::vector<test::RawDataset> raw =
          test::raw_fixed(samples, max_len, kMaxPredictions, H5T_STD_I32LE);
      test::find_dataset(raw, "input_ids").values[static_cast<size_t>(bad_row * max_len + 1)] =
          40000;  // outside BERT's 30522 tokens
      test::write_raw_h5(shard_path(a.dir, i), raw);
    } else {
      ShardWriteOptions w;
      w.max_seq_len = max_len;
      w.max_predictions = kMaxPredictions;
      write_shard(shard_path(a.dir, i), samples, w);
    }
  }
  manifest << "\n";
}

std::map<std::string, std::string> read_manifest(const std::string& dir) {
  std::ifstream f(dir + "/manifest.txt");
  PB_REQUIRE(f.good(), "{}/manifest.txt is missing (run the write mode first)", dir);
  std::map<std::string, std::string> m;
  std::string key, rest;
  while (f >> key && std::getline(f, rest)) m[key] = rest;
  return m;
}

// With dynamic masking the shard's sample with its masks undone (the tokens, segments and label
// must be the shard's; the masks are the loader's).
bool same_payload(const Sample& got, Sample want, bool masked_again) {
  if (!masked_again) return got == want;
  Sample g = got;
  unmask(g);
  unmask(want);
  return g == want && got.num_masked() <= kMaxPredictions;
}

// FNV-1a over the masked tokens, the positions and the labels: what the masks are.
uint64_t mask_hash(const Sample& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto add = [&h](const std::vector<int32_t>& v) {
    for (const int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull;
    h = (h ^ 0xffffffffull) * 0x100000001b3ull;
  };
  add(s.input_ids);
  add(s.masked_lm_positions);
  add(s.masked_lm_ids);
  return h;
}

void check_step(const StepBatch& b, const LoaderOptions& o, uint64_t seed) {
  PB_REQUIRE(b.micro_batches.size() == static_cast<size_t>(o.micro_steps),
             "step {}: {} micro-batches", b.step, b.micro_batches.size());
  for (const LoaderMicroBatch& mb : b.micro_batches) {
    std::vector<int> used(mb.samples.size(), 0);
    for (const Sample& s : mb.samples)
      PB_REQUIRE(
          same_payload(s,
                       make_sample(seed, sample_id_shard(s.id), sample_id_row(s.id), o.max_seq_len),
                       o.masking != nullptr),
          "step {}: the payload of sample {} differs from the shard's", b.step, s.id);
    for (const auto& pack : mb.packs) {
      int len = 0;
      for (const int32_t i : pack) {
        ++used.at(static_cast<size_t>(i));
        len += mb.samples.at(static_cast<size_t>(i)).length();
      }
      PB_REQUIRE(len <= o.max_seq_len && static_cast<int>(pack.size()) <= o.max_seqs_per_pack,
                 "step {}: a pack of {} sequences, {} tokens", b.step, pack.size(), len);
    }
    for (const int u : used) PB_REQUIRE(u == 1, "step {}: a sample in {} packs", b.step, u);
  }
}

void run_mode(const Args& a, int rank, int size) {
  const std::map<std::string, std::string> manifest = read_manifest(a.dir);
  const uint64_t seed = std::stoull(manifest.at("seed"));
  LoaderOptions o;
  o.global_batch_size = a.num("batch", 64);
  o.micro_steps = static_cast<int>(a.num("micro", 2));
  o.max_seq_len = std::stoi(manifest.at("max_len"));
  o.max_seqs_per_pack = 3;
  o.seed = seed ^ 0x5eed;
  o.prefetch_steps = static_cast<int>(a.num("prefetch", 2));
  o.shuffle_block_rows = a.num("block-rows", 32);
  o.shuffle_window_blocks = a.num("window-blocks", 3);
  o.last_step = parse_last_step_policy(a.str("policy", "partial"));
  if (a.has("dynamic-masking")) {
    auto m = std::make_shared<LoaderOptions::Masking>();
    m->rule = mask_rule(0.3, kMaxPredictions, MaskCount::bernoulli, true, 0.8, 0.1);
    m->vocab = mask_vocab(Vocab::load(std::string(PACKBERT_REPO_DATA) + "/vocab.txt"));
    o.masking = m;
  }
  std::optional<LoaderPosition> resume;
  if (a.has("resume")) {
    std::ifstream f(a.str("resume", ""));
    std::stringstream ss;
    ss << f.rdbuf();
    resume = loader_position_from_json(ss.str());
  }
  DataLoader loader(MPI_COMM_WORLD, {a.dir}, o, resume);
  const int64_t last =
      a.has("steps") ? a.num("steps", 0) : a.num("epochs", 2) * loader.steps_per_epoch();
  std::ofstream out(fmt::format("{}.rank{}.txt", a.str("out", "loader"), rank));
  out << "# np " << size << " rank " << rank << " seed " << seed << "\n";
  std::mt19937 jitter(static_cast<unsigned>(rank + 1));
  double waited = 0;
  int64_t samples = 0;
  for (int64_t step = loader.position().step; step < last; ++step) {
    if (step == a.num("fail-step", -1) && rank == a.num("fail-rank", -1))
      PB_THROW("injected failure of rank {}'s trainer at step {}", rank, step);
    const StepBatch b = loader.next();
    PB_REQUIRE(b.step == step, "got step {} where {} was expected", b.step, step);
    check_step(b, o, seed);
    // The trainer's all-reduce: the ranks' samples add up to the step's global count.
    int64_t local[2] = {b.num_samples(), 0}, global[2] = {0, 0};
    for (const LoaderMicroBatch& mb : b.micro_batches) local[1] += mb.masked_tokens;
    MPI_Allreduce(local, global, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    PB_REQUIRE(global[0] == b.global_samples && global[1] == b.global_masked_tokens,
               "step {}: ranks hold {} samples / {} masked, the plan says {} / {}", step, global[0],
               global[1], b.global_samples, b.global_masked_tokens);
    out << "step " << b.step << " epoch " << b.epoch << " begin " << b.epoch_begin << " end "
        << b.epoch_end << " global " << b.global_samples << "\n";
    for (size_t m = 0; m < b.micro_batches.size(); ++m) {
      out << "mb " << m;
      for (const Sample& s : b.micro_batches[m].samples) {
        out << " " << s.id;
        if (o.masking) out << ":" << fmt::format("{:016x}", mask_hash(s));
      }
      out << "\n";
    }
    waited += b.wait_seconds;
    samples += b.num_samples();
    if (a.has("jitter")) std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 4000));
  }
  if (a.has("save") && rank == 0) {
    std::ofstream(a.str("save", "")) << loader_position_to_json(loader.position()) << "\n";
  }
  std::cout << fmt::format("[rank {}] {} steps to {}, {} samples, exposed wait {:.3f} s\n", rank,
                           last, loader_position_to_json(loader.position()), samples, waited);
}

}  // namespace

int main(int argc, char** argv) {
  return packbert::test::run_driver(argc, argv, "mpi_loader_driver write|run DIR [options]",
                                    {"jitter", "dynamic-masking"}, write_mode, run_mode);
}
