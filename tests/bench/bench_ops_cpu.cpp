// CPU backend, one BERT-base-sized encoder layer plus embeddings and heads: time per op, GFLOP/s
// beside this machine's measured cblas_sgemm peak, GB/s for memory-bound ops. Prints a table;
// asserts nothing about time.
//
//   bench_ops_cpu [--tokens 4096] [--reps 3] [--model base|mini|...]   (threads: OMP_NUM_THREADS)
// --model takes the layer's sizes from that preset (base: the default).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/config.h"

namespace {

using namespace packbert;

double seconds(const std::function<void()>& f, int reps) {
  f();  // warm: scratch grows, pages fault in
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::vector<float> randoms(std::mt19937_64& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct Row {
  std::string op, shape;
  double sec, flops, bytes;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t target_tokens = 4096;
  int reps = 3;
  std::string model = "base";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) target_tokens = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
  }
  const BertConfig cfg_model = bert_preset(model);
  const int64_t kHidden = cfg_model.hidden, kHeads = cfg_model.heads, kFfn = cfg_model.intermediate,
                kVocab = cfg_model.real_vocab_size, kMaxPos = cfg_model.max_position_embeddings;
  const std::string sh = std::to_string(kHidden), sf = std::to_string(kFfn),
                    s3 = std::to_string(3 * kHidden), sv = std::to_string(kVocab);
  std::mt19937_64 rng(12345);

  // Sequences of 64..512 tokens, unpadded, until the next one would pass the token target.
  std::vector<int32_t> lens, start, tseq, tpos;
  std::vector<int64_t> sid;
  int64_t rows = 0;
  std::uniform_int_distribution<int32_t> len_dist(64, 512);
  for (;;) {
    const int32_t n = len_dist(rng);
    if (rows + n > target_tokens && !lens.empty()) break;
    start.push_back(static_cast<int32_t>(rows));
    lens.push_back(n);
    sid.push_back(static_cast<int64_t>(lens.size()) * 7919);
    for (int32_t p = 0; p < n; ++p)
      tseq.push_back(static_cast<int32_t>(lens.size() - 1)), tpos.push_back(p);
    rows += n;
  }
  const int64_t s = static_cast<int64_t>(lens.size());
  SeqLayout l;
  l.rows = rows;
  l.num_seqs = static_cast<int32_t>(s);
  l.max_len = *std::max_element(lens.begin(), lens.end());
  l.seq_start = view(start.data(), {s});
  l.seq_len = view(lens.data(), {s});
  l.sample_id = view(sid.data(), {s});
  l.token_seq = view(tseq.data(), {rows});
  l.token_pos = view(tpos.data(), {rows});
  double sum_len2 = 0;
  for (int32_t n : lens) sum_len2 += static_cast<double>(n) * n;

  auto be = make_cpu_backend();
  const int64_t h = kHidden, t = rows, m = rows * 15 / 100;
  auto buf = [&](size_t n, float scale = 1.f) { return randoms(rng, n, scale); };

  // sgemm peak: a large square product, best of reps.
  const int64_t p = 2048;
  auto pa = buf(p * p), pb = buf(p * p), pc = buf(p * p);
  // Measured before and after the ops (best of both), so a busy moment on a shared machine does
  // not understate it.
  auto sgemm_peak = [&] {
    const double sec = seconds(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p, p, p, 1.f, pa.data(), p,
                      pb.data(), p, 0.f, pc.data(), p);
        },
        std::max(reps, 8));
    return 2.0 * p * p * p / sec / 1e9;
  };
  double peak = sgemm_peak();

  // Parameters and activations of one layer.
  auto word = buf(kVocab * h, 0.05f), pos = buf(kMaxPos * h, 0.05f), type = buf(2 * h, 0.05f);
  auto gamma = buf(h), beta = buf(h), wqkv = buf(3 * h * h, 0.05f), bqkv = buf(3 * h),
       wo = buf(h * h, 0.05f), w1 = buf(kFfn * h, 0.05f), b1 = buf(kFfn), w2 = buf(h * kFfn, 0.05f);
  auto dword = buf(kVocab * h), dpos = buf(kMaxPos * h), dtype = buf(2 * h), dgamma = buf(h),
       dbeta = buf(h), dw3 = buf(3 * h * h), db3 = buf(3 * h), dwo = buf(h * h),
       dw1 = buf(kFfn * h), db1 = buf(kFfn), dw2 = buf(h * kFfn), dbias = buf(h),
       dvocab_b = buf(kVocab);
  std::vector<int32_t> ids(t), segs(t, 0), masked(m), labels(m), nsp_labels(s, 1);
  for (auto& i : ids) i = static_cast<int32_t>(rng() % kVocab);
  for (int64_t i = 0; i < m; ++i)
    masked[i] = static_cast<int32_t>(i * (t / m)), labels[i] = ids[masked[i]];
  auto x = buf(t * h), qkv = buf(t * 3 * h), ctx = buf(t * h), proj = buf(t * h), h1 = buf(t * h),
       hin = buf(t * h), pre = buf(t * kFfn), act = buf(t * kFfn), y = buf(t * h), dy = buf(t * h),
       dx = buf(t * h), dres = buf(t * h), dqkv = buf(t * 3 * h), dact = buf(t * kFfn),
       lse = buf(t * kHeads), mean = buf(t), rstd = buf(t), xm = buf(m * h), dxm = buf(m * h),
       logits = buf(m * kVocab), nsp_ws = buf(nsp_workspace_elems(s, h));
  std::vector<float> loss(1);
  std::vector<int32_t> correct(1);
  auto T = [](std::vector<float>& v, std::initializer_list<int64_t> d) {
    return view(v.data(), d);
  };
  Dropout drop;
  drop.p = 0.1f;
  drop.seed = 1;
  const LayerNormParams ln{T(gamma, {h}), T(beta, {h})};
  const EmbeddingParams emb{T(word, {kVocab, h}), T(pos, {kMaxPos, h}), T(type, {2, h}), ln.gamma,
                            ln.beta};
  const EmbeddingParams demb{T(dword, {kVocab, h}), T(dpos, {kMaxPos, h}), T(dtype, {2, h}),
                             T(dgamma, {h}), T(dbeta, {h})};
  const double th = static_cast<double>(t) * h, f4 = 4.0;  // bytes per float

  std::vector<Row> table;
  auto run = [&](const std::string& op, const std::string& shape, double flops, double bytes,
                 const std::function<void()>& f) {
    table.push_back({op, shape, seconds(f, reps), flops, bytes});
  };
  const std::string tok = std::to_string(t);
  run("embedding_forward", tok + " x " + sh, 0, f4 * th * 4, [&] {
    be->embedding_forward(l, view(ids.data(), {t}), view(segs.data(), {t}), emb, drop, T(x, {t, h}),
                          T(mean, {t}), T(rstd, {t}));
  });
  run("embedding_backward", tok + " x " + sh, 0, f4 * th * 10, [&] {
    std::vector<float> d = dy;
    be->embedding_backward(l, view(ids.data(), {t}), view(segs.data(), {t}), emb, drop,
                           T(mean, {t}), T(rstd, {t}), T(d, {t, h}), demb);
  });
  run("linear_forward qkv +bias", tok + " x " + sh + " -> " + s3, 2.0 * t * h * 3 * h, 0, [&] {
    be->linear_forward(T(x, {t, h}), T(wqkv, {3 * h, h}), T(bqkv, {3 * h}), Epilogue::bias,
                       T(qkv, {t, 3 * h}), Tensor());
  });
  Dropout adrop = drop;
  adrop.site = DropoutSite::attention_probs;
  run("attention_forward p=0.1", std::to_string(s) + " seqs 64..512", 4.0 * sum_len2 * h, 0, [&] {
    be->attention_forward(l, T(qkv, {t, 3 * h}), kHeads, 0, adrop, T(ctx, {t, h}),
                          T(lse, {t, kHeads}));
  });
  run("attention_forward p=0", std::to_string(s) + " seqs 64..512", 4.0 * sum_len2 * h, 0, [&] {
    be->attention_forward(l, T(qkv, {t, 3 * h}), kHeads, 0, Dropout(), T(ctx, {t, h}),
                          T(lse, {t, kHeads}));
  });
  run("rotary_embedding (q, k in place)",
      tok + " x " + s3 + ", " + std::to_string(kHeads) + " heads", 0, f4 * th * 4, [&] {
        be->rotary_embedding(l, T(qkv, {t, 3 * h}), kHeads, 10000.f, false);
      });
  run("linear_forward attn out", tok + " x " + sh + " -> " + sh, 2.0 * t * h * h, 0, [&] {
    be->linear_forward(T(ctx, {t, h}), T(wo, {h, h}), Tensor(), Epilogue::none, T(proj, {t, h}),
                       Tensor());
  });
  run("residual_layernorm_forward", tok + " x " + sh, 0, f4 * th * 4, [&] {
    be->residual_layernorm_forward(l, T(proj, {t, h}), T(beta, {h}), T(x, {t, h}), ln, drop,
                                   T(h1, {t, h}), T(hin, {t, h}), T(mean, {t}), T(rstd, {t}));
  });
  run("linear_forward ffn1 +bias+gelu", tok + " x " + sh + " -> " + sf, 2.0 * t * h * kFfn, 0, [&] {
    be->linear_forward(T(h1, {t, h}), T(w1, {kFfn, h}), T(b1, {kFfn}), Epilogue::bias_gelu,
                       T(act, {t, kFfn}), T(pre, {t, kFfn}));
  });
  // A gated MLP's activation of FFN1's columns (GeGLU, I = ffn / 2), forward and backward.
  const int64_t gi = kFfn / 2;
  auto gout = buf(t * gi), dgout = buf(t * gi), gdx = buf(t * kFfn);
  run("glu_forward gelu", tok + " x " + sf + " -> " + std::to_string(gi), 0, f4 * t * 3.0 * gi,
      [&] {
        be->glu_forward(T(pre, {t, kFfn}), GluAct::gelu, T(gout, {t, gi}));
      });
  run("glu_backward gelu", tok + " x " + sf, 0, f4 * t * 5.0 * gi, [&] {
    be->glu_backward(T(pre, {t, kFfn}), T(dgout, {t, gi}), GluAct::gelu, T(gdx, {t, kFfn}));
  });
  run("linear_forward ffn2", tok + " x " + sf + " -> " + sh, 2.0 * t * h * kFfn, 0, [&] {
    be->linear_forward(T(act, {t, kFfn}), T(w2, {h, kFfn}), Tensor(), Epilogue::none,
                       T(proj, {t, h}), Tensor());
  });
  run("residual_layernorm_backward", tok + " x " + sh, 0, f4 * th * 6, [&] {
    be->residual_layernorm_backward(l, T(dy, {t, h}), T(hin, {t, h}), T(mean, {t}), T(rstd, {t}),
                                    ln, drop, T(dx, {t, h}), T(dres, {t, h}), false, T(dbias, {h}),
                                    LayerNormParams{T(dgamma, {h}), T(dbeta, {h})});
  });
  LinearBackwardOptions fused;
  fused.x_gelu_pre = T(pre, {t, kFfn});
  run("linear_backward ffn2 (dx*dgelu, dw)", tok + " x " + sf + " -> " + sh, 4.0 * t * h * kFfn, 0,
      [&] {
        be->linear_backward(T(act, {t, kFfn}), T(w2, {h, kFfn}), T(dx, {t, h}), T(dact, {t, kFfn}),
                            T(dw2, {h, kFfn}), Tensor(), fused);
      });
  LinearBackwardOptions acc;
  acc.dx_accumulate = true;
  run("linear_backward ffn1 (dx+=, dw, db)", tok + " x " + sh + " -> " + sf, 4.0 * t * h * kFfn, 0,
      [&] {
        be->linear_backward(T(h1, {t, h}), T(w1, {kFfn, h}), T(dact, {t, kFfn}), T(dres, {t, h}),
                            T(dw1, {kFfn, h}), T(db1, {kFfn}), acc);
      });
  run("linear_backward attn out (dx, dw)", tok + " x " + sh + " -> " + sh, 4.0 * t * h * h, 0, [&] {
    be->linear_backward(T(ctx, {t, h}), T(wo, {h, h}), T(dx, {t, h}), T(dy, {t, h}), T(dwo, {h, h}),
                        Tensor(), {});
  });
  run("attention_backward p=0.1", std::to_string(s) + " seqs 64..512", 10.0 * sum_len2 * h, 0, [&] {
    be->attention_backward(l, T(qkv, {t, 3 * h}), T(ctx, {t, h}), T(lse, {t, kHeads}),
                           T(dy, {t, h}), kHeads, 0, adrop, T(dqkv, {t, 3 * h}));
  });
  run("linear_backward qkv (dx+=, dw, db)", tok + " x " + sh + " -> " + s3, 4.0 * t * h * 3 * h, 0,
      [&] {
        be->linear_backward(T(x, {t, h}), T(wqkv, {3 * h, h}), T(dqkv, {t, 3 * h}), T(dres, {t, h}),
                            T(dw3, {3 * h, h}), T(db3, {3 * h}), acc);
      });
  run("gather_rows (masked)", std::to_string(m) + " of " + tok, 0, f4 * 2.0 * m * h, [&] {
    be->gather_rows(T(y, {t, h}), view(masked.data(), {m}), T(xm, {m, h}));
  });
  run("gather_rows_backward", std::to_string(m) + " of " + tok, 0, f4 * (th + m * h), [&] {
    be->gather_rows_backward(T(dxm, {m, h}), view(masked.data(), {m}), T(dx, {t, h}));
  });
  run("mlm_loss fwd+bwd (V=" + sv + ")", std::to_string(m) + " x " + sh, 6.0 * m * kVocab * h, 0,
      [&] {
        be->mlm_loss(T(xm, {m, h}), T(word, {kVocab, h}), T(dvocab_b, {kVocab}),
                     view(labels.data(), {m}), 1.f / m, T(logits, {m, kVocab}),
                     view(loss.data(), {1}), view(correct.data(), {1}), T(dxm, {m, h}),
                     T(dword, {kVocab, h}), T(dvocab_b, {kVocab}));
      });
  auto wp = buf(h * h, 0.05f), bp = buf(h), wc = buf(2 * h), bc = buf(2), dwp = buf(h * h),
       dbp = buf(h), dwc = buf(2 * h), dbc = buf(2);
  run("nsp_loss fwd+bwd", std::to_string(s) + " seqs", 6.0 * s * h * (h + 2), 0, [&] {
    be->nsp_loss(l, T(y, {t, h}),
                 PoolerParams{T(wp, {h, h}), T(bp, {h}), T(wc, {2, h}), T(bc, {2})},
                 view(nsp_labels.data(), {s}), 1.f / s, T(nsp_ws, {nsp_workspace_elems(s, h)}),
                 view(loss.data(), {1}), view(correct.data(), {1}), T(dx, {t, h}),
                 PoolerParams{T(dwp, {h, h}), T(dbp, {h}), T(dwc, {2, h}), T(dbc, {2})});
  });
  // The optimizer over embeddings + one layer + heads (~31M floats; BERT-base is ~110M).
  const int64_t np =
      kVocab * h + kMaxPos * h + 12 * h * h + 13 * h + 2 * h * h + 8 * h + 2 * kFfn * h;
  std::vector<LambTensor> lt;
  for (int64_t off = 0, k = 0; off < np; ++k) {
    const int64_t size = std::min<int64_t>(np - off, k % 3 == 0 ? h : 3 * h * h);
    lt.push_back({off, size, k % 3 == 0 ? 0 : 1});
    off += size;
  }
  auto pw = buf(np), pg = buf(np, 1e-3f), pm = buf(np, 1e-3f), pv = buf(np, 1e-6f),
       norms = buf(2 * lt.size());
  for (auto& v : pv) v = std::abs(v);
  std::vector<float> gnorm(1);
  const std::string nps = std::to_string(np);
  run("l2_norm", nps + " floats", 0, f4 * np,
      [&] { be->l2_norm(T(pg, {np}), view(gnorm.data(), {1})); });
  LambConfig cfg;
  cfg.lr = 1e-4f;
  // Bytes: read w, g, m, v; write u, m, v, w; re-read w (norm), u (norm, step).
  run("lamb_step", nps + " floats", 0, f4 * np * 11, [&] {
    be->lamb_step(lamb_table(lt.data(), static_cast<int64_t>(lt.size())), cfg,
                  view(gnorm.data(), {1}), T(pw, {np}), T(pg, {np}), T(pm, {np}), T(pv, {np}),
                  T(norms, {2 * static_cast<int64_t>(lt.size())}));
  });

  peak = std::max(peak, sgemm_peak());
  std::printf(
      "packbert CPU backend, BERT-%s layer: hidden %lld, %lld heads, ffn %lld, vocab %lld\n",
      model.c_str(), static_cast<long long>(h), static_cast<long long>(kHeads),
      static_cast<long long>(kFfn), static_cast<long long>(kVocab));
  std::printf("%lld tokens in %lld sequences (64..512), %lld masked; %d threads; best of %d\n",
              static_cast<long long>(t), static_cast<long long>(s), static_cast<long long>(m),
              cpu::num_threads(), reps);
  std::printf("cblas_sgemm peak (%lldx%lldx%lld): %.1f GFLOP/s\n\n", static_cast<long long>(p),
              static_cast<long long>(p), static_cast<long long>(p), peak);
  std::printf("%-38s %-24s %10s %9s %7s %8s\n", "op", "shape", "ms", "GFLOP/s", "%peak", "GB/s");
  double total = 0;
  for (const Row& r : table) {
    total += r.sec;
    char gf[16] = "", pk[16] = "", gb[16] = "";
    if (r.flops > 0) {
      std::snprintf(gf, sizeof gf, "%.1f", r.flops / r.sec / 1e9);
      std::snprintf(pk, sizeof pk, "%.0f%%", 100 * r.flops / r.sec / 1e9 / peak);
    }
    if (r.bytes > 0) std::snprintf(gb, sizeof gb, "%.2f", r.bytes / r.sec / 1e9);
    std::printf("%-38s %-24s %10.2f %9s %7s %8s\n", r.op.c_str(), r.shape.c_str(), r.sec * 1e3, gf,
                pk, gb);
  }
  std::printf("%-38s %-24s %10.2f\n", "total", "", total * 1e3);
  return 0;
}
