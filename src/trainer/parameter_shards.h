#pragma once
// Fully sharded parameters (trainer.shard: parameters; ZeRO stage 3, as FSDP does it;
// docs/distributed.md "Fully sharded parameters").
//
// The model's parameters are grouped into units (model::ParameterUnits: the embedding, each
// decoder layer, the final norm with the LM head). Each unit is viewed as one flat float32 vector
// of `total` elements, padded to ranks * chunk with chunk = ceil(total / ranks); rank r owns
// elements [r * chunk, (r + 1) * chunk) of every unit: its float32 master weights (`masters()`,
// the tensors the optimizer updates), their gradient and, in the trainer, their AdamW moments.
// No rank holds a whole unit between passes.
//
// A forward (model::Transformer::Gathered over a ParameterShards) asks for each unit just before
// it computes with it (Acquire): the ranks all-gather the unit's slices, cast to the compute
// dtype, into one flat buffer, and the unit's parameters are views of it. While a unit computes,
// the next one is gathered (prefetch). When the unit's forward is done (Release) the buffer's
// memory is returned; when its backward is about to start (a hook on the unit's output) the unit
// is gathered again into the same buffer, and the one before it is prefetched. As soon as
// autograd has the gradients of all of a unit's parameters, they are reduce-scattered (summed
// over the ranks in float32, each rank receiving its slice, added to its gradient shard) straight
// from those tensors, through a staging of at most set_reduce_staging_bytes() a segment at a
// time, while the backward goes on with the units below, and the unit's buffer is freed; one of
// those is in flight at a time, so a backward quicker than the links does not pile up whole
// gradients. The last unit stays gathered from its forward to its backward (its output is the
// forward's output). With set_reshard_after_forward(false) (trainer.reshard_after_forward) every
// unit of a pass that will run backward stays gathered from its forward to its backward instead:
// no second all-gather, at the cost of the whole model in the compute dtype during the pass.
//
// Every collective runs on one thread (CollectiveQueue) in the order the passes ask for them,
// which is the same on every rank as long as every rank runs the same passes: the same number of
// forwards and backwards, each over every unit (the trainer pads a rank that has fewer
// micro-batches with empty ones). EndPass() after each pass waits for the queue and frees what
// is still gathered.
//
// Thread-safety: Acquire, Release, EndPass and the gradient accessors are called from the
// trainer's thread and from autograd's (hooks and backward functions: the caller's thread for CPU
// tensors); one pass at a time.

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "gyre/status.h"
#include "model/transformer.h"
#include "trainer/sharded_adamw.h"

namespace gyre::trainer {

// Runs collectives on one thread, in the order they are posted. After a task fails, the tasks
// after it are not run and report the first failure (the communicator is aborted by then,
// comm/communicator.h). Shared by every ParameterShards of one group (the policy and the KL
// reference), so that their collectives never overlap.
class CollectiveQueue {
 public:
  using Task = std::function<Status(comm::Communicator* comm, comm::Deadline deadline)>;
  // comm (not owned) may be null: one process, the tasks run with a null communicator.
  CollectiveQueue(comm::Communicator* comm, double timeout_s);
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // After every posted task: runs the next ones over `comm` (a group formed again, of the same
  // rank and size) and forgets an earlier failure.
  Status Rebind(comm::Communicator* comm);

  // Queues `task` (described by `what` in errors); returns its ticket.
  int64_t Post(std::string what, Task task);
  // Waits for the task with `ticket` and returns its Status (the first failure when an earlier
  // task failed).
  Status Wait(int64_t ticket);
  // Waits for every task posted so far; the first failure, if any.
  Status Drain();
  // Seconds this queue's thread spent inside collectives, and seconds callers spent waiting for
  // them (the part not hidden behind compute), since construction.
  double busy_seconds() const;
  double wait_seconds() const;

 private:
  void Loop();

  comm::Communicator* comm_;  // guarded by mu_
  const int rank_, ranks_;
  const double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, Task>> queue_;
  int64_t posted_ = 0;
  int64_t done_ = 0;
  bool stop_ = false;
  Status first_error_;
  double busy_s_ = 0, wait_s_ = 0;
  std::thread thread_;
};

class ParameterShards final : public model::ParameterGather {
 public:
  // This rank's slices of `weights` (the whole model in NamedParameters() order, any device and
  // floating dtype; checked against `units`, model::ParameterUnits(spec) when empty) as float32
  // masters on `device`. A tensor-parallel trainer passes its slices' units
  // (model::TensorParallelUnits) and its slices as `weights`: "whole" below then means the whole
  // slice. Units gather in `compute` (float32, bfloat16 or float16). trainable: the masters
  // require grad and the backward reduce-scatters their gradients; otherwise (the KL reference)
  // forwards only. `queue` (not owned) must outlive this object.
  static StatusOr<std::unique_ptr<ParameterShards>> Create(
      const model::ModelSpec& spec, const model::NamedTensors& weights, CollectiveQueue* queue,
      at::ScalarType compute, const at::Device& device, bool trainable,
      std::vector<model::ParameterUnit> units = {});
  // Another set of shards with copies of these masters (same layout), not trainable.
  std::unique_ptr<ParameterShards> FrozenCopy() const;
  ~ParameterShards() override;

  std::vector<at::Tensor> Acquire(int unit) override;
  void Release(int unit, const at::Tensor& output) override;
  // After a forward (and its backward, if any): waits for the queued collectives, frees every
  // gathered unit, and returns the first communication failure.
  Status EndPass();

  const model::ModelSpec& spec() const { return spec_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  const model::ParameterUnit& unit(int u) const { return units_[u].def; }
  const ShardLayout& layout(int u) const { return units_[u].layout; }
  // Per unit: this rank's float32 master slice [chunk] (zero past the unit's end).
  const std::vector<at::Tensor>& masters() const { return masters_; }
  // Per unit, during a step: this rank's slice [chunk] of the gradient summed over the ranks,
  // added to by every backward since BeginStep().
  const std::vector<at::Tensor>& gradients() const { return grads_; }
  // Zeroes `flat` (float32, as many elements as the masters together, on their device) and makes
  // the units' gradient slices views of it, in unit order; an undefined `flat`: new buffers.
  void BeginStep(const at::Tensor& flat = at::Tensor());
  void ReleaseGradients();

  // The whole float32 weights of unit `u` in ParameterUnits order, gathered from every rank (a
  // collective: every rank calls it in the same order). On `device` of the shards; views of one
  // buffer that lives as long as any of them.
  StatusOr<std::vector<at::Tensor>> GatherUnit(int u);
  // The same for any per-rank float32 slice of unit `u`'s layout ([chunk], e.g. an AdamW moment
  // of the masters): the whole unit's tensors, gathered from every rank (a collective).
  StatusOr<std::vector<at::Tensor>> GatherUnitSlices(int u, const at::Tensor& slice);
  // Elements [begin, begin + out.numel()) of unit `u`'s flat weights (its tensors in order, as
  // GatherUnit lays them out) into `out`: 1-D, contiguous, on the shards' device, in any float
  // dtype, on every rank (a collective: every rank calls it with the same range and dtype). Each
  // rank owning part of the range converts that part to out's dtype and broadcasts it, so no rank
  // holds more of the unit than the range: how a version is published a bucket at a time.
  Status GatherRange(int u, int64_t begin, const at::Tensor& out);
  // This rank's slice [chunk] of unit `u` cut from whole tensors of that unit (ParameterUnits
  // order and shapes, any float dtype and device, e.g. views of a checkpoint file; an undefined
  // tensor is zero), float32 on the shards' device, zero past the unit's end. Only the slice's
  // elements are read.
  StatusOr<at::Tensor> SliceOf(int u, const std::vector<at::Tensor>& whole) const;
  // Replaces this rank's slices with those of `weights` (whole, NamedParameters() order); checked
  // first, nothing changes on a mismatch.
  Status SetWeights(const model::NamedTensors& weights);

  // Sum of squares of this rank's part of the units' gradient slices in `flat` (the slices of
  // every unit in order, `chunk` elements each, as BeginStep lays them out), each parameter's
  // squares counted weight(its name) times.
  double WeightedSquaredNorm(const at::Tensor& flat,
                             const std::function<double(const std::string&)>& weight) const;

  // The float32 staging through which a unit's gradients are reduce-scattered, a segment of every
  // rank's chunk at a time (trainer.grad_bucket_mb; 32 MiB unless set). At least one element per
  // rank is sent at a time.
  void set_reduce_staging_bytes(int64_t bytes) {
    reduce_staging_elements_ = std::max<int64_t>(1, bytes / 4);
  }
  // false: a unit whose forward output will be differentiated stays gathered until its
  // backward (no all-gather before the backward); true (the default): freed after its forward.
  void set_reshard_after_forward(bool reshard) { reshard_after_forward_ = reshard; }
  bool reshard_after_forward() const { return reshard_after_forward_; }
  // All-gathers of units posted since this object was made (the backward's included).
  int64_t gathers() const { return gathers_; }

  // Bytes held: master slices, gradient slices (during a step), gathered units right now.
  int64_t master_bytes() const;
  int64_t gathered_bytes() const;

 private:
  struct Unit {
    model::ParameterUnit def;
    std::vector<int64_t> numels;
    ShardLayout layout;
    at::Tensor full;        // compute dtype [ranks * chunk]; its storage is freed when not gathered
    int64_t ticket = -1;    // the all-gather in flight or done, -1 when not gathered
    bool acquired = false;  // by the current pass (prefetch goes to units not yet)
    bool regather = false;  // released with a backward still to come
  };
  ParameterShards(const model::ModelSpec& spec, CollectiveQueue* queue, at::ScalarType compute,
                  const at::Device& device, bool trainable);
  // Posts the all-gather of unit `u` unless it is gathered or in flight.
  void StartGather(int u);
  // StartGather, then waits for it; throws on a failed collective.
  void FinishGather(int u);
  void Free(int u);
  // From the hook on a released unit's output: gather it again, prefetch the one below.
  void BeforeBackward(int u);
  // From the autograd function's backward: the gradient of each of the unit's parameters
  // (undefined: zero), reduce-scattered into its gradient slice straight from these tensors, a
  // segment of every rank's chunk at a time, without a packed copy of the whole unit.
  void OnGradient(int u, std::vector<at::Tensor> grads);
  at::Tensor FlatView(int u) const;
  // The unit's parameters as views of its gathered buffer, shaped.
  std::vector<at::Tensor> Pieces(int u) const;

  friend class GatherUnitFunction;

  const model::ModelSpec spec_;
  CollectiveQueue* const queue_;
  const at::ScalarType compute_;
  const at::Device device_;
  const bool trainable_;
  std::vector<Unit> units_;
  std::vector<at::Tensor> masters_;
  std::vector<at::Tensor> grads_;
  // Reduce-scatters posted and not yet waited for, oldest first. Each holds a unit's
  // gradients until it has run, so the backward waits before it has more than
  // kReducesInFlight of them (a backward faster than the links would otherwise hold the
  // gradients of every unit at once).
  std::deque<int64_t> reduces_;
  static constexpr size_t kReducesInFlight = 1;
  // Elements of the float32 staging a reduce-scatter sends at a time (all ranks' segments).
  int64_t reduce_staging_elements_ = (int64_t{32} << 20) / 4;
  bool reshard_after_forward_ = true;
  int64_t gathers_ = 0;
};

}  // namespace gyre::trainer
