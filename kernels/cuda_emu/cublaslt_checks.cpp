// The emulated cuBLASLt's checks (cublaslt_checks.h): the types, shapes, epilogues and FP8
// rules a matmul must keep, as cublaslt.cpp's header lists them, and the device memory each of
// its buffers must lie in.
#include "kernels/cuda_emu/cublaslt_checks.h"

#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/cuda_emu/cublaslt_matmul.h"
#include "kernels/cuda_emu/runtime.h"

namespace packbert::emu::cublaslt {
namespace {

const char* type_name(int t) {
  switch (t) {
    case CUDA_R_32F: return "fp32";
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_16F: return "f16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    default: return "an unsupported type";
  }
}

bool is_float_type(int t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }

bool is_implemented(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || has_bias_input(e) || e == CUBLASLT_EPILOGUE_DGELU ||
         e == CUBLASLT_EPILOGUE_BGRADB;
}

// Elements a column-major rows x cols matrix with leading dimension ld spans; false on overflow.
bool extent(uint64_t rows, uint64_t cols, uint64_t ld, uint64_t* elements) {
  if (rows == 0 || cols == 0) {
    *elements = 0;
    return true;
  }
  uint64_t e;
  if (__builtin_mul_overflow(ld, cols - 1, &e) || __builtin_add_overflow(e, rows, &e)) return false;
  *elements = e;
  return true;
}

std::string layout_text(const cublasLtMatrixLayoutOpaque_st& l) {
  return std::to_string(l.rows) + " x " + std::to_string(l.cols) + " " + type_name(l.type) +
         ", ld " + std::to_string(l.ld);
}

// The FP8 rules, as the cuBLAS documentation states them (cublasLtMatmul, "FP8" requirements
// and its table of FP8 type combinations; cublasLtMatmulDescAttributes_t; Tensor Core Usage).
// Each refusal is what the real library returns for it.
cublasStatus_t check_fp8(const cublasLtMatmulDescOpaque_st* op, const Problem& p,
                         std::string* why) {
  const int cc = emu::compute_capability();
  // FP8 tensor cores exist from compute capability 8.9 (Ada) and 9.0 (Hopper) on
  // (cublasLtMatmul: the FP8 kernels' requirements).
  if (cc < 89) {
    *why = "FP8 types need compute capability 8.9 or newer; the device is " +
           std::to_string(cc / 10) + "." + std::to_string(cc % 10);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // The FP8 table lists A and B both FP8, never one FP8 with a 16- or 32-bit other.
  if (!is_fp8_type(p.a.type) || !is_fp8_type(p.b.type)) {
    *why = std::string("A ") + type_name(p.a.type) + " with B " + type_name(p.b.type) +
           " (FP8 takes both operands in FP8)";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // The table has E4M3 x E4M3, E4M3 x E5M2 and E5M2 x E4M3; no E5M2 x E5M2.
  if (p.a.type == CUDA_R_8F_E5M2 && p.b.type == CUDA_R_8F_E5M2) {
    *why = "A and B both e5m2 (no FP8 kernel takes E5M2 x E5M2)";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // "A must be transposed and B non-transposed (The TN format)" on Ada and Hopper (later
  // architectures lift it).
  if (cc < 100 && !(p.transa && !p.transb)) {
    *why = std::string("FP8 with transa ") + (p.transa ? "T" : "N") + ", transb " +
           (p.transb ? "T" : "N") + " (compute capability below 10.0 takes only TN)";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // C and D: D fp32, bf16 or f16 with C of D's type, or D FP8 with C bf16 / f16 (the table).
  const int d = p.d.type, c = p.c.type;
  const bool d_fp8 = is_fp8_type(d);
  if (!(d_fp8 ? (c == CUDA_R_16BF || c == CUDA_R_16F)
              : ((d == CUDA_R_32F || d == CUDA_R_16BF || d == CUDA_R_16F) && c == d))) {
    *why = std::string("FP8 with C ") + type_name(c) + " and D " + type_name(d);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // The bias of an FP8 GEMM (BIAS_DATA_TYPE's exceptions): D bf16 -> bf16, D f16 -> f16,
  // D fp32 -> bf16, D FP8 -> bf16 or f16. Never fp32.
  if (has_bias_input(p.epilogue)) {
    const int b = p.bias_type;
    const bool ok = d == CUDA_R_16BF || d == CUDA_R_32F ? b == CUDA_R_16BF
                    : d == CUDA_R_16F                   ? b == CUDA_R_16F
                                                        : (b == CUDA_R_16BF || b == CUDA_R_16F);
    if (!ok) {
      *why = std::string("FP8 with bias ") + type_name(b) + " and D " + type_name(d);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  // The epilogues emulated for FP8: DEFAULT, BIAS, and GELU_AUX_BIAS with a 16-bit or fp32 D
  // (an FP8 D's aux type is an attribute the emulation does not model).
  if (!(p.epilogue == CUBLASLT_EPILOGUE_DEFAULT || p.epilogue == CUBLASLT_EPILOGUE_BIAS ||
        (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && !d_fp8))) {
    *why = "epilogue " + std::to_string(p.epilogue) + " with FP8 (not emulated)";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // FP8 runs on tensor cores only, so their requirements are hard ones (Tensor Core Usage):
  // leading dimensions of 16-byte multiples.
  const char* names[4] = {"A", "B", "C", "D"};
  const cublasLtMatrixLayoutOpaque_st* layouts[4] = {&p.a, &p.b, &p.c, &p.d};
  for (int i = 0; i < 4; ++i)
    if ((static_cast<uint64_t>(layouts[i]->ld) * type_bytes(layouts[i]->type)) % 16 != 0) {
      *why = std::string("FP8 with matrix ") + names[i] + "'s ld " +
             std::to_string(layouts[i]->ld) + " not a multiple of 16 bytes";
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  // D's scale and amax belong to an FP8 D (the emulation's reading of "an unsupported matrix
  // data, scale, and compute type combination": INVALID_VALUE).
  if (!d_fp8 && (op->d_scale || op->amax_d)) {
    *why = std::string(op->d_scale ? "D_SCALE_POINTER" : "AMAX_D_POINTER") + " with D " +
           type_name(d) + " (only an FP8 D is scaled and has an amax)";
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

bool has_aux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

cublasStatus_t check_problem(const cublasLtMatmulDescOpaque_st* op,
                             const cublasLtMatrixLayoutOpaque_st* a,
                             const cublasLtMatrixLayoutOpaque_st* b,
                             const cublasLtMatrixLayoutOpaque_st* c,
                             const cublasLtMatrixLayoutOpaque_st* d, Problem* p, std::string* why) {
  if (!op || !a || !b || !c || !d) {
    *why = "a null descriptor";
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (int32_t t : {op->transa, op->transb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C) {
      *why = "transpose attribute " + std::to_string(t) + " is no cublasOperation_t";
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  p->transa = op->transa != CUBLAS_OP_N;  // conjugate-transpose is the transpose for real data
  p->transb = op->transb != CUBLAS_OP_N;
  p->a = *a;
  p->b = *b;
  p->c = *c;
  p->d = *d;
  p->m = p->transa ? a->cols : a->rows;
  p->k = p->transa ? a->rows : a->cols;
  const uint64_t kb = p->transb ? b->cols : b->rows;
  p->n = p->transb ? b->rows : b->cols;
  p->epilogue = op->epilogue;
  p->aux_ld = op->aux_ld;
  if (kb != p->k || c->rows != p->m || c->cols != p->n || d->rows != p->m || d->cols != p->n) {
    *why = "inconsistent shapes: op(A) " + std::to_string(p->m) + " x " + std::to_string(p->k) +
           ", op(B) " + std::to_string(kb) + " x " + std::to_string(p->n) + ", C " +
           layout_text(*c) + ", D " + layout_text(*d);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const char* names[4] = {"A", "B", "C", "D"};
  const cublasLtMatrixLayoutOpaque_st* layouts[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i) {
    const auto& l = *layouts[i];
    if (l.ld < 1 || static_cast<uint64_t>(l.ld) < l.rows) {
      *why = std::string("matrix ") + names[i] + " (" + layout_text(l) + "): ld below its rows";
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (has_aux(p->epilogue) && (p->aux_ld < 1 || static_cast<uint64_t>(p->aux_ld) < p->m)) {
    *why = "EPILOGUE_AUX_LD " + std::to_string(p->aux_ld) + " below D's " + std::to_string(p->m) +
           " rows";
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  p->bias_type = op->bias_type == -1 ? static_cast<int32_t>(d->type) : op->bias_type;

  if (op->compute != CUBLAS_COMPUTE_32F || op->scale != CUDA_R_32F) {
    *why = "compute type " + std::to_string(op->compute) + " / scale type " +
           std::to_string(op->scale) + " (only CUBLAS_COMPUTE_32F with fp32 scale)";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  p->a_scale = op->a_scale;
  p->b_scale = op->b_scale;
  p->d_scale = op->d_scale;
  p->amax_d = op->amax_d;
  p->fast_accum = op->fast_accum != 0;
  if (is_fp8_type(a->type) || is_fp8_type(b->type) || is_fp8_type(c->type) ||
      is_fp8_type(d->type)) {
    // An FP8 GEMM's default bias type is bf16 where D is fp32 or FP8 (BIAS_DATA_TYPE).
    if (op->bias_type == -1 && (d->type == CUDA_R_32F || is_fp8_type(d->type)))
      p->bias_type = CUDA_R_16BF;
    const cublasStatus_t st = check_fp8(op, *p, why);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  } else {
    // The scaling attributes belong to FP8 (cublasLtMatmulDescAttributes_t: set for an
    // unsupported combination, the matmul returns INVALID_VALUE).
    if (op->a_scale || op->b_scale || op->d_scale || op->amax_d || op->fast_accum) {
      *why = std::string("FP8 scaling attributes with A ") + type_name(a->type) + ", D " +
             type_name(d->type);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!is_float_type(a->type) || b->type != a->type || c->type != d->type ||
        (d->type != a->type && d->type != CUDA_R_32F)) {
      *why = std::string("types A ") + type_name(a->type) + ", B " + type_name(b->type) + ", C " +
             type_name(c->type) + ", D " + type_name(d->type);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!is_implemented(p->epilogue)) {
      *why = "epilogue " + std::to_string(p->epilogue);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const bool uses_bias = has_bias_input(p->epilogue) || p->epilogue == CUBLASLT_EPILOGUE_BGRADB;
    if (uses_bias && p->bias_type != static_cast<int32_t>(d->type) && p->bias_type != CUDA_R_32F) {
      *why = std::string("bias type ") + type_name(p->bias_type) + " with D " + type_name(d->type);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  if (has_aux(p->epilogue) && p->aux_ld % 8 != 0) {
    *why = "EPILOGUE_AUX_LD " + std::to_string(p->aux_ld) + " is not a multiple of 8";
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

bool check_buffer(const char* name, const void* ptr, int type, uint64_t rows, uint64_t cols,
                  uint64_t ld) {
  uint64_t elements = 0;
  const bool sized = extent(rows, cols, ld, &elements);
  uint64_t bytes = 0;
  const bool fits = sized && !__builtin_mul_overflow(elements, type_bytes(type), &bytes);
  if (fits && bytes == 0) return true;  // nothing is accessed
  const std::string what = std::string("cublasLtMatmul: ") + name + " (" + std::to_string(rows) +
                           " x " + std::to_string(cols) + " " + type_name(type) + ", ld " +
                           std::to_string(ld) + ": " +
                           (fits ? std::to_string(bytes) + " bytes" : "an overflowing extent") +
                           " from " + (ptr ? "" : "null ");
  char at[32];
  std::snprintf(at, sizeof(at), "%p", ptr);
  if (!fits || !emu::device_range(ptr, static_cast<size_t>(bytes))) {
    emu::fault(what + at + ") does not lie inside one device allocation");
    return false;
  }
  if (reinterpret_cast<uintptr_t>(ptr) % type_bytes(type) != 0) {
    emu::fault(what + at + ") is misaligned for its element type");
    return false;
  }
  return true;
}

}  // namespace packbert::emu::cublaslt
