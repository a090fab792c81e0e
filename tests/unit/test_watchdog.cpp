// The collective watchdog (core/watchdog.h) without MPI: scopes that overrun a short timeout
// fire once with the rank, collective and step; scopes that close in time, and every scope of a
// watchdog that is off, never do; the default action ends the process with the watchdog's code.
// Asynchronous watches (an NCCL round the host does not wait for): polled until complete, and
// past the timeout the owner's abort runs before the message and the action. After a stop
// signal, the waits of the step are bounded by a few seconds (a dead peer).
// The whole job under mpirun with a stopped rank: tests/mpi/watchdog_sigstop.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/base/error.h"
#include "core/log.h"
#include "core/watchdog.h"

namespace packbert::test {
namespace {

using namespace std::chrono_literals;

// The injected action: records each message (and returns, so the watchdog goes on).
struct Fired {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> messages;

  CollectiveWatchdog::Action action() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lk(mu);
      messages.push_back(m);
      cv.notify_all();
    };
  }
  // Waits (generously: a loaded machine) until n messages came; returns how many did.
  size_t wait_for(size_t n, std::chrono::milliseconds limit = 20000ms) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_for(lk, limit, [&] { return messages.size() >= n; });
    return messages.size();
  }
  size_t count() {
    std::lock_guard<std::mutex> lk(mu);
    return messages.size();
  }
};

TEST(CollectiveWatchdog, AnOverrunScopeFiresOnceNamingRankCollectiveAndStep) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(0.1, 5, fired.action());
  ASSERT_TRUE(wd.enabled());
  const auto t0 = std::chrono::steady_clock::now();
  {
    WatchScope scope(wd, "MPI_Barrier (checkpoint)", 17);
    ASSERT_EQ(fired.wait_for(1), 1u);
    std::this_thread::sleep_for(300ms);  // three more timeouts: it fires once all the same
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
  wd.stop();
  ASSERT_EQ(fired.count(), 1u);
  const std::string& m = fired.messages[0];
  EXPECT_NE(m.find("collective watchdog: rank 5 has waited "), std::string::npos) << m;
  EXPECT_NE(m.find("in MPI_Barrier (checkpoint) at step 17, past "
                   "train.collective_timeout_s = 0.1;"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("aborting the job"), std::string::npos) << m;
}

TEST(CollectiveWatchdog, AScopeThatClosesInTimeDoesNotFire) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(2.0, 0, fired.action());
  for (int i = 0; i < 100; ++i) {
    WatchScope scope(wd, "MPI_Allreduce (stop flag)", i);
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(2500ms);  // past the timeout with no scope open
  wd.stop();
  EXPECT_EQ(fired.count(), 0u);
}

TEST(CollectiveWatchdog, OffWatchesNothing) {
  CollectiveWatchdog wd;
  EXPECT_FALSE(wd.enabled());  // off until configured
  Fired fired;
  wd.configure(0, 0, fired.action());
  EXPECT_FALSE(wd.enabled());
  {
    WatchScope scope(wd, "MPI_Barrier (checkpoint)", 1);
    std::this_thread::sleep_for(50ms);
  }
  // The process's watchdog is off unless a run configured it: library code opening scopes in
  // tests is not watched.
  EXPECT_FALSE(CollectiveWatchdog::global().enabled());
  { WatchScope scope("MPI_Allreduce (stop flag)"); }
  EXPECT_EQ(fired.count(), 0u);
  EXPECT_THROW(wd.configure(-1, 0, fired.action()), Error);
  EXPECT_THROW(wd.configure(std::numeric_limits<double>::quiet_NaN(), 0, fired.action()), Error);
  EXPECT_THROW(wd.configure(std::numeric_limits<double>::infinity(), 0, fired.action()), Error);
}

TEST(CollectiveWatchdog, StepComesFromTheScopeOrTheWatchdog) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.set_step(41);
  EXPECT_EQ(wd.step(), 41);
  wd.configure(0.05, 1, fired.action());
  {
    WatchScope scope(wd, "MPI_Iallreduce (gradient all-reduce)");  // the watchdog's step
    wd.set_step(42);                                               // read when the scope opened
    ASSERT_EQ(fired.wait_for(1), 1u);
  }
  wd.set_step(0);
  {
    WatchScope scope(wd, "MPI_Comm_dup (data loader)");
    ASSERT_EQ(fired.wait_for(2), 2u);
  }
  wd.stop();
  EXPECT_NE(fired.messages[0].find("in MPI_Iallreduce (gradient all-reduce) at step 41,"),
            std::string::npos)
      << fired.messages[0];
  EXPECT_NE(fired.messages[1].find("at step 0 (before the first step),"), std::string::npos)
      << fired.messages[1];
}

// Scopes nest and come from several threads (the compute and the loader thread): each is
// watched on its own, and closing one leaves the others watched.
TEST(CollectiveWatchdog, NestedScopesAndScopesOfOtherThreads) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(0.2, 2, fired.action());
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::thread loader([&] {
    WatchScope scope(wd, "MPI_Ialltoallv (data loader samples)", 9);
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return release; });
  });
  {
    WatchScope outer(wd, "MPI_Barrier (checkpoint)", 8);
    {
      WatchScope inner(wd, "MPI_Allreduce (stop flag)", 8);  // closes in time
    }
    ASSERT_EQ(fired.wait_for(2), 2u);
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    release = true;
  }
  cv.notify_all();
  loader.join();
  std::this_thread::sleep_for(300ms);
  wd.stop();
  ASSERT_EQ(fired.count(), 2u);
  std::string both = fired.messages[0] + "\n" + fired.messages[1];
  EXPECT_NE(both.find("in MPI_Barrier (checkpoint) at step 8,"), std::string::npos) << both;
  EXPECT_NE(both.find("in MPI_Ialltoallv (data loader samples) at step 9,"), std::string::npos)
      << both;
  EXPECT_EQ(both.find("stop flag"), std::string::npos) << both;
}

TEST(CollectiveWatchdog, ReconfigureAndStopAreSafe) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(30, 0, fired.action());
  WatchScope open_across(wd, "MPI_Barrier (checkpoint)", 3);
  wd.configure(60, 0, fired.action());  // restarts the thread; the open scope stays listed
  wd.stop();
  wd.stop();
  EXPECT_FALSE(wd.enabled());
  EXPECT_EQ(fired.count(), 0u);
}

// Without an action: one error line on stderr through the project's logger, then the process
// ends with kExitCode (std::_Exit: no MPI needed).
// A collective the host does not wait for: its poll says when it is complete.
struct FakeCollective {
  std::atomic<bool> complete{false};
  AsyncWatch::Poll poll() {
    return [this] { return complete.load(); };
  }
};

TEST(AsyncWatch, AnIncompleteCollectiveIsAbortedThenReported) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(0.1, 2, fired.action());
  std::atomic<int> aborts{0};
  std::atomic<size_t> messages_at_abort{99};
  AsyncWatch watch(wd, [&] {
    messages_at_abort = fired.count();
    ++aborts;
  });
  FakeCollective a, b;
  wd.set_step(9);
  watch.arm("NCCL reduce-scatter (gradient reducer)", a.poll());
  watch.arm("NCCL all-gather (gradient reducer)", b.poll());
  ASSERT_EQ(fired.wait_for(1), 1u);
  std::this_thread::sleep_for(300ms);  // fires once
  wd.stop();
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(messages_at_abort.load(), 0u) << "the abort runs before the action";
  ASSERT_EQ(fired.count(), 1u);
  const std::string& m = fired.messages[0];
  // The oldest incomplete collective is the one named.
  EXPECT_NE(m.find("collective watchdog: rank 2: NCCL reduce-scatter (gradient reducer) at step "
                   "9 has not completed after "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("past train.collective_timeout_s = 0.1;"), std::string::npos) << m;
  EXPECT_NE(m.find("aborting the NCCL communicator and the job"), std::string::npos) << m;
}

TEST(AsyncWatch, CompletedCollectivesAreDroppedAndNeverFire) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(1.0, 0, fired.action());  // 2 ms apart: a loaded machine has 500x to spare
  std::atomic<int> aborts{0};
  AsyncWatch watch(wd, [&] { ++aborts; });
  std::vector<std::unique_ptr<FakeCollective>> rounds;
  // Many rounds, each complete well within the timeout; a later one complete clears the earlier
  // ones even if their own poll never says so (one stream: they completed first).
  for (int i = 0; i < 200; ++i) {
    rounds.push_back(std::make_unique<FakeCollective>());
    watch.arm("NCCL all-reduce (gradient reducer)", rounds.back()->poll(), i);
    std::this_thread::sleep_for(2ms);
    if (i % 3 == 2) rounds.back()->complete = true;
  }
  rounds.back()->complete = true;
  for (int i = 0; i < 200 && watch.pending() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(watch.pending(), 0u);
  std::this_thread::sleep_for(1200ms);  // past the timeout with nothing pending
  wd.stop();
  EXPECT_EQ(aborts.load(), 0);
  EXPECT_EQ(fired.count(), 0u);
}

TEST(AsyncWatch, TheWaitCountsFromWhenTheDeviceReachedTheCollective) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(0.1, 1, fired.action());
  std::atomic<int> aborts{0};
  AsyncWatch watch(wd, [&] { ++aborts; });
  FakeCollective reached, round;
  watch.arm("NCCL all-reduce (gradient reducer)", reached.poll(), round.poll(), 4);
  std::this_thread::sleep_for(500ms);  // five timeouts: the device is still busy before it
  EXPECT_EQ(fired.count(), 0u) << "the device's queued compute counted as waiting";
  const auto t0 = std::chrono::steady_clock::now();
  reached.complete = true;
  ASSERT_EQ(fired.wait_for(1), 1u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
  wd.stop();
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_NE(fired.messages[0].find("NCCL all-reduce (gradient reducer) at step 4 has not "
                                   "completed"),
            std::string::npos)
      << fired.messages[0];
}

TEST(AsyncWatch, OffArmsNothing) {
  CollectiveWatchdog wd;  // never configured
  AsyncWatch watch(wd, [] {});
  FakeCollective a;
  watch.arm("NCCL all-reduce (optimizer sums)", a.poll());
  EXPECT_EQ(watch.pending(), 0u);
}

// A stop signal bounds the waits of a step (the run would otherwise wait for the launcher's
// SIGKILL with a dead peer): a scope open across the signal fires stop_bound_s after it, one
// opened later stop_bound_s after it opened, naming the signal and the collective; the
// checkpoint barrier (StopBound::kNone) and every wait after the ranks agreed to stop keep the
// usual timeout.
TEST(CollectiveWatchdog, AStopSignalBoundsTheWaitsOfTheStep) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(60.0, 3, fired.action());
  wd.set_stop_bound_s(0.3);
  wd.set_step(12);
  const auto t0 = std::chrono::steady_clock::now();
  {
    WatchScope before(wd, "all-reduce (gradient reducer)");
    WatchScope barrier(wd, "MPI_Barrier (checkpoint)", WatchScope::kCurrentStep, StopBound::kNone);
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(fired.count(), 0u) << "no signal yet: the 60 s timeout holds";
    const auto signal_at = std::chrono::steady_clock::now();
    wd.note_stop_signal(15);
    wd.note_stop_signal(10);  // the first signal counts
    ASSERT_EQ(fired.wait_for(1), 1u);
    EXPECT_GE(std::chrono::steady_clock::now() - signal_at, 300ms);
    std::this_thread::sleep_for(400ms);  // the barrier does not fire
    EXPECT_EQ(fired.count(), 1u);
  }
  {
    WatchScope after(wd, "MPI_Allreduce (stop flag)", 13);  // opened after the signal
    const auto opened = std::chrono::steady_clock::now();
    ASSERT_EQ(fired.wait_for(2), 2u);
    EXPECT_GE(std::chrono::steady_clock::now() - opened, 300ms);
  }
  wd.stop_agreed();
  {
    WatchScope end(wd, "MPI_Barrier (checkpoint)");
    std::this_thread::sleep_for(700ms);
  }
  wd.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);
  ASSERT_EQ(fired.count(), 2u);
  const std::string& m = fired.messages[0];
  EXPECT_NE(m.find("collective watchdog: rank 3 received signal 15 "), std::string::npos) << m;
  EXPECT_NE(m.find(" s ago, while it waits in all-reduce (gradient reducer) at step 12 (for "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("reaches the stop within 0.3 s of the signal"), std::string::npos) << m;
  EXPECT_NE(m.find("aborting the job without one"), std::string::npos) << m;
  EXPECT_NE(fired.messages[1].find("waits in MPI_Allreduce (stop flag) at step 13"),
            std::string::npos)
      << fired.messages[1];
}

// The same bound for a collective the host does not wait for (NCCL): aborted, then reported.
TEST(AsyncWatch, AStopSignalBoundsAnIncompleteCollective) {
  CollectiveWatchdog wd;
  Fired fired;
  wd.configure(60.0, 1, fired.action());
  wd.set_stop_bound_s(0.2);
  std::atomic<int> aborts{0};
  AsyncWatch watch(wd, [&] { ++aborts; });
  FakeCollective a;
  watch.arm("NCCL all-reduce (gradient reducer)", a.poll(), 5);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(fired.count(), 0u);
  wd.note_stop_signal(10);
  ASSERT_EQ(fired.wait_for(1), 1u);
  wd.stop();
  EXPECT_EQ(aborts.load(), 1);
  const std::string& m = fired.messages[0];
  EXPECT_NE(m.find("rank 1 received signal 10 "), std::string::npos) << m;
  EXPECT_NE(m.find("waits in NCCL all-reduce (gradient reducer) at step 5"), std::string::npos)
      << m;
  EXPECT_NE(m.find("the NCCL communicator is aborted first"), std::string::npos) << m;
}

TEST(CollectiveWatchdogDeathTest, DefaultActionLogsAndExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        init_logging(3, "info");
        CollectiveWatchdog wd;
        wd.configure(0.05, 3);
        WatchScope scope(wd, "MPI_Allreduce (evaluation)", 12);
        std::this_thread::sleep_for(20s);
      },
      ::testing::ExitedWithCode(CollectiveWatchdog::kExitCode),
      R"(\[rank 3\] \[error\] collective watchdog: rank 3 has waited [0-9.]+ s in )"
      R"(MPI_Allreduce \(evaluation\) at step 12, past train.collective_timeout_s = 0.05;)");
}

}  // namespace
}  // namespace packbert::test
