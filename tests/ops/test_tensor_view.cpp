// kernels/base/tensor.h: views and the contract checks ops rely on (errors name op and argument).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/base/tensor.h"

#include "test_util.h"

namespace packbert {
namespace {

using test::error_of;

TEST(TensorView, ShapeBytesAndName) {
  std::vector<float> buf(24);
  const Tensor t = view(buf.data(), {2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.bytes(), 96u);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_EQ(t.str(), "f32[2, 3, 4] cpu");
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor().str(), "none");
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_THROW(view(buf.data(), {1, 2, 3, 4, 1}), Error);
  EXPECT_THROW(view(buf.data(), {-1}), Error);
  EXPECT_THROW(t.dim(3), Error);
  EXPECT_THROW(t.ptr<int32_t>(), Error);
}

TEST(TensorView, ChecksNameOpAndArgument) {
  std::vector<float> buf(12);
  std::vector<int32_t> ibuf(12);
  const Tensor t = view(buf.data(), {3, 4});
  EXPECT_NO_THROW(check_tensor("op", "x", t, DType::f32, {3, 4}));
  EXPECT_NO_THROW(check_tensor("op", "x", t, DType::f32, {kAnyDim, 4}));
  EXPECT_EQ(error_of([&] {
              check_tensor("my_op", "x", t, DType::f32, {4, 3});
            }),
            "my_op: x is f32[3, 4] cpu, expected f32[4, 3]");
  EXPECT_EQ(error_of([&] {
              check_tensor("my_op", "ids", t, DType::i32, {3, 4});
            }),
            "my_op: ids is f32[3, 4] cpu, expected i32[3, 4]");
  EXPECT_EQ(error_of([&] { check_tensor("my_op", "x", t, DType::f32, {12}); }),
            "my_op: x is f32[3, 4] cpu, expected f32[12]");
  EXPECT_EQ(error_of([&] { check_tensor("my_op", "x", Tensor(), DType::f32, {kAnyDim}); }),
            "my_op: x is missing, expected f32[*]");
  EXPECT_NO_THROW(check_optional("op", "b", Tensor(), DType::f32, {4}));
  EXPECT_THROW(check_optional("op", "b", view(ibuf.data(), {4}), DType::f32, {4}), Error);
  const Tensor on_gpu = view(buf.data(), {3, 4}, Device::cuda);
  EXPECT_EQ(error_of([&] { check_device("my_op", "x", on_gpu, Device::cpu); }),
            "my_op: x is on cuda, the backend runs on cpu");
}

// The backend reports a bad argument as packbert::Error naming the op.
TEST(TensorView, BackendRejectsMismatches) {
  auto be = make_cpu_backend();
  std::vector<float> x(6 * 4), w(5 * 4), out(6 * 5);
  const std::string e = error_of([&] {
    be->linear_forward(view(x.data(), {6, 4}), view(w.data(), {5, 3}), Tensor(), Epilogue::none,
                       view(out.data(), {6, 5}), Tensor());
  });
  EXPECT_NE(e.find("linear_forward: w"), std::string::npos) << e;
  const std::string e2 = error_of([&] {
    be->linear_forward(view(x.data(), {6, 4}), view(w.data(), {5, 4}), Tensor(), Epilogue::none,
                       view(out.data(), {5, 6}), Tensor());
  });
  EXPECT_NE(e2.find("linear_forward: out"), std::string::npos) << e2;
}

TEST(BackendMemory, ZeroAndCopy) {
  auto be = make_cpu_backend();
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b(6, -1);
  be->copy(view(b.data(), {2, 3}), view(a.data(), {6}));  // shapes may differ, counts may not
  EXPECT_EQ(a, b);
  be->zero(view(b.data(), {6}));
  EXPECT_EQ(b, std::vector<int32_t>(6, 0));
  std::vector<float> f(6);
  EXPECT_THROW(be->copy(view(f.data(), {6}), view(a.data(), {6})), Error);      // dtype
  EXPECT_THROW(be->copy(view(b.data(), {5}), view(a.data(), {6})), Error);      // count
  EXPECT_THROW(be->copy(view(a.data() + 1, {5}), view(a.data(), {5})), Error);  // overlap
  EXPECT_THROW(be->zero(view(f.data(), {6}, Device::cuda)), Error);             // device
}

// Backend::alloc counts what its live buffers hold, and a failed allocation is an Error that
// names the buffer, the bytes asked and the device's free and total memory.
TEST(BackendMemory, AllocatedBytesAndAnAllocationThatFails) {
  auto be = make_cpu_backend();
  const size_t before = be->allocated_bytes();
  {
    BackendBuffer a = be->alloc(DType::f32, {1000}, "test a");
    BackendBuffer b = be->alloc(777, "test b");
    EXPECT_EQ(be->allocated_bytes(), before + 4000 + 777);
    BackendBuffer moved = std::move(a);
    EXPECT_EQ(be->allocated_bytes(), before + 4000 + 777);
    b.reset();
    EXPECT_EQ(be->allocated_bytes(), before + 4000);
  }
  EXPECT_EQ(be->allocated_bytes(), before);
  const Backend::MemoryInfo m = be->memory_info();
  EXPECT_GT(m.total, 0u);
  EXPECT_LE(m.free, m.total);
  const size_t huge = size_t{1} << 60;
  const std::string e = error_of([&] { (void)be->alloc(huge, "a huge test buffer"); });
  EXPECT_NE(
      e.find("out of cpu memory: a huge test buffer asked " + std::to_string(huge) + " bytes"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("MiB free of"), std::string::npos) << e;
  EXPECT_EQ(be->allocated_bytes(), before);
}

}  // namespace
}  // namespace packbert
