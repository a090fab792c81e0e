#include "model/fp8.h"

#include <algorithm>

#include "kernels/base/error.h"
#include "kernels/common/fp8_convert.h"
#include "model/arena.h"

namespace packbert {

Fp8State::Fp8State(Backend& backend, const BertConfig& config, const Fp8Recipe& recipe, int ranks,
                   int rank)
    : backend_(backend), config_(config), recipe_(recipe), ranks_(ranks), rank_(rank) {
  PB_REQUIRE(recipe.history >= 1 && recipe.history <= 65536, "fp8: history {} steps (1 to 65536)",
             recipe.history);
  PB_REQUIRE(recipe.margin >= 0 && recipe.margin <= 64, "fp8: margin {} (0 to 64)", recipe.margin);
  PB_REQUIRE(ranks >= 1 && rank >= 0 && rank < ranks, "fp8: rank {} of {}", rank, ranks);
  const int64_t h = config.hidden, inter = config.intermediate;
  for (int64_t v : {h, inter})
    PB_REQUIRE(v % 16 == 0,
               "fp8: hidden {} and intermediate {} must be multiples of 16 (FP8 "
               "GEMMs' layout)",
               h, inter);
  n_w_ = config.layers * kLinears;
  n_act_ = 2 * n_w_;
  Carver measure(nullptr, backend.device());
  carve(measure, config, recipe, ranks, nullptr);
  memory_ = backend.alloc(measure.used(), "FP8 scaling state and weight copies");
  Carver views(memory_.data(), backend.device());
  carve(views, config, recipe, ranks, this);

  // Initial values: amaxes and histories 0, scales 1, each operand's format's largest value.
  std::vector<float> zeros(static_cast<size_t>(n_act_ * recipe.history), 0.f);
  std::vector<float> ones(static_cast<size_t>(2 * n_act_), 1.f);
  std::vector<float> maxima(static_cast<size_t>(n_act_));
  for (int64_t i = 0; i < n_act_; ++i)
    maxima[static_cast<size_t>(i)] = i % 2 == 0 ? fp8::kE4M3Max : fp8::kE5M2Max;
  auto up = [&](const Tensor& dst, const std::vector<float>& v) {
    backend.copy(dst, view(v.data(), {dst.numel()}));
  };
  auto flat = [](Tensor t) { return Tensor(t.data, t.dtype, {t.numel()}, t.device); };
  up(flat(amax_), zeros);
  up(flat(history_), zeros);
  up(flat(scales_), ones);
  up(flat(fp8_max_), maxima);
  up(flat(w_amax_), zeros);
  up(flat(w_history_), zeros);
  up(flat(w_scales_), ones);
  up(flat(w_fp8_max_), std::vector<float>(static_cast<size_t>(n_w_), fp8::kE4M3Max));
}

namespace {
Tensor row(const Tensor& t, int64_t i) {
  const int64_t w = t.ndim == 2 ? t.dim(1) : 1;
  return Tensor(static_cast<char*>(t.data) + i * w * static_cast<int64_t>(dtype_size(t.dtype)),
                t.dtype, {w}, t.device);
}
Tensor rows(const Tensor& t, int64_t first, int64_t n) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + first * static_cast<int64_t>(t.bytes() / t.dim(0));
  r.shape[0] = n;
  return r;
}
}  // namespace

Fp8State::Operand Fp8State::activation(int64_t layer, Linear j, int kind) const {
  const int64_t i = 2 * index(layer, j) + kind;
  return {row(scales_, i), row(amax_, i)};
}

Fp8State::Operand Fp8State::weight(int64_t layer, Linear j) const {
  const int64_t i = index(layer, j);
  return {row(w_scales_, i), row(w_amax_, i)};
}

void Fp8State::cast_weights(int64_t layer, const LayerWeights& w) {
  const Tensor* weights[kLinears] = {&w.qkv_w, &w.attn_out_w, &w.ffn_in_w, &w.ffn_out_w};
  // The amaxes (from 0), the scales from them alone (history 1), then the casts.
  const int64_t first = index(layer, qkv);
  const Tensor amax = rows(w_amax_, first, kLinears);
  backend_.zero(amax);
  for (int j = 0; j < kLinears; ++j)
    backend_.fp8_cast(*weights[j], Tensor(), Tensor(), weight(layer, Linear(j)).amax, Tensor(),
                      Tensor());
  const Tensor shared = Tensor(w_shared_.data, DType::f64, {1, n_w_}, w_shared_.device);
  const Tensor shared_rows(static_cast<double*>(shared.data) + first, DType::f64, {1, kLinears},
                           shared.device);
  backend_.fp8_amax_share(amax, 0, shared_rows);
  backend_.fp8_scale_update(shared_rows, rows(w_fp8_max_, first, kLinears), recipe_.margin,
                            rows(w_history_, first, kLinears), rows(w_scales_, first, kLinears),
                            amax);
  for (int j = 0; j < kLinears; ++j) {
    const Linear lj = Linear(j);
    backend_.fp8_cast(*weights[j], Tensor(), weight(layer, lj).scale, Tensor(), w8(layer, lj),
                      w8t(layer, lj));
  }
}

void Fp8State::update(const std::function<void(const Tensor&)>& sum_over_ranks) {
  backend_.fp8_amax_share(amax_, rank_, shared_);
  if (ranks_ > 1) {
    PB_REQUIRE(static_cast<bool>(sum_over_ranks), "fp8: {} ranks and no sum over them", ranks_);
    sum_over_ranks(Tensor(shared_.data, DType::f64, {shared_.numel()}, shared_.device));
  }
  backend_.fp8_scale_update(shared_, fp8_max_, recipe_.margin, history_, scales_, amax_);
  ++updates_;
}

void Fp8State::carve(Carver& v, const BertConfig& config, const Fp8Recipe& recipe, int ranks,
                     Fp8State* into) {
  // 256-byte aligned views (the FP8 GEMMs want 16).
  Fp8State* s = into;
  const int64_t n_w = config.layers * kLinears, n_act = 2 * n_w;
  auto take = [&](Tensor Fp8State::*field, DType dtype, std::initializer_list<int64_t> dims) {
    const Tensor t = v.take(dtype, dims);
    if (s) s->*field = t;
  };
  take(&Fp8State::amax_, DType::f32, {n_act});
  take(&Fp8State::scales_, DType::f32, {n_act, 2});
  take(&Fp8State::history_, DType::f32, {n_act, recipe.history});
  take(&Fp8State::fp8_max_, DType::f32, {n_act});
  take(&Fp8State::shared_, DType::f64, {ranks, n_act});
  take(&Fp8State::w_amax_, DType::f32, {n_w});
  take(&Fp8State::w_scales_, DType::f32, {n_w, 2});
  take(&Fp8State::w_history_, DType::f32, {n_w, 1});
  take(&Fp8State::w_fp8_max_, DType::f32, {n_w});
  take(&Fp8State::w_shared_, DType::f64, {1, n_w});
  if (s) {
    s->w8_.clear();
    s->w8t_.clear();
  }
  const int64_t h = config.hidden, inter = config.intermediate, wi = config.mlp_in_width();
  const int64_t out[kLinears] = {3 * h, h, wi, h}, in[kLinears] = {h, h, h, inter};
  for (int64_t l = 0; l < config.layers; ++l)
    for (int j = 0; j < kLinears; ++j) {
      const Tensor w = v.take(DType::e4m3, {out[j], in[j]});
      const Tensor wt = v.take(DType::e4m3, {in[j], out[j]});
      if (s) {
        s->w8_.push_back(w);
        s->w8t_.push_back(wt);
      }
    }
}

size_t Fp8State::state_bytes(const BertConfig& config, const Fp8Recipe& recipe, int ranks) {
  Carver measure(nullptr, Device::cpu);
  carve(measure, config, recipe, ranks, nullptr);
  return std::max<size_t>(measure.used(), 1);  // Backend::alloc gives at least one byte
}

int64_t Fp8State::workspace_bytes_for(const BertConfig& config, int64_t rows) {
  const int64_t wide = std::max(3 * config.hidden, config.mlp_in_width());
  return rows * 3 * wide + 3 * 256;
}

void Fp8State::reserve_workspace(int64_t bytes) {
  if (static_cast<size_t>(bytes) <= workspace_.bytes()) return;
  workspace_.reset();
  workspace_ = backend_.alloc(static_cast<size_t>(bytes), "FP8 operand workspace");
}

Tensor Fp8State::workspace(int64_t bytes) {
  if (static_cast<size_t>(bytes) > workspace_.bytes()) {
    workspace_.reset();
    workspace_ = backend_.alloc(static_cast<size_t>(bytes + bytes / 16), "FP8 operand workspace");
  }
  return Tensor(workspace_.data(), DType::u8, {static_cast<int64_t>(workspace_.bytes())},
                backend_.device());
}

Fp8State::Saved Fp8State::state() const {
  Saved s;
  s.history.resize(static_cast<size_t>(history_.numel()));
  s.scales.resize(static_cast<size_t>(scales_.numel()));
  backend_.copy(view(s.history.data(), {history_.numel()}),
                Tensor(history_.data, DType::f32, {history_.numel()}, history_.device));
  backend_.copy(view(s.scales.data(), {scales_.numel()}),
                Tensor(scales_.data, DType::f32, {scales_.numel()}, scales_.device));
  s.updates = updates_;
  return s;
}

void Fp8State::set_state(const Saved& s) {
  PB_REQUIRE(s.history.size() == static_cast<size_t>(history_.numel()) &&
                 s.scales.size() == static_cast<size_t>(scales_.numel()) && s.updates >= 0,
             "fp8: a saved state of {} history and {} scale values, this model has {} operands "
             "with a history of {} ({} and {})",
             s.history.size(), s.scales.size(), n_act_, recipe_.history, history_.numel(),
             scales_.numel());
  backend_.copy(Tensor(history_.data, DType::f32, {history_.numel()}, history_.device),
                view(s.history.data(), {history_.numel()}));
  backend_.copy(Tensor(scales_.data, DType::f32, {scales_.numel()}, scales_.device),
                view(s.scales.data(), {scales_.numel()}));
  backend_.zero(amax_);
  updates_ = s.updates;
}

}  // namespace packbert
