// The attention ops with a local window (kernels/ops/attention.h: query i attends key j of its
// sequence when |i - j| <= window / 2; window 0 is global): the table entry AttentionWindow.
//
// fp32 cases, each run by both runners: the forward, then the backward from the CPU backend's
// forward outputs (its lse layout, [rows, heads], on every backend), over mixed lengths 1..200
// in every layout (packed with padding rows, padded, unpadded, empty slots after), windows 1
// (each token alone), 2, 3 (odd and even give the same half-width 1), small ones far inside the
// sequences (16, 33), windows that reach past both ends of most sequences (128) or are wider
// than every sequence (1000), window 0, and one sequence of 8192 tokens with window 128 (and a
// global one outside the emulated build, in fp32 and 16 bits).
// - The reference runner: out and lse against the double loop (ref::attention_seq with the
//   window), dqkv against the double formulas of the gradient (ref::attention_seq_backward),
//   rel L2 kTol each, as the global cases of op_cases.cpp (a windowed row sums fewer terms).
//   Swept over 1000 seeds (`scripts/seed_sweep.py --seeds 1000 --jobs 2 --
//   build-cpu/tests/test_ops_reference --gtest_filter=OpsReference.AttentionWindow`, 0.8 s per
//   seed): worst 3.27e-7 (dqkv, window 1000, p 0.1), margin 30.6; no failed run. The short cases
//   also hold dqkv against central differences of the double forward (every coordinate), which
//   checks the formulas themselves (their derived bound below: worst 2.6e-10 of 1e-8).
// - The backend runner: out and lse rel L2 kTol, dqkv kAttnBwdTol against the CPU backend, as
//   the global cases (op_cases.h). Swept in the emulated build over 50 seeds (36 s per seed;
//   test_backend_ops --gtest_filter=BackendOps.AttentionWindow): worst 3.34e-7 (out, window
//   1000), margin 29.9; dqkv 3.22e-7 of 2e-5. The global cases of 8192 tokens (fp32 and 16-bit)
//   run on a GPU only: emulated, one run each took 5.6 and 2.2 minutes, fp32 out 1.55e-6 (margin
//   6.5), dqkv 1.68e-6 (11.9), bf16 at most 2.42e-3 (dq, 4.1). Each is a rel L2 over 131072 or
//   more elements, which varies little from seed to seed (the windowed long case against the
//   double reference over 30 seeds: out 2.43e-7 to 2.50e-7), so one run stands for the sweep a
//   GPU would give.
// The bf16 / f16 cases (add_attention_lowp, op_cases.cpp, with its tolerances and their
// derivation) run the same windows through the tensor-core kernels. Swept over 20 seeds as the
// global ones (25 s per seed; --gtest_filter=BackendOpsLowp.AttentionWindow): worst bf16 dq
// 2.95e-3 of 1e-2 (window 16), margin 3.4, the global cases' 3.5 and the derivation's 4x; f16
// 4.6e-4 of 2.5e-3 (window 3), margin 5.5. Window 1 runs there without dropout only: dq and dk
// are 0 in exact arithmetic (one key: dS = 0), and with dropout both sides return the rounding
// of the dropout scale in P f, which the gradients' floor cannot absorb (the reason of the
// one-token case's p = 0 in op_cases.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "measure.h"
#include "op_cases.h"
#include "reference_ops.h"

namespace packbert::test {

namespace {

using Vec = std::vector<double>;

DropoutStream window_stream(const Dropout& d) {
  return make_dropout_stream(d.p, d.seed, d.step, d.layer, static_cast<uint32_t>(d.site));
}

// layout: 0 unpadded, 1 padded to max_len, 2 packed into rows of max_len, 3 unpadded with 21
// padding rows and 3 empty slots after.
HostLayout window_layout(const std::vector<int32_t>& lens, const std::vector<int64_t>& ids,
                         int layout, int32_t max_len) {
  return layout == 0   ? unpadded(lens, ids)
         : layout == 1 ? padded(lens, ids, max_len)
         : layout == 2 ? packed(lens, ids, max_len)
                       : with_empty_slots(unpadded(lens, ids), 21, 3);
}

const char* layout_name(int layout) {
  return layout == 0 ? "unpadded" : layout == 1 ? "padded" : layout == 2 ? "packed" : "slots";
}

// The double reference of a whole layout: out [rows, H], lse [rows, heads] and dqkv [rows, 3H]
// (0 in rows of no sequence, as the op writes them).
struct WindowReference {
  Vec out, lse, dqkv;
};
WindowReference window_reference(const OpRun& cpu, int64_t hidden, int heads, int64_t window) {
  const HostLayout& l = cpu.host_layout(0);
  const DropoutStream ds = window_stream(cpu.dropout());
  const Vec qkv = cpu.doubles("qkv"), dy = cpu.doubles("dout");
  const int64_t ld = 3 * hidden;
  WindowReference w{Vec(static_cast<size_t>(l.rows * hidden), 0.0),
                    Vec(static_cast<size_t>(l.rows * heads), 0.0),
                    Vec(static_cast<size_t>(l.rows * ld), 0.0)};
  for (size_t s = 0; s < l.seq_len.size(); ++s) {
    Vec lse;
    const Vec o = ref::attention_seq(qkv, l, s, heads, hidden, ds, &lse, window);
    const Vec g = ref::attention_seq_backward(qkv, dy, l, s, heads, hidden, ds, window);
    for (int32_t i = 0; i < l.seq_len[s]; ++i) {
      const int64_t row = l.row(s, i);
      std::copy_n(o.begin() + i * hidden, hidden, w.out.begin() + row * hidden);
      std::copy_n(lse.begin() + i * heads, heads, w.lse.begin() + row * heads);
      std::copy_n(g.begin() + i * ld, ld, w.dqkv.begin() + row * ld);
    }
  }
  return w;
}

// Central differences of L = sum(dout * out) wrt every coordinate of qkv, each from the double
// forward of the coordinate's own sequence (0 for padding rows, an input of nothing).
Vec window_fd(const OpRun& cpu, int64_t hidden, int heads, int64_t window) {
  const HostLayout& l = cpu.host_layout(0);
  const DropoutStream ds = window_stream(cpu.dropout());
  Vec qkv = cpu.doubles("qkv");
  const Vec dy = cpu.doubles("dout");
  const int64_t ld = 3 * hidden;
  Vec fd;
  for (size_t i = 0; i < qkv.size(); ++i) {
    const int32_t s = l.token_seq[static_cast<size_t>(static_cast<int64_t>(i) / ld)];
    if (s < 0) {
      fd.push_back(0.0);
      continue;
    }
    auto loss = [&](const Vec& q) {
      const Vec o =
          ref::attention_seq(q, l, static_cast<size_t>(s), heads, hidden, ds, nullptr, window);
      double sum = 0;
      for (int32_t t = 0; t < l.seq_len[static_cast<size_t>(s)]; ++t)
        for (int64_t k = 0; k < hidden; ++k)
          sum += dy[static_cast<size_t>(l.row(static_cast<size_t>(s), t) * hidden + k)] *
                 o[static_cast<size_t>(t * hidden + k)];
      return sum;
    };
    fd.push_back(fd_gradient(loss, qkv, {i})[0]);
  }
  return fd;
}

struct WindowCase {
  std::string name;
  std::vector<int32_t> lens;  // empty: mixed lengths 1..200 drawn from the case's generator
  int layout = 2;
  int32_t max_len = 256;
  int64_t hidden = 32;
  int heads = 2;
  float p = 0.f;
  int64_t window = 0;
  bool reference = true;  // run by the reference runner too
  bool fd = false;        // dqkv also against central differences (short sequences only)
};

void add_window_case(OpCases& cases, const WindowCase& w) {
  OpCase c;
  c.name = fmt::format("attention window {} {} {} H{} heads{} p{}", w.window, w.name,
                       layout_name(w.layout), w.hidden, w.heads, w.p);
  c.run = [w](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = w.lens.empty() ? mixed_lengths(g, 4) : w.lens;
    const HostLayout l =
        window_layout(lens, random_sample_ids(g, lens.size()), w.layout, w.max_len);
    const int64_t rows = l.rows, hidden = w.hidden;
    const int heads = w.heads;
    const Dropout d = make_dropout(w.p, g(), DropoutSite::attention_probs, 5, 321);
    r.set_dropout(d);
    // Scale 2: scores of std ~1.3 (head dim 16), so the softmax is far from uniform.
    auto qkv = random_floats(g, rows * 3 * hidden, 2.f), dy = random_floats(g, rows * hidden);
    const SeqLayout sl = r.layout(l);
    const Tensor tqkv = r.in("qkv", DType::f32, {rows, 3 * hidden}, qkv, unchanged());
    r.backend().attention_forward(sl, tqkv, heads, w.window, d,
                                  r.out("out", DType::f32, {rows, hidden}, close_to(kTol)),
                                  r.out("lse", DType::f32, {rows, heads}, close_to(kTol)));
    std::vector<float> out(rows * hidden), lse(rows * heads);
    OpRun::host().attention_forward(l.view(), hv(qkv, {rows, 3 * hidden}), heads, w.window, d,
                                    hv(out, {rows, hidden}), hv(lse, {rows, heads}));
    r.backend().attention_backward(
        sl, tqkv, r.in("saved out", DType::f32, {rows, hidden}, out),
        r.in("saved lse", DType::f32, {rows, heads}, lse),
        r.in("dout", DType::f32, {rows, hidden}, dy, unchanged()), heads, w.window, d,
        r.out("dqkv", DType::f32, {rows, 3 * hidden}, close_to(kAttnBwdTol)));
  };
  if (w.reference)
    c.reference = [w](const std::string& what, const OpRun& cpu) {
      const WindowReference want = window_reference(cpu, w.hidden, w.heads, w.window);
      expect_close(what + " out", cpu.doubles("out"), want.out, kTol);
      expect_close(what + " lse", cpu.doubles("lse"), want.lse, kTol);
      expect_close(what + " dqkv", cpu.doubles("dqkv"), want.dqkv, kTol);
      if (!w.fd) return;
      // The formulas against central differences of the double forward, step 1e-5 on inputs in
      // [-2, 2]: truncation h^2 / 6 |L'''| and cancellation 2^-53 |L| / h, both about 1e-10 of
      // the gradient's scale (scores and sums of a few terms of order 1), so 1e-8 relative is a
      // bound with a wide margin; the CPU's dqkv against them, kTol (the global FD cases').
      const Vec fd = window_fd(cpu, w.hidden, w.heads, w.window);
      expect_bound(what + " reference dqkv vs finite differences", rel_l2(want.dqkv, fd), 1e-8);
      expect_close(what + " dqkv (FD)", cpu.doubles("dqkv"), fd, kTol);
    };
  cases.push_back(std::move(c));
}

}  // namespace

OpCases attention_window_cases(bool emulated) {
  OpCases cases;
  // Every kind of window over mixed lengths 1..200, packed into rows of 256 (padding rows).
  for (int64_t window : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{16}, int64_t{33}, int64_t{128},
                         int64_t{1000}, int64_t{0}})
    for (float p : {0.f, 0.1f}) {
      WindowCase w;
      w.name = "lens 1..200";
      w.window = window;
      w.p = p;
      add_window_case(cases, w);
    }
  // The other layouts and head dims (64, 32, 20), one window each that cuts most sequences.
  const std::vector<int32_t> lens = {1, 2, 17, 64, 33, 127, 5, 200, 90};
  auto layout_case = [&](int layout, int64_t hidden, int heads, int64_t window, float p) {
    WindowCase w;
    w.name = "9 seqs";
    w.lens = lens;
    w.layout = layout;
    w.max_len = 200;
    w.hidden = hidden;
    w.heads = heads;
    w.window = window;
    w.p = p;
    add_window_case(cases, w);
  };
  layout_case(0, 128, 2, 16, 0.1f);
  layout_case(1, 96, 3, 33, 0.1f);
  layout_case(2, 40, 2, 7, 0.f);
  layout_case(3, 64, 2, 64, 0.1f);
  // Short sequences, every coordinate of dqkv against finite differences too.
  for (int64_t window : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{9}})
    for (float p : {0.f, 0.2f}) {
      WindowCase w;
      w.name = "5 short seqs";
      w.lens = {1, 2, 5, 8, 3};
      w.max_len = 8;
      w.hidden = 8;
      w.window = window;
      w.p = p;
      w.fd = true;
      add_window_case(cases, w);
    }
  // One long sequence: 8192 tokens, one head of dim 16, window 128, with dropout; and global
  // attention at that length for the backend runner outside the emulated build (there it would
  // take minutes; its double reference, O(len^2), takes 6 s).
  for (int64_t window : {int64_t{128}, int64_t{0}}) {
    if (window == 0 && emulated) continue;
    WindowCase w;
    w.reference = window != 0;
    w.name = "one long seq";
    w.lens = {8192};
    w.layout = 0;
    w.max_len = 8192;
    w.hidden = 16;
    w.heads = 1;
    w.window = window;
    w.p = 0.1f;
    add_window_case(cases, w);
  }
  // bf16 / f16 (the tensor-core kernels) over every length bucket, and the long sequence.
  const std::vector<int32_t> bounds =
      emulated ? std::vector<int32_t>{1, 3, 17, 63, 64, 65, 127, 129, 200}
               : std::vector<int32_t>{1,   2,   3,   17,  63,  64,  65,  127, 128, 129, 200,
                                      255, 256, 257, 301, 383, 384, 385, 450, 511, 512};
  for (DType t : {DType::bf16, DType::f16}) {
    add_attention_lowp(cases, t, "bucket bounds", bounds, 0, 0, 2, 0.f, 1);
    // Three keys per query: dS's roundings no longer average out over the keys (and its three
    // terms cancel), which the f16 tolerance (8x the store's rounding) absorbs and bf16's 4x
    // does not (3.5e-3 against 1e-2 in one run); bf16 takes 33 keys.
    if (t == DType::f16) add_attention_lowp(cases, t, "bucket bounds", bounds, 0, 0, 2, 0.f, 3);
    add_attention_lowp(cases, t, "bucket bounds", bounds, 0, 0, 2, 0.f, 33);
    add_attention_lowp(cases, t, "bucket bounds", bounds, 0, 0, 2, 0.1f, 16);
    add_attention_lowp(cases, t, "bucket bounds", bounds, 0, 0, 2, 0.1f, 128);
    add_attention_lowp(cases, t, "packed", {5, 130, 1, 200, 77, 31}, 2, 256, 3, 0.1f, 100);
    add_attention_lowp(cases, t, "padded", {5, 130, 1, 200, 77, 31}, 1, 256, 2, 0.f, 65);
    add_attention_lowp(cases, t, "one long seq", {8192}, 0, 0, 1, 0.1f, 128);
    if (!emulated) add_attention_lowp(cases, t, "one long seq", {8192}, 0, 0, 1, 0.1f, 0);
  }
  return cases;
}

}  // namespace packbert::test
