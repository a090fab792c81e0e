// The memory plan's own arithmetic (train/memory_plan.h): devices by name or size, the verdict
// at its edge, the sums, the knobs, the rank that holds most. That the plan equals a run to the
// byte is tests/e2e/check_plan.py's (CPU and emulated CUDA).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config/train_config.h"
#include "kernels/base/error.h"
#include "train/memory_plan.h"

namespace packbert::test {
namespace {

TrainConfig tiny_config(const std::vector<std::string>& more = {}) {
  std::vector<std::string> keys = {"model.preset=tiny", "train.global_batch_size=32",
                                   "train.max_seq_len=128", "train.max_predictions_per_seq=20"};
  keys.insert(keys.end(), more.begin(), more.end());
  return load_train_config("", keys);
}

TEST(MemoryPlan, DevicesByNameOrSize) {
  EXPECT_EQ(parse_device_memory("a100-40").bytes, size_t{40960} << 20);
  EXPECT_EQ(parse_device_memory("h100-80").bytes, size_t{81559} << 20);
  EXPECT_EQ(parse_device_memory("h200-141").bytes, size_t{143771} << 20);
  EXPECT_EQ(parse_device_memory("80GiB").bytes, size_t{80} << 30);
  EXPECT_EQ(parse_device_memory("85899345920").bytes, size_t{85899345920});
  EXPECT_EQ(parse_device_memory("2GB").bytes, size_t{2000000000});
  for (const char* bad : {"h100", "", "-3GiB", "12 parsecs", "0"}) {
    try {
      parse_device_memory(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("--gpu ") + bad), std::string::npos) << m;
      EXPECT_NE(m.find("a100-40, a100-80, h100-80, h200-141, b200-180"), std::string::npos) << m;
    }
  }
}

TEST(MemoryPlan, SumsAndTheVerdictAtItsEdge) {
  const TrainConfig c = tiny_config({"train.precision=bf16"});
  const MemoryPlan p = plan_memory(c, 2, {}, /*knobs=*/false);
  size_t buffers = 0, estimated = 0, arena = 0, arena_parts = 0;
  for (const MemoryItem& it : p.items) {
    if (it.depth == 1) {
      arena_parts += it.bytes;
      continue;
    }
    (it.exact ? buffers : estimated) += it.bytes;
    if (it.key == "activation_arena") arena = it.bytes;
  }
  EXPECT_EQ(buffers, p.buffers);
  EXPECT_EQ(estimated, p.estimated);
  EXPECT_EQ(estimated, 0u) << "a cpu config has no backend estimates";
  EXPECT_GT(arena, 0u);
  EXPECT_EQ(arena_parts, arena) << "the arena's kinds add up to it (M fixed: no auto margin)";

  const size_t total = p.total();
  const MemoryPlan edge = plan_memory(c, 2, {{"exact", total, ""}, {"short", total - 1, ""}},
                                      /*knobs=*/false);
  ASSERT_EQ(edge.verdicts.size(), 2u);
  EXPECT_TRUE(edge.verdicts[0].fits);
  EXPECT_EQ(edge.verdicts[0].spare, 0);
  EXPECT_FALSE(edge.verdicts[1].fits);
  EXPECT_EQ(edge.verdicts[1].spare, -1);
  EXPECT_FALSE(edge.fits());
  // The largest micro-batch that fits a device holding exactly this plan: at least one
  // sample, and a device twice as large holds more.
  const MemoryPlan twice = plan_memory(c, 2, {{"twice", 2 * total, ""}}, /*knobs=*/false);
  EXPECT_GE(edge.verdicts[0].largest_samples, 1);
  EXPECT_GT(twice.verdicts[0].largest_samples, edge.verdicts[0].largest_samples);
}

TEST(MemoryPlan, KnobsSayWhatTheySave) {
  const std::vector<std::string> base = {"optim.sharded=false"};
  const TrainConfig c = tiny_config(base);
  const size_t own = plan_memory(c, 4, {}, /*knobs=*/false).total();
  const MemoryPlan p = plan_memory(c, 4, {{"device", own, ""}});
  ASSERT_FALSE(p.knobs.empty());
  int checked = 0;
  for (const MemoryKnob& k : p.knobs) {
    EXPECT_EQ(k.saves, static_cast<int64_t>(p.total()) - static_cast<int64_t>(k.total)) << k.key;
    ASSERT_EQ(k.fits.size(), 1u);
    EXPECT_EQ(k.fits[0], k.total <= own) << k.key;
    // Each knob is the plan of the config with that key set (its own largest rank).
    std::vector<std::string> keys = k.key == "optim.sharded" ? std::vector<std::string>{} : base;
    keys.push_back(k.key + "=" + k.setting);
    EXPECT_EQ(k.total, plan_memory(tiny_config(keys), 4, {}, false).total()) << k.key;
    // What cannot cost memory saves some.
    if (k.key == "model.mst_chunks" || k.key == "model.recompute" || k.key == "optim.sharded" ||
        k.key == "train.gradient_accumulation_steps") {
      EXPECT_GT(k.saves, 0) << k.key << " = " << k.setting;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 + 2 + 1 + 1) << "mst_chunks 2/4/8, recompute mlp/layer, sharded, accum";
}

TEST(MemoryPlan, PlansTheRankThatHoldsMost) {
  const TrainConfig c = tiny_config({"optim.sharded=true"});
  const MemoryPlan most = plan_memory(c, 3, {}, /*knobs=*/false);
  size_t seen = 0;
  for (int r = 0; r < 3; ++r) {
    const size_t t = plan_memory(c, 3, {}, false, r).total();
    EXPECT_LE(t, most.total()) << "rank " << r;
    seen = std::max(seen, t);
  }
  EXPECT_EQ(seen, most.total());
  EXPECT_THROW(plan_memory(c, 3, {}, false, 3), Error);
  EXPECT_THROW(plan_memory(c, 0, {}, false), Error);
}

}  // namespace
}  // namespace packbert::test
