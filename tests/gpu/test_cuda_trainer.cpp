// gpu label: the whole optimizer step (train/trainer.h: forward, backward, the gradient
// reducer (one rank: nothing moves), LAMB on the device) with train.device = cuda against the
// CPU trainer: three steps on one batch of two micro-steps with dropout on. The losses of every
// step and the parameter updates of the three steps must agree. A second CUDA trainer whose
// first two steps do not read the optimizer's scalars back ends bitwise where the first does.
//
// Tolerances: the loss to 1e-4 relative per step (the model test's bound; fp32 on both sides,
// other summation orders). The update (parameters after minus before) to rel L2 1e-3 per
// tensor: LAMB divides by sqrt(v) and by the update norm, which amplifies relative gradient
// differences on tensors whose gradient is tiny; the key bias (true gradient 0) is skipped.
#include <gtest/gtest.h>

#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>

#include "kernels/device.h"

#ifdef PACKBERT_HAVE_CUDA
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "cuda_test_util.h"
#include "train/batching.h"
#include "train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"
#ifdef PACKBERT_CUDA_EMULATION
#include "kernels/cuda/counters.h"
#include "kernels/cuda_emu/runtime.h"
#endif

namespace packbert::test {
namespace {

constexpr int kMaxSeqLen = 64;

TEST(CudaTrainer, ThreeLambStepsMatchTheCpuTrainer) {
  PB_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 10, 2, 5, kMaxSeqLen, 10);
  TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 1e-2, 10);
  o.layout = BatchLayout::unpadded;
  o.lr.num_warmup_steps = 1;
  Trainer cpu(MPI_COMM_WORLD, o);
  o.device = Device::cuda;
  Trainer gpu(MPI_COMM_WORLD, o), unread(MPI_COMM_WORLD, o);
  ASSERT_EQ(cpu.params(), gpu.params()) << "the same seed must give the same initial weights";
  const std::vector<float> before = cpu.params();
  std::vector<double> gpu_losses;
  for (int64_t s = 0; s < 3; ++s) {
    batch.step = s;
    const StepMetrics a = cpu.step(batch), b = gpu.step(batch);
    const StepMetrics u = unread.step(batch, {}, /*read_back=*/s == 2);
    gpu_losses.push_back(b.loss);
    EXPECT_EQ(u.read.optimizer, s == 2);
    EXPECT_EQ(u.grad_norm, s == 2 ? b.grad_norm : -1.f) << "step " << s;
    EXPECT_EQ(u.unread_skips, 0);
    // The unread steps' losses stay on the device and arrive with the read, bit for bit.
    EXPECT_EQ(u.read.losses, s == 2);
    if (s == 2) {
      EXPECT_EQ(u.loss, b.loss);
      ASSERT_EQ(u.earlier_losses.size(), 2u);
      for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(u.earlier_losses[k].step, static_cast<int64_t>(k));
        EXPECT_EQ(u.earlier_losses[k].loss, gpu_losses[k]) << "step " << k;
      }
    }
    const double err = std::abs(b.loss - a.loss) / std::abs(a.loss);
    std::printf(
        "[trainer-error] step %lld: loss cpu %.6f cuda %.6f (rel %.2e), grad norm %.5f "
        "vs %.5f\n",
        static_cast<long long>(s), a.loss, b.loss, err, a.grad_norm, b.grad_norm);
    ASSERT_TRUE(std::isfinite(b.loss));
    expect_measure("step " + std::to_string(s) + ": loss cuda vs cpu (rel)", err, 1e-4);
    EXPECT_EQ(b.skipped, false);
  }
  EXPECT_EQ(unread.params(), gpu.params()) << "reading the optimizer's scalars changed a bit";
  const std::vector<float>& pc = cpu.params();
  const std::vector<float>& pg = gpu.params();
  double worst_update = 0;
  for (const ParamTensor& t : cpu.table().tensors()) {
    if (t.name.find("attention.self.key.bias") != std::string::npos) continue;
    double num = 0, den = 0;
    for (int64_t i = t.offset; i < t.offset + t.size; ++i) {
      const auto k = static_cast<size_t>(i);
      const double uc = static_cast<double>(pc[k]) - before[k];
      const double ug = static_cast<double>(pg[k]) - before[k];
      num += (uc - ug) * (uc - ug);
      den += uc * uc;
    }
    const double e = std::sqrt(num / std::max(den, 1e-300));
    worst_update = std::max(worst_update, e);
    EXPECT_LE(e, 1e-3) << t.name;
  }
  print_measure("3 steps: weight update cuda vs cpu, worst tensor (rel)", worst_update, 1e-3);
  // The optimizer state comes back to the host for checkpoints.
  const auto n = static_cast<size_t>(cpu.table().total());
  std::vector<float> wc(n), mc(n), vc(n), wg(n), mg(n), vg(n);
  cpu.save_state(wc.data(), mc.data(), vc.data());
  gpu.save_state(wg.data(), mg.data(), vg.data());
  EXPECT_EQ(wc, pc);
  EXPECT_EQ(wg, pg);
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) num += (mc[i] - mg[i]) * (mc[i] - mg[i]), den += mc[i] * mc[i];
  expect_measure("3 steps: first moments cuda vs cpu (rel)", std::sqrt(num / den), 1e-3);
  EXPECT_EQ(gpu.lamb_steps_done(), 3);
}

// The sharded optimizer on the CUDA backend, two ranks (mpirun on this binary; the ranks find
// PACKBERT_SHARDED_TEST_CHILD set): three steps with the gradient travelling through the host
// (MPI: two ranks can share one GPU, and NCCL cannot) give the unsharded run's weights, moments
// and gradient norms bit for bit, in fp32 and in bf16 (where each sharded rank keeps only its
// range of the fp32 master weights, model/replica.h shard_masters). The cut lies inside a tensor:
// its norms are the sums of its two pieces' double sums of squares, added in another order than the
// whole tensor's, and equal after the rounding to f32 unless the two double sums (a few 1e-16
// apart, relative) straddle a rounding boundary of f32 (2^-24 relative apart): about 1e-8 per norm,
// 1e-7 for the test. Both ranks see the same samples (a global batch of twice them), which is all
// the comparison needs.
void sharded_rank() {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  struct Finalize {
    ~Finalize() { MPI_Finalize(); }
  } finalize;
  // fp32, and bf16, whose sharded ranks keep only their range of the fp32 master weights.
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    std::mt19937_64 rng(test_seed());  // the same on both ranks
    StepBatch batch = random_step_batch(rng, 6, 2, 5, kMaxSeqLen, 10);
    batch.global_samples *= 2;
    batch.global_masked_tokens *= 2;
    batch.global_tokens *= 2;
    TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 1e-2, 10);
    o.lr.num_warmup_steps = 1;
    o.device = Device::cuda;
    o.gpu_transport = GradTransport::mpi;
    o.bucket_bytes = 256 << 10;  // several buckets, cut inside tensors
    o.bert.precision = precision;
    Trainer plain(MPI_COMM_WORLD, o);
    o.sharded = true;
    Trainer sharded(MPI_COMM_WORLD, o);
    ASSERT_TRUE(sharded.optimizer_sharded());
    ASSERT_LT(sharded.optimizer_state_bytes(), plain.optimizer_state_bytes());
    double step1_loss = 0;
    for (int64_t s = 0; s < 3; ++s) {
      batch.step = s;
      const StepMetrics a = plain.step(batch), b = sharded.step(batch, {}, /*read=*/s != 1);
      if (s == 1) step1_loss = a.loss;
      if (s != 1) {
        EXPECT_EQ(a.loss, b.loss) << "step " << s;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
      }
      if (s == 2) {  // step 1's loss, unread there, arrives here
        ASSERT_EQ(b.earlier_losses.size(), 1u);
        EXPECT_EQ(b.earlier_losses[0].loss, step1_loss);
      }
    }
    EXPECT_EQ(plain.params(), sharded.params());
    const auto n = static_cast<size_t>(plain.table().total());
    std::vector<float> wp(n), mp(n), vp(n), ws(n), ms(n), vs(n);
    plain.save_state(wp.data(), mp.data(), vp.data(), plain.rank());
    for (int root : {0, 1}) {  // each rank's range from the device, gathered on root
      std::fill(ws.begin(), ws.end(), -1.f);
      std::fill(ms.begin(), ms.end(), -1.f);
      std::fill(vs.begin(), vs.end(), -1.f);
      sharded.save_state(ws.data(), ms.data(), vs.data(), root);
      if (sharded.rank() != root) continue;
      EXPECT_EQ(wp, ws) << "root " << root;
      EXPECT_EQ(mp, ms) << "root " << root;
      EXPECT_EQ(vp, vs) << "root " << root;
    }
  }
}

// PACKBERT_NVTX=1: the CUDA backend installs NVTX as the trace hooks (kernels/base/trace.h), and a
// step's ranges reach it, here the emulated NVTX's record: balanced and nested on the calling
// thread; at the top the phases (forward and backward once per micro-step, the gradient wait,
// LAMB) and no compute op; inside them the ops, the heads' ops inside heads, the gradient
// buckets inside the backward that readied them. Without the variable nothing is recorded.
TEST(CudaTrainer, NvtxRangesNestThePhasesAndTheOps) {
  PB_REQUIRE_CUDA_DEVICE();
  if (!kEmulated) GTEST_SKIP() << "reads the emulated NVTX's record";
#ifdef PACKBERT_CUDA_EMULATION
  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 6, 2, 5, kMaxSeqLen, 10);  // two micro-steps
  TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 1e-2, 10);
  o.device = Device::cuda;
  o.bucket_bytes = 256 << 10;  // several buckets
  {
    Trainer quiet(MPI_COMM_WORLD, o);
    quiet.step(batch);
    EXPECT_TRUE(emu::take_nvtx_events().empty()) << "ranges recorded without PACKBERT_NVTX";
  }
  ASSERT_EQ(setenv("PACKBERT_NVTX", "1", 1), 0);
  Trainer traced(MPI_COMM_WORLD, o);
  unsetenv("PACKBERT_NVTX");
  emu::take_nvtx_events();  // those of the set-up
  traced.step(batch);
  std::vector<std::string> open;
  std::map<std::string, int> top;
  std::set<std::pair<std::string, std::string>> inside;  // (parent, child)
  for (const emu::NvtxEvent& e : emu::take_nvtx_events()) {
    ASSERT_EQ(e.thread, std::this_thread::get_id());
    if (e.push) {
      ASSERT_EQ(e.depth, static_cast<int>(open.size())) << e.name;
      if (open.empty())
        ++top[e.name];
      else
        inside.emplace(open.back(), e.name);
      open.push_back(e.name);
    } else {
      ASSERT_FALSE(open.empty()) << "a pop without a range";
      ASSERT_EQ(e.depth, static_cast<int>(open.size()) - 1);
      open.pop_back();
    }
  }
  EXPECT_TRUE(open.empty()) << open.size() << " ranges left open, the last " << open.back();
  EXPECT_EQ(top["forward"], 2);
  EXPECT_EQ(top["backward"], 2);
  EXPECT_EQ(top["grad_wait"], 1);
  EXPECT_EQ(top["lamb"], 1);
  for (const char* op : {"embedding_forward", "linear_forward", "attention_forward",
                         "residual_layernorm_forward", "mlm_loss", "nsp_loss", "linear_backward",
                         "attention_backward", "embedding_backward", "lamb_update", "lamb_apply"})
    EXPECT_EQ(top.count(op), 0u) << op << " outside every phase";
  const std::pair<std::string, std::string> edges[] = {{"forward", "embedding_forward"},
                                                       {"forward", "linear_forward"},
                                                       {"forward", "attention_forward"},
                                                       {"forward", "residual_layernorm_forward"},
                                                       {"forward", "heads"},
                                                       {"heads", "mlm_loss"},
                                                       {"heads", "nsp_loss"},
                                                       {"nsp_loss", "linear_forward"},
                                                       {"backward", "linear_backward"},
                                                       {"backward", "attention_backward"},
                                                       {"backward", "residual_layernorm_backward"},
                                                       {"backward", "embedding_backward"},
                                                       {"backward", "grad_bucket"},
                                                       {"lamb", "lamb_update"},
                                                       {"lamb", "lamb_apply"}};
  for (const auto& edge : edges)
    EXPECT_EQ(inside.count(edge), 1u) << edge.second << " never inside " << edge.first;
#endif
}

TEST(CudaTrainerSharded, TwoRanksMatchTheUnshardedRunBitForBit) {
  if (std::getenv("PACKBERT_SHARDED_TEST_CHILD")) {
    sharded_rank();
    return;
  }
  PB_REQUIRE_CUDA_DEVICE();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string out;
  const int rc = run_command(
      std::string(PACKBERT_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 " +
          "-x PACKBERT_SHARDED_TEST_CHILD=1 -x PACKBERT_TEST_SEED=" + std::to_string(test_seed()) +
          " -x OMP_NUM_THREADS=1 " + self +
          " --gtest_color=no"
          " --gtest_filter=CudaTrainerSharded.TwoRanksMatchTheUnshardedRunBitForBit 2>&1",
      &out);
  std::cout << out;
  EXPECT_EQ(rc, 0) << "the ranks failed (output above)";
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos);
}

// The backend's counts of host work (kernels/cuda/counters.h: host synchronisations, launches,
// pageable copies) are the runtime's: in the emulated build the runtime counts the same calls
// itself (kernels/cuda_emu/runtime.h), and over a trainer's construction, six steps (two
// reading the losses and the optimizer back) and its destruction, in fp32 and bf16, the two
// agree exactly. So no call escapes the backend's counting, and the metrics' per-step figures
// (host_syncs_per_step, ...) are exact here and mean the same on a GPU. Single ops pin what
// counts: a small upload is staged in pinned memory (no wait, no pageable copy), a small
// read-back one wait, a large upload a pageable copy and a wait, a zero a launch (a memset), a
// synchronisation one. After the first step (which allocates the arena and the staging
// buffers) a step that does not read waits for the device 0 times and one that reads once, and
// no step copies from or to pageable memory. Prints the counts per step.
TEST(CudaTrainer, HostWorkCountsAreTheRuntimes) {
  PB_REQUIRE_CUDA_DEVICE();
  if (!kEmulated) GTEST_SKIP() << "compares with the emulated runtime's own counts";
#ifdef PACKBERT_CUDA_EMULATION
  auto delta = [](const cuda::HostWork& a, const cuda::HostWork& b) {
    return cuda::HostWork{b.host_syncs - a.host_syncs, b.launches - a.launches,
                          b.graph_launches - a.graph_launches,
                          b.pageable_copies - a.pageable_copies};
  };
  auto runtime = [] {
    const emu::Counters c = emu::counters();
    return cuda::HostWork{c.host_syncs, c.launches, c.graph_launches, c.pageable_copies};
  };
  auto expect_same = [](const cuda::HostWork& backend, const cuda::HostWork& rt,
                        const std::string& what) {
    EXPECT_EQ(backend.host_syncs, rt.host_syncs) << what << ": host synchronisations";
    EXPECT_EQ(backend.launches, rt.launches) << what << ": launches";
    EXPECT_EQ(backend.graph_launches, rt.graph_launches) << what << ": graph launches";
    EXPECT_EQ(backend.pageable_copies, rt.pageable_copies) << what << ": pageable copies";
  };

  {  // single ops
    auto be = make_cuda_backend(0);
    BackendBuffer buf = be->alloc(DType::f32, {64});
    std::vector<float> host(64, 1.f), back(64, 0.f);
    cuda::HostWork b0 = cuda::host_work(), r0 = runtime();
    be->copy(buf.tensor(), view(host.data(), {64}));
    cuda::HostWork d = delta(b0, cuda::host_work());
    expect_same(d, delta(r0, runtime()), "small upload");
    EXPECT_EQ(d.pageable_copies, 0);
    EXPECT_EQ(d.host_syncs, 0);
    EXPECT_EQ(d.launches, 0);
    b0 = cuda::host_work(), r0 = runtime();
    be->copy(view(back.data(), {64}), buf.tensor());
    d = delta(b0, cuda::host_work());
    expect_same(d, delta(r0, runtime()), "small read-back");
    EXPECT_EQ(back, host);
    EXPECT_EQ(d.pageable_copies, 0);
    EXPECT_EQ(d.host_syncs, 1);
    const int64_t big = (int64_t{4} << 20) / 4 + 1;  // one float more than copy() stages
    BackendBuffer large = be->alloc(DType::f32, {big});
    std::vector<float> big_host(static_cast<size_t>(big), 2.f);
    b0 = cuda::host_work(), r0 = runtime();
    be->copy(large.tensor(), view(big_host.data(), {big}));
    d = delta(b0, cuda::host_work());
    expect_same(d, delta(r0, runtime()), "large upload");
    EXPECT_EQ(d.pageable_copies, 1);
    EXPECT_EQ(d.host_syncs, 1);
    b0 = cuda::host_work(), r0 = runtime();
    be->zero(buf.tensor());
    d = delta(b0, cuda::host_work());
    expect_same(d, delta(r0, runtime()), "zero");
    EXPECT_EQ(d.launches, 1);
    EXPECT_EQ(d.host_syncs, 0);
    b0 = cuda::host_work(), r0 = runtime();
    be->synchronize();
    d = delta(b0, cuda::host_work());
    expect_same(d, delta(r0, runtime()), "synchronize");
    EXPECT_EQ(d.host_syncs, 1);
    const BackendCounters c = be->counters();
    const cuda::HostWork now = cuda::host_work();
    EXPECT_EQ(c.host_syncs, now.host_syncs);
    EXPECT_EQ(c.launches, now.launches);
    EXPECT_EQ(c.pageable_copies, now.pageable_copies);
  }

  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 10, 2, 5, kMaxSeqLen, 10);  // two micro-steps
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    TrainerOptions o = tiny_trainer_options(rng, kMaxSeqLen, 1e-2, 10);
    o.bert.precision = p;
    o.device = Device::cuda;
    const cuda::HostWork b0 = cuda::host_work(), r0 = runtime();
    {
      Trainer t(MPI_COMM_WORLD, o);
      for (int64_t s = 0; s < 6; ++s) {
        batch.step = s;
        const bool read = s % 3 == 2;
        const cuda::HostWork before = cuda::host_work(), rt_before = runtime();
        t.step(batch, {}, read);
        const cuda::HostWork d = delta(before, cuda::host_work());
        expect_same(d, delta(rt_before, runtime()),
                    std::string(precision_name(p)) + " step " + std::to_string(s));
        std::printf(
            "[host-work] %s step %lld (%s): %lld host syncs, %lld launches, %lld graph "
            "launches, %lld pageable copies\n",
            precision_name(p), static_cast<long long>(s), read ? "read" : "not read",
            static_cast<long long>(d.host_syncs), static_cast<long long>(d.launches),
            static_cast<long long>(d.graph_launches), static_cast<long long>(d.pageable_copies));
        EXPECT_GT(d.launches, 0);
        if (s > 0) {
          EXPECT_EQ(d.host_syncs, read ? 1 : 0) << precision_name(p) << " step " << s;
          EXPECT_EQ(d.pageable_copies, 0) << precision_name(p) << " step " << s;
        }
      }
    }
    expect_same(delta(b0, cuda::host_work()), delta(r0, runtime()),
                std::string(precision_name(p)) + " construction, steps and destruction");
  }
#endif
}

// train.cuda_graphs = full through the trainer: the same batch of two micro-steps every step,
// six steps, fp32 and bf16. The capacities are fixed by the reserve (GraphCapacity), so each
// micro-step's graphs are run at step 0 and recorded at step 1 (both at step 0 when the two
// micro-batches share a capacity), and every graph replays from step 2. Against the same steps with
// graphs off: the losses of the steps read and the final weights bit for bit; from step 2 a step
// waits for the device only on a step that reads (once) and copies nothing from or to pageable
// memory, and from step 3 launches at least 10x fewer times (kernels and graphs counted alike); the
// gradient round is inside the last backward's graph (whose key is final from step 0: run at step
// 0, recorded at 1, replayed from 2). Prints the counts.
TEST(CudaTrainer, FullGraphsLaunchTenTimesFewerForTheSameBits) {
  PB_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(test_seed());
  StepBatch batch = random_step_batch(rng, 10, 2, 5, kMaxSeqLen, 10);  // two micro-steps
  TrainerOptions base = tiny_trainer_options(rng, kMaxSeqLen, 1e-2, 10);
  // The arena sized for the largest micro-batch up front, as a run's is (run_train.cpp): an
  // arena that grew at the second micro-batch would move under the first one's graphs.
  for (const LoaderMicroBatch& mb : batch.micro_batches) {
    const BatchShape s = make_batch(mb.samples, base.layout, base.max_seq_len, mb.packs).shape();
    base.reserve.rows = std::max(base.reserve.rows, s.rows);
    base.reserve.masked = std::max(base.reserve.masked, s.masked);
    base.reserve.seqs = std::max(base.reserve.seqs, s.seqs);
    base.reserve.max_len = std::max(base.reserve.max_len, s.max_len);
  }
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(p));
    struct Run {
      std::vector<double> losses;
      std::vector<float> params;
      int64_t launches = 0;             // over steps 3 .. 5
      int64_t syncs = 0, pageable = 0;  // over steps 2 .. 5
    };
    auto train = [&](CudaGraphs graphs) {
      TrainerOptions o = base;
      o.bert.precision = p;
      o.bert.cuda_graphs = graphs;
      o.device = Device::cuda;
      Run r;
      Trainer t(MPI_COMM_WORLD, o);
      for (int64_t s = 0; s < 6; ++s) {
        batch.step = s;
        const bool read = s % 3 == 2;
        const BackendCounters before = t.host_work();
        const StepMetrics m = t.step(batch, {}, read);
        const BackendCounters after = t.host_work();
        if (read) r.losses.push_back(m.loss);
        // The gradient round (one rank: bookkeeping only) inside the last backward's graph:
        // run at step 0, recorded at 1, replayed from 2 on (comm/grad_reducer.h, Graphs).
        EXPECT_EQ(m.allreduce.graph, graphs == CudaGraphs::full ? std::min<int64_t>(s, 2) : 0)
            << "step " << s;
        std::printf("[graphs] %s %s step %lld: %lld launches, %lld graph launches\n",
                    precision_name(p), cuda_graphs_name(graphs), static_cast<long long>(s),
                    static_cast<long long>(after.launches - before.launches),
                    static_cast<long long>(after.graph_launches - before.graph_launches));
        if (s >= 3)
          r.launches +=
              (after.launches - before.launches) + (after.graph_launches - before.graph_launches);
        // Once everything replays, a full step is its graphs (each micro-step's forward and
        // backward, the optimizer's: norm, update, zeroing) and one launch outside them, the
        // write of the optimizer's step scalars (Lamb::step).
        if (s >= 3 && graphs == CudaGraphs::full) {
          EXPECT_EQ(after.launches - before.launches, 1) << "step " << s;
          EXPECT_EQ(after.graph_launches - before.graph_launches,
                    2 * static_cast<int64_t>(batch.micro_batches.size()) + 1)
              << "step " << s;
        }
        if (s >= 2) {
          r.syncs += after.host_syncs - before.host_syncs;
          r.pageable += after.pageable_copies - before.pageable_copies;
          EXPECT_EQ(after.host_syncs - before.host_syncs, read ? 1 : 0) << "step " << s;
        }
      }
      r.params = t.params();
      return r;
    };
    const Run off = train(CudaGraphs::off);
    const Run full = train(CudaGraphs::full);
    EXPECT_EQ(full.losses, off.losses);
    EXPECT_EQ(full.params, off.params) << "the weights differ";
    EXPECT_EQ(full.pageable, 0);
    EXPECT_GE(off.launches, 10 * full.launches)
        << off.launches / 3.0 << " launches per step op by op, " << full.launches / 3.0
        << " with full graphs";
    std::printf(
        "[graphs] %s: launches per step (kernels and graphs) %.2f op by op, %.2f with "
        "full graphs (%.1fx fewer); host syncs per step %.2f\n",
        precision_name(p), off.launches / 3.0, full.launches / 3.0,
        static_cast<double>(off.launches) / static_cast<double>(full.launches), full.syncs / 4.0);
  }
}

}  // namespace
}  // namespace packbert::test

#else  // no CUDA in this build

TEST(CudaTrainer, Skipped) {
  std::cout << "skipped: no CUDA device (" << packbert::describe_devices() << ")" << std::endl;
  GTEST_SKIP() << "skipped: no CUDA device";
}

#endif
