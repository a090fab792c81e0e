// One table of op cases for every backend (as ggml's test-backend-ops): each op's cases are
// defined once here -- shapes, layouts, dtypes and options, each with a printable name -- and
// run by two runners:
// - the reference runner (tests/ops/test_ops_reference.cpp, label ops): the CPU backend against
//   double loops and finite differences (each case's `reference`);
// - the backend runner (tests/gpu/test_backend_ops.cpp, labels gpu and emulated): the CPU
//   backend against another backend (CUDA, emulated CUDA) on the same inputs, in fp32 and, as a
//   mode, in bf16 / f16 against the CPU backend's emulation of low precision (widen, fp32 op,
//   round).
//
// A case's `run` allocates its tensors on the backend it is given (OpRun: guarded buffers,
// inputs drawn from a generator seeded the same way for every backend, so every backend sees the
// same values) and calls the op; every buffer carries the check the backend runner applies to it
// (rel L2 under a tolerance, bit equality, the low-precision element match, unchanged). Written
// outputs start as a NaN pattern and sit between NaN-pattern guards: a stray write or an
// unwritten element fails on every backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/common/philox.h"
#include "ops_test_util.h"

namespace packbert::test {

// ---- tolerances of the backend runner -------------------------------------------------------
// Rel L2 ||other - cpu|| / ||cpu||, fp32 against fp32 (both backends round each product once
// and sum in another order):
// - kTol (ops_test_util.h, 1e-5) for elementwise ops and short reductions: ~sqrt(K) * 6e-8
//   <= 1e-6; LayerNorm and column sums: the CPU sums in double, the GPU too (in other groupings).
// - 2e-5 (kAttnBwdTol) for attention backward: dS = P (dP - D) cancels D, the mean of dP over
//   the row, so the relative error of dQ / dK grows with the cancellation (up to 512 keys).
// - losses: 1e-6 relative on the summed loss (double sums of per-row double values).
// - 2e-3 (kGeluEpilogueTol) where cuBLASLt's GELU_AUX_BIAS / DGELU epilogues compute the tanh
//   GELU (ld % 8 == 0): its tanh may be the hardware approximation (tanh.approx.f32, relative
//   error ~2^-11), not the formula of common/math.h.
constexpr double kAttnBwdTol = 2e-5;
constexpr double kGeluEpilogueTol = 2e-3;

// The low-precision element match (expect_lowp_match) of the native bf16 / f16 kernels
// (embedding_forward / backward, residual_layernorm_forward / backward) against the CPU
// backend's emulation on the same 16-bit inputs. Both sides compute the same fp32 expressions
// per element and differ only in the order of the row reductions (Welford merges, double sums of
// the backward, column sums), which moves the fp32 value before the final rounding by a few fp32
// ulps of the row's scale (~2e-7 relative; FMA contraction on the GPU adds half an fp32 ulp).
// Rounding to 16 bits then gives the same bits unless that fp32 value sits that close to a
// rounding midpoint: probability ~2e-7 / 2^-8 = 5e-5 per bf16 element, 4e-4 per f16 element, a
// few times more for elements that are small against their row (cancellation in LayerNorm's
// output and dx: the error is relative to the row, the ulp to the element). So per element:
// |other - cpu| <= 2 ulps of the format at |cpu| (a flipped rounding is 1 ulp), plus 1e-5 of the
// tensor's rms for elements near zero; and at least 98% of the elements bit for bit (the
// estimate gives > 99.5% for f16). Swept (tests/seed_sweeps.txt: embeddings 200 seeds, residual
// LayerNorm 50): the worst element is 1 ulp, half the 2-ulp bound, and the worst fraction not
// bit-exact 9.0e-4 against the 0.02 that kMinExact allows (margin 22). The fp32 outputs of those
// ops (statistics, parameter gradients) are fp32 against fp32 in another order: kFp32Tol, the
// fp32 runner's kTol.
inline constexpr double kFp32Tol = 1e-5;
inline constexpr double kMinExact = 0.98;
inline constexpr uint16_t kNaN16 = 0x7FC1;  // a NaN as bf16 and as f16

// ---- 16-bit formats (round16, widen16, is_lowp: ops_test_util.h) -----------------------------
// One unit in the last place of the format at |x|.
double ulp16(DType t, double x);

// Normal(0, s) values (the low-precision cases draw these; the fp32 cases random_floats).
std::vector<float> randn(std::mt19937_64& rng, size_t n, float s = 1.f);

// Sequence lengths 1..200 with the edge cases always present (1, 2, odd, 200) and `extra` random
// others, shuffled (the attention cases and tests).
std::vector<int32_t> mixed_lengths(std::mt19937_64& rng, int extra);

// A bound on |loss - loss'| of two fp32 evaluations of the NSP loss in any summation order
// (derived in op_cases.cpp).
double nsp_loss_bound(const HostLayout& l, const std::vector<float>& x,
                      const std::vector<float>& wp, const std::vector<float>& bp,
                      const std::vector<float>& wc, const std::vector<float>& bc,
                      const std::vector<int32_t>& labels, double init, double scale, int64_t h);

// ---- checks -----------------------------------------------------------------------------------
struct Check {
  enum Kind {
    none,        // guards only
    close,       // rel L2 <= tol (expect_close)
    increments,  // rel L2 of (value - initial value) <= tol (accumulated outputs)
    exact,       // the same bytes
    lowp,        // the element match of 16-bit outputs (expect_lowp_match)
    unchanged,   // the same bytes as it was given (an input the op must not write)
    abs_diff,    // max |other - cpu| <= tol (counts)
  };
  Kind kind = none;
  double tol = 0;
};
inline Check close_to(double tol) { return {Check::close, tol}; }
inline Check increments_to(double tol) { return {Check::increments, tol}; }
inline Check bits() { return {Check::exact, 0}; }
inline Check lowp_match() { return {Check::lowp, 0}; }
inline Check unchanged() { return {Check::unchanged, 0}; }
inline Check within(double tol) { return {Check::abs_diff, tol}; }

// The 16-bit output `got` against the emulation's `want`: every element written and finite,
// per-element ulps, the fraction of exact matches (the tolerance above kFp32Tol).
void expect_lowp_match(const std::string& what, DType t, const std::vector<uint16_t>& got,
                       const std::vector<uint16_t>& want);

// ---- one run of one case on one backend ---------------------------------------------------
class OpRun {
 public:
  OpRun(Backend& backend, const Memory& memory, uint64_t seed);
  Backend& backend() const { return *be_; }
  // The case's generator: the same sequence on every backend.
  std::mt19937_64& rng() { return rng_; }
  // A CPU backend on host memory, for inputs made by another op (a forward's saved tensors for
  // a backward): the same values whichever backend the case runs on.
  static Backend& host();

  // An input: `values` rounded to t when t is 16-bit (int inputs: the second form). Checked as
  // `check` says (e.g. unchanged) after the op.
  Tensor in(const std::string& name, DType t, std::vector<int64_t> dims,
            const std::vector<float>& values, Check check = {});
  Tensor in(const std::string& name, std::vector<int64_t> dims, const std::vector<int32_t>& values,
            Check check = {});
  Tensor in(const std::string& name, std::vector<int64_t> dims, const std::vector<int64_t>& values,
            Check check = {});
  // Bits of a 16-bit or fp32 tensor as they are (a host emulation's output given to the next op).
  Tensor in_bits(const std::string& name, DType t, std::vector<int64_t> dims, const void* bits,
                 Check check = {});
  // A written output: starts as the NaN pattern, every element must be written and finite.
  Tensor out(const std::string& name, DType t, std::vector<int64_t> dims, Check check);
  // A written output that may hold NaN or infinity (conversions): every element must differ
  // from the pre-fill pattern.
  Tensor out_any(const std::string& name, DType t, std::vector<int64_t> dims, Check check);
  // A buffer the op accumulates into (or may leave alone), starting from `init` (rounded to t).
  Tensor acc(const std::string& name, DType t, std::vector<int64_t> dims,
             const std::vector<float>& init, Check check);
  Tensor acc(const std::string& name, std::vector<int64_t> dims, const std::vector<int32_t>& init,
             Check check);
  // The layout's arrays on this backend; host_layout(i) is the i-th given.
  SeqLayout layout(const HostLayout& l);
  const HostLayout& host_layout(size_t i) const { return host_layouts_.at(i); }

  // The case's dropout (drawn from rng()), kept for its reference.
  void set_dropout(const Dropout& d) { dropout_ = d; }
  const Dropout& dropout() const { return dropout_; }

  bool has(const std::string& name) const { return index_.count(name) > 0; }
  const GuardedBytes& buf(const std::string& name) const;
  std::vector<double> doubles(const std::string& name) const { return buf(name).doubles(); }
  // The values a buffer was given (inputs, accumulated outputs), widened.
  std::vector<double> initial(const std::string& name) const;

  struct Entry {
    std::string name;
    std::unique_ptr<GuardedBytes> buf;
    Check check;
    bool written = false;          // an output every element of which must be written
    bool finite = true;            // ... and be finite
    std::vector<uint8_t> initial;  // the bytes it was given (inputs, accumulated outputs)
  };
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  Tensor add(const std::string& name, DType t, std::vector<int64_t> dims, const void* init,
             Check check, bool written, bool finite = true);

  Backend* be_;
  const Memory* mem_;
  std::mt19937_64 rng_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t> index_;
  std::vector<std::unique_ptr<LayoutOn>> layouts_;
  std::vector<HostLayout> host_layouts_;
  Dropout dropout_;
};

// ---- cases --------------------------------------------------------------------------------
struct OpCase {
  std::string name;          // printed in measures and traces; never drawn from the seed
  DType dtype = DType::f32;  // f32: the fp32 runs; bf16 / f16: the low-precision mode
  std::function<void(OpRun&)> run;
  // Comparisons beyond each buffer's check (derived bounds, parts of a buffer), `got` against
  // `want` (the CPU backend's run).
  std::function<void(const std::string& what, const OpRun& want, const OpRun& got)> compare;
  // The reference runner's check of the CPU backend's run against double loops and finite
  // differences; cases without one are left to the backend runner. Each tolerance is the one
  // its hand-written test had, with its derivation beside the case.
  std::function<void(const std::string& what, const OpRun& cpu)> reference;
};
using OpCases = std::vector<OpCase>;

// ---- what references share --------------------------------------------------------------
inline DropoutStream stream_of(const Dropout& d) {
  return make_dropout_stream(d.p, d.seed, d.step, d.layer, static_cast<uint32_t>(d.site));
}

inline std::vector<int32_t> ints_of(const std::vector<double>& v) {
  return std::vector<int32_t>(v.begin(), v.end());
}

// Increments of an accumulated output: its value less what it was given.
inline std::vector<double> increments(const OpRun& r, const std::string& name) {
  std::vector<double> a = r.doubles(name);
  const std::vector<double> i = r.initial(name);
  for (size_t j = 0; j < a.size() && j < i.size(); ++j) a[j] -= i[j];
  return a;
}

// A host tensor of dtype t made from float values (rounded when 16-bit), for inputs prepared
// by the host CPU backend.
struct HostT {
  DType t;
  std::vector<int64_t> dims;
  std::vector<uint8_t> b;
  HostT(DType type, std::vector<int64_t> d, const std::vector<float>& v)
      : t(type), dims(std::move(d)) {
    if (is_lowp(t)) {
      const std::vector<uint16_t> r = round16(t, v);
      b.resize(r.size() * 2);
      if (!r.empty()) std::memcpy(b.data(), r.data(), b.size());
    } else {
      b.resize(v.size() * 4);
      if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    }
  }
  HostT(DType type, std::vector<int64_t> d) : t(type), dims(std::move(d)) {
    int64_t n = 1;
    for (int64_t x : dims) n *= x;
    b.assign(static_cast<size_t>(n) * dtype_size(t), 0);
  }
  Tensor tensor() {
    Tensor v(b.data(), t, {}, Device::cpu);
    v.ndim = static_cast<int>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) v.shape[i] = dims[i];
    return v;
  }
  std::vector<float> floats() const {
    std::vector<float> f(b.size() / dtype_size(t));
    for (size_t i = 0; i < f.size(); ++i) {
      if (is_lowp(t)) {
        uint16_t h;
        std::memcpy(&h, &b[2 * i], 2);
        f[i] = widen16(t, h);
      } else {
        std::memcpy(&f[i], &b[4 * i], 4);
      }
    }
    return f;
  }
};

// ---- the registry -----------------------------------------------------------------------
// Every op's cases, one entry per op, listed in op_tables() at the end of op_cases.cpp: adding an
// op is its cases function and its line there, nothing else. The runners register one test per
// entry and mode that has cases: OpsReference.<op> (cases with a reference),
// BackendOps.<op> (fp32 cases) and BackendOpsLowp.<op> (bf16 / f16 cases). `emulated`: the
// emulated CUDA build, where the cases that would take minutes use shorter sequences
// (cuda_test_util.h, kEmulated); the table is the same otherwise.
struct OpTable {
  std::string op;
  std::function<OpCases(bool emulated)> cases;
};
const std::vector<OpTable>& op_tables();

// The attention cases of the bf16 / f16 kernels (op_cases.cpp): forward and backward of sequences
// `lens` in a layout (0 unpadded, 1 padded to max_len, 2 packed into rows of max_len) with a
// window (kernels/ops/attention.h; 0 global) on each backend against the CPU backend's fp32
// attention on the same inputs widened, within the tolerances derived there.
void add_attention_lowp(OpCases& cases, DType t, const std::string& name, std::vector<int32_t> lens,
                        int layout, int32_t max_len, int heads, float p, int64_t window = 0);
// The local-window attention cases (op_cases_window.cpp), listed in op_tables().
OpCases attention_window_cases(bool emulated);

// The FP8 ops' cases (op_cases_fp8.cpp), listed in op_tables().
OpCases fp8_op_cases_cast();
OpCases fp8_op_cases_gemm();
OpCases fp8_op_cases_scaling();
// The norm options' cases (op_cases_norm_options.cpp), listed in op_tables().
OpCases norm_option_cases_residual();
OpCases norm_option_cases_embedding();
// The cases of the ops of ModernBERT-class encoders (op_cases_arch.cpp: rotary position
// embeddings, gated MLP activations), listed in op_tables().
OpCases arch_op_cases_rotary();
OpCases arch_op_cases_glu_forward();
OpCases arch_op_cases_glu_backward();
// The f32 values of a buffer's bytes (OpRun::buf(...).bytes()).
std::vector<float> floats_of(const std::vector<uint8_t>& bytes);
// The name of an epilogue in case names ("none", "bias", "bias_gelu", "bias_gelu_tanh").
std::string ep_name(Epilogue e);

// Registers `suite`.<op> for every table with a case that `wanted` takes, before RUN_ALL_TESTS;
// the test calls body(op's cases). Call it from a namespace-scope initialiser.
bool register_op_tests(const char* suite, bool emulated,
                       const std::function<bool(const OpCase&)>& wanted,
                       const std::function<void(const OpCases&)>& body);

// PACKBERT_OP_CASES=TEXT runs only the cases whose name contains TEXT (a planted mistake's test
// aims at the cases that cover it; a run that selects none fails, as any run of no case does).
// The backend runner: every case of the mode (f32, or the 16-bit ones) on `want` (the CPU
// backend) and on `got`, then each buffer's check and the case's compare. Returns the number of
// cases run (a test expects it positive: a test that runs nothing cannot fail).
int run_against(const OpCases& cases, bool lowp_mode, Backend& want, const Memory& want_mem,
                Backend& got, const Memory& got_mem);
// The reference runner: every case with a reference, on the CPU backend. Returns the count.
int run_reference(const OpCases& cases);

}  // namespace packbert::test
