#include "optim/lamb.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/common/math.h"
#include "kernels/base/error.h"
#include "kernels/base/trace.h"

namespace packbert {

namespace {

constexpr int64_t kScalarBytes = sizeof(float) + 3 * sizeof(int32_t);  // Lamb::scalars_

void check_options(const LambOptions& o) {
  PB_REQUIRE(o.beta1 >= 0.f && o.beta1 < 1.f && o.beta2 >= 0.f && o.beta2 < 1.f,
             "lamb: beta1 {} and beta2 {} must be in [0, 1)", o.beta1, o.beta2);
  PB_REQUIRE(o.eps > 0.f && std::isfinite(o.eps), "lamb: epsilon {} must be > 0", o.eps);
  PB_REQUIRE(o.weight_decay >= 0.f && std::isfinite(o.weight_decay),
             "lamb: weight_decay {} must be >= 0", o.weight_decay);
  PB_REQUIRE(o.max_grad_norm > 0.f, "lamb: max_grad_norm {} must be > 0 (infinity: no clipping)",
             o.max_grad_norm);
  PB_REQUIRE(!o.decouple_lr || o.rule != UpdateRule::lamb,
             "lamb: decouple_lr applies to AdamW and StableAdamW, not LAMB");
}

// Sorts by offset (lamb_step wants ascending rows) and rejects overlaps and rows outside the
// buffer, naming the tensors: a wrong table would otherwise update one tensor twice.
void check_table(std::vector<LambParam>& params, int64_t n) {
  PB_REQUIRE(n >= 1 && !params.empty(), "lamb: {} parameter elements in {} tensors (need some)", n,
             params.size());
  std::stable_sort(params.begin(), params.end(), [](const LambParam& a, const LambParam& b) {
    // An empty tensor before a non-empty one at the same offset.
    return a.offset != b.offset ? a.offset < b.offset : a.size < b.size;
  });
  const LambParam* prev = nullptr;
  for (const LambParam& p : params) {
    PB_REQUIRE(p.offset >= 0 && p.size >= 0 && p.offset + p.size <= n,
               "lamb: tensor '{}' (offset {}, size {}) leaves the {} parameter elements", p.name,
               p.offset, p.size, n);
    PB_REQUIRE(!prev || prev->offset + prev->size <= p.offset,
               "lamb: tensors '{}' (offset {}, size {}) and '{}' (offset {}) overlap", prev->name,
               prev->offset, prev->size, p.name, p.offset);
    prev = &p;
  }
}

}  // namespace

bool mlperf_no_decay(std::string_view hf_name) {
  for (std::string_view key : {"bias", "gamma", "beta", "LayerNorm"})
    if (hf_name.find(key) != std::string_view::npos) return true;
  return false;
}

Lamb::Lamb(Backend& backend, std::vector<LambParam> params, int64_t num_elems,
           const LrSchedule& schedule, const LambOptions& options, const LambShard* shard)
    : backend_(backend),
      params_(std::move(params)),
      num_elems_(num_elems),
      end_(num_elems),
      schedule_(schedule),
      options_(options),
      graph_(backend, 1) {
  check_options(options_);
  PB_REQUIRE(!options_.decouple_lr || schedule_.config().base_lr > 0,
             "lamb: decouple_lr divides by the peak rate, which is {}", schedule_.config().base_lr);
  check_table(params_, num_elems_);
  // Empty tensors have nothing to update (and no norm to sum).
  params_.erase(std::remove_if(params_.begin(), params_.end(),
                               [](const LambParam& p) { return p.size == 0; }),
                params_.end());
  const auto all_tensors = static_cast<int64_t>(params_.size());
  if (shard) {
    PB_REQUIRE(shard->sum_over_ranks, "lamb: a shard needs its sum over ranks");
    PB_REQUIRE(0 <= shard->begin && shard->begin <= shard->end && shard->end <= num_elems_,
               "lamb: shard [{}, {}) of {} elements", shard->begin, shard->end, num_elems_);
    shard_ = *shard;
    begin_ = shard->begin;
    end_ = shard->end;
    // The pieces inside the shard: consecutive rows of the sorted table, clipped.
    std::vector<LambParam> own;
    sums_first_ = all_tensors;
    for (int64_t t = 0; t < all_tensors; ++t) {
      const LambParam& p = params_[static_cast<size_t>(t)];
      const int64_t lo = std::max(p.offset, begin_), hi = std::min(p.offset + p.size, end_);
      if (lo >= hi) continue;
      if (own.empty()) sums_first_ = t;
      own.push_back({p.name, lo, hi - lo, p.no_decay});
    }
    params_ = std::move(own);
  }
  const int64_t len = end_ - begin_;
  const auto num_tensors = static_cast<int64_t>(params_.size());
  host_table_.reserve(params_.size());
  for (const LambParam& p : params_)
    host_table_.push_back({p.offset - begin_, p.size, p.no_decay ? 0 : 1});
  // A rank of a sharded optimizer may own no tensor: the op still runs (it keeps the skip
  // record) over an empty table, which needs a pointer all the same.
  static const LambTensor kNoRow{0, 0, 0};
  table_ = lamb_table(host_table_.empty() ? &kNoRow : host_table_.data(), num_tensors);
  m_buffer_ = backend_.alloc(DType::f32, {len}, "LAMB first moments");
  v_buffer_ = backend_.alloc(DType::f32, {len}, "LAMB second moments");
  scalars_ = backend_.alloc(DType::u8, {kScalarBytes}, "LAMB scalars");
  norms_buffer_ = backend_.alloc(DType::f32, {2 * num_tensors}, "LAMB norms");
  if (shard) squares_ = backend_.alloc(DType::f64, {1}, "LAMB sum of squares");
  sums_buffer_ = backend_.alloc(DType::f64, {2 * std::max<int64_t>(all_tensors, 1)}, "LAMB sums");
  sums_all_ = Tensor(sums_buffer_.data(), DType::f64, {2 * all_tensors}, backend_.device());
  sums_ = Tensor(static_cast<double*>(sums_buffer_.data()) + 2 * std::min(sums_first_, all_tensors),
                 DType::f64, {num_tensors, 2}, backend_.device());
  m_ = m_buffer_.tensor();
  v_ = v_buffer_.tensor();
  grad_norm_ = scalars_.tensor(DType::f32, {1});
  record_ = Tensor(static_cast<char*>(scalars_.data()) + sizeof(float), DType::i32, {3},
                   backend_.device());
  norms_ = norms_buffer_.tensor();
  backend_.zero(m_);
  backend_.zero(v_);
  backend_.zero(scalars_.tensor());
}

size_t Lamb::state_bytes() const {
  return m_buffer_.bytes() + v_buffer_.bytes() + norms_buffer_.bytes() + scalars_.bytes() +
         squares_.bytes() + sums_buffer_.bytes();
}

size_t Lamb::state_bytes_for(int64_t len, int64_t tensors, int64_t all_tensors, bool sharded) {
  // As the constructor allocates them (Backend::alloc gives at least one byte).
  auto buffer = [](int64_t bytes) { return static_cast<size_t>(std::max<int64_t>(bytes, 1)); };
  return 2 * buffer(4 * len) + buffer(8 * tensors) + buffer(kScalarBytes) +
         (sharded ? buffer(8) : 0) + buffer(16 * std::max<int64_t>(all_tensors, 1));
}

LambStepInfo Lamb::step(const Tensor& params, const Tensor& grads, const Tensor& params_lowp,
                        float grad_scale, bool read_back,
                        const std::vector<Backend::HostRead>& also_read) {
  const trace::Range range("lamb");
  const char* op = "Lamb::step";
  // Sharded, the master weights may be this rank's range only (model/replica.h shard_masters).
  const bool local = sharded() && params.defined() && params.numel() == end_ - begin_ &&
                     end_ - begin_ != num_elems_;
  check_tensor(op, "params", params, DType::f32, {local ? end_ - begin_ : num_elems_});
  check_tensor(op, "grads", grads, DType::f32, {num_elems_});
  check_device(op, "params", params, backend_.device());
  check_device(op, "grads", grads, backend_.device());
  if (params_lowp.defined()) {
    PB_REQUIRE(params_lowp.dtype == DType::bf16 || params_lowp.dtype == DType::f16,
               "{}: params_lowp is {}, expected bf16 or f16", op, params_lowp.str());
    check_tensor(op, "params_lowp", params_lowp, params_lowp.dtype, {num_elems_});
    check_device(op, "params_lowp", params_lowp, backend_.device());
  }
  PB_REQUIRE(grad_scale > 0.f && std::isfinite(grad_scale),
             "{}: grad_scale {} must be positive and finite", op, grad_scale);

  LambStepInfo info;
  info.step = steps_done_ + 1;
  const bool in_tokens = schedule_.config().unit == ScheduleUnit::tokens;
  PB_REQUIRE(!in_tokens || schedule_tokens_ >= 1,
             "{}: a schedule in tokens needs the tokens trained (set_schedule_tokens), got {}", op,
             schedule_tokens_);
  info.lr = schedule_.lr(in_tokens ? schedule_tokens_ : info.step);

  // Every rank holds the all-reduced gradient, so this is the global norm (apex FusedLAMB
  // takes one norm over all parameter groups, decayed or not). Sharded: each rank holds the
  // reduced gradient of its range only, and the squares are summed over ranks.
  const Tensor own_params = local ? params : slice(params, begin_, end_ - begin_);
  const Tensor own_grads = slice(grads, begin_, end_ - begin_);
  const Tensor own_lowp = slice(params_lowp, begin_, end_ - begin_);
  LambConfig cfg;
  cfg.lr = static_cast<float>(info.lr);
  cfg.beta1 = options_.beta1;
  cfg.beta2 = options_.beta2;
  cfg.eps = options_.eps;
  cfg.rule = options_.rule;
  // optimi's decouple_lr: w (1 - lr wd / max_lr) is the op's w (1 - lr wd') with wd' = wd / max_lr.
  cfg.weight_decay = options_.decouple_lr
                         ? static_cast<float>(options_.weight_decay / schedule_.config().base_lr)
                         : options_.weight_decay;
  cfg.max_grad_norm = options_.max_grad_norm;
  cfg.step = info.step;
  cfg.grad_scale = grad_scale;
  // The norm, then the update. A non-finite norm makes both passes no-ops on the device (and
  // counts it in the record); the sums still go round, so every rank makes the same
  // collectives.
  auto update = [&] {
    if (sharded()) {
      // The double sums of squares summed over ranks, rooted and rounded as l2_norm does: the
      // unsharded norm up to double rounding, computed where the gradient is.
      backend_.sum_squares(own_grads, squares_.tensor());
      shard_.sum_over_ranks(squares_.tensor());
      backend_.norm_from_sum_squares(squares_.tensor(), grad_norm_);
      backend_.zero(sums_all_);
    } else {
      backend_.l2_norm(own_grads, grad_norm_);
    }
    backend_.lamb_update(table_, cfg, grad_norm_, own_params, own_grads, m_, v_, sums_, record_);
    // Sharded: the sums of a tensor cut between ranks are its pieces' sums added, in the order
    // the collective adds them (double rounding, then the square root rounds to f32).
    if (sharded()) shard_.sum_over_ranks(sums_all_);
    backend_.lamb_apply(table_, cfg, grad_norm_, sums_, own_params, own_grads, own_lowp, norms_);
    // lamb_update left the update direction in grads; the next accumulation starts from zero.
    if (own_grads.numel() > 0) backend_.zero(own_grads);
    if (shard_.after_update) shard_.after_update();
  };
  if (options_.graph && backend_.supports_graphs() && (!sharded() || shard_.capturable)) {
    const LambStepScalars sc = lamb_step_scalars(cfg);
    const float values[4] = {sc.lr, sc.bias_correction1, sc.bias_correction2, sc.grad_scale};
    if (!step_scalars_.data()) step_scalars_ = backend_.alloc(DType::f32, {4}, "LAMB step scalars");
    backend_.write_floats(step_scalars_.tensor(), values, 4);
    cfg.step_scalars = step_scalars_.tensor();
    // One graph, for the buffers it was recorded on (another set evicts it).
    const UpdateKey key{params.data, grads.data, params_lowp.data};
    if (graph_.run(key, update) != GraphCache<UpdateKey>::Use::ran) {
      ++graph_steps_;
      info.graph = true;
      if (sharded() && shard_.graph_launched) shard_.graph_launched();
    }
  } else {
    update();
  }

  // The reads wait for the update: the norm is the one it used, and the record counts this
  // step (a skipped step left the weights and moments as they were).
  bool finite = true;
  if (!read_back && !also_read.empty()) backend_.read(also_read);
  if (read_back) {
    // One copy: the norm, and the record of the steps up to this one.
    struct {
      float norm;
      int32_t record[3];
    } host;
    static_assert(sizeof(host) == kScalarBytes, "Lamb::scalars_ layout");
    std::vector<Backend::HostRead> reads = also_read;
    reads.push_back({&host, scalars_.tensor()});
    backend_.read(reads);
    info.read_back = true;
    info.grad_norm = host.norm / grad_scale;  // exact for the power-of-two loss scales
    finite = std::isfinite(info.grad_norm);
    info.unread_skips = host.record[0] - skips_seen_ - (finite ? 0 : 1);
    skips_seen_ = host.record[0];
    info.skipped_run = host.record[1];
    info.longest_skipped_run = host.record[2];
    PB_REQUIRE(finite || !options_.check_finite || options_.skip_nonfinite,
               "lamb: the gradient norm is {} at step {}; the weights were left as they were "
               "(diverged: lower the learning rate or check the input)",
               info.grad_norm, info.step);
  }
  info.skipped = !finite;
  if (finite) steps_done_ = info.step;
  return info;
}

void Lamb::set_steps_done(int64_t steps) {
  PB_REQUIRE(steps >= 0, "lamb: steps done {} must be >= 0", steps);
  steps_done_ = steps;
}

void Lamb::save_moments(float* m_host, float* v_host) const {
  backend_.copy(view(m_host + begin_, {end_ - begin_}), m_);
  backend_.copy(view(v_host + begin_, {end_ - begin_}), v_);
}

void Lamb::load_moments(const float* m_host, const float* v_host) {
  backend_.copy(m_, view(const_cast<float*>(m_host) + begin_, {end_ - begin_}));
  backend_.copy(v_, view(const_cast<float*>(v_host) + begin_, {end_ - begin_}));
}

}  // namespace packbert
