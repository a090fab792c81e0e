// The LAMB optimizer of MLPerf BERT (NVIDIA apex FusedLAMB: decoupled weight decay, gradient
// averaging, bias correction, global-norm clipping, per-tensor trust ratio) over the flat
// parameter buffer, or with LambOptions::rule AdamW or StableAdamW on the same state. The math is
// Backend::lamb_step; this class owns what persists between steps (the moments m and v, the step
// counter), turns the parameter table into the op's table, and drives one step: global gradient
// norm -> lamb_step with the schedule's rate -> zero the gradients for the next accumulation.
//
// Where it sits in a training step (DESIGN.md, data flow):
//   for each micro-step: forward, backward  (parameter gradients accumulate, +=, into grads;
//                                            the loss is already scaled by the global counts)
//   the last micro-step's backward all-reduces grads (comm/grad_reducer.h), so every rank
//   holds the gradient of the whole global batch and the norm below is the global norm
//   lamb.step(params, grads)                 (grads is zero again afterwards)
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/graph_cache.h"
#include "optim/lr_schedule.h"

namespace packbert {

// A tensor of the flat parameter buffer as the optimizer sees it. no_decay tensors (LayerNorm
// weights and biases, all biases: MLPerf's no_decay = ['bias', 'gamma', 'beta', 'LayerNorm'])
// get neither weight decay nor the trust ratio.
struct LambParam {
  std::string name;
  int64_t offset = 0;  // first element in the flat buffers
  int64_t size = 0;    // elements
  bool no_decay = false;
};

// MLPerf's rule for no_decay from a Hugging Face parameter name: the name contains 'bias',
// 'gamma', 'beta' or 'LayerNorm' (substring match, as the reference's
// any(nd in n for nd in no_decay)).
bool mlperf_no_decay(std::string_view hf_name);

struct LambOptions {
  // The update rule (optim.name): LAMB, AdamW or StableAdamW (kernels/ops/lamb.h has the
  // formulas); the state, clipping, sharding and graphs are the same for each.
  UpdateRule rule = UpdateRule::lamb;
  // AdamW family: optimi's fully decoupled weight decay, w (1 - lr wd / max_lr) with max_lr the
  // schedule's peak rate (its base_lr), instead of w (1 - lr wd).
  bool decouple_lr = false;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-6f;
  float weight_decay = 0.01f;
  float max_grad_norm = 1.0f;  // +infinity: no clipping
  // A step whose norm is read back (step(..., read_back)) throws Error when the norm is NaN or
  // infinite, before the weights are touched (fp32/bf16 training has no loss scaler that would
  // skip such a step).
  bool check_finite = true;
  // With check_finite: instead of throwing, skip the update of a non-finite gradient (the
  // weights, moments and step count stay as they were, the gradients are zeroed) and report it
  // in LambStepInfo::skipped. The trainer counts such steps and gives up after several in a row.
  bool skip_nonfinite = false;
  // A step that does not read back never waits for the device: a non-finite norm then skips the
  // update on the device (Backend::lamb_step; the weights and moments stay as they were) and is
  // counted in its record, which the next read reports (LambStepInfo). Such a step still takes
  // its step number: the host cannot know, so the bias correction and the schedule advance.
  // How, not what (train.cuda_graphs = full): on a backend that records graphs, a step's work
  // on the device (the global norm, lamb_update, lamb_apply, the zeroing of the gradient;
  // sharded, when the shard's sums can be captured, with the sums over ranks and
  // LambShard::after_update) is recorded as a graph at the second step and replayed after,
  // reading the rate, the bias corrections and the loss scale from device memory written
  // before it (LambConfig::step_scalars); a read-back follows it. The same bits as the ops.
  bool graph = false;
};

// One rank's part of a sharded optimizer (optim.sharded; the cut: optim/sharding.h, the
// optimizer that drives it: optim/distributed_lamb.h). The rank owns the elements [begin, end)
// of the flat buffers, keeps m and v for them only and updates only them; a tensor may be cut
// anywhere, its pieces on several ranks. Norms over ranks come from sums over ranks: the global
// gradient norm from each rank's sum of squares, each tensor's ||w|| and ||u|| from the sums
// of its pieces (Backend::lamb_update / lamb_apply). Two small sums over ranks per step, in the
// backend's memory (on a GPU with NCCL the host never waits for them).
struct LambShard {
  int64_t begin = 0;
  int64_t end = 0;
  // In-place sum over ranks of a few f64 values in the backend's memory, ordered with the
  // backend's work (ShardExchange::sum).
  std::function<void(const Tensor& values)> sum_over_ranks;
  // Whether sum_over_ranks can be recorded into a CUDA graph (NCCL's: LambOptions::graph then
  // takes a sharded update in), and what to call after each launch of a graph holding it (the
  // transport watches the launch). Every rank records and replays at the same steps.
  bool capturable = false;
  std::function<void()> graph_launched;
  // Issued at the end of each update, after the gradient's zeroing, and recorded with it into
  // the update's graph (optional): the sharded optimizer's weight gathers and the zeroing of
  // the gradient outside the shard (optim/distributed_lamb.h).
  std::function<void()> after_update;
};

// What one step did (host values).
struct LambStepInfo {
  int64_t step = 0;        // 1-based index of the update just made
  double lr = 0.0;         // the schedule's rate for it
  bool read_back = false;  // the norm and the skip record below were read from the device
  float grad_norm = -1.f;  // global gradient norm before clipping; -1 when not read back
  bool skipped = false;    // non-finite gradient norm, no update made (skip_nonfinite)
  // When read back: steps the device skipped since the previous read, this one excluded (steps
  // that did not read back), and the record after this step (Backend::lamb_step): the current
  // run of consecutive skipped steps and the longest run since the optimizer was made.
  int64_t unread_skips = 0;
  int64_t skipped_run = 0;
  int64_t longest_skipped_run = 0;
  bool graph = false;  // the update ran as a graph, recorded or replayed (LambOptions::graph)
};

class Lamb {
 public:
  // params: the parameter table in any order; rows may leave gaps (alignment) but must not
  // overlap or leave [0, num_elems). Throws Error naming the offending tensor. The state (m, v
  // and the norms) is the backend's memory; the table stays on the host (Backend::lamb_step).
  // shard (optional): this rank's part of a sharded optimizer; it may cut tensors, and own
  // nothing.
  Lamb(Backend& backend, std::vector<LambParam> params, int64_t num_elems,
       const LrSchedule& schedule, const LambOptions& options = {},
       const LambShard* shard = nullptr);

  Lamb(const Lamb&) = delete;
  Lamb& operator=(const Lamb&) = delete;

  // One update from the gradient of the whole global batch: params (fp32 master weights) and
  // grads f32 [num_elems] on the backend's device. Afterwards grads is zero over the range this
  // rank owns (the whole buffer, gaps included, when not sharded), ready for the next step's
  // accumulation; sharded, the rest of grads (after a reduce-scatter: this rank's unreduced
  // sums of the other ranks' ranges) is the caller's to zero. Elements outside every table
  // row must be zero in grads: they count in the norm.
  // Mixed precision: params_lowp (bf16 / f16 [num_elems], optional) is the GEMMs' weight copy,
  // rewritten as round(params) in the update's own pass (left alone by a skipped step).
  // grad_scale: grads hold the gradient of the loss times this (fp16 loss scaling); the update
  // divides it out, and LambStepInfo::grad_norm is the unscaled norm. 1 for fp32 / bf16: the
  // plain step, bit for bit.
  // read_back: read the gradient norm and the skip record back after the update (a 16-byte
  // copy: on a GPU it waits for the stream; a non-finite norm has left the weights and moments
  // as they were). Without it the step never waits; see LambOptions for what a non-finite
  // gradient does then.
  // also_read: other host reads (Backend::read) to make in the same wait, after the update is
  // issued (the trainer's loss sums); with read_back false they are the step's only wait.
  // Sharded, params may instead hold the shard's range only (f32 [end - begin]: a replica
  // that keeps only its shard of the master weights).
  LambStepInfo step(const Tensor& params, const Tensor& grads, const Tensor& params_lowp = {},
                    float grad_scale = 1.0f, bool read_back = true,
                    const std::vector<Backend::HostRead>& also_read = {});

  // ---- state, for checkpoints ----------------------------------------------------------------
  int64_t steps_done() const { return steps_done_; }
  // Steps whose update ran as a graph (LambOptions::graph: recorded or replayed).
  int64_t graph_steps() const { return graph_steps_; }
  // The next update is steps_done + 1 (bias correction and schedule both follow it).
  void set_steps_done(int64_t steps);
  // A schedule in tokens (LrScheduleConfig::unit): the tokens trained once the next update is
  // made, its position in the schedule. Set before each step; unused for a schedule in steps.
  void set_schedule_tokens(int64_t tokens) { schedule_tokens_ = tokens; }
  // Views of the moments on the backend's device: f32 [shard_end() - shard_begin()], element i
  // the moment of parameter shard_begin() + i (the whole buffer when not sharded).
  const Tensor& m() const { return m_; }
  const Tensor& v() const { return v_; }
  // Copies between the moments and host arrays of num_elems floats: of the range this rank
  // owns (the rest of the arrays is neither written nor read).
  void save_moments(float* m_host, float* v_host) const;
  void load_moments(const float* m_host, const float* v_host);
  int64_t shard_begin() const { return begin_; }
  int64_t shard_end() const { return end_; }
  bool sharded() const { return static_cast<bool>(shard_.sum_over_ranks); }
  // Bytes of optimizer state this rank holds on the backend's device (m, v, norms, sums,
  // scalars).
  size_t state_bytes() const;
  // The same for a rank owning `len` elements that cut `tensors` of the table's `all_tensors`
  // non-empty ones (any rank's, from the cut alone).
  static size_t state_bytes_for(int64_t len, int64_t tensors, int64_t all_tensors, bool sharded);
  // The tensors (or their pieces) this rank updates, sorted by offset (the order of
  // tensor_norms()), offsets and sizes in the whole buffer, clipped to the shard.
  const std::vector<LambParam>& params() const { return params_; }
  // f32 [2T] on the device: ||w|| (before the last step) then ||u|| of each tensor params()
  // lists (of the whole tensor, all its pieces, when sharded).
  const Tensor& tensor_norms() const { return norms_; }

  const LrSchedule& schedule() const { return schedule_; }
  const LambOptions& options() const { return options_; }
  int64_t num_elems() const { return num_elems_; }

 private:
  Backend& backend_;
  std::vector<LambParam> params_;
  int64_t num_elems_;
  LambShard shard_;
  int64_t begin_ = 0, end_ = 0;  // the range this rank owns
  LrSchedule schedule_;
  LambOptions options_;
  int64_t steps_done_ = 0;
  int64_t schedule_tokens_ = 0;

  std::vector<LambTensor> host_table_;  // offsets relative to begin_
  Tensor table_;                        // host_table_ as the op's i64 [T, 3]
  // scalars_: the global norm (f32) then the skip record (i32 [3]), read back in one copy.
  BackendBuffer m_buffer_, v_buffer_, scalars_, norms_buffer_;
  BackendBuffer squares_;  // sharded: this rank's sum of squared gradients (f64 [1])
  // The per-tensor sums of squares (w, u) of every tensor of the table, f64 [T_all, 2]: the
  // rows of this rank's pieces at sums_first_; sharded, the rest zero and summed over ranks.
  BackendBuffer sums_buffer_;
  int64_t sums_first_ = 0;
  Tensor m_, v_, grad_norm_, record_, norms_, sums_all_, sums_;  // their views
  int64_t skips_seen_ = 0;                                       // record[0] at the last read
  // LambOptions::graph: the update's graph, keyed by the buffers it reads (GraphCache of one:
  // recorded again when they change), and its step scalars (f32 [4]; not state).
  struct UpdateKey {
    const void* params = nullptr;
    const void* grads = nullptr;
    const void* lowp = nullptr;
    auto fields() const { return std::tie(params, grads, lowp); }
    bool operator==(const UpdateKey& o) const { return key_equal(*this, o); }
  };
  GraphCache<UpdateKey> graph_;
  int64_t graph_steps_ = 0;
  BackendBuffer step_scalars_;
};

}  // namespace packbert
