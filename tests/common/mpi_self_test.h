// A gtest test that runs its body under mpirun: the test, run by ctest, starts PACKBERT_MPIEXEC
// -np N on its own binary filtered to itself, with `child_var`=1 in the ranks' environment (they
// find it and run the body), the parent's PACKBERT_TEST_SEED (every rank draws the same inputs)
// and one OpenMP / OpenBLAS thread. `extra` adds mpirun arguments (" -x NAME" passes a
// variable on). Needs the definitions packbert_test_executable gives (tests/CMakeLists.txt).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "test_util.h"

namespace packbert::test {

// Runs the current test in np ranks; expects mpirun to exit 0 and each rank to pass the one
// test, none skipped. Returns the ranks' output (printed too).
inline std::string run_test_in_ranks(int np, const char* child_var, const std::string& extra = "") {
  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string out;
  const int rc = run_command(
      std::string(PACKBERT_MPIEXEC) +
          " --allow-run-as-root --oversubscribe --mca btl self,vader -np " + std::to_string(np) +
          " -x " + child_var + "=1 -x PACKBERT_TEST_SEED=" + std::to_string(test_seed()) +
          " -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1" + extra + " " + self +
          " --gtest_color=no --gtest_filter=" + info->test_suite_name() + "." + info->name(),
      &out);
  std::cout << out;
  EXPECT_EQ(rc, 0) << "the ranks failed (output above)";
  size_t passed = 0;
  for (size_t at = out.find("[  PASSED  ] 1 test."); at != std::string::npos;
       at = out.find("[  PASSED  ] 1 test.", at + 1))
    ++passed;
  EXPECT_EQ(passed, static_cast<size_t>(np)) << "every rank passes the test";
  EXPECT_EQ(out.find("[  SKIPPED ]"), std::string::npos) << "a rank skipped the test";
  return out;
}

}  // namespace packbert::test
