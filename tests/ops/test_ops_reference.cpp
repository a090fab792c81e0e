// The reference runner of the op table (op_cases.h): the CPU backend against double loops and
// finite differences, for every case of the table that has a reference (the backend runner,
// tests/gpu/test_backend_ops.cpp, runs the same cases on the other backends). Tests that are no
// per-op case (layouts, threads, aliasing, several LAMB steps, the encoder layer) stay in the
// other test_ops_*.cpp files.
#include <gtest/gtest.h>

#include "op_cases.h"

namespace packbert::test {
namespace {

// OpsReference.<op> for every table with a case that has a reference (op_cases.h, the registry).
// For LambStep that is the pieces case only: the rest of the LAMB table is checked against apex's
// formulas by test_ops_lamb.cpp, and against the CPU by the backend runner.
const bool registered = register_op_tests(
    "OpsReference", false, [](const OpCase& c) { return static_cast<bool>(c.reference); },
    [](const OpCases& cases) { EXPECT_GT(run_reference(cases), 0) << "no case with a reference"; });

}  // namespace
}  // namespace packbert::test
