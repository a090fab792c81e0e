// DataLoader on one rank (an MPI program of its own: main below initialises MPI): exactly once
// per epoch, the last partial step, payloads and packs, position save/restore, determinism
// under timing, errors. The multi-rank properties are in tests/mpi (mpi_loader_driver).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "data/loader/epoch_order.h"
#include "data/loader/loader.h"
#include "data/shards/shard.h"
#include "shard_test_util.h"

namespace packbert {
namespace {

// Shards written to a temporary directory, with the samples kept for comparison.
struct Dataset {
  test::TempDir dir;
  std::vector<std::vector<Sample>> shards;
  const Sample& sample(int64_t id) const {
    return shards.at(sample_id_shard(id)).at(sample_id_row(id));
  }
  int64_t size() const {
    int64_t n = 0;
    for (const auto& s : shards) n += static_cast<int64_t>(s.size());
    return n;
  }
  std::string file(size_t i) const { return dir.file(fmt::format("shard_{:03d}.h5", i)); }
};

std::unique_ptr<Dataset> make_dataset(const std::vector<int64_t>& sizes, int max_len = 64) {
  auto d = std::make_unique<Dataset>();
  std::mt19937_64 rng(test::test_seed());
  ShardWriteOptions w;
  w.max_seq_len = max_len;
  w.max_predictions = 12;
  for (size_t i = 0; i < sizes.size(); ++i) {
    d->shards.push_back(test::random_samples(rng, static_cast<size_t>(sizes[i]), max_len, 12));
    write_shard(d->file(i), d->shards.back(), w);
  }
  return d;
}

LoaderOptions small_options(int64_t batch) {
  LoaderOptions o;
  o.global_batch_size = batch;
  o.micro_steps = 3;
  o.max_seq_len = 64;
  o.max_seqs_per_pack = 3;
  o.seed = test::test_seed();
  o.shuffle_block_rows = 16;  // many blocks and windows even in a small dataset
  o.shuffle_window_blocks = 3;
  return o;
}

// Checks one single-rank batch against the dataset; returns its sample ids (all micro-batches).
std::vector<int64_t> check_batch(const StepBatch& b, const Dataset& d, const LoaderOptions& o) {
  EXPECT_EQ(b.micro_batches.size(), static_cast<size_t>(o.micro_steps));
  std::vector<int64_t> ids;
  int64_t tokens = 0, masked = 0;
  for (const LoaderMicroBatch& mb : b.micro_batches) {
    std::vector<int> used(mb.samples.size(), 0);
    for (size_t i = 0; i < mb.samples.size(); ++i) {
      const Sample& s = mb.samples[i];
      if (i > 0) {
        EXPECT_LT(mb.samples[i - 1].id, s.id);
      }
      EXPECT_EQ(s, d.sample(s.id)) << "payload of sample " << s.id;
      ids.push_back(s.id);
      tokens += s.length();
      masked += s.num_masked();
    }
    for (const auto& pack : mb.packs) {
      int len = 0;
      EXPECT_LE(static_cast<int>(pack.size()), o.max_seqs_per_pack);
      for (const int32_t i : pack) {
        ++used.at(static_cast<size_t>(i));
        len += mb.samples[static_cast<size_t>(i)].length();
      }
      EXPECT_LE(len, o.max_seq_len);
    }
    for (const int u : used) EXPECT_EQ(u, 1) << "every sample in exactly one pack";
  }
  EXPECT_EQ(b.global_samples, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(b.global_tokens, tokens);
  EXPECT_EQ(b.global_masked_tokens, masked);
  EXPECT_EQ(b.epoch_end - b.epoch_begin, b.global_samples);
  EXPECT_GE(b.wait_seconds, 0.0);
  return ids;
}

std::vector<std::vector<int64_t>> run_steps(DataLoader& loader, int64_t steps, const Dataset& d,
                                            const LoaderOptions& o) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < steps; ++s) out.push_back(check_batch(loader.next(), d, o));
  return out;
}

TEST(DataLoader, EveryEpochTrainsEverySampleOncePartialLastStep) {
  const auto d = make_dataset({200, 37, 0, 113, 1});  // 351: not a multiple of 32
  LoaderOptions o = small_options(32);
  DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
  EXPECT_EQ(loader.num_samples(), 351);
  ASSERT_EQ(loader.steps_per_epoch(), 11);
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> seen;
    for (int64_t s = 0; s < 11; ++s) {
      const StepBatch b = loader.next();
      EXPECT_EQ(b.step, e * 11 + s);
      EXPECT_EQ(b.epoch, e);
      EXPECT_EQ(b.epoch_begin, s * 32);
      EXPECT_EQ(b.global_samples, s < 10 ? 32 : 351 - 320);  // the policy: a short last step
      const std::vector<int64_t> ids = check_batch(b, *d, o);
      seen.insert(seen.end(), ids.begin(), ids.end());
    }
    epochs.push_back(seen);
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "a sample twice";
    EXPECT_EQ(static_cast<int64_t>(seen.size()), d->size()) << "epoch " << e;
  }
  EXPECT_NE(epochs[0], epochs[1]) << "every epoch is shuffled anew";
  const LoaderPosition p = loader.position();
  EXPECT_EQ(p.epoch, 3);
  EXPECT_EQ(p.epoch_cursor, 0);
  EXPECT_EQ(p.step, 33);
}

TEST(DataLoader, DropPolicyKeepsEveryStepFull) {
  const auto d = make_dataset({90, 61});  // 151 = 4 * 32 + 23
  LoaderOptions o = small_options(32);
  o.last_step = LastStepPolicy::drop;
  DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
  ASSERT_EQ(loader.steps_per_epoch(), 4);
  for (int64_t e = 0; e < 2; ++e) {
    std::set<int64_t> seen;
    for (int s = 0; s < 4; ++s) {
      const StepBatch b = loader.next();
      EXPECT_EQ(b.epoch, e);
      EXPECT_EQ(b.global_samples, 32);
      for (const int64_t id : check_batch(b, *d, o)) EXPECT_TRUE(seen.insert(id).second);
    }
    EXPECT_EQ(seen.size(), 128u);
  }
  o.global_batch_size = 152;
  EXPECT_NE(test::error_of([&] {
              DataLoader(MPI_COMM_WORLD, {d->dir.path()}, o);
            }).find("fewer than one global batch"),
            std::string::npos);
}

TEST(DataLoader, ResumedRunContinuesWithTheSameSamples) {
  const auto d = make_dataset({150, 211, 50});  // 411 samples, 9 steps of 48 an epoch
  const LoaderOptions o = small_options(48);
  const int64_t total = 22;
  std::vector<std::vector<int64_t>> straight;
  std::vector<LoaderPosition> positions;
  {
    DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
    positions.push_back(loader.position());
    for (int64_t s = 0; s < total; ++s) {
      straight.push_back(check_batch(loader.next(), *d, o));
      positions.push_back(loader.position());
    }
  }
  for (const int64_t k : {int64_t{0}, int64_t{4}, int64_t{8}, int64_t{9}, int64_t{13}, total}) {
    std::string saved;
    std::vector<std::vector<int64_t>> resumed;
    {
      DataLoader first(MPI_COMM_WORLD, {d->dir.path()}, o);
      resumed = run_steps(first, k, *d, o);
      EXPECT_EQ(first.position(), positions[k]) << "after " << k << " steps";
      saved = loader_position_to_json(first.position());
    }
    const LoaderPosition p = loader_position_from_json(saved);
    EXPECT_EQ(p, positions[k]);
    DataLoader second(MPI_COMM_WORLD, {d->dir.path()}, o, p);
    EXPECT_EQ(second.position(), positions[k]);
    for (int64_t s = k; s < total; ++s) {
      const StepBatch b = second.next();
      EXPECT_EQ(b.step, s);
      resumed.push_back(check_batch(b, *d, o));
      EXPECT_EQ(second.position(), positions[s + 1]);
    }
    EXPECT_EQ(resumed, straight) << "resumed after " << k << " steps";
  }
}

// `steps` steps with options `first`, then, resumed with options `then`, the rest of epoch 0:
// the ids trained in epoch 0, sorted, and the resumed steps (their sizes and ends).
std::vector<int64_t> epoch_across_resume(const Dataset& d, const LoaderOptions& first,
                                         int64_t steps, const LoaderOptions& then,
                                         std::vector<StepBatch>* resumed) {
  std::vector<int64_t> seen;
  LoaderPosition p;
  {
    DataLoader loader(MPI_COMM_WORLD, {d.dir.path()}, first);
    for (const auto& ids : run_steps(loader, steps, d, first))
      seen.insert(seen.end(), ids.begin(), ids.end());
    p = loader.position();
  }
  DataLoader loader(MPI_COMM_WORLD, {d.dir.path()}, then, p);
  for (;;) {
    StepBatch b = loader.next();
    if (b.epoch != 0) break;
    const std::vector<int64_t> ids = check_batch(b, d, then);
    seen.insert(seen.end(), ids.begin(), ids.end());
    resumed->push_back(std::move(b));
  }
  std::sort(seen.begin(), seen.end());
  return seen;
}

TEST(DataLoader, ResumeWithAnotherBatchSizeStillTrainsTheEpochOnce) {
  const auto d = make_dataset({150, 100});
  const LoaderOptions o = small_options(40);
  LoaderOptions then = o;
  then.global_batch_size = 17;
  then.micro_steps = 2;
  std::vector<StepBatch> resumed;
  const std::vector<int64_t> seen = epoch_across_resume(*d, o, 3, then, &resumed);
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(seen.size(), 250u);
}

// Under the drop policy a resume with another batch size can end an epoch's last step past
// floor(n / B) B of the new size: 256 samples in full blocks of 16, windows of 48 positions;
// 3 steps of 36 leave the cursor at 108, and steps of 20 then end at 248, in the window of
// positions 240..255. The reader must have read it (it once stopped at the window of 239).
TEST(DataLoader, DropPolicyResumeWithAnotherBatchSizeReadsTheEpochsTail) {
  const auto d = make_dataset({160, 96});
  LoaderOptions o = small_options(36);
  o.last_step = LastStepPolicy::drop;
  LoaderOptions then = o;
  then.global_batch_size = 20;
  then.micro_steps = 2;
  std::vector<StepBatch> resumed;
  const std::vector<int64_t> seen = epoch_across_resume(*d, o, 3, then, &resumed);
  ASSERT_EQ(resumed.size(), 7u);  // from 108 to 248 in steps of 20
  EXPECT_EQ(resumed.front().epoch_begin, 108);
  for (const StepBatch& b : resumed) EXPECT_EQ(b.global_samples, 20);
  EXPECT_EQ(resumed.back().epoch_end, 248);
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(seen.size(), 248u);
}

TEST(DataLoader, TimingDoesNotChangeTheBatches) {
  const auto d = make_dataset({120, 80, 77});
  LoaderOptions o = small_options(25);
  o.prefetch_steps = 1;
  std::vector<std::vector<int64_t>> slow, fast;
  {
    DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
    std::mt19937 rng(7);
    for (int s = 0; s < 25; ++s) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
      slow.push_back(check_batch(loader.next(), *d, o));
    }
  }
  o.prefetch_steps = 6;
  for (const int ahead : {0, 4}) {  // the reader thread close behind or far ahead
    o.read_ahead_windows = ahead;
    DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the queue fill
    fast = run_steps(loader, 25, *d, o);
    EXPECT_EQ(slow, fast) << "read ahead " << ahead;
  }
}

TEST(DataLoader, StepsLargerThanAShuffleWindow) {
  const auto d = make_dataset({300, 250});
  LoaderOptions o = small_options(130);  // windows hold 48 samples: a step spans 3 to 4
  o.read_ahead_windows = 0;
  DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
  for (int e = 0; e < 2; ++e) {
    std::vector<int64_t> seen;
    for (int s = 0; s < 5; ++s) {
      const std::vector<int64_t> ids = check_batch(loader.next(), *d, o);
      seen.insert(seen.end(), ids.begin(), ids.end());
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
    EXPECT_EQ(seen.size(), 550u);
  }
}

TEST(DataLoader, ResumeRefusesAnotherOrderOrDataset) {
  const auto d = make_dataset({60, 60});
  const LoaderOptions o = small_options(16);
  LoaderPosition p;
  {
    DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
    loader.next();
    p = loader.position();
  }
  LoaderOptions other = o;
  other.seed = o.seed + 1;
  EXPECT_NE(
      test::error_of([&] { DataLoader(MPI_COMM_WORLD, {d->dir.path()}, other, p); }).find("seed"),
      std::string::npos);
  other = o;
  other.shuffle_window_blocks = 5;
  EXPECT_NE(test::error_of([&] {
              DataLoader(MPI_COMM_WORLD, {d->dir.path()}, other, p);
            }).find("shuffle_window_blocks"),
            std::string::npos);
  EXPECT_NE(
      test::error_of([&] { DataLoader(MPI_COMM_WORLD, {d->file(0)}, o, p); }).find("num_shards"),
      std::string::npos);
  EXPECT_NE(test::error_of([] { loader_position_from_json("{\"epoch\": 1}"); }), "");
}

TEST(DataLoader, BadSampleFailsAtTheStepThatNeedsIt) {
  test::TempDir dir;
  std::mt19937_64 rng(test::test_seed());
  const std::vector<Sample> good = test::random_samples(rng, 100, 64, 12);
  ShardWriteOptions w;
  w.max_seq_len = 64;
  w.max_predictions = 12;
  write_shard(dir.file("a.h5"), good, w);
  // Shard b: row 70's first token is outside the vocabulary (int32 datasets hold it).
  std::vector<test::RawDataset> raw = test::raw_fixed(good, 64, 12, H5T_STD_I32LE);
  test::find_dataset(raw, "input_ids").values[70 * 64 + 1] = 40000;
  test::write_raw_h5(dir.file("b.h5"), raw);

  const LoaderOptions o = small_options(10);
  // The first step whose shuffle windows hold the bad row's block is the one that fails.
  const BlockLayout layout({100, 100}, o.shuffle_block_rows);
  const EpochOrder order(layout, o.seed, o.shuffle_window_blocks, 0);
  const int64_t start =
      order.window_begin(order.window_of_block(layout.block_of(make_sample_id(1, 70))));
  const int64_t failing_step = start / 10;

  DataLoader loader(MPI_COMM_WORLD, {dir.path()}, o);
  for (int64_t s = 0; s < failing_step; ++s) EXPECT_EQ(loader.next().step, s);
  const std::string err = test::error_of([&] { loader.next(); });
  EXPECT_NE(err.find(dir.file("b.h5")), std::string::npos) << err;
  EXPECT_NE(err.find("sample 70"), std::string::npos) << err;
  EXPECT_NE(err.find("outside the vocabulary"), std::string::npos) << err;
  EXPECT_EQ(test::error_of([&] { loader.next(); }), err) << "the error stays";
}

TEST(DataLoader, UnreadableShardFailsTheConstructor) {
  const auto d = make_dataset({30});
  std::ofstream(d->dir.file("shard_001.h5")) << "not an HDF5 file at all";
  const std::string err =
      test::error_of([&] { DataLoader(MPI_COMM_WORLD, {d->dir.path()}, small_options(8)); });
  EXPECT_NE(err.find(d->dir.file("shard_001.h5")), std::string::npos) << err;
  EXPECT_NE(test::error_of([&] {
              DataLoader(MPI_COMM_WORLD, {d->dir.file("missing.h5")}, small_options(8));
            }).find("missing.h5"),
            std::string::npos);
}

TEST(DataLoader, SampleLongerThanMaxSeqLenIsAnError) {
  const auto d = make_dataset({40}, 128);
  LoaderOptions o = small_options(8);
  o.max_seq_len = 20;
  DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
  std::string err;
  for (int s = 0; s < 5 && err.empty(); ++s) err = test::error_of([&] { loader.next(); });
  EXPECT_NE(err.find("exceeds max_seq_len 20"), std::string::npos) << err;
  EXPECT_NE(err.find("shard_000.h5"), std::string::npos) << err;
}

TEST(DataLoader, StopsCleanlyWhateverItsState) {
  const auto d = make_dataset({300});
  LoaderOptions o = small_options(8);
  o.prefetch_steps = 3;
  { DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o); }  // before any next()
  {
    DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
    loader.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // queue full, thread waiting
  }
  o.global_batch_size = 0;
  EXPECT_NE(test::error_of([&] {
              DataLoader(MPI_COMM_WORLD, {d->dir.path()}, o);
            }).find("global_batch_size"),
            std::string::npos);
}

// The batch-warmup rule derived another way than batch_warmup.cpp: the largest size start +
// j * multiple whose growth over start is at most the linear growth (final - start) * x / n,
// and the final size from x = n on.
int64_t warmup_size_by_search(const BatchWarmup& w, int64_t final_size, int64_t x) {
  const int64_t n = w.steps > 0 ? w.steps : w.tokens;
  if (x >= n) return final_size;
  int64_t size = w.start;
  while ((size + w.multiple - w.start) * n <= (final_size - w.start) * x) size += w.multiple;
  return size;
}

TEST(BatchWarmup, SizesAreTheLinearGrowthRoundedDownToMultiples) {
  std::mt19937_64 rng(test::test_seed());
  for (int trial = 0; trial < 2000; ++trial) {
    BatchWarmup w;
    w.multiple = std::uniform_int_distribution<int64_t>(1, 12)(rng);
    const int64_t final_size = w.multiple * std::uniform_int_distribution<int64_t>(1, 40)(rng);
    w.start = w.multiple * std::uniform_int_distribution<int64_t>(1, final_size / w.multiple)(rng);
    (trial % 2 ? w.steps : w.tokens) = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    check_batch_warmup(w, final_size, "t");
    const int64_t n = w.steps + w.tokens;
    int64_t previous = 0;
    for (int64_t x = 0; x <= n + 3; ++x) {
      const int64_t b = warmup_batch_size(w, final_size, w.steps > 0 ? x : 0, x);
      ASSERT_EQ(b, warmup_size_by_search(w, final_size, x)) << "x " << x;
      EXPECT_EQ(b % w.multiple, 0);
      EXPECT_GE(b, previous);
      previous = b;
    }
    EXPECT_EQ(warmup_batch_size(w, final_size, 0, 0), w.start);
  }
  // ModernBERT's: 768 to 4608 sequences over 50B tokens, in multiples of 768. Halfway the linear
  // size is 768 + 3840 / 2 = 2688, rounded down to 2304.
  BatchWarmup big{768, 0, 50'000'000'000LL, 768};
  EXPECT_EQ(warmup_batch_size(big, 4608, 0, 25'000'000'000LL), 2304);
  EXPECT_EQ(warmup_batch_size(big, 4608, 0, 49'999'999'999LL), 3840);
  EXPECT_EQ(warmup_batch_size(big, 4608, 0, 50'000'000'000LL), 4608);
  // Inconsistent settings are errors naming the keys.
  for (const BatchWarmup& bad :
       {BatchWarmup{12, 0, 0, 6}, BatchWarmup{12, 5, 5, 6}, BatchWarmup{10, 5, 0, 6},
        BatchWarmup{54, 5, 0, 6}, BatchWarmup{0, 5, 0, 6}})
    EXPECT_NE(test::error_of([&] {
                check_batch_warmup(bad, 48, "train.batch_warmup");
              }).find("train.batch_warmup"),
              std::string::npos);
}

// Under the drop policy every step holds exactly the rule's size, an epoch trains no sample
// twice, and a run resumed in the middle of the warmup continues with the same samples; in
// tokens, the size follows the tokens the steps before it trained.
TEST(DataLoader, BatchWarmupStepsFollowTheRuleAndResumeMidWarmup) {
  const auto d = make_dataset({150, 211, 50});  // 411 samples
  LoaderOptions o = small_options(48);
  o.last_step = LastStepPolicy::drop;
  o.warmup = BatchWarmup{12, 10, 0, 6};
  const int64_t total = 20;
  std::vector<std::vector<int64_t>> straight;
  std::vector<LoaderPosition> positions;
  {
    DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
    std::set<int64_t> seen;
    int64_t epoch = 0;
    for (int64_t s = 0; s < total; ++s) {
      const StepBatch b = loader.next();
      EXPECT_EQ(b.global_samples, warmup_size_by_search(o.warmup, 48, s)) << "step " << s;
      if (b.epoch != epoch) {
        seen.clear();
        epoch = b.epoch;
      }
      straight.push_back(check_batch(b, *d, o));
      for (const int64_t id : straight.back()) EXPECT_TRUE(seen.insert(id).second);
      positions.push_back(loader.position());
    }
    EXPECT_GE(epoch, 1);
  }
  for (const int64_t k : {int64_t{3}, int64_t{7}}) {
    DataLoader second(MPI_COMM_WORLD, {d->dir.path()}, o,
                      loader_position_from_json(loader_position_to_json(positions[k - 1])));
    for (int64_t s = k; s < total; ++s) {
      const StepBatch b = second.next();
      EXPECT_EQ(b.step, s);
      EXPECT_EQ(check_batch(b, *d, o), straight[s]) << "resumed after " << k << ", step " << s;
    }
  }

  o.warmup = BatchWarmup{12, 0, 2000, 6};
  DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
  int64_t tokens = 0;
  bool grew = false;
  for (int64_t s = 0; s < 12; ++s) {
    const StepBatch b = loader.next();
    EXPECT_EQ(b.global_samples, warmup_size_by_search(o.warmup, 48, tokens)) << "step " << s;
    grew |= b.global_samples > 12 && b.global_samples < 48;
    tokens += b.global_tokens;
    EXPECT_EQ(loader.position().tokens, tokens);
  }
  EXPECT_TRUE(grew);
}

TEST(DataLoader, MoreMicroStepsThanSamplesGivesEmptyMicroBatches) {
  const auto d = make_dataset({9});
  LoaderOptions o = small_options(4);
  o.micro_steps = 6;
  DataLoader loader(MPI_COMM_WORLD, {d->dir.path()}, o);
  int64_t n = 0;
  for (int s = 0; s < 3; ++s) n += static_cast<int64_t>(check_batch(loader.next(), *d, o).size());
  EXPECT_EQ(n, 9);  // 4 + 4 + 1
}

}  // namespace
}  // namespace packbert

// gtest_main is not used: MPI must be initialised (with threads) around the tests.
int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
