// FP8 on the CUDA backend (kernels/ops/fp8.h): the cast kernel (fp8_kernels.cu), and the FP8 GEMM
// through cuBLASLt. cuBLASLt's FP8 GEMMs (Ada and Hopper: compute capability 8.9 and 9.x) take
// one layout, "TN": in column-major terms A transposed and B not, i.e. both operands K-major --
// what fp8_gemm's row-major a [n, k] and b [m, k] are:
//   out^T (m x n) = op_T(A = b, stored k x m) * (B = a, stored k x n)
// with A_SCALE_POINTER = b_scale + 1 and B_SCALE_POINTER = a_scale + 1, the inverses.
// Epilogues: for an FP8 GEMM with a bf16 / f16 output cuBLASLt wants a bias of that 16-bit type
// (cublasLtMatmul's FP8 table), while the contract's bias is fp32 and is added in fp32; so a
// GEMM with an epilogue writes fp32 scratch and fp8_epilogue adds the bias (and the GELU) and
// rounds once, as the CPU does. Without one, cuBLASLt writes out directly (accumulating into
// fp32 with beta = 1 for the weight gradients).
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/fp8.h"

namespace packbert {

namespace {

cudaDataType_t fp8_type(DType t) { return t == DType::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

cudaDataType_t out_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace

std::string CudaBackend::fp8_unsupported() const {
  if (compute_capability_ >= 89) return {};
  return fmt::format(
      "cuda:{} ({}) is compute capability {}.{}; FP8 GEMMs need 8.9 or newer "
      "(Ada, Hopper)",
      device_, device_name_, compute_capability_ / 10, compute_capability_ % 10);
}

void CudaBackend::fp8_cast(const Tensor& src, const Tensor& rows, const Tensor& scale,
                           const Tensor& amax, const Tensor& out, const Tensor& out_t) {
  const trace::Range range("fp8_cast");
  const char* op = "fp8_cast";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, c, n_out, n_t] = checks::fp8_cast_args(args, src, rows, scale, amax, out, out_t);
  begin(op);
  const bool cast = out.defined() || out_t.defined();
  const bool e4m3 = cast && (out.defined() ? out : out_t).dtype == DType::e4m3;
  launched(op, "fp8_cast",
           cuda::fp8_cast(src.data, float_format(op, "src", src),
                          rows.defined() ? rows.ptr<int32_t>() : nullptr,
                          scale.defined() ? scale.ptr<float>() : nullptr,
                          amax.defined() ? amax.ptr<float>() : nullptr,
                          static_cast<uint8_t*>(out.data), static_cast<uint8_t*>(out_t.data), n, c,
                          out.defined() ? n_out : 0, out_t.defined() ? n_t : 0, e4m3, stream_));
  end(op);
}

void CudaBackend::fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b,
                           const Tensor& b_scale, const Tensor& out, const Fp8GemmOptions& o) {
  const trace::Range range("fp8_gemm");
  const char* op = "fp8_gemm";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::fp8_gemm_args(args, a, a_scale, b, b_scale, out, o);
  const std::string unsupported = fp8_unsupported();
  PB_REQUIRE(unsupported.empty(), "{}: {}", op, unsupported);
  if (n == 0 || m == 0) return;
  begin(op);
  // Straight into out (accumulating with beta = 1) unless an epilogue needs the fp32 product.
  const bool direct = o.epilogue == Epilogue::none && !o.dgelu_pre.defined();
  void* d = direct ? out.data : scratch_floats(op, static_cast<size_t>(n * m));
  GemmCall g = gemm_call(true, false, m, n, k, b.data, k, a.data, k, d, m, fp8_type(b.dtype),
                         direct ? out_type(out.dtype) : CUDA_R_32F);
  g.b_type = static_cast<int32_t>(fp8_type(a.dtype));
  g.a_scale = b_scale.ptr<float>() + 1;
  g.b_scale = a_scale.ptr<float>() + 1;
  g.fast_accum = o.fast_accum;
  g.beta = o.accumulate ? 1.f : 0.f;
  gemm(op, g);  // DEFAULT epilogue: throws naming the status when cuBLASLt refuses
  if (!direct) {
    const bool tanh_form =
        o.dgelu_pre.defined() ? o.gelu == Gelu::tanh : gelu_of(o.epilogue) == Gelu::tanh;
    const int mode = o.dgelu_pre.defined()  ? (tanh_form ? 4 : 3)
                     : has_gelu(o.epilogue) ? (tanh_form ? 2 : 1)
                                            : 0;
    const Tensor& pre = o.dgelu_pre.defined() ? o.dgelu_pre : o.pre;
    launched(op, "fp8_epilogue",
             cuda::fp8_epilogue(static_cast<const float*>(d),
                                o.bias.defined() ? o.bias.ptr<float>() : nullptr, out.data,
                                pre.defined() ? pre.data : nullptr, float_format(op, "out", out), n,
                                m, mode, stream_));
  }
  end(op);
}

void CudaBackend::fp8_amax_share(const Tensor& amax, int rank, const Tensor& shared) {
  const char* op = "fp8_amax_share";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto dims = checks::fp8_amax_share_args(args, amax, rank, shared);
  begin(op);
  launched(op, "fp8_amax_share",
           cuda::fp8_amax_share(amax.ptr<float>(), rank, shared.ptr<double>(), dims.n, dims.ranks,
                                stream_));
  end(op);
}

void CudaBackend::fp8_scale_update(const Tensor& shared, const Tensor& fp8_max, int margin,
                                   const Tensor& history, const Tensor& scales,
                                   const Tensor& amax) {
  const char* op = "fp8_scale_update";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto dims =
      checks::fp8_scale_update_args(args, shared, fp8_max, margin, history, scales, amax);
  begin(op);
  launched(op, "fp8_scale_update",
           cuda::fp8_scale_update(shared.ptr<double>(), fp8_max.ptr<float>(), margin,
                                  history.ptr<float>(), scales.ptr<float>(), amax.ptr<float>(),
                                  dims.n, dims.ranks, dims.h, stream_));
  end(op);
}

}  // namespace packbert
