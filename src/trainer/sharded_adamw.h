#pragma once
// ShardedAdamW: AdamW whose state is split across the ranks of a data-parallel group
// (trainer.shard; ZeRO stages 1 and 2, docs/distributed.md "Sharded optimizer state").
//
// The parameters, in NamedParameters() order, are viewed as one flat float32 vector of `total`
// elements, padded to ranks * chunk with chunk = ceil(total / ranks). Rank r owns the slice
// [r * chunk, min((r + 1) * chunk, total)): it keeps the AdamW moments of that slice only, and
// updates only that slice of the weights, which the ranks then exchange (all-gather) so that
// every rank ends the step with the same full weights. Per-parameter step counts are small and
// kept on every rank.
//
// Two modes:
// - kOptimizer (ZeRO-1): gradients are all-reduced as without sharding (grad_reducer.h, bucketed
//   and overlapped with backward); each rank then takes its slice of the summed gradient.
// - kGradients (ZeRO-2): before the step's backward passes the parameters' gradients become views
//   of one flat buffer (BeginStep); after them that buffer is reduce-scattered, so each rank
//   receives only its slice of the sum, and the full-size buffer is released. Between steps a
//   rank holds its gradient slice and its moments: (1 + 2) * chunk floats instead of 3 * total.
//
// The update is element for element the one torch::optim::AdamW makes (decoupled weight decay,
// bias-corrected moments, eps 1e-8), so one rank with sharding equals the unsharded optimizer to
// the last bit and N ranks equal it up to the order in which gradients are summed.
//
// Thread-safety: none; the trainer calls it from its one thread, outside backward passes (the
// flat gradient buffer is written by autograd during them).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "gyre/status.h"

namespace gyre::trainer {

// trainer.shard. kParameters (ZeRO-3) is trainer/parameter_shards.h; its trainer keeps the AdamW
// state of its parameter slices in a one-rank ShardedAdamW (kOptimizer) over those slices.
enum class Shard { kNone, kOptimizer, kGradients, kParameters };
const char* ShardName(Shard s);
// "none", "optimizer", "gradients" or "parameters"; InvalidArgument otherwise.
StatusOr<Shard> ParseShard(const std::string& name);

// Which slice of the flat parameter vector a rank owns.
struct ShardLayout {
  int rank = 0;
  int ranks = 1;
  int64_t total = 0;  // float32 elements of all parameters
  int64_t chunk = 0;  // ceil(total / ranks): every rank's slot in the padded flat buffers
  int64_t begin = 0;  // this rank's slice [begin, end) of the flat vector
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
// The layout of rank `rank` of `ranks` over parameters of `numels` elements.
ShardLayout PlanShards(const std::vector<int64_t>& numels, int rank, int ranks);

// Sum of squares of a float32 tensor, in float64 a million elements at a time (a float64 copy
// of a large gradient slice would be the biggest allocation of a step).
double SquaredSum(const at::Tensor& v);

class ShardedAdamW {
 public:
  struct Hyper {
    double weight_decay = 0.0;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
  };
  // `params`: float32 leaf tensors, contiguous, all on one device. Starts with no state (every
  // step count 0, moments zero) as rank `rank` of `ranks`.
  ShardedAdamW(std::vector<at::Tensor> params, Shard mode, Hyper hyper, int rank, int ranks);
  ~ShardedAdamW();
  ShardedAdamW(const ShardedAdamW&) = delete;
  ShardedAdamW& operator=(const ShardedAdamW&) = delete;

  Shard mode() const { return mode_; }
  const ShardLayout& layout() const { return layout_; }
  // True once any parameter has a step count above zero.
  bool has_state() const;

  // Start of an optimizer step's backward passes: kGradients makes every parameter's gradient a
  // zeroed view of the flat buffer; kOptimizer drops the gradients (autograd creates them).
  void BeginStep();
  // After the backward passes. kOptimizer: the gradients already hold the sum over ranks (the
  // reducer ran); copies this rank's slice. kGradients: reduce-scatters the flat buffer over
  // `comm` (null or one rank: no collective) and releases it. Either way the gradient slice is
  // then this rank's part of the summed gradient.
  Status ReduceGradients(comm::Communicator* comm, double timeout_s);
  // This rank's gradient slice itself ([chunk], float32): a caller that sums the gradients on its
  // own (trainer.shard: parameters) writes it during the step instead of calling
  // ReduceGradients.
  const at::Tensor& gradient_slice() const { return grad_; }
  // Sum of squares of this rank's gradient slice (the ranks' values add up to the global norm²).
  // `weights` (one per parameter, or empty for all 1): each parameter's squares count that many
  // times (tensor parallelism counts a parameter every slice holds whole 1/T times per slice).
  double LocalSquaredNorm(const std::vector<double>& weights = {}) const;
  // Multiplies the gradient slice by `scale` (global-norm clipping).
  void ScaleGradients(double scale);
  // One AdamW step at `lr` on this rank's slice of the weights (every step count + 1).
  void Update(double lr);
  // Every rank's updated slice to every rank (no collective for one rank).
  Status GatherWeights(comm::Communicator* comm, double timeout_s);
  // Drops the parameters' gradients and the flat buffer (a failed or finished step).
  void ReleaseGradients();
  // Back to no state: step counts 0, moments zero.
  void Reset();

  // The state, as copies on the CPU: per-parameter step counts and this rank's moment slices
  // (float32, layout().size() elements).
  struct State {
    std::vector<int64_t> steps;
    at::Tensor exp_avg, exp_avg_sq;
  };
  State Get() const;
  // The state itself, not copies: this rank's moments [layout().size()] and the step counts.
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const std::vector<int64_t>& steps() const { return steps_; }
  // Writes `m` and `v` (float32 vectors of one length) over this rank's moments from element
  // `offset`, and replaces the step counts (one per parameter): the state restored a piece at a
  // time, without a second copy of it. The caller checked the sizes.
  void SetMomentRange(int64_t offset, const at::Tensor& m, const at::Tensor& v);
  void SetSteps(const std::vector<int64_t>& steps);
  // Replaces the state; checked first (counts, sizes, dtypes), nothing changes on a mismatch.
  Status Set(const State& state);
  // Replaces the state from every parameter's whole moments (each of the parameter's shape or
  // undefined for zeros), keeping this rank's part; checked first like Set.
  Status SetFromWhole(const std::vector<int64_t>& steps, const std::vector<at::Tensor>& exp_avg,
                      const std::vector<at::Tensor>& exp_avg_sq);
  // Parameter `param`'s moment (exp_avg, or exp_avg_sq when `second`) as a float32 tensor of the
  // parameter's shape holding this rank's part and zeros elsewhere: summed over the ranks, the
  // whole moment.
  at::Tensor MomentPart(size_t param, bool second) const;

  // Bytes this rank holds between steps: the moments, and the gradients (the full gradients for
  // kOptimizer, whose parameters keep them; the slice for kGradients).
  int64_t optimizer_state_bytes() const;
  int64_t gradient_bytes() const;

 private:
  // Calls fn(param index, offset in the parameter, offset in the slice, length) for each piece of
  // a parameter inside this rank's slice, in order.
  template <typename Fn>
  void ForEachSegment(Fn fn) const;
  // A float32 buffer of `n` elements on the device collectives run on.
  at::Tensor CommBuffer(int64_t n, comm::Communicator* comm) const;

  const std::vector<at::Tensor> params_;
  const Shard mode_;
  const Hyper hyper_;
  ShardLayout layout_;
  std::vector<int64_t> offsets_;  // per parameter: its first element in the flat vector
  std::vector<int64_t> steps_;
  at::Tensor exp_avg_, exp_avg_sq_;  // [layout_.size()], the parameters' device
  at::Tensor grad_;                  // [layout_.chunk], this rank's summed gradient slice
  at::Tensor flat_grad_;             // kGradients, during a step: [ranks * chunk]
};

}  // namespace gyre::trainer
