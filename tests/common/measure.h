// One line per randomized comparison, in the format scripts/seed_sweep.py reads:
//
//   [measure] NAME ERROR <= TOLERANCE
//   [measure] NAME ERROR <= BOUND (bound)
//
// NAME says what is compared (op, dtype, shape, tensor) and nothing drawn from the seed, so the
// same comparison has the same name in every run and the sweep can take its worst over seeds.
// ERROR and TOLERANCE are printed with 3 significant digits. Each tolerance is justified where
// it is set: an error bound derived in a comment, or a sweep of fresh seeds with its worst, its
// margin (tolerance / worst >= 3) and the command (docs/testing.md, "Tolerances"). A derived
// bound prints "(bound)": it holds for every input (a rounding bound, the one ulp a flipped
// rounding moves), or fails with a probability the comment gives (a statistical test's 5
// standard deviations), so the sweep's 3x margin rule does not apply to it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace packbert::test {

// Prints the measure only, for a caller that checks its parts itself (e.g. every tensor of a
// gradient against the bar, where the measure is the worst of them).
inline void print_measure(const std::string& name, double error, double tol) {
  std::printf("[measure] %s %.3e <= %.3e\n", name.c_str(), error, tol);
}

// Prints the measure and expects error <= tol (a NaN error never passes). Returns whether it
// passed, for callers that stop at the first failure.
inline bool expect_measure(const std::string& name, double error, double tol) {
  print_measure(name, error, tol);
  EXPECT_LE(error, tol) << name;
  return error <= tol;
}

// A measure whose tolerance is a derived bound (see above): printed with "(bound)".
inline void print_bound(const std::string& name, double error, double bound) {
  std::printf("[measure] %s %.3e <= %.3e (bound)\n", name.c_str(), error, bound);
}

inline bool expect_bound(const std::string& name, double error, double bound) {
  print_bound(name, error, bound);
  EXPECT_LE(error, bound) << name;
  return error <= bound;
}

}  // namespace packbert::test
