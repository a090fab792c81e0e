// The reference runner of the op table (op_cases.h): the CPU backend against double loops and
// finite differences, for every case of the table that has a reference (the backend runner,
// tests/gpu/test_backend_ops.cpp, runs the same cases on the other backends). Tests that are no
// per-op case (layouts, threads, aliasing, several LAMB steps, the encoder layer) stay in the
// other test_ops_*.cpp files.
#include <gtest/gtest.h>

#include "op_cases.h"

namespace packbert::test {
namespace {

#define REFERENCE_TEST(op, cases) \
  TEST(OpsReference, op) { EXPECT_GT(run_reference(cases), 0) << "no case with a reference"; }

REFERENCE_TEST(LinearForward, linear_forward_cases())
REFERENCE_TEST(LinearBackward, linear_backward_cases())
REFERENCE_TEST(Embedding, embedding_cases())
REFERENCE_TEST(ResidualLayerNorm, residual_layernorm_cases())
REFERENCE_TEST(Attention, attention_cases(false))
REFERENCE_TEST(GatherRows, gather_rows_cases())
REFERENCE_TEST(SoftmaxCrossEntropy, softmax_cross_entropy_cases())
REFERENCE_TEST(MlmLoss, mlm_loss_cases())
REFERENCE_TEST(NspLoss, nsp_loss_cases())
REFERENCE_TEST(L2Norm, l2_norm_cases())
// The pieces case only: the rest of the LAMB table is checked against apex's formulas by
// test_ops_lamb.cpp, and against the CPU by the backend runner.
REFERENCE_TEST(LambPieces, lamb_step_cases())

}  // namespace
}  // namespace packbert::test
