// Ops built around LayerNorm: the embedding (gather + sum + LayerNorm + dropout) and the
// encoder's bias + dropout + residual add + LayerNorm, forward and backward.
//
// Backward passes alternate between row-parallel loops (per-token math) and column-parallel
// loops (parameter gradients: each thread owns a block of columns and walks the rows in order,
// so the sums are race-free and identical for any thread count).
#include <omp.h>

#include <algorithm>

#include "kernels/common/math.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_lowp.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/layernorm.h"

namespace packbert {

using cpu::expect;
using cpu::expect_optional;

namespace {

constexpr int64_t kColBlock = 64;

int64_t col_blocks(int64_t cols) { return (cols + kColBlock - 1) / kColBlock; }

// LayerNorm parameter gradients: dgamma += sum_r dy * xhat, dbeta += sum_r dy over the rows
// use_row(r) accepts, with xhat = (input(r, c) - mean[r]) * rstd[r]. Each column block sums its
// rows in order in double, so the result does not depend on the thread count.
template <typename Input, typename UseRow>
void add_layernorm_param_grads(int64_t rows, int64_t h, const float* dy, Input input,
                               const float* mean, const float* rstd, UseRow use_row, float* dgamma,
                               float* dbeta) {
  if (!dgamma && !dbeta) return;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < col_blocks(h); ++b) {
    const int64_t c0 = b * kColBlock, c1 = std::min(h, c0 + kColBlock);
    double sg[kColBlock] = {}, sb[kColBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      if (!use_row(r)) continue;
      const float* dr = dy + r * h;
      for (int64_t c = c0; c < c1; ++c) {
        const float xhat = (input(r, c) - mean[r]) * rstd[r];
        sg[c - c0] += dr[c] * xhat;
        sb[c - c0] += dr[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      if (dgamma) dgamma[c] += static_cast<float>(sg[c - c0]);
      if (dbeta) dbeta[c] += static_cast<float>(sb[c - c0]);
    }
  }
}

// The embedding sum of one row before LayerNorm, element c (one expression, so forward and the
// backward's recomputation agree to the bit). A table the model does not have adds 0, as the
// CUDA kernel's sum does.
struct EmbeddingRows {
  const float* word;
  const float* pos;
  const float* type;
  const int32_t* ids;
  const int32_t* segs;
  const int32_t* positions;
  int64_t hidden;
  float sum(int64_t r, int64_t c) const {
    const float p = pos ? pos[static_cast<int64_t>(positions[r]) * hidden + c] : 0.f;
    const float t = type ? type[static_cast<int64_t>(segs[r]) * hidden + c] : 0.f;
    return (word[ids[r] * hidden + c] + p) + t;
  }
};

EmbeddingRows embedding_rows(const SeqLayout& layout, const Tensor& input_ids,
                             const Tensor& segment_ids, const EmbeddingParams& p, int64_t h) {
  auto ptr = [](const Tensor& t) { return t.defined() ? t.ptr<float>() : nullptr; };
  return EmbeddingRows{p.word.ptr<float>(),
                       ptr(p.position),
                       ptr(p.token_type),
                       input_ids.ptr<int32_t>(),
                       p.token_type.defined() ? segment_ids.ptr<int32_t>() : nullptr,
                       layout.token_pos.ptr<int32_t>(),
                       h};
}

}  // namespace

void CpuBackend::embedding_forward(const SeqLayout& layout, const Tensor& input_ids,
                                   const Tensor& segment_ids, const EmbeddingParams& p,
                                   const Dropout& dropout, const Tensor& out, const Tensor& ln_mean,
                                   const Tensor& ln_rstd) {
  if (lowp::any(
          {&p.word, &p.position, &p.token_type, &p.ln_gamma, &p.ln_beta, &out, &ln_mean, &ln_rstd}))
    return lowp::embedding_forward(*this, lowp_, layout, input_ids, segment_ids, p, dropout, out,
                                   ln_mean, ln_rstd);
  const char* op = "embedding_forward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [rows, vocab, h] = checks::embedding_forward_args(args, layout, input_ids, segment_ids,
                                                               p, out, ln_mean, ln_rstd);
  cpu::check_layout(op, layout, rows);
  const DropoutStream ds = cpu::dropout_stream(op, dropout, h, 1, layout.max_len);

  const EmbeddingRows e = embedding_rows(layout, input_ids, segment_ids, p, h);
  const int64_t types = p.token_type.defined() ? p.token_type.dim(0) : 0;
  const int64_t positions = p.position.defined() ? p.position.dim(0) : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t seg = e.segs ? e.segs[r] : 0;
    PB_REQUIRE(e.ids[r] >= 0 && e.ids[r] < vocab && (!e.type || (seg >= 0 && seg < types)) &&
                   (!e.pos || e.positions[r] < positions),
               "{}: row {} has token id {} (vocab {}), segment {} (types {}), position {} "
               "(positions {})",
               op, r, e.ids[r], vocab, seg, types, e.positions[r], positions);
  }
  const float* gamma = p.ln_gamma.ptr<float>();
  const float* beta = p.ln_beta.defined() ? p.ln_beta.ptr<float>() : nullptr;
  float* y = out.ptr<float>();
  float* mean = ln_mean.ptr<float>();
  float* rstd = ln_rstd.ptr<float>();
  reserve_thread_scratch(static_cast<size_t>(h));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* factors = thread_scratch(omp_get_thread_num(), static_cast<size_t>(h));
    cpu::row_dropout_factors(ds, layout, r, h, factors);
    float* yr = y + r * h;
    Welford w;
    for (int64_t c = 0; c < h; ++c) {
      yr[c] = e.sum(r, c);
      welford_push(w, yr[c]);
    }
    const float rs = layernorm_rstd(w, p.ln_eps);
    for (int64_t c = 0; c < h; ++c)
      yr[c] = ((yr[c] - w.mean) * rs * gamma[c] + (beta ? beta[c] : 0.f)) * factors[c];
    mean[r] = w.mean;
    rstd[r] = rs;
  }
}

void CpuBackend::embedding_backward(const SeqLayout& layout, const Tensor& input_ids,
                                    const Tensor& segment_ids, const EmbeddingParams& p,
                                    const Dropout& dropout, const Tensor& ln_mean,
                                    const Tensor& ln_rstd, const Tensor& dout,
                                    const EmbeddingParams& grads) {
  if (lowp::any({&p.word, &p.position, &p.token_type, &p.ln_gamma, &p.ln_beta, &ln_mean, &ln_rstd,
                 &dout, &grads.word, &grads.position, &grads.token_type, &grads.ln_gamma,
                 &grads.ln_beta}))
    return lowp::embedding_backward(*this, lowp_, layout, input_ids, segment_ids, p, dropout,
                                    ln_mean, ln_rstd, dout, grads);
  const char* op = "embedding_backward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [rows, h] = checks::embedding_backward_args(args, layout, input_ids, segment_ids, p,
                                                         ln_mean, ln_rstd, dout, grads);
  cpu::check_layout(op, layout, rows);
  const DropoutStream ds = cpu::dropout_stream(op, dropout, h, 1, layout.max_len);
  // Ids were validated by the forward; backward trusts them (same buffers, same step).

  const EmbeddingRows e = embedding_rows(layout, input_ids, segment_ids, p, h);
  const int32_t* tseq = layout.token_seq.ptr<int32_t>();
  const float* gamma = p.ln_gamma.ptr<float>();
  const float* mean = ln_mean.ptr<float>();
  const float* rstd = ln_rstd.ptr<float>();
  float* d = dout.ptr<float>();

  // Pass 1 (rows): d <- dy, the gradient wrt the LayerNorm output (dropout backward); padding
  // rows are zeroed so they contribute nothing below.
  reserve_thread_scratch(static_cast<size_t>(h));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* dr = d + r * h;
    if (tseq[r] < 0) {
      std::fill(dr, dr + h, 0.f);
      continue;
    }
    float* factors = thread_scratch(omp_get_thread_num(), static_cast<size_t>(h));
    cpu::row_dropout_factors(ds, layout, r, h, factors);
    for (int64_t c = 0; c < h; ++c) dr[c] *= factors[c];
  }

  // Pass 2 (columns): gamma and beta gradients.
  add_layernorm_param_grads(
      rows, h, d, [&](int64_t r, int64_t c) { return e.sum(r, c); }, mean, rstd,
      [&](int64_t r) { return tseq[r] >= 0; },
      grads.ln_gamma.defined() ? grads.ln_gamma.ptr<float>() : nullptr,
      grads.ln_beta.defined() ? grads.ln_beta.ptr<float>() : nullptr);

  // Pass 3 (rows): d <- gradient wrt the embedding sum (LayerNorm backward).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    if (tseq[r] < 0) continue;
    float* dr = d + r * h;
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < h; ++c) {
      const float g = dr[c] * gamma[c];
      sum_g += g;
      sum_gx += static_cast<double>(g) * ((e.sum(r, c) - mean[r]) * rstd[r]);
    }
    const auto mean_g = static_cast<float>(sum_g / h), mean_gx = static_cast<float>(sum_gx / h);
    for (int64_t c = 0; c < h; ++c) {
      const float xhat = (e.sum(r, c) - mean[r]) * rstd[r];
      dr[c] = layernorm_dx(dr[c] * gamma[c], xhat, mean_g, mean_gx, rstd[r]);
    }
  }

  // Pass 4 (columns): scatter-add into the three tables in row order.
  float* dword = grads.word.defined() ? grads.word.ptr<float>() : nullptr;
  float* dpos = grads.position.defined() ? grads.position.ptr<float>() : nullptr;
  float* dtype = grads.token_type.defined() ? grads.token_type.ptr<float>() : nullptr;
  if (!dword && !dpos && !dtype) return;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < col_blocks(h); ++b) {
    const int64_t c0 = b * kColBlock, c1 = std::min(h, c0 + kColBlock);
    for (int64_t r = 0; r < rows; ++r) {
      if (tseq[r] < 0) continue;
      const float* dr = d + r * h;
      const int64_t wo = e.ids[r] * h, po = static_cast<int64_t>(e.positions[r]) * h,
                    to = e.segs ? e.segs[r] * h : 0;
      for (int64_t c = c0; c < c1; ++c) {
        if (dword) dword[wo + c] += dr[c];
        if (dpos) dpos[po + c] += dr[c];
        if (dtype) dtype[to + c] += dr[c];
      }
    }
  }
}

void CpuBackend::residual_layernorm_forward(const SeqLayout& layout, const Tensor& x,
                                            const Tensor& bias, const Tensor& residual,
                                            const LayerNormParams& ln, const Dropout& dropout,
                                            const Tensor& out, const Tensor& ln_in,
                                            const Tensor& ln_mean, const Tensor& ln_rstd) {
  if (lowp::any({&x, &bias, &residual, &ln.gamma, &ln.beta, &out, &ln_in, &ln_mean, &ln_rstd}))
    return lowp::residual_layernorm_forward(*this, lowp_, layout, x, bias, residual, ln, dropout,
                                            out, ln_in, ln_mean, ln_rstd);
  const char* op = "residual_layernorm_forward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [rows, h] = checks::residual_layernorm_forward_args(args, x, bias, residual, ln, out,
                                                                 ln_in, ln_mean, ln_rstd);
  const DropoutStream ds = cpu::dropout_stream(op, dropout, h, 1, layout.max_len);
  if (dropout_enabled(ds)) cpu::check_layout(op, layout, rows);

  const float* xp = x.ptr<float>();
  const float* b = bias.defined() ? bias.ptr<float>() : nullptr;
  const float* res = residual.defined() ? residual.ptr<float>() : nullptr;
  const float* gamma = ln.gamma.ptr<float>();
  const float* beta = ln.beta.defined() ? ln.beta.ptr<float>() : nullptr;
  float* y = out.ptr<float>();
  float* hin = ln_in.ptr<float>();
  float* mean = ln_mean.ptr<float>();
  float* rstd = ln_rstd.ptr<float>();
  reserve_thread_scratch(static_cast<size_t>(h));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* factors = thread_scratch(omp_get_thread_num(), static_cast<size_t>(h));
    cpu::row_dropout_factors(ds, layout, r, h, factors);
    const int64_t o = r * h;
    Welford w;
    for (int64_t c = 0; c < h; ++c) {
      float v = xp[o + c];
      if (b) v += b[c];
      v *= factors[c];
      if (res) v += res[o + c];
      hin[o + c] = v;  // after reading x[o + c]: ln_in may alias x
      welford_push(w, v);
    }
    const float rs = layernorm_rstd(w, ln.eps);
    for (int64_t c = 0; c < h; ++c)
      y[o + c] = (hin[o + c] - w.mean) * rs * gamma[c] + (beta ? beta[c] : 0.f);
    mean[r] = w.mean;
    rstd[r] = rs;
  }
}

void CpuBackend::residual_layernorm_backward(const SeqLayout& layout, const Tensor& dout,
                                             const Tensor& ln_in, const Tensor& ln_mean,
                                             const Tensor& ln_rstd, const LayerNormParams& ln,
                                             const Dropout& dropout, const Tensor& dx,
                                             const Tensor& dresidual, bool dresidual_in,
                                             const Tensor& dbias, const LayerNormParams& dln) {
  if (lowp::any({&dout, &ln_in, &ln_mean, &ln_rstd, &ln.gamma, &ln.beta, &dx, &dresidual, &dbias,
                 &dln.gamma, &dln.beta}))
    return lowp::residual_layernorm_backward(*this, lowp_, layout, dout, ln_in, ln_mean, ln_rstd,
                                             ln, dropout, dx, dresidual, dresidual_in, dbias, dln);
  const char* op = "residual_layernorm_backward";
  const checks::OpArgs args(op, Device::cpu);
  const auto [rows, h] = checks::residual_layernorm_backward_args(
      args, dout, ln_in, ln_mean, ln_rstd, ln, dx, dresidual, dresidual_in, dbias, dln);
  const DropoutStream ds = cpu::dropout_stream(op, dropout, h, 1, layout.max_len);
  if (dropout_enabled(ds)) cpu::check_layout(op, layout, rows);

  const float* dy = dout.ptr<float>();
  const float* hin = ln_in.ptr<float>();
  const float* mean = ln_mean.ptr<float>();
  const float* rstd = ln_rstd.ptr<float>();
  const float* gamma = ln.gamma.ptr<float>();

  // Pass 1 (columns): gamma and beta gradients, before dresidual may overwrite dout.
  add_layernorm_param_grads(
      rows, h, dy, [&](int64_t r, int64_t c) { return hin[r * h + c]; }, mean, rstd,
      [](int64_t) { return true; }, dln.gamma.defined() ? dln.gamma.ptr<float>() : nullptr,
      dln.beta.defined() ? dln.beta.ptr<float>() : nullptr);

  // Pass 2 (rows): dh = LayerNorm backward (+ dresidual's entry); dresidual = dh;
  // dx = dh * dropout factor.
  float* dxp = dx.ptr<float>();
  float* dres = dresidual.defined() ? dresidual.ptr<float>() : nullptr;
  reserve_thread_scratch(static_cast<size_t>(h));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* factors = thread_scratch(omp_get_thread_num(), static_cast<size_t>(h));
    cpu::row_dropout_factors(ds, layout, r, h, factors);
    const int64_t o = r * h;
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < h; ++c) {
      const float g = dy[o + c] * gamma[c];
      sum_g += g;
      sum_gx += static_cast<double>(g) * ((hin[o + c] - mean[r]) * rstd[r]);
    }
    const auto mean_g = static_cast<float>(sum_g / h), mean_gx = static_cast<float>(sum_gx / h);
    for (int64_t c = 0; c < h; ++c) {
      const float xhat = (hin[o + c] - mean[r]) * rstd[r];
      float dh = layernorm_dx(dy[o + c] * gamma[c], xhat, mean_g, mean_gx, rstd[r]);
      if (dresidual_in) dh += dres[o + c];
      if (dres) dres[o + c] = dh;  // after reading dy[o + c]: dresidual may alias dout
      dxp[o + c] = dh * factors[c];
    }
  }

  // Pass 3 (columns): the bias was added before dropout, so its gradient sums dx.
  if (dbias.defined()) cpu::add_column_sums(dxp, rows, h, h, dbias.ptr<float>());
}

}  // namespace packbert
