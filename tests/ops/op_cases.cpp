// The op cases of op_cases.h, and the two runners' loops.
#include "op_cases.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/common/lowp_convert.h"
#include "kernels/common/math.h"
#include "kernels/common/philox.h"
#include "float_format.h"
#include "reference_ops.h"

namespace packbert::test {

// ---- helpers ----------------------------------------------------------------------------------
double ulp16(DType t, double x) {
  const int mant = t == DType::bf16 ? 7 : 10;
  int e = 0;
  std::frexp(x == 0.0 ? 1e-30 : std::abs(x), &e);  // |x| = m 2^e, m in [0.5, 1)
  const double u = std::ldexp(1.0, e - 1 - mant);
  return t == DType::f16 ? std::max(u, std::ldexp(1.0, -24)) : u;
}

std::vector<float> randn(std::mt19937_64& rng, size_t n, float s) {
  std::normal_distribution<float> nd(0.f, s);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

void expect_lowp_match(const std::string& what, DType t, const std::vector<uint16_t>& g,
                       const std::vector<uint16_t>& want) {
  ASSERT_EQ(g.size(), want.size()) << what;
  double ss = 0;
  for (uint16_t w : want) ss += static_cast<double>(widen16(t, w)) * widen16(t, w);
  const double floor = 1e-5 * std::sqrt(ss / static_cast<double>(std::max<size_t>(want.size(), 1)));
  size_t exact = 0, bad = 0, non_finite = 0;
  double worst = 0, worst_of_bound = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = widen16(t, g[i]), b = widen16(t, want[i]);
    if (!std::isfinite(a) || !std::isfinite(b)) {  // NaN never passes
      ++non_finite;
      continue;
    }
    exact += g[i] == want[i];
    const double ulps = std::abs(a - b) / ulp16(t, b);
    worst = std::max(worst, ulps);
    worst_of_bound = std::max(worst_of_bound, std::abs(a - b) / (2 * ulp16(t, b) + floor));
    if (std::abs(a - b) > 2 * ulp16(t, b) + floor) {
      if (bad++ < 5)
        ADD_FAILURE() << what << ": element " << i << " is " << a << ", the emulation's " << b;
    }
  }
  const double frac = g.empty() ? 1.0 : static_cast<double>(exact) / static_cast<double>(g.size());
  std::printf("[lowp-error] %-62s worst %.1f ulp\n", what.c_str(), worst);
  EXPECT_EQ(non_finite, 0u) << what << ": unwritten or non-finite elements (either side)";
  EXPECT_EQ(bad, 0u) << what << ": elements beyond 2 ulp";
  print_bound(what + ": worst element / (2 ulp + floor)", worst_of_bound, 1.0);
  expect_measure(what + ": fraction not bit-exact", 1 - frac, 1 - kMinExact);
}

namespace {

std::vector<uint16_t> as16(const std::vector<uint8_t>& b) {
  std::vector<uint16_t> v(b.size() / 2);
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::vector<double> widen_bytes(DType t, const std::vector<uint8_t>& b, size_t n) {
  Guarded<uint8_t> tmp(host_memory(), {static_cast<int64_t>(n)}, t);
  if (n) tmp.set_bytes(b.data());
  return tmp.doubles();
}

// The low-precision linear ops' bar (linear_forward / linear_backward / gather_rows_backward with
// repeats): CUDA and the CPU's emulation differ by one 16-bit rounding per element, not by
// summation order alone: CUDA applies GELU and its derivative to the stored 16-bit
// pre-activation where the CPU uses the fp32 one, and rounds d(pre) to 16 bits before the
// weight-gradient GEMMs read it. One rounding is at most 2^-9 (bf16) or 2^-12 (f16) of a value;
// GELU multiplies it by x gelu'(x) / gelu(x), ~9 near x = -3, and db's sum over rows cancels to
// below its terms. Measured over 1000 seeds (tests/seed_sweeps.txt): bf16 4.2e-3 (db of n64 k24
// m19), f16 6.8e-4. Bars 1.5e-2 and 2.5e-3 (margins 3.6 and 3.7); a wrong epilogue,
// transposition or bias is of order 1e-1 and above.
double lowp_linear_tol(DType t) { return t == DType::bf16 ? 1.5e-2 : 2.5e-3; }

}  // namespace

std::vector<float> floats_of(const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

std::string ep_name(Epilogue e) {
  return e == Epilogue::none        ? "none"
         : e == Epilogue::bias      ? "bias"
         : e == Epilogue::bias_gelu ? "bias_gelu"
                                    : "bias_gelu_tanh";
}

// A bound on |loss - loss'| of two fp32 evaluations of the NSP loss in any summation order, from
// its fp32 inputs (a 16-bit input widened is exact in fp32) in double. With u = 2^-24 and g(n) = n
// u / (1 - n u) (a sum of n fp32 terms in any order is off by at most g(n) times the sum of their
// magnitudes), for sequence s, logit j, pooled unit k, each value is off by at most:
//   pre_sk    = bp_k + sum_i wp_ki x_si       g(h+1) P_sk, with P_sk = |bp_k| + sum_i |wp_ki x_si|
//   pooled_sk = tanh(pre_sk)                  g(h+1) P_sk + 4u |pooled_sk|
//                                             (|tanh'| <= 1; tanhf within 2 ulp)
//   z_sj      = bc_j + sum_k wc_jk pooled_sk  g(h+1) T_sj + sum_k |wc_jk| dpooled_sk, with
//                                             T_sj = |bc_j| + sum_k |wc_jk pooled_sk|
//   ce_s      = lse(z_s) - z_s,label          2 max_j dz_sj + 8u (1 + |lse| + |z_label|)
//                                             (exp, log and the adds, a few ulp each)
//   loss      = init + scale sum_s ce_s       scale sum_s dce_s + g(s+1) (|init| + scale sum|ce|)
// Each side is within that of the exact value, so the two are within twice it.
double nsp_loss_bound(const HostLayout& l, const std::vector<float>& x,
                      const std::vector<float>& wp, const std::vector<float>& bp,
                      const std::vector<float>& wc, const std::vector<float>& bc,
                      const std::vector<int32_t>& labels, double init, double scale, int64_t h) {
  constexpr double u = 1.0 / (1 << 24);
  auto g = [](double n) { return n * u / (1 - n * u); };
  auto at = [](const std::vector<float>& v, int64_t i) {
    return static_cast<double>(v[static_cast<size_t>(i)]);
  };
  double dloss = 0, ce_sum = 0;
  for (size_t q = 0; q < l.seq_start.size(); ++q) {
    if (l.seq_len[q] == 0) continue;  // an empty slot, left out
    const int64_t row = l.seq_start[q];
    std::vector<double> pooled(static_cast<size_t>(h)), dpooled(static_cast<size_t>(h));
    for (int64_t k = 0; k < h; ++k) {
      double pre = at(bp, k), mag = std::abs(at(bp, k));
      for (int64_t i = 0; i < h; ++i) {
        pre += at(wp, k * h + i) * at(x, row * h + i);
        mag += std::abs(at(wp, k * h + i) * at(x, row * h + i));
      }
      pooled[static_cast<size_t>(k)] = std::tanh(pre);
      dpooled[static_cast<size_t>(k)] = g(h + 1) * mag + 4 * u * std::abs(std::tanh(pre));
    }
    double z[2], dz[2];
    for (int64_t j = 0; j < 2; ++j) {
      double a = at(bc, j), mag = std::abs(at(bc, j)), carried = 0;
      for (int64_t k = 0; k < h; ++k) {
        a += at(wc, j * h + k) * pooled[static_cast<size_t>(k)];
        mag += std::abs(at(wc, j * h + k) * pooled[static_cast<size_t>(k)]);
        carried += std::abs(at(wc, j * h + k)) * dpooled[static_cast<size_t>(k)];
      }
      z[j] = a;
      dz[j] = g(h + 1) * mag + carried;
    }
    const double m = std::max(z[0], z[1]);
    const double lse = m + std::log(std::exp(z[0] - m) + std::exp(z[1] - m));
    const double zl = z[labels[q]];
    ce_sum += lse - zl;
    dloss += scale * (2 * std::max(dz[0], dz[1]) + 8 * u * (1 + std::abs(lse) + std::abs(zl)));
  }
  const double s = static_cast<double>(l.seq_start.size());
  dloss += g(s + 1) * (std::abs(init) + scale * ce_sum);
  return 2 * dloss;
}

// ---- OpRun ------------------------------------------------------------------------------------
OpRun::OpRun(Backend& backend, const Memory& memory, uint64_t seed)
    : be_(&backend), mem_(&memory), rng_(seed) {}

Backend& OpRun::host() {
  static std::unique_ptr<Backend> cpu = make_cpu_backend();
  return *cpu;
}

Tensor OpRun::add(const std::string& name, DType t, std::vector<int64_t> dims, const void* init,
                  Check check, bool written, bool finite) {
  EXPECT_EQ(index_.count(name), 0u) << "buffer " << name << " twice";
  Entry e;
  e.name = name;
  e.buf = std::make_unique<GuardedBytes>(*mem_, t, std::move(dims));
  e.check = check;
  e.written = written;
  e.finite = finite;
  if (init) {
    e.buf->set_bytes(init);
    const auto* p = static_cast<const uint8_t*>(init);
    e.initial.assign(p, p + e.buf->size() * dtype_size(t));
  }
  const Tensor v = e.buf->tensor();
  index_[name] = entries_.size();
  entries_.push_back(std::move(e));
  return v;
}

Tensor OpRun::in(const std::string& name, DType t, std::vector<int64_t> dims,
                 const std::vector<float>& values, Check check) {
  if (is_lowp(t)) {
    const std::vector<uint16_t> b = round16(t, values);
    return add(name, t, std::move(dims), b.data(), check, false);
  }
  EXPECT_EQ(t, DType::f32) << name;
  return add(name, t, std::move(dims), values.data(), check, false);
}
Tensor OpRun::in(const std::string& name, std::vector<int64_t> dims,
                 const std::vector<int32_t>& values, Check check) {
  return add(name, DType::i32, std::move(dims), values.data(), check, false);
}
Tensor OpRun::in(const std::string& name, std::vector<int64_t> dims,
                 const std::vector<int64_t>& values, Check check) {
  return add(name, DType::i64, std::move(dims), values.data(), check, false);
}
Tensor OpRun::in_bits(const std::string& name, DType t, std::vector<int64_t> dims, const void* bits,
                      Check check) {
  return add(name, t, std::move(dims), bits, check, false);
}
Tensor OpRun::out(const std::string& name, DType t, std::vector<int64_t> dims, Check check) {
  return add(name, t, std::move(dims), nullptr, check, true);
}
Tensor OpRun::out_any(const std::string& name, DType t, std::vector<int64_t> dims, Check check) {
  return add(name, t, std::move(dims), nullptr, check, true, false);
}
Tensor OpRun::acc(const std::string& name, DType t, std::vector<int64_t> dims,
                  const std::vector<float>& init, Check check) {
  if (is_lowp(t)) {
    const std::vector<uint16_t> b = round16(t, init);
    return add(name, t, std::move(dims), b.data(), check, false);
  }
  return add(name, t, std::move(dims), init.data(), check, false);
}
Tensor OpRun::acc(const std::string& name, std::vector<int64_t> dims,
                  const std::vector<int32_t>& init, Check check) {
  return add(name, DType::i32, std::move(dims), init.data(), check, false);
}

SeqLayout OpRun::layout(const HostLayout& l) {
  host_layouts_.push_back(l);
  layouts_.push_back(std::make_unique<LayoutOn>(*mem_, l));
  return layouts_.back()->view();
}

const GuardedBytes& OpRun::buf(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw Error("no buffer " + name);
  return *entries_[it->second].buf;
}

std::vector<double> OpRun::initial(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw Error("no buffer " + name);
  const Entry& e = entries_[it->second];
  return widen_bytes(e.buf->dtype(), e.initial, e.initial.empty() ? 0 : e.buf->size());
}

// ---- runners ------------------------------------------------------------------------------
namespace {

uint64_t case_salt(const OpCase& c) { return std::hash<std::string>{}(c.name); }

// PACKBERT_OP_CASES (op_cases.h).
bool selected(const OpCase& c) {
  const char* only = std::getenv("PACKBERT_OP_CASES");
  return only == nullptr || c.name.find(only) != std::string::npos;
}

// One registered test: its body.
class OpTableTest : public testing::Test {
 public:
  explicit OpTableTest(std::function<void()> body) : body_(std::move(body)) {}
  void TestBody() override { body_(); }

 private:
  std::function<void()> body_;
};

// Guards of every buffer, every written output written and finite.
void check_own(const std::string& what, const OpRun& r) {
  for (const auto& e : r.entries()) {
    EXPECT_TRUE(e.buf->guards_intact()) << what << " " << e.name << ": write outside the buffer";
    if (e.written && e.finite) {
      EXPECT_EQ(e.buf->non_finite(), 0u)
          << what << " " << e.name << ": unwritten or non-finite elements";
    }
    if (e.written && !e.finite) {
      EXPECT_EQ(e.buf->unwritten(), 0u) << what << " " << e.name << ": unwritten elements";
    }
    if (e.check.kind == Check::unchanged) {
      EXPECT_TRUE(e.buf->bytes() == e.initial) << what << " " << e.name << ": changed";
    }
  }
}

void compare_runs(const std::string& what, const OpRun& want, const OpRun& got) {
  for (const auto& e : got.entries()) {
    const std::string w = what + " " + e.name;
    if (!want.has(e.name)) {
      ADD_FAILURE() << w << ": not in the CPU backend's run";
      continue;
    }
    const GuardedBytes& ref = want.buf(e.name);
    switch (e.check.kind) {
      case Check::none:
      case Check::unchanged: break;
      case Check::close: expect_close(w, e.buf->doubles(), ref.doubles(), e.check.tol); break;
      case Check::increments: {
        const std::vector<double> init = widen_bytes(e.buf->dtype(), e.initial, e.buf->size());
        std::vector<double> a = e.buf->doubles(), b = ref.doubles();
        for (size_t i = 0; i < a.size() && i < init.size(); ++i) a[i] -= init[i], b[i] -= init[i];
        expect_close(w, a, b, e.check.tol);
        break;
      }
      case Check::exact:
        EXPECT_TRUE(e.buf->bytes() == ref.bytes()) << w << ": not the CPU backend's bits";
        break;
      case Check::lowp:
        expect_lowp_match(w, e.buf->dtype(), as16(e.buf->bytes()), as16(ref.bytes()));
        break;
      case Check::abs_diff: {
        const std::vector<double> a = e.buf->doubles(), b = ref.doubles();
        double worst = 0;
        for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
        expect_measure(w, worst, e.check.tol);
        break;
      }
    }
  }
}

}  // namespace

int run_against(const OpCases& cases, bool lowp_mode, Backend& want, const Memory& want_mem,
                Backend& got, const Memory& got_mem) {
  int n = 0;
  for (const OpCase& c : cases) {
    if (is_lowp(c.dtype) != lowp_mode || !selected(c)) continue;
    SCOPED_TRACE(c.name);
    ++n;
    OpRun a(want, want_mem, make_rng(case_salt(c))());
    c.run(a);
    want.synchronize();
    OpRun b(got, got_mem, make_rng(case_salt(c))());
    c.run(b);
    got.synchronize();
    check_own(c.name + " (" + want.name() + ")", a);
    check_own(c.name, b);
    compare_runs(c.name, a, b);
    if (c.compare) c.compare(c.name, a, b);
  }
  return n;
}

int run_reference(const OpCases& cases) {
  int n = 0;
  Backend& cpu = OpRun::host();
  for (const OpCase& c : cases) {
    if (!c.reference || !selected(c)) continue;
    SCOPED_TRACE(c.name);
    ++n;
    OpRun a(cpu, host_memory(), make_rng(case_salt(c))());
    c.run(a);
    check_own(c.name, a);
    c.reference(c.name, a);
  }
  return n;
}

bool register_op_tests(const char* suite, bool emulated,
                       const std::function<bool(const OpCase&)>& wanted,
                       const std::function<void(const OpCases&)>& body) {
  for (const OpTable& t : op_tables()) {
    const OpCases cases = t.cases(emulated);
    if (std::none_of(cases.begin(), cases.end(), wanted)) continue;
    testing::RegisterTest(
        suite, t.op.c_str(), nullptr, nullptr, __FILE__, __LINE__,
        [t, emulated, body]() -> testing::Test* {
          return new OpTableTest([t, emulated, body] { body(t.cases(emulated)); });
        });
  }
  return true;
}

// ---- linear -----------------------------------------------------------------------------------
using ref::Vec;

namespace {

// The double forward of each epilogue: y = act(x w^T + b).
Vec linear_ref(const Vec& x, const Vec& w, const Vec& b, Epilogue e, int64_t n, int64_t k,
               int64_t m, Vec* pre = nullptr) {
  Vec y = ref::linear(x, w, e == Epilogue::none || b.empty() ? nullptr : &b, n, k, m);
  if (pre) *pre = y;
  if (has_gelu(e))
    for (auto& v : y) v = ref::gelu(v, gelu_of(e));
  return y;
}

constexpr Epilogue kEpilogues[] = {Epilogue::none, Epilogue::bias, Epilogue::bias_gelu,
                                   Epilogue::bias_gelu_tanh};

}  // namespace

static OpCases linear_forward_cases() {
  OpCases cases;
  // ws: the scale of the weights. The GPU's shapes draw them at 1 (pre-activations of order 1 to
  // 6: the GELU epilogues' tanh over its whole range); the reference's at 0.2, as its tolerance
  // was swept with.
  struct Shape {
    int64_t n, k, m;
    float ws = 1.f;
  };
  // no_bias: a GELU epilogue without a bias (a layer of a model without biases).
  auto add = [&cases](DType t, Shape s, Epilogue ep, bool no_bias = false) {
    const bool lowp = is_lowp(t), gelu = has_gelu(ep), with_bias = ep != Epilogue::none && !no_bias;
    const int64_t n = s.n, k = s.k, m = s.m;
    const bool epilogue_gelu = ep == Epilogue::bias_gelu_tanh && m % 8 == 0;
    OpCase c;
    c.dtype = t;
    const char* bias_note = no_bias ? " without bias" : epilogue_gelu ? " GELU_AUX_BIAS" : "";
    c.name = lowp ? fmt::format("linear_forward {} n{} k{} m{} {}{}", dtype_name(t), n, k, m,
                                ep_name(ep), bias_note)
                  : fmt::format("linear_forward n{} k{} m{} {}{}", n, k, m, ep_name(ep), bias_note);
    const double tol = lowp                        ? lowp_linear_tol(t)
                       : epilogue_gelu && !no_bias ? kGeluEpilogueTol
                                                   : kTol;
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const auto x = lowp ? randn(g, n * k) : random_floats(g, n * k);
      const auto w = lowp ? randn(g, m * k, 0.2f) : random_floats(g, m * k, s.ws);
      const auto b = lowp ? randn(g, m) : random_floats(g, m);
      const Tensor tx = r.in("x", t, {n, k}, x), tw = r.in("w", t, {m, k}, w);
      const Tensor tb = with_bias ? r.in("bias", DType::f32, {m}, b) : Tensor();
      const Tensor out = r.out("out", t, {n, m}, close_to(tol));
      const Tensor pre = gelu ? r.out("pre", t, {n, m}, close_to(lowp ? tol : kTol)) : Tensor();
      r.backend().linear_forward(tx, tw, tb, ep, out, pre);
    };
    if (!lowp)
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        Vec want_pre;
        const Vec want =
            linear_ref(cpu.doubles("x"), cpu.doubles("w"), with_bias ? cpu.doubles("bias") : Vec(),
                       ep, n, k, m, &want_pre);
        expect_close(what + " out", cpu.doubles("out"), want, kTol);
        if (gelu) expect_close(what + " pre", cpu.doubles("pre"), want_pre, kTol);
      };
    cases.push_back(std::move(c));
  };
  // fp32: the GPU's tile edges (1, 5, 130 rows; k 1 and 128; m 2 and 3) and the reference's
  // (a 1x1x1 product that cancels its bias, k = 768).
  for (const Shape s : {Shape{37, 24, 40}, Shape{1, 8, 3}, Shape{130, 64, 96}, Shape{5, 1, 7},
                        Shape{64, 128, 2}, Shape{37, 29, 53, 0.2f}, Shape{1, 1, 1, 0.2f},
                        Shape{130, 768, 96, 0.2f}, Shape{64, 3, 7, 0.2f}})
    for (Epilogue ep : kEpilogues) add(DType::f32, s, ep);
  for (DType t : {DType::bf16, DType::f16})
    for (const Shape s : {Shape{37, 64, 48}, Shape{64, 24, 19}, Shape{5, 128, 512}})
      for (Epilogue ep : kEpilogues) add(t, s, ep);
  // The GELU epilogues without a bias (the kernels' GELU, never GELU_AUX_BIAS).
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (const Shape s : {Shape{37, 29, 53, 0.2f}, Shape{64, 24, 48}})
      for (Epilogue ep : {Epilogue::bias_gelu, Epilogue::bias_gelu_tanh}) add(t, s, ep, true);
  return cases;
}

// Variant bits of linear_backward: 1 dx, 2 dw, 4 db (and the bias in the forward), 8
// dx_accumulate, 16 x = gelu(x_gelu_pre), 32 out_gelu_pre (dout is wrt gelu(pre)), 64 the tanh
// GELU for both, 128 x not given (dx only).
static OpCases linear_backward_cases() {
  OpCases cases;
  struct Shape {
    int64_t n, k, m;
  };
  auto add = [&cases](DType t, Shape s, int var) {
    const bool lowp = is_lowp(t);
    const int64_t n = s.n, k = s.k, m = s.m;
    const bool want_dx = var & 1, want_dw = var & 2, want_db = var & 4, accumulate = var & 8,
               x_gelu = var & 16, out_gelu = var & 32, no_x = var & 128;
    const bool with_bias = want_db || out_gelu;
    const Gelu form = var & 64 ? Gelu::tanh : Gelu::erf;
    const bool epilogue_dgelu = (var & 64) && x_gelu && k % 8 == 0;  // DGELU
    OpCase c;
    c.dtype = t;
    c.name = fmt::format("linear_backward {}n{} k{} m{} var{}{}",
                         lowp ? std::string(dtype_name(t)) + " " : "", n, k, m, var,
                         epilogue_dgelu ? " DGELU" : "");
    const double tol = lowp ? lowp_linear_tol(t) : kTol;
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      // fp32: uniform values; 16-bit: normal ones, dout of 1e-2 and accumulated gradients of
      // 1e-3 (a backward's scale).
      const auto xpre = lowp ? randn(g, n * k) : random_floats(g, n * k, 2.f);
      const auto w = lowp ? randn(g, m * k, 0.2f) : random_floats(g, m * k, 0.5f);
      const auto b = lowp ? randn(g, m) : random_floats(g, m);
      const auto dout = lowp ? randn(g, n * m, 1e-2f) : random_floats(g, n * m);
      const auto dx0 = lowp ? randn(g, n * k) : random_floats(g, n * k);
      const auto dw0 = lowp ? randn(g, m * k, 1e-3f) : random_floats(g, m * k);
      const auto db0 = lowp ? randn(g, m, 1e-3f) : random_floats(g, m);
      // x = gelu(x_gelu_pre) when dx goes through it (FFN2 after FFN1), else xpre itself.
      std::vector<float> x = xpre;
      if (x_gelu)
        for (auto& v : x) v = form == Gelu::tanh ? gelu_tanh(v) : gelu(v);
      HostT hx(t, {n, k}, x), hw(t, {m, k}, w);
      LinearBackwardOptions o;
      o.gelu = form;
      o.dx_accumulate = accumulate;
      if (x_gelu) o.x_gelu_pre = r.in("x_gelu_pre", t, {n, k}, xpre);
      const Tensor tx = no_x ? Tensor() : r.in_bits("x", t, {n, k}, hx.b.data());
      const Tensor tw = r.in_bits("w", t, {m, k}, hw.b.data());
      // The bias: the forward's below, and the objective's for the reference.
      const Tensor tbias = with_bias ? r.in("bias", DType::f32, {m}, b) : Tensor();
      if (out_gelu && lowp) {
        // 16-bit: each backend's own forward gives the pre-activation its backward reads, as in
        // the model; the two stored pre-activations differ by a rounding, which the bar
        // (lowp_linear_tol) covers.
        r.backend().linear_forward(tx, tw, tbias, bias_gelu_epilogue(form),
                                   r.out("forward out", t, {n, m}, close_to(tol)),
                                   r.out("out_gelu_pre", t, {n, m}, close_to(tol)));
        o.out_gelu_pre = r.buf("out_gelu_pre").tensor();
      } else if (out_gelu) {
        // fp32: the CPU backend's pre-activation for every backend, so the backward alone is
        // compared (kTol).
        HostT out(t, {n, m}), pre(t, {n, m});
        std::vector<float> bias = b;
        OpRun::host().linear_forward(hx.tensor(), hw.tensor(), hv(bias, {m}),
                                     bias_gelu_epilogue(form), out.tensor(), pre.tensor());
        o.out_gelu_pre = r.in_bits("out_gelu_pre", t, {n, m}, pre.b.data());
      }
      // dout becomes d(pre) in place with out_gelu_pre; otherwise it is left alone.
      const Tensor tdout = r.acc("dout", t, {n, m}, dout, out_gelu ? close_to(tol) : unchanged());
      const double dx_tol = epilogue_dgelu && !lowp ? kGeluEpilogueTol : tol;
      const Tensor tdx = !want_dx     ? Tensor()
                         : accumulate ? r.acc("dx", t, {n, k}, dx0, close_to(dx_tol))
                                      : r.out("dx", t, {n, k}, close_to(dx_tol));
      const Check gcheck = lowp ? increments_to(tol) : close_to(kTol);
      const Tensor tdw = want_dw ? r.acc("dw", DType::f32, {m, k}, dw0, gcheck) : Tensor();
      const Tensor tdb = want_db ? r.acc("db", DType::f32, {m}, db0, gcheck) : Tensor();
      r.backend().linear_backward(tx, tw, tdout, tdx, tdw, tdb, o);
    };
    // Against central differences of the double forward of L = sum(dout * y) wrt every
    // coordinate of every input, on the reference's shapes (9x7x5 and 33x17x24). Not on the
    // GPU's: their cost is coordinates x n k m, and on the one-row 1x8x3 the finite differences'
    // own error against gradients of 3 to 24 elements reached half the tolerance (5.0e-6 in 200
    // seeds, margin 2); the backend runner holds those shapes to the CPU backend.
    if (!lowp && n > 1 && n * k * m <= 15000)
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        const Epilogue ep = out_gelu    ? bias_gelu_epilogue(form)
                            : with_bias ? Epilogue::bias
                                        : Epilogue::none;
        const Vec rd = cpu.initial("dout");  // before an out_gelu_pre backward made it d(pre)
        Vec xv = cpu.doubles(x_gelu ? "x_gelu_pre" : "x"), wv = cpu.doubles("w"),
            bv = with_bias ? cpu.doubles("bias") : Vec();
        auto loss = [&](const Vec& xin, const Vec& win, const Vec& bin) {
          Vec xx = xin;
          if (x_gelu)
            for (auto& v : xx) v = ref::gelu(v, form);
          return dot_d(rd, linear_ref(xx, win, bin, ep, n, k, m));
        };
        auto inc = [&](const std::string& name) {
          Vec a = cpu.doubles(name);
          const Vec i = cpu.initial(name);
          for (size_t j = 0; j < a.size(); ++j) a[j] -= i[j];
          return a;
        };
        if (want_dx) {
          const Vec fd =
              fd_gradient([&](const Vec& v) { return loss(v, wv, bv); }, xv, all_coords(xv.size()));
          expect_close(what + " dx (FD)", accumulate ? inc("dx") : cpu.doubles("dx"), fd, kTol);
        }
        if (want_dw) {
          const Vec fd =
              fd_gradient([&](const Vec& v) { return loss(xv, v, bv); }, wv, all_coords(wv.size()));
          expect_close(what + " dw (FD)", inc("dw"), fd, kTol);
        }
        if (want_db) {
          const Vec fd =
              fd_gradient([&](const Vec& v) { return loss(xv, wv, v); }, bv, all_coords(bv.size()));
          expect_close(what + " db (FD)", inc("db"), fd, kTol);
        }
      };
    cases.push_back(std::move(c));
  };
  // fp32: the GPU's variants on four shapes.
  const int variants[] = {1,
                          1 | 8,
                          2 | 4,
                          4,
                          2,
                          1 | 2 | 4,
                          1 | 16,
                          1 | 2 | 4 | 32,
                          1 | 16 | 2 | 4,
                          1 | 16 | 64,
                          1 | 2 | 4 | 32 | 64};
  for (const Shape s : {Shape{37, 24, 40}, Shape{1, 8, 3}, Shape{130, 64, 96}, Shape{300, 16, 5}})
    for (int var : variants) add(DType::f32, s, var);
  // fp32: the reference's configurations (every gradient; the epilogue's GELU out, through x,
  // accumulated dx) on small shapes.
  for (int var : {1 | 2, 1 | 2 | 4, 1 | 2 | 4 | 32, 1 | 2 | 4 | 16, 1 | 2 | 4 | 8,
                  1 | 2 | 4 | 16 | 32, 1 | 2 | 4 | 32 | 64, 1 | 2 | 4 | 16 | 64})
    add(DType::f32, Shape{9, 7, 5}, var);
  add(DType::f32, Shape{33, 17, 24}, 1 | 2 | 4 | 32);
  add(DType::f32, Shape{33, 17, 24}, 1 | 2 | 4 | 16 | 32 | 64);
  // 16-bit: through the GELU of the forward (dx accumulated, dw and db in fp32), and dx through
  // the GELU of the input (x not given; tanh: the DGELU epilogue where k % 8 == 0).
  for (DType t : {DType::bf16, DType::f16})
    for (const Shape s : {Shape{37, 64, 48}, Shape{64, 24, 19}, Shape{5, 128, 512}})
      for (int tanh_bit : {0, 64}) {
        add(t, s, 1 | 2 | 4 | 8 | 32 | tanh_bit);
        add(t, s, 1 | 16 | 128 | tanh_bit);
      }
  return cases;
}

// ---- embeddings -------------------------------------------------------------------------------
// fp32 trials 0..3: H 64 / 130, padded (40) / unpadded, dropout 0 / 0.1. 16-bit trials 0..7 per
// dtype, bits: 1 dropout, 2 tables in the dtype (else f32, as the model passes them), 4 unpadded
// (else padded 64), and trials 3 / 6 leave out the position and gamma gradients. The forward's
// outputs are compared; the backward runs from the CPU backend's saved statistics, so only the
// backward is compared.
namespace {

// The reference's embedding cases (fp32; tables 97 x 64 x 2, gamma near 1 as in trained BERT,
// token ids 0 in padding rows): the forward at H 37 and 768 with and without dropout against the
// double loop (out and rstd rel L2 kTol; the row means are near 0, so their error is measured
// against the spread of the row, the scale LayerNorm divides out: mean - m_ref in units of
// 1 / rstd, rms over rows, kTol), and the backward at H 10 (tables 11 x 8 x 2, dropout 0.25)
// against central differences of L = sum(r * out) over every coordinate of every table, r zero
// on padding rows while dout holds values there the op must ignore.
void add_embedding_reference(OpCases& cases, bool backward, int64_t h, float p) {
  const int64_t vocab = backward ? 11 : 97, positions = backward ? 8 : 64, types = 2;
  const std::vector<int32_t> lens =
      backward ? std::vector<int32_t>{3, 1, 6, 4} : std::vector<int32_t>{5, 64, 1, 33};
  OpCase c;
  c.name = fmt::format("embedding_{} H={} p={}", backward ? "backward" : "forward", h, p);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const auto word = random_floats(g, vocab * h), pos = random_floats(g, positions * h),
               type = random_floats(g, types * h);
    auto gamma = random_floats(g, h);
    for (auto& x : gamma) x += 1.5f;
    const auto beta = random_floats(g, h);
    const HostLayout l =
        padded(lens, random_sample_ids(g, lens.size()), static_cast<int32_t>(positions));
    const int64_t rows = l.rows;
    auto tok = random_ints(g, rows, 0, static_cast<int32_t>(vocab - 1));
    auto seg = random_ints(g, rows, 0, static_cast<int32_t>(types - 1));
    for (int64_t i = 0; i < rows; ++i)
      if (l.token_seq[i] < 0) tok[i] = 0, seg[i] = 0;
    const Dropout d = make_dropout(p, g(), DropoutSite::embedding);
    r.set_dropout(d);
    const SeqLayout sl = r.layout(l);
    const Tensor ttok = r.in("tokens", {rows}, tok), tseg = r.in("segments", {rows}, seg);
    const EmbeddingParams ep{r.in("word", DType::f32, {vocab, h}, word),
                             r.in("position", DType::f32, {positions, h}, pos),
                             r.in("token_type", DType::f32, {types, h}, type),
                             r.in("gamma", DType::f32, {h}, gamma),
                             r.in("beta", DType::f32, {h}, beta)};
    if (!backward) {
      r.backend().embedding_forward(sl, ttok, tseg, ep, d,
                                    r.out("out", DType::f32, {rows, h}, close_to(kTol)),
                                    r.out("mean", DType::f32, {rows}, Check{}),
                                    r.out("rstd", DType::f32, {rows}, close_to(kTol)));
      return;
    }
    // The backward from the CPU backend's statistics.
    std::vector<float> hw = word, hp = pos, ht = type, hg = gamma, hb = beta, out(rows * h),
                       mean(rows), rstd(rows);
    OpRun::host().embedding_forward(
        l.view(), hv(tok, {rows}), hv(seg, {rows}),
        {hv(hw, {vocab, h}), hv(hp, {positions, h}), hv(ht, {types, h}), hv(hg, {h}), hv(hb, {h})},
        d, hv(out, {rows, h}), hv(mean, {rows}), hv(rstd, {rows}));
    const auto dy = random_floats(g, rows * h);
    const EmbeddingParams gr{
        r.acc("dword", DType::f32, {vocab, h}, random_floats(g, vocab * h), close_to(kTol)),
        r.acc("dposition", DType::f32, {positions, h}, random_floats(g, positions * h),
              close_to(kTol)),
        r.acc("dtoken_type", DType::f32, {types, h}, random_floats(g, types * h), close_to(kTol)),
        r.acc("dgamma", DType::f32, {h}, random_floats(g, h), close_to(kTol)),
        r.acc("dbeta", DType::f32, {h}, random_floats(g, h), close_to(kTol))};
    r.backend().embedding_backward(
        sl, ttok, tseg, ep, d, r.in("saved mean", DType::f32, {rows}, mean),
        r.in("saved rstd", DType::f32, {rows}, rstd),
        r.acc("dout (d sum)", DType::f32, {rows, h}, dy, close_to(kTol)), gr);
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const HostLayout& l = cpu.host_layout(0);
    const std::vector<int32_t> tok = ints_of(cpu.doubles("tokens")),
                               seg = ints_of(cpu.doubles("segments"));
    ref::EmbeddingInputs in{cpu.doubles("word"),       cpu.doubles("position"),
                            cpu.doubles("token_type"), cpu.doubles("gamma"),
                            cpu.doubles("beta"),       h};
    const DropoutStream ds = stream_of(cpu.dropout());
    if (!backward) {
      Vec want_mean, want_rstd;
      const Vec want = ref::embedding(in, tok, seg, l, ds, &want_mean, &want_rstd);
      expect_close(what, cpu.doubles("out"), want, kTol);
      const Vec mean = cpu.doubles("mean");
      Vec mean_err(static_cast<size_t>(l.rows)), zeros(static_cast<size_t>(l.rows), 0.0);
      for (int64_t i = 0; i < l.rows; ++i) mean_err[i] = (mean[i] - want_mean[i]) * want_rstd[i];
      expect_measure(what + " mean (x rstd)",
                     rel_l2(mean_err, zeros) / std::sqrt(static_cast<double>(l.rows)), kTol);
      expect_close(what + " rstd", cpu.doubles("rstd"), want_rstd, kTol);
      return;
    }
    Vec rd = cpu.initial("dout (d sum)");
    for (int64_t i = 0; i < l.rows; ++i)
      if (l.token_seq[i] < 0)
        for (int64_t k = 0; k < h; ++k) rd[i * h + k] = 0.0;
    auto check = [&](const char* name, Vec& param, const std::string& grad) {
      const Vec fd =
          fd_gradient([&](const Vec&) { return dot_d(rd, ref::embedding(in, tok, seg, l, ds)); },
                      param, all_coords(param.size()));
      expect_close(fmt::format("{} d{} (FD)", what, name), increments(cpu, grad), fd, kTol);
    };
    check("word", in.word, "dword");
    check("position", in.pos, "dposition");
    check("token_type", in.type, "dtoken_type");
    check("gamma", in.gamma, "dgamma");
    check("beta", in.beta, "dbeta");
  };
  cases.push_back(std::move(c));
}

}  // namespace

static OpCases embedding_cases() {
  OpCases cases;
  auto add = [&cases](DType t, int trial) {
    const bool lowp = is_lowp(t);
    const bool drop = lowp ? (trial & 1) != 0 : trial % 2 == 1;
    const bool lowp_tables = lowp && (trial & 2);
    const bool unpad = lowp ? (trial & 4) != 0 : trial >= 2;
    const bool some = lowp && (trial == 3 || trial == 6);
    const int64_t h = lowp ? (trial % 3 == 0 ? 130 : 256) : (trial % 2 ? 130 : 64);
    const int64_t vocab = 50, positions = lowp ? 64 : 40, types = 2;
    const DType tt = lowp_tables ? t : DType::f32;
    OpCase c;
    c.dtype = t;
    c.name = lowp ? fmt::format("embedding {} tables {} trial {} h {}", dtype_name(t),
                                dtype_name(tt), trial, h)
                  : fmt::format("embedding trial {} h {} p {}", trial, h, drop ? 0.1 : 0.0);
    const Check out_check = lowp ? lowp_match() : close_to(kTol);
    const Check f32_check = close_to(lowp ? kFp32Tol : kTol);
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const std::vector<int32_t> lens = {1, 17, lowp ? 64 : 40, 3, 9};
      const auto ids = random_sample_ids(g, lens.size());
      const int32_t max_seq = lowp ? 64 : 40;
      const HostLayout l = unpad ? unpadded(lens, ids) : padded(lens, ids, max_seq);
      const int64_t rows = l.rows;
      const Dropout d =
          make_dropout(drop ? 0.1f : 0.f, g(), DropoutSite::embedding, 0, lowp ? 4321 : 1234);
      // Tables: values exactly representable in t, so both table dtypes see the same values.
      auto table = [&](int64_t n) {
        std::vector<float> v = random_floats(g, n);
        if (lowp)
          for (float& x : v) x = widen16(t, round16(t, x));
        return v;
      };
      const auto word = table(vocab * h), pos = table(positions * h), type = table(types * h);
      const auto gamma = random_floats(g, h), beta = random_floats(g, h);
      const auto tok = random_ints(g, rows, 0, vocab - 1), seg = random_ints(g, rows, 0, types - 1);
      const SeqLayout sl = r.layout(l);
      const Tensor ttok = r.in("tokens", {rows}, tok), tseg = r.in("segments", {rows}, seg);
      const EmbeddingParams p{
          r.in("word", tt, {vocab, h}, word), r.in("position", tt, {positions, h}, pos),
          r.in("token_type", tt, {types, h}, type), r.in("gamma", DType::f32, {h}, gamma),
          r.in("beta", DType::f32, {h}, beta)};
      r.backend().embedding_forward(sl, ttok, tseg, p, d, r.out("out", t, {rows, h}, out_check),
                                    r.out("mean", DType::f32, {rows}, f32_check),
                                    r.out("rstd", DType::f32, {rows}, f32_check));
      // The CPU backend's statistics for the backward.
      HostT hword(tt, {vocab, h}, word), hpos(tt, {positions, h}, pos), htype(tt, {types, h}, type),
          hgamma(DType::f32, {h}, gamma), hbeta(DType::f32, {h}, beta), hout(t, {rows, h}),
          hmean(DType::f32, {rows}), hrstd(DType::f32, {rows});
      std::vector<int32_t> htok = tok, hseg = seg;
      OpRun::host().embedding_forward(
          l.view(), hv(htok, {rows}), hv(hseg, {rows}),
          {hword.tensor(), hpos.tensor(), htype.tensor(), hgamma.tensor(), hbeta.tensor()}, d,
          hout.tensor(), hmean.tensor(), hrstd.tensor());
      const auto dy = random_floats(g, rows * h);
      const auto gw0 = random_floats(g, vocab * h), gp0 = random_floats(g, positions * h),
                 gt0 = random_floats(g, types * h), gg0 = random_floats(g, h),
                 gb0 = random_floats(g, h);
      // dout is scratch, overwritten (fp32: compared as the gradient wrt the sum).
      const Tensor tdy = r.acc("dout (d sum)", t, {rows, h}, dy, lowp ? Check{} : close_to(kTol));
      const EmbeddingParams gr{
          r.acc("dword", DType::f32, {vocab, h}, gw0, f32_check),
          r.acc("dpos", DType::f32, {positions, h}, gp0, some ? unchanged() : f32_check),
          r.acc("dtype", DType::f32, {types, h}, gt0, f32_check),
          r.acc("dgamma", DType::f32, {h}, gg0, some ? unchanged() : f32_check),
          r.acc("dbeta", DType::f32, {h}, gb0, f32_check)};
      r.backend().embedding_backward(
          sl, ttok, tseg, p, d, r.in_bits("saved mean", DType::f32, {rows}, hmean.b.data()),
          r.in_bits("saved rstd", DType::f32, {rows}, hrstd.b.data()), tdy,
          {gr.word, some ? Tensor() : gr.position, gr.token_type, some ? Tensor() : gr.ln_gamma,
           gr.ln_beta});
    };
    cases.push_back(std::move(c));
  };
  for (int trial = 0; trial < 4; ++trial) add(DType::f32, trial);
  for (DType t : {DType::bf16, DType::f16})
    for (int trial = 0; trial < 8; ++trial) add(t, trial);
  for (float p : {0.f, 0.1f})
    for (int64_t h : {int64_t{37}, int64_t{768}}) add_embedding_reference(cases, false, h, p);
  add_embedding_reference(cases, true, 10, 0.25f);
  return cases;
}

// ---- residual + LayerNorm ---------------------------------------------------------------------
// Variant bits: 1 bias, 2 residual, 4 dropout, 8 ln_in aliases x, 16 dresidual aliases dout,
// 32 parameter gradients (dbias, dgamma, dbeta), 64 no dresidual, 128 the MLM transform's call
// (no layout, nothing but x). The backward runs from the CPU backend's saved ln_in, mean, rstd.
namespace {

// The reference's residual LayerNorm cases (fp32, lengths 4, 1, 7 unpadded, every input
// uniform): h = dropout(x + bias) + residual, out = LN(h), with and without bias, residual and
// dropout (H 9 to 768; bias and residual both off is the MLM transform's plain LayerNorm). The
// forward's out, ln_in and rstd against the double loop (rel L2 kTol); the backward, from the
// backend's own forward (dresidual aliasing dout when dropout is on, the documented in-place
// use), against central differences of L = sum(r * out) on at most 600 random coordinates of
// each input (wide rows make a full sweep quadratic in H), kTol.
void add_residual_layernorm_reference(OpCases& cases, bool bias, bool residual, float p,
                                      int64_t h) {
  OpCase c;
  c.name = fmt::format("residual_layernorm{}{} p={} H={}", bias ? " +bias" : "",
                       residual ? " +residual" : "", p, h);
  const bool alias = p > 0;
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = {4, 1, 7};
    const HostLayout l = unpadded(lens, random_sample_ids(g, lens.size()));
    const int64_t rows = l.rows;
    const auto x = random_floats(g, rows * h), b = random_floats(g, h),
               res = random_floats(g, rows * h), gamma = random_floats(g, h),
               beta = random_floats(g, h), dy = random_floats(g, rows * h);
    const Dropout d = make_dropout(p, g(), DropoutSite::attention_output, 5);
    r.set_dropout(d);
    const SeqLayout sl = r.layout(l);
    const LayerNormParams ln{r.in("gamma", DType::f32, {h}, gamma),
                             r.in("beta", DType::f32, {h}, beta)};
    const Tensor tx = r.in("x", DType::f32, {rows, h}, x, unchanged());
    const Tensor tb = bias ? r.in("bias", DType::f32, {h}, b, unchanged()) : Tensor();
    const Tensor tres =
        residual ? r.in("residual", DType::f32, {rows, h}, res, unchanged()) : Tensor();
    const Tensor hin = r.out("ln_in", DType::f32, {rows, h}, close_to(kTol));
    const Tensor mean = r.out("mean", DType::f32, {rows}, Check{});
    const Tensor rstd = r.out("rstd", DType::f32, {rows}, close_to(kTol));
    r.backend().residual_layernorm_forward(sl, tx, tb, tres, ln, d,
                                           r.out("out", DType::f32, {rows, h}, close_to(kTol)), hin,
                                           mean, rstd);
    const Tensor tdy =
        r.acc("dout", DType::f32, {rows, h}, dy, alias && residual ? close_to(kTol) : unchanged());
    const Tensor tdres = !residual ? Tensor()
                         : alias   ? tdy
                                   : r.out("dresidual", DType::f32, {rows, h}, close_to(kTol));
    const auto b0 = random_floats(g, h), g0 = random_floats(g, h), be0 = random_floats(g, h);
    r.backend().residual_layernorm_backward(
        sl, tdy, hin, mean, rstd, ln, d, r.out("dx", DType::f32, {rows, h}, close_to(kTol)), tdres,
        false, bias ? r.acc("dbias", DType::f32, {h}, b0, close_to(kTol)) : Tensor(),
        LayerNormParams{r.acc("dgamma", DType::f32, {h}, g0, close_to(kTol)),
                        r.acc("dbeta", DType::f32, {h}, be0, close_to(kTol))});
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const HostLayout& l = cpu.host_layout(0);
    const int64_t rows = l.rows;
    const DropoutStream ds = stream_of(cpu.dropout());
    Vec xv = cpu.doubles("x"), bv = bias ? cpu.doubles("bias") : Vec(),
        rv = residual ? cpu.doubles("residual") : Vec(), gv = cpu.doubles("gamma"),
        betav = cpu.doubles("beta");
    Vec want_hin, want_mean, want_rstd;
    const Vec want = ref::residual_layernorm(xv, bv, rv, gv, betav, rows, h, &l, ds, &want_hin,
                                             &want_mean, &want_rstd);
    expect_close(what + " forward", cpu.doubles("out"), want, kTol);
    expect_close(what + " forward ln_in", cpu.doubles("ln_in"), want_hin, kTol);
    expect_close(what + " forward rstd", cpu.doubles("rstd"), want_rstd, kTol);
    const Vec rd = cpu.initial("dout");
    auto loss = [&] {
      return dot_d(rd, ref::residual_layernorm(xv, bv, rv, gv, betav, rows, h, &l, ds));
    };
    auto pick_rng = make_rng(std::hash<std::string>{}(what) + 1);
    auto check = [&](const std::string& name, const Vec& got, Vec& param) {
      const auto idx = some_coords(pick_rng, param.size(), 600);
      const Vec fd = fd_gradient([&](const Vec&) { return loss(); }, param, idx);
      expect_close(what + " " + name + " (FD)", pick(got, idx), fd, kTol);
    };
    check("dx", cpu.doubles("dx"), xv);
    if (residual) check("dresidual", cpu.doubles(alias ? "dout" : "dresidual"), rv);
    if (bias) check("dbias", increments(cpu, "dbias"), bv);
    check("dgamma", increments(cpu, "dgamma"), gv);
    check("dbeta", increments(cpu, "dbeta"), betav);
  };
  cases.push_back(std::move(c));
}

}  // namespace

static OpCases residual_layernorm_cases() {
  OpCases cases;
  auto add = [&cases](DType t, int var, int64_t h) {
    const bool lowp = is_lowp(t);
    const bool drop = var & 4, alias_in = var & 8, alias_res = var & 16, pg = var & 32,
               no_res = var & 64, plain = var & 128;
    // fp32 passes an empty layout whenever dropout is off; 16-bit only for the MLM transform.
    const bool empty_layout = lowp ? plain : !drop;
    OpCase c;
    c.dtype = t;
    c.name = lowp ? fmt::format("residual_layernorm {} var {} h {}", dtype_name(t), var, h)
                  : fmt::format("residual_layernorm var {} h {}", var, h);
    const Check out_check = lowp ? lowp_match() : close_to(kTol);
    const Check f32_check = close_to(lowp ? kFp32Tol : kTol);
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const std::vector<int32_t> lens =
          lowp ? std::vector<int32_t>{1, 33, 12, 64, 7} : std::vector<int32_t>{1, 33, 12, 64};
      const HostLayout l = padded(lens, random_sample_ids(g, lens.size()), 64);
      const int64_t rows = l.rows;
      const Dropout d =
          lowp ? make_dropout(drop ? 0.1f : 0.f, g(), DropoutSite::attention_output, 3, 4321)
               : make_dropout(drop ? 0.15f : 0.f, g(), DropoutSite::ffn_output, 5);
      const float scale = lowp ? 2.f : 1.f;
      const auto x = random_floats(g, rows * h, scale), res = random_floats(g, rows * h, scale);
      const auto bias = random_floats(g, h), gamma = random_floats(g, h),
                 beta = random_floats(g, h);
      const SeqLayout sl = empty_layout ? SeqLayout{} : r.layout(l);
      const Tensor tx = r.in("x", t, {rows, h}, x, alias_in ? out_check : Check{});
      const Tensor tbias = var & 1 ? r.in("bias", DType::f32, {h}, bias) : Tensor();
      const Tensor tres = var & 2 ? r.in("residual", t, {rows, h}, res) : Tensor();
      const LayerNormParams ln{r.in("gamma", DType::f32, {h}, gamma),
                               r.in("beta", DType::f32, {h}, beta)};
      const Tensor tln = alias_in ? tx : r.out("ln_in", t, {rows, h}, out_check);
      // fp32 compares rstd (the mean is near 0: written is what it checks); 16-bit both.
      r.backend().residual_layernorm_forward(
          sl, tx, tbias, tres, ln, d, r.out("out", t, {rows, h}, out_check), tln,
          r.out("mean", DType::f32, {rows}, lowp ? f32_check : Check{}),
          r.out("rstd", DType::f32, {rows}, f32_check));
      // The CPU backend's saved tensors.
      HostT hx(t, {rows, h}, x), hres(t, {rows, h}, res), hout(t, {rows, h}), hln(t, {rows, h}),
          hmean(DType::f32, {rows}), hrstd(DType::f32, {rows});
      std::vector<float> hbias = bias, hgamma = gamma, hbeta = beta;
      OpRun::host().residual_layernorm_forward(
          empty_layout ? SeqLayout{} : l.view(), hx.tensor(), var & 1 ? hv(hbias, {h}) : Tensor(),
          var & 2 ? hres.tensor() : Tensor(), {hv(hgamma, {h}), hv(hbeta, {h})}, d, hout.tensor(),
          alias_in ? hx.tensor() : hln.tensor(), hmean.tensor(), hrstd.tensor());
      const HostT& saved = alias_in ? hx : hln;
      const auto dy = random_floats(g, rows * h);
      const auto gg0 = random_floats(g, h), gb0 = random_floats(g, h), gbias0 = random_floats(g, h);
      // dout is read-only unless dresidual aliases it.
      const Tensor tdy = r.acc("dout", t, {rows, h}, dy, alias_res ? out_check : unchanged());
      const Tensor tsaved = r.in_bits("saved ln_in", t, {rows, h}, saved.b.data(), unchanged());
      const Tensor tdres = no_res      ? Tensor()
                           : alias_res ? tdy
                                       : r.out("dresidual", t, {rows, h}, out_check);
      r.backend().residual_layernorm_backward(
          sl, tdy, tsaved, r.in_bits("saved mean", DType::f32, {rows}, hmean.b.data()),
          r.in_bits("saved rstd", DType::f32, {rows}, hrstd.b.data()), {ln.gamma, Tensor()}, d,
          r.out("dx", t, {rows, h}, out_check), tdres, false,
          pg ? r.acc("dbias", DType::f32, {h}, gbias0, f32_check) : Tensor(),
          {pg ? r.acc("dgamma", DType::f32, {h}, gg0, f32_check) : Tensor(),
           pg ? r.acc("dbeta", DType::f32, {h}, gb0, f32_check) : Tensor()});
    };
    cases.push_back(std::move(c));
  };
  for (int var : {0, 1 | 2 | 4 | 32, 1 | 2 | 32, 2 | 4 | 8 | 16, 1 | 4 | 16 | 32, 8})
    add(DType::f32, var, var & 8 ? 96 : 130);
  for (DType t : {DType::bf16, DType::f16})
    for (int var : {1 | 2 | 4 | 32, 1 | 2 | 8 | 16 | 32, 2 | 4 | 8, 1 | 4 | 64 | 32, 1 | 2 | 4 | 16,
                    0, 128 | 8 | 32 | 64})
      for (int64_t h : {int64_t{130}, int64_t{768}}) add(t, var, h);
  add_residual_layernorm_reference(cases, true, true, 0.1f, 24);
  add_residual_layernorm_reference(cases, true, true, 0.f, 13);
  add_residual_layernorm_reference(cases, false, false, 0.f, 16);
  add_residual_layernorm_reference(cases, true, false, 0.3f, 9);
  add_residual_layernorm_reference(cases, false, true, 0.1f, 768);
  return cases;
}

// ---- attention --------------------------------------------------------------------------------
// Lengths 1 to 127 in three layouts and head dims 64 / 32 / 20, a single token, and long
// sequences (512 and 300; the emulated build 300 only), with and without dropout. The backward
// runs from the CPU backend's forward outputs (its lse layout, [rows, heads], on both).
std::vector<int32_t> mixed_lengths(std::mt19937_64& rng, int extra) {
  std::vector<int32_t> lens = {1, 200, 2, 3, 17, 64, 127};
  for (int i = 0; i < extra; ++i) lens.push_back(1 + static_cast<int32_t>(rng() % 200));
  std::shuffle(lens.begin(), lens.end(), rng);
  return lens;
}

namespace {

// The reference's attention cases (fp32, packed into rows of 256, qkv uniform in [-2, 2]):
// - the forward over mixed lengths 1..200 (7 + 6 sequences; head dims 16 and 7) against the
//   double loop per sequence: out and lse rel L2 kTol (padding rows: 0 on both sides);
// - the backward (from the backend's own forward) against central differences of
//   L = sum(r * out) wrt qkv: every coordinate of five short sequences (head dim 4), or 300
//   random coordinates over mixed lengths 1..200 (7 + 2 sequences, head dim 16), rel L2 kTol.
//   Perturbing a coordinate changes only its own sequence, so each difference recomputes one.
// `lens` empty: mixed lengths drawn from the case's generator.
void add_attention_reference(OpCases& cases, bool backward, std::vector<int32_t> lens,
                             int64_t hidden, int heads, float p, size_t coords) {
  OpCase c;
  c.name =
      backward
          ? fmt::format("attention_backward dqkv ({}) H={} heads={} p={} (FD)",
                        lens.empty() ? "mixed lengths 1..200" : "5 short seqs", hidden, heads, p)
          : fmt::format("attention_forward lens 1..200 H={} heads={} p={}", hidden, heads, p);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> ls = lens.empty() ? mixed_lengths(g, backward ? 2 : 6) : lens;
    const HostLayout l = packed(ls, random_sample_ids(g, ls.size()), 256);
    const int64_t rows = l.rows;
    const auto qkv = random_floats(g, rows * 3 * hidden, 2.f);
    const Dropout d = make_dropout(p, g(), DropoutSite::attention_probs, 3, 77);
    r.set_dropout(d);
    const SeqLayout sl = r.layout(l);
    const Tensor tqkv = r.in("qkv", DType::f32, {rows, 3 * hidden}, qkv, unchanged());
    const Tensor out = r.out("out", DType::f32, {rows, hidden}, close_to(kTol));
    const Tensor lse = r.out("lse", DType::f32, {rows, heads}, close_to(kTol));
    r.backend().attention_forward(sl, tqkv, heads, 0, d, out, lse);
    if (!backward) return;
    r.backend().attention_backward(
        sl, tqkv, out, lse,
        r.in("dout", DType::f32, {rows, hidden}, random_floats(g, rows * hidden), unchanged()),
        heads, 0, d, r.out("dqkv", DType::f32, {rows, 3 * hidden}, close_to(kAttnBwdTol)));
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const HostLayout& l = cpu.host_layout(0);
    const DropoutStream ds = stream_of(cpu.dropout());
    Vec qd = cpu.doubles("qkv");
    if (!backward) {
      Vec want_out(static_cast<size_t>(l.rows * hidden), 0.0),
          want_lse(static_cast<size_t>(l.rows * heads), 0.0);
      for (size_t s = 0; s < l.seq_len.size(); ++s) {
        Vec lse;
        const Vec o = ref::attention_seq(qd, l, s, heads, hidden, ds, &lse);
        for (int32_t i = 0; i < l.seq_len[s]; ++i) {
          std::copy_n(o.begin() + i * hidden, hidden, want_out.begin() + l.row(s, i) * hidden);
          std::copy_n(lse.begin() + i * heads, heads, want_lse.begin() + l.row(s, i) * heads);
        }
      }
      expect_close(what, cpu.doubles("out"), want_out, kTol);
      expect_close(what + " lse", cpu.doubles("lse"), want_lse, kTol);
      return;
    }
    const int64_t ld = 3 * hidden;
    const Vec rd = cpu.doubles("dout");
    auto pick_rng = make_rng(std::hash<std::string>{}(what) + 1);
    const std::vector<size_t> idx =
        coords ? some_coords(pick_rng, qd.size(), coords) : all_coords(qd.size());
    Vec fd;
    for (size_t i : idx) {
      const int32_t s = l.token_seq[static_cast<int64_t>(i) / ld];
      if (s < 0) {  // padding: not an input of anything
        fd.push_back(0.0);
        continue;
      }
      auto loss = [&](const Vec& q) {
        const Vec o = ref::attention_seq(q, l, static_cast<size_t>(s), heads, hidden, ds);
        double sum = 0;
        for (int32_t t = 0; t < l.seq_len[s]; ++t)
          for (int64_t k = 0; k < hidden; ++k)
            sum += rd[l.row(s, t) * hidden + k] * o[t * hidden + k];
        return sum;
      };
      fd.push_back(fd_gradient(loss, qd, {i})[0]);
    }
    expect_close(what, pick(cpu.doubles("dqkv"), idx), fd, kTol);
  };
  cases.push_back(std::move(c));
}

// The bf16 / f16 cases (the tensor-core kernels, fmha_mma_forward.cu / fmha_mma_backward.cu,
// through the grouped launch): each backend's forward and backward on 16-bit inputs against the
// CPU backend's fp32 attention on the SAME inputs widened, so the only difference is the op's own
// rounding (P and dS rounded to 16 bits before their products, the outputs rounded when stored,
// D = dO . O from the 16-bit O). The backward runs from the backend's own forward, as in
// training. Rows of no sequence must be exactly 0 (out, lse, dqkv), and a second run gives the
// same bits (no atomics; buckets on other streams change nothing). Tolerances, rel L2 per tensor
// over the sequence rows:
// - The inputs agree exactly and Q K^T accumulates exact 16-bit products in fp32, so the scores
//   and lse differ by fp32 rounding only: lse kTol. That error is absolute (two orders of the
//   64-term sum of products, of magnitude sum |q_i k_i| * scale, 8 on average at these inputs'
//   scale, plus a few ulps of |lse|), and relative to |lse| unbounded where lse is near 0: a lone
//   one-token row makes lse its one score (1.03e-5 relative once, f16, before the one-token case
//   had a case of its own). So the denominator is at least 1 per element, sqrt(count)
//   (expect_close_floor). A float32 model of two summation orders over 200000 one-token draws
//   gives at most 1.1e-6 against it, and the emulated one-token case over 5000 seeds at most
//   5.4e-7 (margin 18.6; tests/seed_sweeps.txt).
// - out and dqkv: a 16-bit rounding is a relative error <= u (bf16 u = 2^-8, fp16 2^-11),
//   roughly uniform: RMS u / sqrt(3) = 2.3e-3 (bf16), 2.8e-4 (fp16). The final store dominates;
//   the internal roundings of P and dS are independent per key and average out over the sum. A
//   float64 model of exactly these roundings (tile-wise online softmax, these inputs, lengths
//   64..512) gives 2.2e-3 .. 2.5e-3 (bf16) and 2.9e-4 .. 3.1e-4 (fp16) per tensor, for out, dq,
//   dk and dv alike. We allow 4x (bf16: 1e-2, DESIGN.md's bf16 GPU-vs-CPU tolerance) and 8x
//   (fp16: 2.5e-3). A wrong fragment layout, dropout bit or missed tile gives errors of order 1.
//   dq and dk of one-token sequences are 0 in exact arithmetic (P = 1, so dS = 0) and rounding
//   noise on both sides, so the gradients' denominator is at least 1e-2 of the whole dqkv's norm.
// The CPU backend's own 16-bit attention (widen, the fp32 op, round once) is held to the same.
double lowp_attention_tol(DType t) { return t == DType::bf16 ? 1e-2 : 2.5e-3; }

// Columns [c0, c0 + w) of every sequence row of a [rows, width] buffer.
Vec seq_cols(const Vec& v, const HostLayout& l, int64_t width, int64_t c0, int64_t w) {
  Vec r;
  for (int64_t row = 0; row < l.rows; ++row) {
    if (l.token_seq[static_cast<size_t>(row)] < 0) continue;
    for (int64_t c = c0; c < c0 + w; ++c) r.push_back(v[static_cast<size_t>(row * width + c)]);
  }
  return r;
}

// Elements of rows of no sequence that are not exactly +0 (16-bit or fp32 bytes).
size_t nonzero_padding(const std::vector<uint8_t>& bytes, size_t esize, const HostLayout& l,
                       int64_t width) {
  size_t bad = 0;
  for (int64_t row = 0; row < l.rows; ++row) {
    if (l.token_seq[static_cast<size_t>(row)] >= 0) continue;
    for (size_t i = static_cast<size_t>(row * width) * esize;
         i < static_cast<size_t>((row + 1) * width) * esize; ++i)
      bad += bytes[i] != 0;
  }
  return bad;
}

std::vector<float> narrow(const Vec& v) { return {v.begin(), v.end()}; }

double norm2(const Vec& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// rel L2 with the denominator at least `floor` (see above).
void expect_close_floor(const std::string& what, const Vec& got, const Vec& want, double floor,
                        double tol) {
  Vec diff(got.size());
  bool nan = got.size() != want.size();
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    nan = nan || std::isnan(got[i]) || std::isnan(want[i]);
    diff[i] = got[i] - want[i];
  }
  const double den = std::max(norm2(want), floor);
  const double e =
      nan ? std::numeric_limits<double>::infinity() : (den > 0 ? norm2(diff) / den : norm2(diff));
  expect_measure(what, e, tol);
}

// The fp32 reference: the CPU backend's fp32 op on a run's inputs widened.
struct AttentionReference {
  std::vector<float> out, lse, dqkv;
};
AttentionReference fp32_attention(const OpRun& r, int heads, int64_t window) {
  const HostLayout& l = r.host_layout(0);
  const int64_t rows = l.rows, hidden = int64_t{heads} * 64;
  std::vector<float> qkv = narrow(r.initial("qkv")), dy = narrow(r.initial("dout"));
  AttentionReference a{std::vector<float>(rows * hidden), std::vector<float>(rows * heads),
                       std::vector<float>(rows * 3 * hidden)};
  Backend& cpu = OpRun::host();
  cpu.attention_forward(l.view(), hv(qkv, {rows, 3 * hidden}), heads, window, r.dropout(),
                        hv(a.out, {rows, hidden}), hv(a.lse, {rows, heads}));
  cpu.attention_backward(l.view(), hv(qkv, {rows, 3 * hidden}), hv(a.out, {rows, hidden}),
                         hv(a.lse, {rows, heads}), hv(dy, {rows, hidden}), heads, window,
                         r.dropout(), hv(a.dqkv, {rows, 3 * hidden}));
  return a;
}

// One backend's 16-bit run against the fp32 reference.
void check_lowp_attention(const std::string& what, const OpRun& r, DType t, int heads,
                          const AttentionReference& ref) {
  const HostLayout& l = r.host_layout(0);
  const int64_t hidden = int64_t{heads} * 64;
  const std::vector<float>&out = ref.out, &lse = ref.lse, &dqkv = ref.dqkv;
  const double tol = lowp_attention_tol(t);
  EXPECT_EQ(nonzero_padding(r.buf("out").bytes(), 2, l, hidden), 0u) << what << " out padding";
  EXPECT_EQ(nonzero_padding(r.buf("lse").bytes(), 4, l, heads), 0u) << what << " lse padding";
  EXPECT_EQ(nonzero_padding(r.buf("dqkv").bytes(), 2, l, 3 * hidden), 0u)
      << what << " dqkv padding";
  expect_close(what + " out", seq_cols(r.doubles("out"), l, hidden, 0, hidden),
               seq_cols(to_double(out), l, hidden, 0, hidden), tol);
  const Vec lse_want = seq_cols(to_double(lse), l, heads, 0, heads);
  expect_close_floor(what + " lse", seq_cols(r.doubles("lse"), l, heads, 0, heads), lse_want,
                     std::sqrt(static_cast<double>(lse_want.size())), kTol);
  const Vec g = r.doubles("dqkv"), want = to_double(dqkv);
  const double whole = norm2(seq_cols(want, l, 3 * hidden, 0, 3 * hidden));
  const char* part[] = {"dq", "dk", "dv"};
  for (int s = 0; s < 3; ++s)
    expect_close_floor(what + " " + part[s], seq_cols(g, l, 3 * hidden, s * hidden, hidden),
                       seq_cols(want, l, 3 * hidden, s * hidden, hidden), 1e-2 * whole, tol);
  for (const char* b : {"out", "lse", "dqkv"})
    EXPECT_TRUE(r.buf(b).bytes() == r.buf(std::string(b) + " again").bytes())
        << what << " " << b << " differs between two runs";
}

}  // namespace

void add_attention_lowp(OpCases& cases, DType t, const std::string& name, std::vector<int32_t> lens,
                        int layout, int32_t max_len, int heads, float p, int64_t window) {
  OpCase c;
  c.dtype = t;
  c.name = fmt::format("attention {} {} heads{} p{}", dtype_name(t), name, heads, p);
  if (window != 0) c.name += fmt::format(" window {}", window);
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const auto ids = random_sample_ids(g, lens.size());
    const HostLayout l = layout == 0   ? unpadded(lens, ids)
                         : layout == 1 ? padded(lens, ids, max_len)
                                       : packed(lens, ids, max_len);
    const int64_t rows = l.rows, hidden = int64_t{heads} * 64;
    // Layer 11, step 4321; scale 2: scores of std ~1.3, so the softmax is far from uniform.
    const Dropout d = make_dropout(p, g(), DropoutSite::attention_probs, 11, 4321);
    r.set_dropout(d);
    const SeqLayout sl = r.layout(l);
    const Tensor qkv =
        r.in("qkv", t, {rows, 3 * hidden}, random_floats(g, rows * 3 * hidden, 2.f), unchanged());
    const Tensor dy = r.in("dout", t, {rows, hidden}, random_floats(g, rows * hidden), unchanged());
    for (const char* again : {"", " again"}) {
      const std::string a = again;
      const Tensor out = r.out("out" + a, t, {rows, hidden}, {});
      const Tensor lse = r.out("lse" + a, DType::f32, {rows, heads}, {});
      r.backend().attention_forward(sl, qkv, heads, window, d, out, lse);
      r.backend().attention_backward(sl, qkv, out, lse, dy, heads, window, d,
                                     r.out("dqkv" + a, t, {rows, 3 * hidden}, {}));
    }
  };
  c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
    const AttentionReference ref = fp32_attention(want, heads, window);
    check_lowp_attention(what + " (" + want.backend().name() + ")", want, t, heads, ref);
    check_lowp_attention(what, got, t, heads, ref);
  };
  cases.push_back(std::move(c));
}

static OpCases attention_cases(bool emulated) {
  OpCases cases;
  auto add = [&cases](const std::string& name, std::vector<int32_t> lens, int layout,
                      int64_t hidden, int heads, float p, int32_t max_len = 128) {
    OpCase c;
    c.name = fmt::format("attention {} H{} heads{} p{}", name, hidden, heads, p);
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const auto ids = random_sample_ids(g, lens.size());
      const HostLayout l = layout == 0   ? unpadded(lens, ids)
                           : layout == 1 ? padded(lens, ids, max_len)
                           : layout == 2 ? packed(lens, ids, max_len)
                                         : with_empty_slots(unpadded(lens, ids), 21, 3);
      const int64_t rows = l.rows;
      const Dropout d = make_dropout(p, g(), DropoutSite::attention_probs, 7);
      auto qkv = random_floats(g, rows * 3 * hidden), dy = random_floats(g, rows * hidden);
      const SeqLayout sl = r.layout(l);
      const Tensor tqkv = r.in("qkv", DType::f32, {rows, 3 * hidden}, qkv, unchanged());
      r.backend().attention_forward(sl, tqkv, heads, 0, d,
                                    r.out("out", DType::f32, {rows, hidden}, close_to(kTol)),
                                    r.out("lse", DType::f32, {rows, heads}, close_to(kTol)));
      std::vector<float> out(rows * hidden), lse(rows * heads);
      OpRun::host().attention_forward(l.view(), hv(qkv, {rows, 3 * hidden}), heads, 0, d,
                                      hv(out, {rows, hidden}), hv(lse, {rows, heads}));
      r.backend().attention_backward(
          sl, tqkv, r.in("saved out", DType::f32, {rows, hidden}, out),
          r.in("saved lse", DType::f32, {rows, heads}, lse),
          r.in("dout", DType::f32, {rows, hidden}, dy, unchanged()), heads, 0, d,
          r.out("dqkv", DType::f32, {rows, 3 * hidden}, close_to(kAttnBwdTol)));
    };
    cases.push_back(std::move(c));
  };
  const std::vector<int32_t> lens = {1, 2, 17, 64, 33, 127, 5};
  for (float p : {0.f, 0.1f}) {
    add("unpadded", lens, 0, 128, 2, p);  // head dim 64
    add("padded", lens, 1, 96, 3, p);     // head dim 32
    add("packed", lens, 2, 40, 2, p);     // head dim 20
    add("unpadded, 21 padding rows and 3 empty slots after", lens, 3, 64, 2, p);
    add("one token", {1}, 0, 64, 4, p);
  }
  add("long", emulated ? std::vector<int32_t>{300, 1} : std::vector<int32_t>{512, 300, 1}, 0, 128,
      2, 0.1f);
  // Every length bucket of the grouped launch: 1, 2, odd, each bucket bound and one past it,
  // tile edges (63, 64, 65).
  const std::vector<int32_t> bounds =
      emulated ? std::vector<int32_t>{1, 3, 17, 63, 64, 65, 127, 129, 200}
               : std::vector<int32_t>{1,   2,   3,   17,  63,  64,  65,  127, 128, 129, 200,
                                      255, 256, 257, 301, 383, 384, 385, 450, 511, 512};
  for (float p : {0.f, 0.1f}) {
    add("bucket bounds", bounds, 0, 128, 2, p);      // head dim 64
    add("bucket bounds", bounds, 1, 96, 3, p, 512);  // head dim 32, padded to 512
  }
  for (DType t : {DType::bf16, DType::f16}) {
    for (float p : {0.f, 0.1f}) add_attention_lowp(cases, t, "bucket bounds", bounds, 0, 0, 2, p);
    const std::vector<int32_t> mixed = emulated ? std::vector<int32_t>{5, 130, 1, 200, 77, 31}
                                                : std::vector<int32_t>{5, 130, 1, 512, 77, 260, 31};
    const int32_t max_len = emulated ? 256 : 512;
    add_attention_lowp(cases, t, "padded", mixed, 1, max_len, 3, 0.1f);
    add_attention_lowp(cases, t, "packed", mixed, 2, max_len, 4, 0.f);
    const std::vector<int32_t> big =
        emulated ? std::vector<int32_t>{130, 96, 1, 45} : std::vector<int32_t>{512, 384, 96, 1, 45};
    add_attention_lowp(cases, t, "BERT-Large heads", big, 0, 0, 16, 0.1f);
    add_attention_lowp(cases, t, "BERT-Base heads", big, 0, 0, 12, 0.5f);
    // Without dropout: dq and dk of a lone one-token sequence are 0 in exact arithmetic; with
    // dropout both the kernel and the reference return the rounding of the dropout scale in P f
    // (1.6e-3 relative in bf16 at p = 0.1), which the floor cannot absorb when nothing else sets
    // the gradient's scale. "long" keeps a one-token sequence with dropout, among long ones.
    add_attention_lowp(cases, t, "one token", {1}, 0, 0, 1, 0.f);
    // Longer than 512: correct, not tuned (its own bucket).
    add_attention_lowp(cases, t, "long",
                       emulated ? std::vector<int32_t>{520, 1} : std::vector<int32_t>{777, 1, 600},
                       0, 0, 2, 0.1f);
  }
  add_attention_reference(cases, true, {1, 2, 5, 8, 3}, 8, 2, 0.f, 0);
  add_attention_reference(cases, true, {1, 2, 5, 8, 3}, 8, 2, 0.2f, 0);
  // The mixed lengths up to 200 would add minutes to the emulated build's run of the backend
  // runner; there its cases above cover the same tiles and tails.
  if (emulated) return cases;
  add_attention_reference(cases, false, {}, 48, 3, 0.f, 0);
  add_attention_reference(cases, false, {}, 48, 3, 0.1f, 0);
  add_attention_reference(cases, false, {}, 14, 2, 0.1f, 0);  // odd head dim 7
  add_attention_reference(cases, true, {}, 32, 2, 0.f, 300);
  add_attention_reference(cases, true, {}, 32, 2, 0.1f, 300);
  return cases;
}

// ---- masked rows ------------------------------------------------------------------------------
// fp32: a repeated index (its two gradients add up), and a masked-token scale (6000 rows, 4000
// indices) with distinct rows and with rows hit several times: the same bits as the CPU's sums in
// order of i. 16-bit: the gather is a bit copy, as the emulation's widen-copy-round; the backward
// adds in fp32 and rounds after each add, the emulation once at the end: the same bits where
// every row is hit once (the model's masked positions), within one rounding per repeat
// otherwise (1e-2, as the linear ops).
static OpCases gather_rows_cases() {
  OpCases cases;
  // unused: that many indices -1 (a fixed-capacity batch's unused masked slots), at the first,
  // the middle and the last place: their out rows 0, nothing added for them.
  auto add = [&cases](DType t, int64_t rows, int64_t h, int64_t m, int repeats, int unused = 0) {
    const bool lowp = is_lowp(t);
    OpCase c;
    c.dtype = t;
    c.name = fmt::format("gather_rows {}rows {} h {} m {} {}{}",
                         lowp ? std::string(dtype_name(t)) + " " : "", rows, h, m,
                         repeats == 0   ? "distinct"
                         : repeats == 1 ? "one repeat"
                                        : "repeated",
                         unused ? fmt::format(", {} unused", unused) : std::string());
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      std::vector<int32_t> idx;
      if (repeats == 1) {
        idx = random_ints(g, m, 0, static_cast<int32_t>(rows - 1));
        // A repeated index: its two gradients add up (m >= 5 in every case); the short case
        // also touches the first and the last row, as the hand-written test did.
        idx[3] = idx[static_cast<size_t>(m > 7 ? 7 : 4)];
        if (m < 8) {
          idx[1] = 0;
          idx[2] = static_cast<int32_t>(rows - 1);
        }
      } else {
        idx.resize(static_cast<size_t>(rows));
        for (int64_t i = 0; i < rows; ++i) idx[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        std::shuffle(idx.begin(), idx.end(), g);
        idx.resize(static_cast<size_t>(m));
        if (repeats == 2 && lowp) idx[5] = idx[9] = idx[40] = idx[2];
        if (repeats == 2 && !lowp)
          for (int64_t i = 0; i < m; i += 7)
            idx[static_cast<size_t>(i)] = idx[static_cast<size_t>(i % 1000 / 4)];
      }
      for (int k = 0; k < unused; ++k)
        idx[static_cast<size_t>(k == 0 ? 0 : k == 1 ? m - 1 : m / 2 + k)] = -1;
      const auto x = lowp ? randn(g, rows * h) : random_floats(g, rows * h);
      const auto dy = lowp ? randn(g, m * h) : random_floats(g, m * h);
      const Tensor tidx = r.in("index", {m}, idx);
      const Check dx_check = lowp && repeats ? close_to(1e-2) : bits();
      const auto dx0 = randn(g, rows * h);
      if (m < 1000) {
        const Tensor tx = r.in("x", t, {rows, h}, x);
        const Tensor out = r.out("out", t, {m, h}, bits());
        r.backend().gather_rows(tx, tidx, out);
        r.backend().gather_rows_backward(r.in("dout", t, {m, h}, dy, unchanged()), tidx,
                                         r.acc("dx", t, {rows, h}, dx0, dx_check));
        // An index out of range is refused (the CUDA backend validates its index arrays), and
        // so is a negative one but -1.
        std::vector<int32_t> bad = idx;
        bad[0] = static_cast<int32_t>(rows);
        const Tensor tbad = r.in("bad index", {m}, bad);
        EXPECT_THROW(r.backend().gather_rows(tx, tbad, out), Error) << r.backend().name();
        bad[0] = -2;
        const Tensor tneg = r.in("negative index", {m}, bad);
        EXPECT_THROW(r.backend().gather_rows(tx, tneg, out), Error) << r.backend().name();
      } else {
        r.backend().gather_rows_backward(r.in("dout", t, {m, h}, dy, unchanged()), tidx,
                                         r.acc("dx", t, {rows, h}, dx0, dx_check));
      }
    };
    if (!lowp)
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        const bool forward = cpu.has("x");  // the masked-token scale runs the backward alone
        const Vec x = forward ? cpu.doubles("x") : Vec(),
                  out = forward ? cpu.doubles("out") : Vec();
        const Vec dy = cpu.doubles("dout");
        const std::vector<double> idx = cpu.doubles("index");
        Vec want(static_cast<size_t>(rows * h), 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t k = 0; k < h; ++k) {
            const auto row = static_cast<int64_t>(idx[static_cast<size_t>(i)]);
            if (forward) {
              ASSERT_EQ(out[i * h + k], row < 0 ? 0.0 : x[row * h + k]) << what;
            }
            if (row >= 0) want[row * h + k] += dy[i * h + k];
          }
        expect_close(what + " dx", cpu.doubles("dx"), want, kTol);
      };
    cases.push_back(std::move(c));
  };
  add(DType::f32, 57, 70, 23, 1);
  add(DType::f32, 50, 19, 6, 1);
  add(DType::f32, 57, 70, 23, 0, 3);
  for (DType t : {DType::bf16, DType::f16}) add(t, 300, 72, 120, 0, 4);
  for (DType t : {DType::bf16, DType::f16})
    for (int repeats : {0, 2}) add(t, 300, 72, 120, repeats);
  for (int repeats : {0, 2}) add(DType::f32, 6000, 96, 4000, repeats);
  return cases;
}

// ---- losses -----------------------------------------------------------------------------------
// Logits with a tie in row 0 (the first maximum wins), without dlogits, with them separate and in
// place; the loss and correct count accumulate onto given values.
static OpCases softmax_cross_entropy_cases() {
  OpCases cases;
  struct Shape {
    int64_t m, v;
  };
  for (const Shape s : {Shape{37, 1000}, Shape{1, 1}, Shape{5, 30528}, Shape{64, 2},
                        Shape{37, 1001}, Shape{6, 30522}})
    // 0 no dlogits, 1 separate, 2 in place; 3 separate, with rows left out (label -1: the
    // first, the last and every fifth) and the factor read from device memory (its host value
    // 0.5 differs from the device's 0.125 here, so that a read of the wrong one shows; a graph's
    // replay relies on the device's).
    for (int mode = 0; mode < 4; ++mode) {
      const int64_t m = s.m, v = s.v;
      if (mode == 3 && m < 3) continue;
      OpCase c;
      c.name = fmt::format("softmax_cross_entropy m{} v{} mode{}", m, v, mode);
      c.run = [=](OpRun& r) {
        auto& g = r.rng();
        auto z = random_floats(g, m * v, 4.f);
        if (v > 3) z[2] = z[1] = 9.f;
        auto labels = random_ints(g, m, 0, static_cast<int32_t>(v - 1));
        labels[0] = v > 1 ? 1 : 0;
        for (int64_t i = 2; i < m; i += 2) z[i * v + labels[i]] += 8.f;  // some rows right
        if (mode == 3)
          for (int64_t i = 0; i < m; ++i)
            if (i == 0 || i == m - 1 || i % 5 == 0) labels[i] = -1;
        const Tensor tz =
            r.acc("logits", DType::f32, {m, v}, z, mode == 2 ? close_to(kTol) : unchanged());
        const Tensor tl = r.in("labels", {m}, labels);
        const Tensor dz = mode == 0   ? Tensor()
                          : mode != 2 ? r.out("dlogits", DType::f32, {m, v}, close_to(kTol))
                                      : tz;
        if (mode == 3) {
          const GradScale device(0.5f, r.in("grad scale", DType::f32, {1}, {0.125f}));
          r.backend().softmax_cross_entropy(tz, tl, device,
                                            r.acc("loss", DType::f32, {1}, {0.75f}, close_to(1e-6)),
                                            r.acc("correct", {1}, {3}, bits()), dz);
          return;
        }
        if (mode == 2) {
          // In place gives the bits the separate output gets, on every backend: first the
          // separate call on the same logits (its loss and count into buffers of their own).
          const Tensor sep = r.out("dlogits separate", DType::f32, {m, v}, close_to(kTol));
          r.backend().softmax_cross_entropy(
              tz, tl, 0.125f, r.acc("loss separate", DType::f32, {1}, {0.75f}, Check{}),
              r.acc("correct separate", {1}, {3}, Check{}), sep);
        }
        r.backend().softmax_cross_entropy(tz, tl, 0.125f,
                                          r.acc("loss", DType::f32, {1}, {0.75f}, close_to(1e-6)),
                                          r.acc("correct", {1}, {3}, bits()), dz);
        if (mode == 2) {
          EXPECT_TRUE(r.buf("logits").bytes() == r.buf("dlogits separate").bytes())
              << r.backend().name() << ": dlogits in place are not the separate output's bits";
        }
      };
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        const Vec z = cpu.initial("logits");
        const Vec lab = cpu.doubles("labels");
        std::vector<int32_t> labels(lab.begin(), lab.end());
        int correct = 0;
        Vec dz;
        const double loss = ref::softmax_xent(z, labels, m, v, 0.125, &correct, &dz);
        expect_close(what + " loss", {cpu.doubles("loss")[0] - 0.75}, {loss}, kTol);
        EXPECT_EQ(cpu.doubles("correct")[0], 3 + correct) << what;
        if (mode == 1 || mode == 3)
          expect_close(what + " dlogits", cpu.doubles("dlogits"), dz, kTol);
        if (mode == 3) {  // the rows left out: exactly 0
          const Vec d = cpu.doubles("dlogits");
          for (int64_t i = 0; i < m; ++i) {
            if (labels[i] >= 0) continue;
            for (int64_t k = 0; k < v; ++k) ASSERT_EQ(d[i * v + k], 0.0) << what << " row " << i;
          }
        }
        if (mode == 2) expect_close(what + " dlogits in place", cpu.doubles("logits"), dz, kTol);
      };
      cases.push_back(std::move(c));
    }
  return cases;
}

// The MLM decoder: fp32 forward only and with every gradient; 16-bit on the low-precision word
// embeddings (the native path: logits in fp32, the backward in blocks of vocabulary columns with
// 64 MiB of rounded logits gradient) against the CPU's emulation. The logits come from the same
// rounded operands in fp32 on both sides: the forward-only logits to 1e-5 and the loss sum to
// 1e-4. The gradients differ by CUDA's rounding of the logits gradient before the two GEMMs
// (2^-9 relative per element in bf16) and dx's own rounding: 1e-2, as the linear ops. Near-ties
// of the logits may flip a correct count: within 2. Shapes: small ones (one block), one with dx
// and db but no dw (the column-sum path), and 2300 masked tokens over the BERT vocabulary, which
// takes three blocks (dx summed over them in fp32).
namespace {

// The reference's MLM case (fp32, m 13, H 16, vocabulary 97, every value uniform, scale
// 1 / (m + 5)): the loss (accumulated unscaled) and the correct count against the double loop,
// and dx, dw, db against central differences of scale * loss over every coordinate, rel L2 kTol
// (dw, db: the increments onto random values).
// unused: rows 2 and 9 are left out (label -1, a fixed-capacity batch's unused masked slots)
// and the factor is read from device memory (GradScale::device; its host value is 4x off): the
// central differences of the loss over the other rows then give their dx 0.
void add_mlm_loss_reference(OpCases& cases, bool unused) {
  const int64_t m = 13, h = 16, v = 97;
  const float scale = 1.f / static_cast<float>(m + 5);
  OpCase c;
  c.name = fmt::format("mlm_loss m{} h{} v{}{}", m, h, v, unused ? " rows 2, 9 left out" : "");
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const auto x = random_floats(g, m * h), w = random_floats(g, v * h), b = random_floats(g, v);
    auto labels = random_ints(g, m, 0, static_cast<int32_t>(v - 1));
    if (unused) labels[2] = labels[9] = -1;
    const auto dw0 = random_floats(g, v * h), db0 = random_floats(g, v);
    const GradScale factor =
        unused ? GradScale(4 * scale, r.in("grad scale", DType::f32, {1}, {scale})) : scale;
    r.backend().mlm_loss(r.in("x", DType::f32, {m, h}, x, unchanged()),
                         r.in("w", DType::f32, {v, h}, w, unchanged()),
                         r.in("bias", DType::f32, {v}, b, unchanged()), r.in("labels", {m}, labels),
                         factor, r.out("logits_ws", DType::f32, {m, v}, Check{}),
                         r.acc("loss", DType::f32, {1}, {0.f}, close_to(1e-6)),
                         r.acc("correct", {1}, {0}, bits()),
                         r.out("dx", DType::f32, {m, h}, close_to(kTol)),
                         r.acc("dw", DType::f32, {v, h}, dw0, close_to(kTol)),
                         r.acc("db", DType::f32, {v}, db0, close_to(kTol)));
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    Vec xd = cpu.doubles("x"), wd = cpu.doubles("w"), bd = cpu.doubles("bias");
    const std::vector<int32_t> labels = ints_of(cpu.doubles("labels"));
    auto loss = [&](int* correct) {
      return ref::softmax_xent(ref::linear(xd, wd, &bd, m, h, v), labels, m, v, 1.0, correct);
    };
    int want_correct = 0;
    const double want = loss(&want_correct);
    expect_close(what + " loss", {cpu.doubles("loss")[0]}, {want}, kTol);
    EXPECT_EQ(cpu.doubles("correct")[0], want_correct) << what;
    auto f = [&](const Vec&) { return loss(nullptr) * scale; };
    expect_close(what + " dx (FD)", cpu.doubles("dx"), fd_gradient(f, xd, all_coords(xd.size())),
                 kTol);
    expect_close(what + " dw (FD)", increments(cpu, "dw"),
                 fd_gradient(f, wd, all_coords(wd.size())), kTol);
    expect_close(what + " db (FD)", increments(cpu, "db"),
                 fd_gradient(f, bd, all_coords(bd.size())), kTol);
  };
  cases.push_back(std::move(c));
}

}  // namespace

static OpCases mlm_loss_cases() {
  OpCases cases;
  // unused: the first and the last row left out (label -1), the factor on the device.
  auto add = [&cases](DType t, int64_t m, int64_t h, int64_t v, bool backward, bool dw, bool db,
                      bool unused = false) {
    const bool lowp = is_lowp(t);
    OpCase c;
    c.dtype = t;
    c.name =
        (lowp ? fmt::format("mlm_loss {} m{} h{} v{}{}{} {}", dtype_name(t), m, h, v,
                            dw ? " dw" : "", db ? " db" : "", backward ? "backward" : "forward")
              : fmt::format("mlm_loss m{} h{} v{} grads {}", m, h, v, backward)) +
        (unused ? ", 2 rows left out" : "");
    const bool want_dw = backward && dw, want_db = backward && db;
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const auto x = lowp ? randn(g, m * h) : random_floats(g, m * h);
      const auto w = lowp ? randn(g, v * h, 0.2f) : random_floats(g, v * h, 0.2f);
      const auto b = lowp ? randn(g, v) : random_floats(g, v);
      auto labels = random_ints(g, m, 0, static_cast<int32_t>(v - 1));
      if (unused) labels[0] = labels[static_cast<size_t>(m - 1)] = -1;
      const auto dw0 = lowp ? randn(g, v * h, 1e-3f) : random_floats(g, v * h);
      const auto db0 = lowp ? randn(g, v, 1e-3f) : random_floats(g, v);
      const float scale = lowp ? 1.f / static_cast<float>(m) : 1.f / 77;
      const GradScale factor =
          unused ? GradScale(scale, r.in("grad scale", DType::f32, {1}, {scale})) : scale;
      const Check grad = lowp ? increments_to(1e-2) : close_to(kTol);
      const Tensor ws = r.out("logits_ws", DType::f32, {m, v},
                              lowp ? (backward ? Check{} : close_to(1e-5)) : close_to(kTol));
      // Gradients not asked for stay as they were.
      const Tensor tdw = r.acc("dw", DType::f32, {v, h}, dw0, want_dw ? grad : unchanged());
      const Tensor tdb = r.acc("db", DType::f32, {v}, db0, want_db ? grad : unchanged());
      r.backend().mlm_loss(
          r.in("x", t, {m, h}, x), r.in("w", t, {v, h}, w), r.in("bias", DType::f32, {v}, b),
          r.in("labels", {m}, labels), factor, ws,
          r.acc("loss", DType::f32, {1}, {0.5f}, lowp ? increments_to(1e-4) : close_to(1e-6)),
          r.acc("correct", {1}, {lowp ? 3 : 0}, lowp ? within(2) : bits()),
          backward ? r.out("dx", t, {m, h}, close_to(lowp ? 1e-2 : kTol)) : Tensor(),
          want_dw ? tdw : Tensor(), want_db ? tdb : Tensor());
    };
    cases.push_back(std::move(c));
  };
  for (bool grads : {false, true}) add(DType::f32, 29, 48, 301, grads, true, true);
  for (DType t : {DType::bf16, DType::f16})
    for (const auto& s :
         {std::array<int64_t, 5>{37, 64, 96, 1, 1}, std::array<int64_t, 5>{19, 128, 1000, 1, 0},
          std::array<int64_t, 5>{64, 64, 512, 0, 1}, std::array<int64_t, 5>{2300, 64, 30528, 1, 1}})
      for (bool backward : {false, true}) add(t, s[0], s[1], s[2], backward, s[3], s[4]);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) add(t, 37, 64, 96, true, true, true, true);
  for (bool unused : {false, true}) add_mlm_loss_reference(cases, unused);
  return cases;
}

// Pooler + NSP: fp32 H 40 over 4 sequences; 16-bit x, dx and weight matrices (the native path:
// the [CLS] rows and the weights widened, the fp32 head, dcls added to dx's [CLS] rows in fp32
// and rounded once) H 40 and 130 over 5, against the CPU's emulation, which runs the same fp32
// ops on the same widened values in another order (cuBLASLt's against OpenBLAS's sums, the
// CUDA softmax against the CPU's). Each quantity is measured against the scale of the terms it
// is made of, since several cancel:
// - the logits, rel L2: kTol;
// - the loss, init + scale sum_s (lse(z_s) - z_s,label): a cross-entropy near 0 is a difference
//   of two logits' size, so its rounding is relative to the logits' terms, not to the loss: it
//   is held to the bound nsp_loss_bound derives (a wrong label moves it by ~100x that; a rel
//   1e-6 reached 4.2e-7 in 200 seeds in fp32, margin 2.4);
// - the logits' gradient scale (p - onehot) in place (p - 1 cancels for a confident
//   prediction): abs error / (scale sqrt(2 s)), each element being at most scale;
// - the parameter gradients, added onto random values: error / (|total| + the size of what
//   was added); cls_b's increment is scale sum_s (p_s - onehot_s), which cancels when the labels
//   balance, and its terms are at most scale each (2 scale s in all);
// - 16-bit dx to a flipped rounding (1e-2) in its [CLS] rows and bit for bit in every other row.
// Measured over 1000 seeds (the 16-bit cases), worst against kTol: dlogits 1.1e-6 (margin 9),
// logits 7.6e-7 (13), cls_b 2.9e-7 (34), the other gradients 2.5e-7 (39), dx 1.3e-4 against
// 1e-2 (80); the loss reached 5.3e-3 of its bound (188), and a flipped label 4.4e3 of it.
namespace {

// The reference's NSP case (fp32, H 12, lengths 5, 1, 9, 3, 7 packed into rows of 12, scale 1/9,
// the global sample count): the loss and the correct count against the double loop, and every
// gradient against central differences of scale * loss over every coordinate, rel L2 kTol. The
// gradients are ADDED to small values (0.01): rounding the sums to fp32 (an ulp of the starting
// value) then stays far below the tolerance (starting values of order 1 put it at 1e-5, and one
// seed in a few hundred over kTol). cls_b's gradient is scale sum_s (p_s - onehot_s): with
// p ~ 1/2 its terms carry the labels' signs and cancel when the labels balance, while their fp32
// rounding does not (2 seeds in 1000 reached 1.6e-4 of the remainder); it is measured against
// max(its norm, the norm such a sum of s random-sign terms of size scale / 2 has), as the model
// tests' nsp_bias_error does. The backend runner holds the loss to nsp_loss_bound, cls_b as
// the cases above (against |cls_b| + 2 scale s), the other outputs to kTol.
// empty: that many empty slots after the sequences (and 5 padding rows: a fixed-capacity
// batch's layout), which the op leaves out whatever their labels, and the factor read from
// device memory (its host value 4x off).
void add_nsp_loss_reference(OpCases& cases, int empty) {
  const int64_t h = 12;
  const float scale = 1.f / 9.f;
  OpCase c;
  c.name =
      empty ? fmt::format("nsp_loss h12 packed, {} empty slots", empty) : "nsp_loss h12 packed";
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const std::vector<int32_t> lens = {5, 1, 9, 3, 7};
    HostLayout l = packed(lens, random_sample_ids(g, lens.size()), 12);
    if (empty) l = with_empty_slots(l, 5, empty);
    const int64_t rows = l.rows, s = static_cast<int64_t>(l.seq_len.size());
    const auto x = random_floats(g, rows * h), wp = random_floats(g, h * h, 0.5f),
               bp = random_floats(g, h), wc = random_floats(g, 2 * h), bc = random_floats(g, 2);
    const auto labels = random_ints(g, s, 0, 1);
    const auto dx0 = random_floats(g, rows * h, 0.01f), dwp0 = random_floats(g, h * h, 0.01f),
               dbp0 = random_floats(g, h, 0.01f), dwc0 = random_floats(g, 2 * h, 0.01f),
               dbc0 = random_floats(g, 2, 0.01f);
    const SeqLayout sl = r.layout(l);
    const PoolerParams p{r.in("dense_w", DType::f32, {h, h}, wp),
                         r.in("dense_b", DType::f32, {h}, bp),
                         r.in("cls_w", DType::f32, {2, h}, wc), r.in("cls_b", DType::f32, {2}, bc)};
    r.backend().nsp_loss(
        sl, r.in("x", DType::f32, {rows, h}, x, unchanged()), p, r.in("labels", {s}, labels),
        empty ? GradScale(4 * scale, r.in("grad scale", DType::f32, {1}, {scale})) : scale,
        r.out("workspace", DType::f32, {nsp_workspace_elems(s, h)}, Check{}),
        r.acc("loss", DType::f32, {1}, {0.f}, Check{}), r.acc("correct", {1}, {0}, bits()),
        r.acc("dx", DType::f32, {rows, h}, dx0, close_to(kTol)),
        PoolerParams{r.acc("d dense_w", DType::f32, {h, h}, dwp0, close_to(kTol)),
                     r.acc("d dense_b", DType::f32, {h}, dbp0, close_to(kTol)),
                     r.acc("d cls_w", DType::f32, {2, h}, dwc0, close_to(kTol)),
                     r.acc("d cls_b", DType::f32, {2}, dbc0, Check{})});
  };
  c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
    const HostLayout& l = want.host_layout(0);
    const int64_t s = static_cast<int64_t>(l.seq_len.size());
    auto floats = [&](const char* name) {
      const Vec d = want.doubles(name);
      return std::vector<float>(d.begin(), d.end());
    };
    // The op accumulates the unscaled sum of the cross-entropies: the bound's scale is 1.
    const double bound =
        nsp_loss_bound(l, floats("x"), floats("dense_w"), floats("dense_b"), floats("cls_w"),
                       floats("cls_b"), ints_of(want.doubles("labels")), 0.0, 1.0, h);
    expect_bound(what + " loss / its rounding bound",
                 std::abs(got.doubles("loss")[0] - want.doubles("loss")[0]) / bound, 1.0);
    const Vec gb = got.doubles("d cls_b"), wb = want.doubles("d cls_b");
    double db2 = 0, b2 = 0;
    for (size_t i = 0; i < 2; ++i) db2 += (gb[i] - wb[i]) * (gb[i] - wb[i]), b2 += wb[i] * wb[i];
    expect_measure(what + " cls_b / (|cls_b| + 2 scale s)",
                   std::sqrt(db2) / (std::sqrt(b2) + 2 * scale * static_cast<double>(s)), kTol);
  };
  c.reference = [=](const std::string& what, const OpRun& cpu) {
    const HostLayout& l = cpu.host_layout(0);
    const int64_t s = static_cast<int64_t>(l.seq_len.size());
    Vec xd = cpu.doubles("x"), wpd = cpu.doubles("dense_w"), bpd = cpu.doubles("dense_b"),
        wcd = cpu.doubles("cls_w"), bcd = cpu.doubles("cls_b");
    const std::vector<int32_t> labels = ints_of(cpu.doubles("labels"));
    int want_correct = 0;
    const double want = ref::nsp(xd, l, h, wpd, bpd, wcd, bcd, labels, &want_correct);
    expect_close(what + " loss", {cpu.doubles("loss")[0]}, {want}, kTol);
    EXPECT_EQ(cpu.doubles("correct")[0], want_correct) << what;
    auto f = [&](const Vec&) { return scale * ref::nsp(xd, l, h, wpd, bpd, wcd, bcd, labels); };
    expect_close(what + " dx (FD)", increments(cpu, "dx"),
                 fd_gradient(f, xd, all_coords(xd.size())), kTol);
    expect_close(what + " d dense_w (FD)", increments(cpu, "d dense_w"),
                 fd_gradient(f, wpd, all_coords(wpd.size())), kTol);
    expect_close(what + " d dense_b (FD)", increments(cpu, "d dense_b"),
                 fd_gradient(f, bpd, all_coords(bpd.size())), kTol);
    expect_close(what + " d cls_w (FD)", increments(cpu, "d cls_w"),
                 fd_gradient(f, wcd, all_coords(wcd.size())), kTol);
    const Vec got = increments(cpu, "d cls_b"), fd = fd_gradient(f, bcd, all_coords(bcd.size()));
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < got.size(); ++i)
      d2 += (got[i] - fd[i]) * (got[i] - fd[i]), n2 += fd[i] * fd[i];
    const double floor = 0.5 * scale * std::sqrt(2.0 * static_cast<double>(s));
    expect_measure(what + " d cls_b (FD) / max(|d cls_b|, its noise floor)",
                   std::sqrt(d2) / std::max(std::sqrt(n2), floor), kTol);
  };
  cases.push_back(std::move(c));
}

}  // namespace

static OpCases nsp_loss_cases() {
  OpCases cases;
  // empty: 2 empty slots and 3 padding rows after the sequences (a fixed-capacity batch).
  auto add = [&cases](DType t, int64_t h, bool grads, bool empty = false) {
    const bool lowp = is_lowp(t);
    OpCase c;
    c.dtype = t;
    c.name = (lowp ? fmt::format("nsp_loss {} h{}{}", dtype_name(t), h, grads ? " grads" : "")
                   : fmt::format("nsp_loss grads {}", grads)) +
             (empty ? ", 2 empty slots" : "");
    const float scale = 1.f / 9;
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const std::vector<int32_t> lens =
          lowp ? std::vector<int32_t>{3, 1, 20, 7, 12} : std::vector<int32_t>{3, 1, 20, 7};
      HostLayout l = padded(lens, random_sample_ids(g, lens.size()), 24);
      if (empty) l = with_empty_slots(l, 3, 2);
      const int64_t rows = l.rows, s = static_cast<int64_t>(l.seq_len.size());
      auto draw = [&](size_t n, float sc) {
        return lowp ? randn(g, n, sc) : random_floats(g, n, sc);
      };
      const auto x = draw(rows * h, 1.f), wp = draw(h * h, 0.3f), bp = draw(h, 1.f),
                 wc = draw(2 * h, 1.f), bc = draw(2, 1.f);
      const auto labels = random_ints(g, s, 0, 1);
      const auto dx0 = draw(rows * h, 1.f), gwp0 = draw(h * h, 1.f), gbp0 = draw(h, 1.f),
                 gwc0 = draw(2 * h, 1.f), gbc0 = draw(2, 1.f);
      const SeqLayout sl = r.layout(l);
      const PoolerParams p{r.in("dense_w", t, {h, h}, wp), r.in("dense_b", DType::f32, {h}, bp),
                           r.in("cls_w", t, {2, h}, wc), r.in("cls_b", DType::f32, {2}, bc)};
      const Check grad = grads ? close_to(kTol) : unchanged();
      const Tensor dx = r.acc("dx", t, {rows, h}, dx0,
                              !grads ? unchanged()
                              : lowp ? Check{}
                                     : close_to(kTol));
      const PoolerParams gr{r.acc("d dense_w", DType::f32, {h, h}, gwp0, grad),
                            r.acc("d dense_b", DType::f32, {h}, gbp0, grad),
                            r.acc("d cls_w", DType::f32, {2, h}, gwc0, grad),
                            r.acc("d cls_b", DType::f32, {2}, gbc0, grads ? Check{} : unchanged())};
      r.backend().nsp_loss(
          sl, r.in("x", t, {rows, h}, x), p, r.in("labels", {s}, labels), scale,
          // Without gradients only the logits are written (compared below).
          r.acc("workspace", DType::f32, {nsp_workspace_elems(s, h)},
                std::vector<float>(static_cast<size_t>(nsp_workspace_elems(s, h))), Check{}),
          r.acc("loss", DType::f32, {1}, {0.25f}, Check{}), r.acc("correct", {1}, {1}, bits()),
          grads ? dx : Tensor(), grads ? gr : PoolerParams{});
    };
    c.compare = [=](const std::string& what, const OpRun& want, const OpRun& got) {
      const HostLayout& l = want.host_layout(0);
      const int64_t s = static_cast<int64_t>(l.seq_len.size());
      auto floats = [&](const char* name) {
        const Vec d = want.doubles(name);
        return std::vector<float>(d.begin(), d.end());
      };
      const Vec lab = want.doubles("labels");
      const std::vector<int32_t> labels(lab.begin(), lab.end());
      const double bound = nsp_loss_bound(l, floats("x"), floats("dense_w"), floats("dense_b"),
                                          floats("cls_w"), floats("cls_b"), labels, 0.25, scale, h);
      expect_bound(what + " loss / its rounding bound",
                   std::abs(got.doubles("loss")[0] - want.doubles("loss")[0]) / bound, 1.0);
      // The logits (or, with gradients, their gradient) at offset 4 s h, as on the CPU.
      const Vec gws = got.doubles("workspace"), hws = want.doubles("workspace");
      const Vec glog(gws.begin() + 4 * s * h, gws.end()), hlog(hws.begin() + 4 * s * h, hws.end());
      if (!grads) {
        expect_close(what + " logits at 4sh", glog, hlog, kTol);
        return;
      }
      double d2 = 0;
      for (size_t i = 0; i < glog.size(); ++i) d2 += (glog[i] - hlog[i]) * (glog[i] - hlog[i]);
      expect_measure(what + " dlogits at 4sh / (scale sqrt(2 s))",
                     std::sqrt(d2) / (scale * std::sqrt(2.0 * static_cast<double>(s))), kTol);
      const Vec got_b = got.doubles("d cls_b"), want_b = want.doubles("d cls_b");
      double db2 = 0, b2 = 0;
      for (size_t i = 0; i < 2; ++i) {
        db2 += (got_b[i] - want_b[i]) * (got_b[i] - want_b[i]);
        b2 += want_b[i] * want_b[i];
      }
      expect_measure(what + " cls_b / (|cls_b| + 2 scale s)",
                     std::sqrt(db2) / (std::sqrt(b2) + 2 * scale * static_cast<double>(s)), kTol);
      if (!lowp) return;
      expect_close(what + " dx", got.doubles("dx"), want.doubles("dx"), 1e-2);
      const std::vector<uint8_t> gdx = got.buf("dx").bytes();
      const std::vector<double> dx0 = want.initial("dx"), gd = got.doubles("dx");
      std::vector<bool> cls(static_cast<size_t>(l.rows), false);
      for (int32_t start : l.seq_start) cls[static_cast<size_t>(start)] = true;
      for (int64_t r = 0; r < l.rows; ++r) {
        if (cls[static_cast<size_t>(r)]) continue;
        ASSERT_TRUE(std::equal(gd.begin() + r * h, gd.begin() + (r + 1) * h, dx0.begin() + r * h))
            << what << ": row " << r << " is no [CLS] row, yet changed";
      }
    };
    cases.push_back(std::move(c));
  };
  for (bool grads : {false, true}) add(DType::f32, 40, grads);
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t h : {int64_t{40}, int64_t{130}})
      for (bool grads : {false, true}) add(t, h, grads);
  for (DType t : {DType::f32, DType::bf16}) add(t, 40, true, true);
  for (int empty : {0, 3}) add_nsp_loss_reference(cases, empty);
  return cases;
}

// ---- optimizer --------------------------------------------------------------------------------
// l2_norm (the same bits when called again: a fixed order) and sum_squares (l2_norm is the root
// of the same sum, norm_from_sum_squares of it) over sizes across the reduction block.
static OpCases l2_norm_cases() {
  OpCases cases;
  for (int64_t n : {int64_t{1}, int64_t{8191}, int64_t{8192}, int64_t{100003}, int64_t{3000001}}) {
    OpCase c;
    c.name = fmt::format("l2_norm n{}", n);
    c.run = [=](OpRun& r) {
      const Tensor x = r.in("x", DType::f32, {n}, random_floats(r.rng(), n));
      const Tensor out = r.out("out", DType::f32, {1}, close_to(1e-6));
      r.backend().l2_norm(x, out);
      const double first = r.doubles("out")[0];
      r.backend().l2_norm(x, out);
      EXPECT_EQ(r.doubles("out")[0], first) << r.backend().name() << ": not deterministic";
    };
    if (n <= 100003)  // the reference's sizes (see sum_squares below)
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        double s = 0;
        for (double v : cpu.doubles("x")) s += v * v;
        expect_close(what, cpu.doubles("out"), {std::sqrt(s)}, kTol);
      };
    cases.push_back(std::move(c));
  }
  // sum_squares: the double l2_norm roots, so sqrt of it rounds to l2_norm's bits; and sums of
  // consecutive pieces add up to the whole to double rounding (a sharded global norm). Worst over
  // 1000 seeds: 1.8e-13 against a naive double sum of 100003 squares (bar 1e-12), 5.0e-15 for
  // the pieces (bar 1e-13). The reference runner takes the sizes up to 100003, as the hand-written
  // test did: over 3000001 terms the naive sum's own rounding (a running double sum, ~n 2^-53 at
  // worst) reaches the bar (9.7e-13 in 50 seeds), and drawing 3M values per case costs more than
  // the rest of the runner; the backend runner takes every size.
  for (int64_t n : {int64_t{1}, int64_t{8191}, int64_t{8192}, int64_t{100003}, int64_t{3000001}}) {
    OpCase c;
    c.name = fmt::format("sum_squares n{}", n);
    c.run = [=](OpRun& r) {
      const Tensor x = r.in("x", DType::f32, {n}, random_floats(r.rng(), n));
      const Tensor sum = r.out("sum", DType::f64, {1}, close_to(1e-12));
      r.backend().sum_squares(x, sum);
      const Tensor norm = r.out("norm", DType::f32, {1}, Check{});
      const Tensor from = r.out("norm from sum", DType::f32, {1}, Check{});
      r.backend().l2_norm(x, norm);
      r.backend().norm_from_sum_squares(sum, from);
      const double got = r.doubles("sum")[0];
      EXPECT_EQ(r.doubles("norm")[0], static_cast<float>(std::sqrt(got))) << r.backend().name();
      EXPECT_EQ(r.doubles("norm from sum")[0], r.doubles("norm")[0]) << r.backend().name();
      if (n < 3) return;
      const int64_t cut = n / 3;
      const Tensor a = r.out("sum of a piece", DType::f64, {1}, Check{}),
                   b = r.out("sum of the rest", DType::f64, {1}, Check{});
      r.backend().sum_squares(slice(x, 0, cut), a);
      r.backend().sum_squares(slice(x, cut, n - cut), b);
    };
    if (n <= 100003)
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        const double got = cpu.doubles("sum")[0];
        double naive = 0;
        for (double v : cpu.doubles("x")) naive += v * v;
        expect_measure(what + " vs a naive double sum (rel)", std::abs(got - naive) / naive, 1e-12);
        if (n < 3) return;
        const double a = cpu.doubles("sum of a piece")[0], b = cpu.doubles("sum of the rest")[0];
        expect_measure(what + ": two pieces vs the whole (rel)", std::abs(a + b - got) / got,
                       1e-13);
      };
    cases.push_back(std::move(c));
  }
  return cases;
}

// lamb_step over tensors with gaps between them (left alone), sizes across the chunk boundary,
// both flags, clipped and not; then the same rows with the flags flipped (a device backend keeps
// the work list it derived from a table and must notice a new one); and a non-finite global norm,
// which skips the step inside the op (no read-back) with the same record on every backend, then a
// finite step that updates and ends the run of skips.
namespace {
// A LAMB step's inputs over n elements: weights, gradient, first moment and (non-negative)
// second moment.
struct LambInputs {
  std::vector<float> w, grad, m, v;
};
LambInputs lamb_inputs(std::mt19937_64& g, int64_t n) {
  LambInputs in{random_floats(g, n), random_floats(g, n), random_floats(g, n, 0.1f),
                random_floats(g, n, 0.1f)};
  for (float& x : in.v) x = std::abs(x);
  return in;
}
}  // namespace

static OpCases lamb_step_cases() {
  OpCases cases;
  static const std::vector<LambTensor> first = {{0, 1000, 1},  {1000, 64, 0},    {1100, 20000, 1},
                                                {21100, 1, 0}, {21105, 8192, 1}, {29297, 0, 1}};
  static const std::vector<LambTensor> flipped = [] {
    std::vector<LambTensor> f = first;
    for (LambTensor& r : f) r.decay = 1 - r.decay;
    return f;
  }();
  const int64_t n = 29400, t = static_cast<int64_t>(first.size());
  // The AdamW family (config.rule) on the same inputs: its own steps, clipped and not.
  struct RuleCase {
    UpdateRule rule;
    const char* name;
    float gnorm;
    bool flip;
  };
  for (const RuleCase& rc : {RuleCase{UpdateRule::lamb, "lamb_step", 0.5f, false},
                             RuleCase{UpdateRule::lamb, "lamb_step", 7.f, false},
                             RuleCase{UpdateRule::lamb, "lamb_step", 2.f, true},
                             RuleCase{UpdateRule::lamb, "lamb_step", 3.f, false},
                             RuleCase{UpdateRule::adamw, "adamw step", 0.5f, false},
                             RuleCase{UpdateRule::adamw, "adamw step", 7.f, true},
                             RuleCase{UpdateRule::stable_adamw, "stable_adamw step", 0.5f, false},
                             RuleCase{UpdateRule::stable_adamw, "stable_adamw step", 7.f, true}}) {
    const float gnorm = rc.gnorm;
    const bool flip = rc.flip;
    const UpdateRule rule = rc.rule;
    OpCase c;
    c.name = fmt::format("{} global norm {}{}", rc.name, gnorm, flip ? ", flipped" : "");
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const LambInputs in = lamb_inputs(g, n);
      const auto &w = in.w, &gr = in.grad, &m = in.m, &v = in.v;
      LambConfig cfg;
      cfg.rule = rule;
      cfg.lr = 1e-3f;
      cfg.step = 7;
      const auto& rows = flip ? flipped : first;
      r.backend().lamb_step(lamb_table(rows.data(), t), cfg,
                            r.in("global norm", DType::f32, {1}, {gnorm}),
                            r.acc("params", DType::f32, {n}, w, close_to(kTol)),
                            r.acc("update", DType::f32, {n}, gr, close_to(kTol)),
                            r.acc("m", DType::f32, {n}, m, close_to(kTol)),
                            r.acc("v", DType::f32, {n}, v, close_to(kTol)),
                            r.out("norms", DType::f32, {2 * t}, close_to(1e-6)));
    };
    cases.push_back(std::move(c));
  }
  // LambConfig::step_scalars: the rate, the bias corrections and the loss scale read from device
  // memory (a graph's replay) give the bits of the same values given as the config's fields,
  // while the config's own fields say otherwise (rate 0.5, step 1, loss scale 1).
  {
    OpCase c;
    c.name = "lamb_step with its step scalars in device memory";
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const LambInputs in = lamb_inputs(g, n);
      const auto &w = in.w, &gr = in.grad, &m = in.m, &v = in.v;
      LambConfig cfg;
      cfg.lr = 2e-3f;
      cfg.step = 11;
      cfg.grad_scale = 4.f;
      const LambStepScalars sc = lamb_step_scalars(cfg);
      const Tensor gnorm = r.in("global norm", DType::f32, {1}, {12.f});
      auto step = [&](const LambConfig& config, const std::string& suffix) {
        r.backend().lamb_step(lamb_table(first.data(), t), config, gnorm,
                              r.acc("params" + suffix, DType::f32, {n}, w, close_to(kTol)),
                              r.acc("update" + suffix, DType::f32, {n}, gr, close_to(kTol)),
                              r.acc("m" + suffix, DType::f32, {n}, m, close_to(kTol)),
                              r.acc("v" + suffix, DType::f32, {n}, v, close_to(kTol)),
                              r.out("norms" + suffix, DType::f32, {2 * t}, close_to(1e-6)));
      };
      step(cfg, "");
      LambConfig other = cfg;
      other.lr = 0.5f;
      other.step = 1;
      other.grad_scale = 1.f;
      other.step_scalars = r.in("step scalars", DType::f32, {4},
                                {sc.lr, sc.bias_correction1, sc.bias_correction2, sc.grad_scale});
      step(other, " (scalars)");
      for (const char* name : {"params", "update", "m", "v", "norms"})
        EXPECT_TRUE(r.buf(name).bytes() == r.buf(std::string(name) + " (scalars)").bytes())
            << r.backend().name() << ": " << name << " differs with the scalars in memory";
    };
    cases.push_back(std::move(c));
  }
  // The sharded optimizer's step (optim/distributed_lamb.h): the buffer cut at two random
  // elements, one inside the 20000-element tensor, each piece updated on its own with the rows
  // clipped to it, the pieces' per-row sums added (on the host here, over ranks there), then
  // each piece applied. Against the whole step on the same inputs: m, v and u bit for bit (they
  // do not depend on the norms); each row's sums to 1e-11 relative (two fixed-order double sums
  // of <= 20000 positive terms differ by at most 2 (n - 1) 2^-53 = 4.4e-12 relative), so each f32
  // norm is equal or one ulp away (2^-24 relative), the step size lr * ||w|| / ||u|| within two
  // ulps (2^-22), and each weight w - step * u within 2^-22 |step * u| plus one rounding of w
  // (2^-24 |w|): the bar is 2^-21 (|w| + |w_initial - w|), twice that.
  // StableAdamW's sums are its RMS terms and element counts, added over the pieces the same way;
  // the same bar holds (its rate lr / RMS moves as LAMB's step size does).
  for (const UpdateRule rule : {UpdateRule::lamb, UpdateRule::stable_adamw}) {
    OpCase c;
    c.name = fmt::format("{} of pieces cut inside tensors", rule == UpdateRule::lamb
                                                                ? "lamb_update and lamb_apply"
                                                                : "stable_adamw update and apply");
    c.run = [=](OpRun& r) {
      auto& g = r.rng();
      const LambInputs in = lamb_inputs(g, n);
      const auto &w = in.w, &gr = in.grad, &m = in.m, &v = in.v;
      const int64_t cut1 = std::uniform_int_distribution<int64_t>(1101, 21099)(g);
      const int64_t cut2 = std::uniform_int_distribution<int64_t>(cut1 + 1, n - 1)(g);
      LambConfig cfg;
      cfg.rule = rule;
      cfg.lr = 1e-3f;
      cfg.step = 5;
      const Tensor gnorm = r.in("global norm", DType::f32, {1}, {2.5f});
      const Tensor norms = r.out("norms", DType::f32, {2 * t}, close_to(1e-6));
      const Tensor tw = r.acc("params", DType::f32, {n}, w, close_to(kTol));
      const Tensor tu = r.acc("update", DType::f32, {n}, gr, close_to(kTol));
      const Tensor tm = r.acc("m", DType::f32, {n}, m, close_to(kTol));
      const Tensor tv = r.acc("v", DType::f32, {n}, v, close_to(kTol));
      r.backend().lamb_step(lamb_table(first.data(), t), cfg, gnorm, tw, tu, tm, tv, norms);
      const Tensor sw = r.acc("params (pieces)", DType::f32, {n}, w, close_to(kTol));
      const Tensor su = r.acc("update (pieces)", DType::f32, {n}, gr, close_to(kTol));
      const Tensor sm = r.acc("m (pieces)", DType::f32, {n}, m, close_to(kTol));
      const Tensor sv = r.acc("v (pieces)", DType::f32, {n}, v, close_to(kTol));
      // A piece past the last row holds none; the op still needs a table pointer.
      static const LambTensor kNoRow{0, 0, 0};
      auto table_of = [](const std::vector<LambTensor>& rows) {
        return lamb_table(rows.empty() ? &kNoRow : rows.data(), static_cast<int64_t>(rows.size()));
      };
      struct Piece {
        int64_t begin, end;
        std::vector<LambTensor> rows;
        std::vector<int64_t> global;  // the row of `first` each row clips
        Tensor sums;
      };
      std::vector<Piece> pieces = {
          {0, cut1, {}, {}, {}}, {cut1, cut2, {}, {}, {}}, {cut2, n, {}, {}, {}}};
      std::vector<double> total(static_cast<size_t>(2 * t), 0.0);
      for (size_t k = 0; k < pieces.size(); ++k) {
        Piece& p = pieces[k];
        for (int64_t i = 0; i < t; ++i) {
          const int64_t lo = std::max(first[i].offset, p.begin);
          const int64_t hi = std::min(first[i].offset + first[i].size, p.end);
          if (lo >= hi) continue;
          p.rows.push_back({lo - p.begin, hi - lo, first[i].decay});
          p.global.push_back(i);
        }
        const auto rows = static_cast<int64_t>(p.rows.size());
        const int64_t len = p.end - p.begin;
        p.sums = r.out(fmt::format("sums of piece {}", k), DType::f64, {rows, 2}, Check{});
        r.backend().lamb_update(table_of(p.rows), cfg, gnorm, slice(sw, p.begin, len),
                                slice(su, p.begin, len), slice(sm, p.begin, len),
                                slice(sv, p.begin, len), p.sums);
        const std::vector<double> got = r.doubles(fmt::format("sums of piece {}", k));
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < 2; ++j)
            total[static_cast<size_t>(2 * p.global[static_cast<size_t>(i)] + j)] +=
                got[static_cast<size_t>(2 * i + j)];
      }
      for (size_t k = 0; k < pieces.size(); ++k) {
        Piece& p = pieces[k];
        const auto rows = static_cast<int64_t>(p.rows.size());
        std::vector<double> mine;
        for (int64_t gi : p.global)
          for (int64_t j = 0; j < 2; ++j) mine.push_back(total[static_cast<size_t>(2 * gi + j)]);
        if (rows > 0)
          r.backend().copy(p.sums, Tensor(mine.data(), DType::f64, {rows, 2}, Device::cpu));
        const int64_t len = p.end - p.begin;
        r.backend().lamb_apply(table_of(p.rows), cfg, gnorm, p.sums, slice(sw, p.begin, len),
                               slice(su, p.begin, len));
      }
      const std::string what = fmt::format("{} (cuts {}, {})", r.backend().name(), cut1, cut2);
      EXPECT_EQ(r.doubles("update (pieces)"), r.doubles("update")) << what;
      EXPECT_EQ(r.doubles("m (pieces)"), r.doubles("m")) << what;
      EXPECT_EQ(r.doubles("v (pieces)"), r.doubles("v")) << what;
      const std::vector<double> wn = r.doubles("norms");
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < 2; ++j) {
          const double whole = static_cast<double>(wn[static_cast<size_t>(j * t + i)]);
          const double split = std::sqrt(total[static_cast<size_t>(2 * i + j)]);
          EXPECT_LE(std::abs(split - whole), 1e-11 * whole + 2e-7 * whole)
              << what << ": row " << i << (j ? " ||u||" : " ||w||");
        }
      const std::vector<double> whole = r.doubles("params"), split = r.doubles("params (pieces)");
      double worst = 0;
      for (size_t i = 0; i < whole.size(); ++i) {
        const double bar = std::ldexp(std::abs(whole[i]) + std::abs(w[i] - whole[i]), -21);
        worst = std::max(worst, std::abs(split[i] - whole[i]) / std::max(bar, 1e-30));
      }
      expect_measure(
          std::string(r.backend().name()) + ": pieces vs whole, weights (of the derived bar)",
          worst, 1.0);
    };
    // On the CPU (where run() above also compares the pieces with the whole): each row's
    // ||w|| against a naive double sum of the initial weights, to f32 rounding (2^-24 relative).
    if (rule == UpdateRule::lamb)
      c.reference = [=](const std::string& what, const OpRun& cpu) {
        const std::vector<double> w0 = cpu.initial("params"), norms = cpu.doubles("norms");
        for (int64_t i = 0; i < t; ++i) {
          double s2 = 0;
          for (int64_t k = first[i].offset; k < first[i].offset + first[i].size; ++k)
            s2 += w0[static_cast<size_t>(k)] * w0[static_cast<size_t>(k)];
          EXPECT_LE(std::abs(norms[static_cast<size_t>(i)] - std::sqrt(s2)), 1e-7 * std::sqrt(s2))
              << what << ": row " << i;
        }
      };
    cases.push_back(std::move(c));
  }
  OpCase c;
  c.name = "lamb_step skipped, then stepped";
  c.run = [=](OpRun& r) {
    auto& g = r.rng();
    const LambInputs in = lamb_inputs(g, n);
    const auto &w = in.w, &gr = in.grad, &m = in.m, &v = in.v;
    LambConfig cfg;
    cfg.lr = 1e-3f;
    cfg.step = 3;
    const Tensor tw = r.acc("params", DType::f32, {n}, w, close_to(kTol));
    const Tensor tm = r.acc("m", DType::f32, {n}, m, close_to(kTol));
    const Tensor tv = r.acc("v", DType::f32, {n}, v, close_to(kTol));
    const Tensor norms =
        r.acc("norms", DType::f32, {2 * t}, std::vector<float>(2 * t, 0.f), Check{});
    const Tensor record = r.acc("record", {3}, {0, 0, 0}, bits());
    r.backend().lamb_step(
        lamb_table(first.data(), t), cfg,
        r.in("NaN norm", DType::f32, {1}, {std::numeric_limits<float>::quiet_NaN()}), tw,
        r.acc("update 1", DType::f32, {n}, gr, Check{}), tm, tv, norms, Tensor(), record);
    const std::string what = r.backend().name();
    EXPECT_EQ(r.buf("params").bytes(), r.entries()[0].initial)
        << what << ": skipped, yet params changed";
    EXPECT_EQ(r.doubles("m"), r.initial("m")) << what;
    EXPECT_EQ(r.doubles("v"), r.initial("v")) << what;
    EXPECT_EQ(r.doubles("record"), (std::vector<double>{1, 1, 1})) << what;
    r.backend().lamb_step(
        lamb_table(first.data(), t), cfg, r.in("finite norm", DType::f32, {1}, {1.5f}), tw,
        r.acc("update 2", DType::f32, {n}, gr, Check{}), tm, tv, norms, Tensor(), record);
    EXPECT_EQ(r.doubles("record"), (std::vector<double>{1, 0, 1})) << what;
  };
  cases.push_back(std::move(c));
  return cases;
}

// ---- copies and conversions -------------------------------------------------------------------
namespace {

// The reference's description of a 16-bit format (tests/common/float_format.h).
const FloatFormat& format16(DType t) {
  static const FloatFormat bf16 = bf16_format(), f16 = f16_format();
  return t == DType::bf16 ? bf16 : f16;
}

std::vector<uint16_t> patterns16(const OpRun& r, const std::string& name) {
  const std::vector<uint8_t> b = r.buf(name).bytes();
  std::vector<uint16_t> v(b.size() / 2);
  std::memcpy(v.data(), b.data(), v.size() * 2);
  return v;
}

// fp32 values that round to every kind of 16-bit result: random bit patterns over the whole
// exponent range (subnormals of both formats, values that flush to zero), the midpoints between
// random neighbouring 16-bit values (ties) and one fp32 ulp either side, both zeros, the
// largest finite value, the overflow bound and an ulp below it, infinities and NaNs with random
// payloads.
std::vector<float> narrowing_inputs(std::mt19937_64& g, DType t) {
  const FloatFormat& f = format16(t);
  std::vector<float> v;
  for (int i = 0; i < 20000; ++i) v.push_back(from_bits(static_cast<uint32_t>(g())));
  const uint32_t max = f.max_finite();
  for (int i = 0; i < 4000; ++i) {
    const auto p = static_cast<uint32_t>(g() % max);                           // p and p + 1 finite
    const auto mid = static_cast<float>((f.values[p] + f.values[p + 1]) / 2);  // exact
    const float s = (g() & 1) ? -1.f : 1.f;
    v.push_back(s * mid);
    v.push_back(s * std::nextafter(mid, 0.f));
    v.push_back(s * std::nextafter(mid, std::numeric_limits<float>::infinity()));
  }
  const double top = f.values[max], bound = (top + f.values[max + 1]) / 2;
  for (double x : {0.0, -0.0, top, -top, bound, -bound}) v.push_back(static_cast<float>(x));
  v.push_back(std::nextafter(static_cast<float>(bound), 0.f));
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < 64; ++i)
    v.push_back(from_bits(0x7F800001u | static_cast<uint32_t>(g() % 0x7FFFFFu) |
                          static_cast<uint32_t>(g() & 1) << 31));
  return v;
}

}  // namespace

// convert: every 16-bit pattern widened to fp32 and narrowed back, and fp32 values of every kind
// narrowed; between the same dtypes a copy. Bit for bit the CPU backend on every backend; the
// reference: tests/common/float_format.h's decoder and nearest-value search. Outputs that are
// finite start as the NaN pattern and must all be written; the narrowed values whose result is an
// infinity or a NaN go to a buffer of their own that starts at 0, so an element left unwritten
// shows.
static OpCases convert_cases() {
  OpCases cases;
  for (DType t : {DType::bf16, DType::f16}) {
    OpCase widen;
    widen.dtype = t;
    widen.name = fmt::format("convert every {} pattern to f32 and back", dtype_name(t));
    widen.run = [t](OpRun& r) {
      std::vector<uint16_t> all(65536);
      for (uint32_t p = 0; p < all.size(); ++p) all[p] = static_cast<uint16_t>(p);
      const Tensor in = r.in_bits("patterns", t, {65536}, all.data(), unchanged());
      // Widened NaNs keep their low 16 (bf16) or 13 (f16) bits zero: never the f32 pre-fill.
      const Tensor wide = r.out_any("f32", DType::f32, {65536}, bits());
      const Tensor back = r.acc("back", t, {65536}, std::vector<float>(65536, 0.f), bits());
      r.backend().convert(wide, in);
      r.backend().convert(back, wide);
    };
    widen.reference = [t](const std::string& what, const OpRun& cpu) {
      const std::vector<float> wide = floats_of(cpu.buf("f32").bytes());
      const std::vector<uint16_t> back = patterns16(cpu, "back");
      for (uint32_t p = 0; p < 65536; ++p) {
        const double want = format16(t).decode(p);
        const float got = wide[p];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << what << " pattern " << p;
          EXPECT_TRUE(format16(t).is_nan(back[p])) << what << " back " << p;
          continue;
        }
        EXPECT_TRUE(static_cast<double>(got) == want && std::signbit(got) == std::signbit(want))
            << what << " pattern " << p << ": " << got << ", want " << want;
        EXPECT_EQ(back[p], p) << what << ": pattern " << p << " back";
      }
    };
    cases.push_back(std::move(widen));

    OpCase narrow_case;
    narrow_case.dtype = t;
    narrow_case.name =
        fmt::format("convert f32 to {}: ties, subnormals, overflow, NaN", dtype_name(t));
    narrow_case.run = [t](OpRun& r) {
      std::vector<float> finite, special;
      for (float x : narrowing_inputs(r.rng(), t)) {
        const FloatFormat& f = format16(t);
        (std::isfinite(f.decode(f.reference(x))) ? finite : special).push_back(x);
      }
      const auto nf = static_cast<int64_t>(finite.size()),
                 ns = static_cast<int64_t>(special.size());
      r.backend().convert(r.out("finite results", t, {nf}, bits()),
                          r.in("finite", DType::f32, {nf}, finite, unchanged()));
      r.backend().convert(r.acc("special results", t, {ns}, std::vector<float>(ns, 0.f), bits()),
                          r.in("special", DType::f32, {ns}, special, unchanged()));
    };
    narrow_case.reference = [t](const std::string& what, const OpRun& cpu) {
      for (const char* part : {"finite", "special"}) {
        const std::vector<float> in = floats_of(cpu.buf(part).bytes());
        const std::vector<uint16_t> got = patterns16(cpu, std::string(part) + " results");
        ASSERT_EQ(got.size(), in.size());
        for (size_t i = 0; i < in.size(); ++i) {
          const auto want = static_cast<uint16_t>(format16(t).reference(in[i]));
          if (format16(t).is_nan(want)) {
            EXPECT_TRUE(format16(t).is_nan(got[i])) << what << " " << in[i];
          } else {
            EXPECT_EQ(got[i], want) << what << " " << std::hexfloat << in[i];
          }
        }
      }
    };
    cases.push_back(std::move(narrow_case));
  }
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    OpCase same;
    same.dtype = t;
    same.name = fmt::format("convert {} to {} (a copy)", dtype_name(t), dtype_name(t));
    same.run = [t](OpRun& r) {
      const auto x = randn(r.rng(), 1001);
      r.backend().convert(r.out("copy", t, {1001}, bits()), r.in("x", t, {1001}, x, unchanged()));
    };
    same.reference = [](const std::string& what, const OpRun& cpu) {
      EXPECT_EQ(cpu.buf("copy").bytes(), cpu.buf("x").bytes()) << what;
    };
    cases.push_back(std::move(same));
  }
  return cases;
}

// write_floats: n = 1..8 values from the host, as they are, and nothing past them (the guards).
static OpCases write_floats_cases() {
  OpCases cases;
  for (int n : {1, 3, 8}) {
    OpCase c;
    c.name = fmt::format("write_floats n{}", n);
    c.run = [n](OpRun& r) {
      const auto v = random_floats(r.rng(), static_cast<size_t>(n));
      r.in("values", DType::f32, {n}, v);
      r.backend().write_floats(r.out("dst", DType::f32, {n}, bits()), v.data(), n);
    };
    c.reference = [](const std::string& what, const OpRun& cpu) {
      EXPECT_EQ(cpu.buf("dst").bytes(), cpu.buf("values").bytes()) << what;
    };
    cases.push_back(std::move(c));
  }
  return cases;
}

// upload: one call with destinations of every dtype a batch carries (i32 ids, i64 sample ids,
// f32, bf16), each its source's bytes; the host buffers may be reused once upload returns, so
// they are overwritten right after it.
static OpCases upload_cases() {
  OpCase c;
  c.name = "upload i32 i64 f32 bf16";
  c.run = [](OpRun& r) {
    auto& g = r.rng();
    std::vector<int32_t> a = random_ints(g, 777, -5, 30521);
    std::vector<int64_t> b = random_sample_ids(g, 33);
    std::vector<float> f = random_floats(g, 1000);
    std::vector<uint16_t> h = round16(DType::bf16, randn(g, 129));
    r.in("i32 source", {777}, a);
    r.in("i64 source", {33}, b);
    r.in("f32 source", DType::f32, {1000}, f);
    r.in_bits("bf16 source", DType::bf16, {129}, h.data());
    r.backend().upload({{r.out("i32", DType::i32, {777}, bits()), a.data()},
                        {r.out("i64", DType::i64, {33}, bits()), b.data()},
                        {r.out("f32", DType::f32, {1000}, bits()), f.data()},
                        {r.out("bf16", DType::bf16, {129}, bits()), h.data()}});
    std::fill(a.begin(), a.end(), -1);
    std::fill(b.begin(), b.end(), -1);
    std::fill(f.begin(), f.end(), -1.f);
    std::fill(h.begin(), h.end(), uint16_t{0});
  };
  c.reference = [](const std::string& what, const OpRun& cpu) {
    for (const char* t : {"i32", "i64", "f32", "bf16"})
      EXPECT_EQ(cpu.buf(t).bytes(), cpu.buf(std::string(t) + " source").bytes())
          << what << " " << t;
  };
  return {c};
}

// ---- the registry -----------------------------------------------------------------------------
const std::vector<OpTable>& op_tables() {
  auto any = [](OpCases (*f)()) { return [f](bool) { return f(); }; };
  static const std::vector<OpTable> tables = {
      {"LinearForward", any(linear_forward_cases)},
      {"LinearBackward", any(linear_backward_cases)},
      {"Embedding", any(embedding_cases)},
      {"ResidualLayerNorm", any(residual_layernorm_cases)},
      {"EmbeddingOptions", any(norm_option_cases_embedding)},
      {"ResidualLayerNormOptions", any(norm_option_cases_residual)},
      {"Attention", attention_cases},
      {"AttentionWindow", attention_window_cases},
      {"GatherRows", any(gather_rows_cases)},
      {"SoftmaxCrossEntropy", any(softmax_cross_entropy_cases)},
      {"MlmLoss", any(mlm_loss_cases)},
      {"NspLoss", any(nsp_loss_cases)},
      {"L2Norm", any(l2_norm_cases)},
      {"LambStep", any(lamb_step_cases)},
      {"Convert", any(convert_cases)},
      {"WriteFloats", any(write_floats_cases)},
      {"Upload", any(upload_cases)},
      {"Fp8Cast", any(fp8_op_cases_cast)},
      {"Fp8Gemm", any(fp8_op_cases_gemm)},
      {"Fp8Scaling", any(fp8_op_cases_scaling)},
      {"RotaryEmbedding", any(arch_op_cases_rotary)},
      {"GluForward", any(arch_op_cases_glu_forward)},
      {"GluBackward", any(arch_op_cases_glu_backward)},
  };
  return tables;
}

}  // namespace packbert::test
