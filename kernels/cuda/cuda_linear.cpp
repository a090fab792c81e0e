// Linear layers on the CUDA backend: linear_forward and linear_backward with fp32 operands, and
// with bf16 / f16 ones ("linear layers in bf16 / f16" below), through the GEMMs of cuda_gemm.cpp
// (which says how the row-major buffers map to cuBLASLt's column-major and which epilogues run,
// and why); a kernel does what an epilogue cannot (bias, GELU, the bias gradient).
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ops/linear.h"

namespace packbert {

// ---- linear layers -------------------------------------------------------------------------
void CudaBackend::linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                 Epilogue epilogue, const Tensor& out, const Tensor& pre) {
  const trace::Range range("linear_forward");
  if (lowp::any({&x, &w, &bias, &out, &pre})) {
    if (linear_forward_lowp(x, w, bias, epilogue, out, pre)) return;
    return lowp::linear_forward(*this, lowp_, x, w, bias, epilogue, out, pre);
  }
  const char* op = "linear_forward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_forward_args(args, x, w, bias, epilogue, out, pre);
  PB_REQUIRE(!has_gelu(epilogue) || pre.data != out.data, "{}: pre may not alias out", op);
  if (n == 0 || m == 0) return;
  begin(op);
  // With GELU the GEMM writes the pre-activation buffer, which backward needs anyway.
  float* c = has_gelu(epilogue) ? pre.ptr<float>() : out.ptr<float>();
  const float* b = bias.defined() ? bias.ptr<float>() : nullptr;
  bool bias_done = false;
  if (k == 0) {
    PB_CUDA_OP(op, cuda::memset_async(c, 0, static_cast<size_t>(n * m) * sizeof(float), stream_));
  } else {
    GemmCall g = forward_gemm_call(x.data, w.data, c, n, k, m, CUDA_R_32F);
    if (epilogue == Epilogue::bias_gelu_tanh && b && gelu_aux_gemm(op, g, out.data, b)) {
      end(op);
      return;
    }
    if (b) {
      g.epilogue = CUBLASLT_EPILOGUE_BIAS;
      g.bias = const_cast<float*>(b);
      bias_done = gemm(op, g);
    }
    if (!bias_done) {
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      gemm(op, g);
    }
  }
  if (b && !bias_done) launched(op, "add_bias_rows", cuda::add_bias_rows(c, b, n, m, stream_));
  if (has_gelu(epilogue))
    launched(
        op, "gelu_forward",
        cuda::gelu_forward(c, out.ptr<float>(), n * m, gelu_of(epilogue) == Gelu::tanh, stream_));
  end(op);
}

void CudaBackend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dout,
                                  const Tensor& dx, const Tensor& dw, const Tensor& db,
                                  const LinearBackwardOptions& opt) {
  const trace::Range range("linear_backward");
  if (lowp::any({&x, &w, &dout, &dx, &dw, &db, &opt.out_gelu_pre, &opt.x_gelu_pre})) {
    if (linear_backward_lowp(x, w, dout, dx, dw, db, opt)) return;
    return lowp::linear_backward(*this, lowp_, x, w, dout, dx, dw, db, opt);
  }
  const char* op = "linear_backward";
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_backward_args(args, x, w, dout, dx, dw, db, opt);
  if (n == 0) return;
  begin(op);

  float* g = dout.ptr<float>();
  const bool tanh_form = opt.gelu == Gelu::tanh;
  if (opt.out_gelu_pre.defined())
    launched(
        op, "gelu_backward_inplace",
        cuda::gelu_backward_inplace(g, opt.out_gelu_pre.ptr<float>(), n * m, tanh_form, stream_));
  bool db_done = !db.defined() || m == 0;
  if (dw.defined() && m > 0 && k > 0)
    db_done = weight_grad_gemm(op, x.data, g, dw.ptr<float>(), db_done ? nullptr : db.ptr<float>(),
                               n, k, m, CUDA_R_32F) ||
              db_done;
  if (!db_done) {
    double* partial = scratch_doubles(op, static_cast<size_t>(cuda::column_sum_partials(n, m)));
    launched(op, "add_column_sums",
             cuda::add_column_sums(g, n, m, m, partial, db.ptr<float>(), stream_));
  }
  if (dx.defined() && k > 0) {
    float* d = dx.ptr<float>();
    if (m == 0) {
      if (!opt.dx_accumulate)
        PB_CUDA_OP(op,
                   cuda::memset_async(d, 0, static_cast<size_t>(n * k) * sizeof(float), stream_));
    } else {
      const bool fused = input_grad_gemm(op, w.data, g, d, n, k, m, opt.dx_accumulate, CUDA_R_32F,
                                         CUDA_R_32F, tanh_form ? opt.x_gelu_pre.data : nullptr);
      if (opt.x_gelu_pre.defined() && !fused)
        launched(
            op, "gelu_backward_inplace",
            cuda::gelu_backward_inplace(d, opt.x_gelu_pre.ptr<float>(), n * k, tanh_form, stream_));
    }
  }
  end(op);
}

// ---- linear layers in bf16 / f16 -------------------------------------------------------------
// x, w (and dout) of one low-precision type T, fp32 compute; activations written in T, weight
// and bias gradients in fp32 (C/D fp32 with T operands), the bias read in fp32. The epilogues
// are the fp32 path's: BIAS (bias type fp32) and BGRADB (fp32 bias gradient) when cuBLASLt
// offers them for these types, else the GEMM writes fp32 scratch and the fp32 kernels finish.
// GELU runs on the rounded pre-activation (the CPU emulation takes it of the fp32 value before
// rounding: the two differ by a rounding of the argument, inside the precision's tolerance).

bool CudaBackend::linear_forward_lowp(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      Epilogue epilogue, const Tensor& out, const Tensor& pre) {
  const char* op = "linear_forward";
  const DType t = x.dtype;
  if (!lowp::is_lowp(t) || w.dtype != t || out.dtype != t || (pre.defined() && pre.dtype != t) ||
      (bias.defined() && bias.dtype != DType::f32))
    return false;
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_forward_args(args, shape_of(x), shape_of(w), bias, epilogue,
                                                     shape_of(out), shape_of(pre));
  PB_REQUIRE(!has_gelu(epilogue) || pre.data != out.data, "{}: pre may not alias out", op);
  if (n == 0 || m == 0) return true;
  begin(op);
  const cuda::FloatFormat f = float_format(op, "out", out);
  void* c = has_gelu(epilogue) ? pre.data : out.data;
  const float* b = bias.defined() ? bias.ptr<float>() : nullptr;
  if (k == 0) {
    PB_CUDA_OP(op, cuda::memset_async(c, 0, static_cast<size_t>(n * m) * dtype_size(t), stream_));
    if (b) {  // bias only: through fp32 scratch
      float* tmp = scratch_floats(op, static_cast<size_t>(n * m));
      PB_CUDA_OP(op,
                 cuda::memset_async(tmp, 0, static_cast<size_t>(n * m) * sizeof(float), stream_));
      launched(op, "add_bias_rows", cuda::add_bias_rows(tmp, b, n, m, stream_));
      launched(op, "convert", cuda::convert(tmp, cuda::FloatFormat::f32, c, f, n * m, stream_));
    }
  } else {
    GemmCall g = forward_gemm_call(x.data, w.data, c, n, k, m, cuda_type(t));
    if (epilogue == Epilogue::bias_gelu_tanh && b && gelu_aux_gemm(op, g, out.data, b)) {
      end(op);
      return true;
    }
    bool done = false;
    if (b) {
      g.epilogue = CUBLASLT_EPILOGUE_BIAS;
      g.bias = const_cast<float*>(b);
      done = gemm(op, g);
    }
    if (!done && !b) {
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      gemm(op, g);
    } else if (!done) {  // no BIAS epilogue for these types: fp32 scratch, bias, round
      float* tmp = scratch_floats(op, static_cast<size_t>(n * m));
      g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
      g.bias = nullptr;
      g.c = tmp;
      g.c_type = CUDA_R_32F;
      gemm(op, g);
      launched(op, "add_bias_rows", cuda::add_bias_rows(tmp, b, n, m, stream_));
      launched(op, "convert", cuda::convert(tmp, cuda::FloatFormat::f32, c, f, n * m, stream_));
    }
  }
  if (has_gelu(epilogue))
    launched(
        op, "gelu_forward_lowp",
        cuda::gelu_forward_lowp(c, out.data, f, n * m, gelu_of(epilogue) == Gelu::tanh, stream_));
  end(op);
  return true;
}

bool CudaBackend::linear_backward_lowp(const Tensor& x, const Tensor& w, const Tensor& dout,
                                       const Tensor& dx, const Tensor& dw, const Tensor& db,
                                       const LinearBackwardOptions& opt) {
  const char* op = "linear_backward";
  const DType t = dout.dtype;
  auto is_t = [t](const Tensor& v) { return !v.defined() || v.dtype == t; };
  auto is_f32 = [](const Tensor& v) { return !v.defined() || v.dtype == DType::f32; };
  if (!lowp::is_lowp(t) || w.dtype != t || !is_t(x) || !is_t(dx) || !is_t(opt.out_gelu_pre) ||
      !is_t(opt.x_gelu_pre) || !is_f32(dw) || !is_f32(db))
    return false;
  LinearBackwardOptions shapes = opt;
  shapes.out_gelu_pre = shape_of(opt.out_gelu_pre);
  shapes.x_gelu_pre = shape_of(opt.x_gelu_pre);
  const checks::OpArgs args(op, Device::cuda, pointer_check());
  const auto [n, k, m] = checks::linear_backward_args(args, shape_of(x), shape_of(w),
                                                      shape_of(dout), shape_of(dx), dw, db, shapes);
  if (n == 0) return true;
  begin(op);
  const cuda::FloatFormat f = float_format(op, "dout", dout);
  void* g = dout.data;
  const bool tanh_form = opt.gelu == Gelu::tanh;
  if (opt.out_gelu_pre.defined())
    launched(
        op, "gelu_backward_inplace_lowp",
        cuda::gelu_backward_inplace_lowp(g, opt.out_gelu_pre.data, f, n * m, tanh_form, stream_));
  bool db_done = !db.defined() || m == 0;
  if (dw.defined() && m > 0 && k > 0)  // weight gradients accumulate in fp32
    db_done = weight_grad_gemm(op, x.data, g, dw.ptr<float>(), db_done ? nullptr : db.ptr<float>(),
                               n, k, m, cuda_type(t)) ||
              db_done;
  if (!db_done) {  // column sums of the widened dout, in fixed order as the fp32 path
    float* gf = scratch_floats(op, static_cast<size_t>(n * m));
    launched(op, "convert", cuda::convert(g, f, gf, cuda::FloatFormat::f32, n * m, stream_));
    double* partial = scratch_doubles(op, static_cast<size_t>(cuda::column_sum_partials(n, m)));
    launched(op, "add_column_sums",
             cuda::add_column_sums(gf, n, m, m, partial, db.ptr<float>(), stream_));
  }
  if (dx.defined() && k > 0) {
    if (m == 0) {
      if (!opt.dx_accumulate)
        PB_CUDA_OP(op, cuda::memset_async(dx.data, 0, static_cast<size_t>(n * k) * dtype_size(t),
                                          stream_));
    } else {  // dx += in fp32, rounded once
      const bool fused =
          input_grad_gemm(op, w.data, g, dx.data, n, k, m, opt.dx_accumulate, cuda_type(t),
                          cuda_type(t), tanh_form ? opt.x_gelu_pre.data : nullptr);
      if (opt.x_gelu_pre.defined() && !fused)
        launched(op, "gelu_backward_inplace_lowp",
                 cuda::gelu_backward_inplace_lowp(dx.data, opt.x_gelu_pre.data, f, n * k, tanh_form,
                                                  stream_));
    }
  }
  end(op);
  return true;
}

}  // namespace packbert
