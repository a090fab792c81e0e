// The trace ranges (kernels/base/trace.h): nothing reaches a profiler until hooks are installed,
// ranges nest per scope, a range pops through the hooks that pushed it; and the model's phases on
// the CPU backend (whose ops open no ranges of their own): forward holding heads, then backward.
// The CUDA backend's NVTX ranges are checked in the emulated build (test_cuda_trainer).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../model/model_test_util.h"
#include "kernels/base/trace.h"

namespace packbert::test {
namespace {

std::vector<std::string> events;  // "+name" per push, "-" per pop
void record_push(const char* name) { events.push_back(std::string("+") + name); }
void record_pop() { events.push_back("-"); }
const trace::Hooks kRecorder{&record_push, &record_pop};

struct Installed {
  Installed() {
    events.clear();
    trace::install(&kRecorder);
  }
  ~Installed() { trace::install(nullptr); }
};

TEST(Trace, RangesReachTheHooksOnlyOnceInstalled) {
  events.clear();
  ASSERT_FALSE(trace::enabled());
  { const trace::Range off("off"); }
  EXPECT_TRUE(events.empty());
  {
    const Installed on;
    EXPECT_TRUE(trace::enabled());
    const trace::Range outer("outer");
    { const trace::Range a("a"); }
    {
      const trace::Range b("b");
      const trace::Range c("c");
    }
  }
  EXPECT_EQ(events, (std::vector<std::string>{"+outer", "+a", "-", "+b", "+c", "-", "-", "-"}));
  EXPECT_FALSE(trace::enabled());
}

TEST(Trace, ARangePopsThroughTheHooksThatPushedIt) {
  events.clear();
  {
    trace::install(&kRecorder);
    const trace::Range r("r");
    trace::install(nullptr);  // r still pops where it pushed
    { const trace::Range quiet("quiet"); }
  }
  EXPECT_EQ(events, (std::vector<std::string>{"+r", "-"}));
}

TEST(Trace, ModelPhasesOnTheCpuBackend) {
  auto rng = model_rng(41);
  auto be = make_cpu_backend();
  HostModel m(bert_preset("tiny"), rng());
  const auto samples = model_samples(rng, {30, 12, 50}, 6, m.config.real_vocab_size);
  const Batch b = make_batch(samples, BatchLayout::unpadded, 64);
  std::vector<float> grads(m.params.size(), 0.f);
  Bert bert(m.config, *be, m.params_view(), view(grads.data(), {m.table.total()}));
  const Installed on;
  bert.forward(b, b.num_masked(), b.num_seqs(), 1, 2);
  bert.backward();
  EXPECT_EQ(events, (std::vector<std::string>{"+forward", "+heads", "-", "-", "+backward", "-"}));
}

}  // namespace
}  // namespace packbert::test
