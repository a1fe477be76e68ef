#pragma once
// PolicyTrainer: owns the policy model and its AdamW optimizer and performs one optimizer step
// per batch, for either the clipped policy-gradient objective (GRPO family) or supervised
// fine-tuning (the warm-up). Log-probs are recomputed here at the sampling temperature.
//
// With mini_batches = 1 a batch is one optimizer step, and the old policy is the current one:
// logp_old is the detached logp of the same forward (ratio 1). With mini_batches = M > 1
// (PPO-style) the trainer first recomputes logp_old for the whole batch, then takes M steps on
// consecutive slices, so the clip bounds how far the later steps move. Each optimizer step
// counts as one policy version. Within a step, samples go through micro-batches of
// `micro_batch_size` sequences whose loss uses the step-wide denominators (token or sequence
// count), so the accumulated gradient equals that of one big batch.
//
// Data parallel (SetDataParallel): M trainer processes each call Step with their shard of the
// same global batch. The step-wide denominators, the gradients (in fixed-size buckets) and the
// logged sums are all-reduced, so every rank takes the same AdamW step as one trainer would on
// the whole batch (up to floating-point summation order): the token-mean is over the global
// batch, not a mean of per-rank means. Mini-batch boundaries then come from the controller
// (TrainOptions::mini_batch_sizes), so each optimizer step sees the same global mini-batch.
// By default the gradient buckets are all-reduced during the backward pass of each optimizer
// step's last micro-batch, by a communication thread (grad_reducer.h); earlier micro-batches
// only accumulate locally.
//
// A failed Step changes nothing: the weights, the AdamW state (moments and step counts) and the
// version are either all updated or all as before the call, on every rank. With one optimizer
// step per batch that holds because every check (collectives, the rank count, the gradient
// norm) comes before the one AdamW update. With mini_batches > 1 the earlier mini-batches are
// applied before a later one can fail, so Step first copies the weights and the AdamW state
// (three tensors per parameter, kept between steps on the parameter's device) and restores the
// copy on any failure of any mini-batch. Every rank sees a failure in the same mini-batch (a
// short rank count, a failed collective, or a non-finite norm of the same summed gradient), so
// every rank rolls back (docs/distributed.md). One exception: with trainer.shard, a failure of the
// all-gather that follows the update leaves this rank's slice updated and the rest not; the
// group is aborted by then and the error says to resume from the last checkpoint.
//
// Not thread-safe: one caller at a time (the trainer service serialises calls). With overlapped
// gradient reduction the trainer owns one extra thread, which uses the communicator only inside
// Step.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "gyre/config.h"
#include "gyre/status.h"
#include "kernels/reference/policy_loss_ref.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "trainer/parameter_shards.h"
#include "trainer/sharded_adamw.h"

namespace gyre::comm {
class CommTensorParallel;  // comm/tensor_parallel_group.h
}  // namespace gyre::comm

namespace gyre::trainer {

struct TrainSample {
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  std::vector<float> rollout_logprobs;  // behaviour log-probs (may be empty for SFT)
  std::vector<float> loss_mask;         // per response token; empty = all ones
  std::vector<float> old_logprobs;      // filled by the trainer for PPO-style mini-batches
  // Policy version that produced each response token (rollout); needed by Proximal::kLogLinear.
  std::vector<int64_t> versions;
  float advantage = 0.0f;
};

enum class Objective { kPolicyGradient, kSft };

// The policy the clipped ratio is taken against (logp_old; docs/algorithms.md, "Off-policy
// corrections"). kRecompute: the trainer's policy before the step (the same forward's log-probs
// with one optimizer step per batch, a no-grad forward of the batch before the first update
// otherwise). kLogLinear: that policy approximated per token from the behaviour and current
// log-probs by versions (kernels::LogLinearProximalAlpha), with no extra forward. kBehaviour: the
// rollout policy itself (coupled PPO).
enum class Proximal { kRecompute, kLogLinear, kBehaviour };

struct TrainOptions {
  int64_t micro_batch_size = 64;
  int64_t mini_batches = 1;  // optimizer steps per policy-gradient batch
  double grad_clip = 1.0;
  double temperature = 1.0;
  kernels::PolicyLossParams loss;
  Proximal proximal = Proximal::kRecompute;
  // Correction::kM2po: the trainer sets loss.m2po_threshold from this bound on the mean squared
  // log weight, over the whole batch (every rank).
  double m2po_tau = 0.04;
  // Entropy bonus (policy gradient): the loss subtracts entropy_coef times the token entropy of
  // the policy at `temperature`, aggregated with loss.agg's weights. 0 = off (no extra graph).
  double entropy_coef = 0.0;
  // A policy loss registered through include_torch/gyre/torch.h (RegisterPolicyLoss), by name, in
  // place of loss.kind's term: its per-token loss is aggregated with loss.agg's weights and
  // differentiated by autograd. Empty = loss.kind.
  std::string user_loss;
  // Data parallel only: this rank's share of each global mini-batch (sums to the batch size).
  // Empty: the batch is split into `mini_batches` consecutive slices locally.
  std::vector<int64_t> mini_batch_sizes;
  // Start this step from a fresh AdamW state (no moments, step counts 0). Part of the step: a
  // failed step restores the state it dropped.
  bool reset_optimizer_state = false;
};

struct DataParallelOptions {
  int64_t bucket_bytes = 32 << 20;  // gradient all-reduce bucket size (at least 1 KiB is used)
  double timeout_s = 600;           // deadline of each collective
  // All-reduce gradient buckets while the last micro-batch's backward pass runs (true), or all
  // of them after it (false). Same buckets, same order, same result either way.
  bool overlap_grad_reduce = true;
  // trainer.shard: parameters: free each gathered unit after its forward (true) or keep it until
  // its backward (false; ParameterShards::set_reshard_after_forward).
  bool reshard_after_forward = true;
};

class GradReducer;
struct StepSums;  // OptimizerStep's stages (policy_trainer.cc)
struct StepPlan;

// trainer.prompt_sharing: whether a packed micro-batch lays out the samples that share a prompt
// (a GRPO group) as one copy of the prompt followed by each sample's response (PackedBatch's
// trunks), so the prompt's tokens are computed once per group instead of once per sample.
// kAuto shares when an estimate of the forward's cost (linear layers per token computed,
// attention per score computed) is lower that way and the attention scores held grow at most
// 2x; kOn whenever a micro-batch has two samples with the same prompt; kOff never.
enum class PromptSharing { kAuto, kOn, kOff };

// Sequence packing's layout: sequences of `lengths` tokens placed into rows of `width` (>= the
// longest), first fit, longest first. Returns each sequence's (row, column); *rows gets the
// number of rows used (at least 1).
std::vector<std::pair<int64_t, int64_t>> PackFirstFit(const std::vector<int64_t>& lengths,
                                                      int64_t width, int64_t* rows);

class PolicyTrainer {
 public:
  PolicyTrainer(std::unique_ptr<model::Transformer> model, double lr, double weight_decay,
                double beta1, double beta2);
  ~PolicyTrainer();

  // One optimizer step on `batch` at learning rate `lr` (mini_batches of them for a PPO-style
  // policy-gradient batch). All or nothing: on any error (a malformed sample: empty response,
  // mask/logprob length mismatch, ids out of range, sequence longer than max_seq_len; a
  // non-finite gradient norm; a failed collective or a missing data-parallel rank, in any
  // mini-batch) the weights, the AdamW state and version() are as before the call; an exception
  // from libtorch also rolls back before it leaves. Metrics: loss, grad_norm, tokens, clip_frac,
  // approx_kl, entropy, and for SFT token accuracy.
  StatusOr<std::map<std::string, double>> Step(const std::vector<TrainSample>& batch,
                                               Objective objective, double lr,
                                               const TrainOptions& options);

  // KL to the reference policy in the reward (algorithm.kl_in: reward): per sample, the sum over
  // its response tokens with loss mask 1 of the estimator `kind` (k1/k2/k3, as the loss kernel
  // defines them) of logp - logp_ref, logp under the current weights at `temperature`, in
  // micro-batches of `micro_batch_size`. Freezes the reference first when there is none. Same
  // sample checks as Step; no gradient, no change to the weights.
  StatusOr<std::vector<double>> SequenceKl(const std::vector<TrainSample>& batch,
                                           kernels::KlKind kind, double temperature,
                                           int64_t micro_batch_size);

  // Joins a data-parallel group: from now on every Step all-reduces over `comm` (not owned; it
  // must outlive the trainer's use of it, or the next SetDataParallel call), as `options` say.
  // nullptr returns to single-process training. A sharded trainer (SetSharding) takes its slice
  // of the optimizer state for its rank; that needs the state to be empty or the group to be the
  // same size with the same rank (FailedPrecondition otherwise: the other slices live on other
  // ranks; save a checkpoint and load it into the new group, which reshards it).
  Status SetDataParallel(comm::Communicator* comm, const DataParallelOptions& options);

  // Tensor parallelism (trainer.tensor_parallel; model/tensor_parallel.h): this trainer becomes
  // rank comm->rank() of comm->size() ranks that hold slices of one model and compute every
  // forward and backward together over `comm` (not owned; it must outlive the trainer). The model
  // is replaced by this rank's slices of it; model() is then the slice (NamedParameters() lists
  // the slices; FullWeights() gathers them whole). Log-probs, entropies and accuracies are
  // computed over the vocabulary slices (VocabParallelTokenStats) and the gradient norm over every
  // slice. Every rank of `comm` must get the same batches and call Step, SequenceKl and
  // FullWeights together. Composes with SetDataParallel, whose group is then the ranks holding the
  // same slice (workers = DP x TP), and with SetSharding, which then splits the slices' optimizer
  // state (kOptimizer, kGradients) or the slices themselves (kParameters: each unit of this
  // rank's slices, model::TensorParallelUnits) over that group. Only before the first step and
  // the split, with no reference yet (FailedPrecondition otherwise); InvalidArgument when the
  // model does not split
  // (CheckTensorParallel). A group of one rank (or null) changes nothing.
  Status SetTensorParallel(comm::Communicator* comm, double timeout_s);
  // This trainer's tensor-parallel rank and the group's size (0 and 1 without one).
  int tp_rank() const { return tp_group_ != nullptr ? tp_group_->rank() : 0; }
  int tp_size() const { return tp_group_ != nullptr ? tp_group_->size() : 1; }
  // Another communicator for the same tensor-parallel rank and size (a group formed again after
  // a failure); FailedPrecondition for another layout.
  Status RebindTensorParallel(comm::Communicator* comm);
  // Whether no rank holds the whole model: shard parameters once split, or tensor parallel. Then
  // checkpoints, HF directories and published versions are gathered unit by unit (GatherUnits,
  // GatherUnitWeights: collectives of every rank) and a state is restored from whole tensors
  // (RestoreSplitState, RestoreReference: each rank reads its slices).
  bool holds_slices() const { return shards_ != nullptr || tp_group_ != nullptr; }
  // Whether this rank writes what GatherUnits gathers (data- and tensor-parallel rank 0).
  bool writes_gathered() const { return dp_rank() == 0 && tp_rank() == 0; }
  // holds_slices(): the AdamW steps taken by each unit's parameters (model::ParameterUnits
  // order).
  std::vector<int64_t> UnitSteps() const;

  // trainer.shard: kOptimizer (ZeRO-1) keeps only this rank's slice of the AdamW moments;
  // kGradients (ZeRO-2) also reduce-scatters the gradients and keeps only their slice between
  // steps (sharded_adamw.h); kParameters (ZeRO-3) keeps only this rank's slice of every
  // parameter unit, its gradient and its moments, and gathers each unit whole only while a
  // forward or backward computes with it (parameter_shards.h). The update equals the unsharded
  // one up to summation order. Only before the first optimizer step (FailedPrecondition
  // otherwise).
  //
  // With kParameters the whole model stays as it was given until the first Step, SequenceKl or
  // FreezeReference (so RestoreState and RestoreReference may load a checkpoint first); then it
  // is split into this rank's slices (of the group SetDataParallel joined) and let go: model()
  // becomes a model that gathers its parameters (NamedParameters() empty; FullWeights() gathers
  // them), and the group can no longer change size. Every rank must then call Step, SequenceKl
  // and FullWeights together: each of their forwards gathers from every rank. OptimizerState,
  // RestoreState and RestoreShardedState are FailedPrecondition once split.
  Status SetSharding(Shard mode);
  Shard sharding() const { return shard_mode_; }
  // kParameters: the whole float32 weights in NamedParameters() order, gathered unit by unit from
  // every rank (a collective). Otherwise a copy of the model's parameters.
  StatusOr<model::NamedTensors> FullWeights();
  // kParameters after the split: this rank's slices; null otherwise.
  const ParameterShards* parameter_shards() const { return shards_.get(); }
  // kParameters: one unit of the model (model::ParameterUnits), gathered whole (GatherUnits).
  struct GatheredUnit {
    int index = 0;
    const model::ParameterUnit* def = nullptr;    // its parameters' names and shapes
    std::vector<at::Tensor> weights;              // float32
    int64_t step = 0;                             // AdamW steps taken by its parameters
    std::vector<at::Tensor> exp_avg, exp_avg_sq;  // when asked for and step > 0
    std::vector<at::Tensor> reference;            // the KL reference's weights, when there is one
  };
  // holds_slices(): gathers the model unit by unit, in ParameterUnits order (which
  // is NamedParameters() order), and hands each unit to `visit` before gathering the next, so
  // that no rank ever holds more than one unit whole: how a checkpoint or an HF directory is
  // written from slices. A collective: every rank of the group calls it. `moments`: also the
  // AdamW moments. After `visit` fails the remaining units are still gathered (the other ranks
  // go on) but not visited; the first failure is returned.
  Status GatherUnits(bool moments, const std::function<Status(const GatheredUnit&)>& visit);
  // kParameters: splits the whole model into this rank's slices now (over the group
  // SetDataParallel joined), as the first Step would; a no-op otherwise or once split. A job's
  // trainers split before their first publish, so that no trainer keeps the whole model longer.
  Status SplitParameters() { return ShardParameters(); }
  // holds_slices(): the whole float32 weights of unit `u` (ParameterUnits order), a collective
  // like GatherUnits.
  StatusOr<std::vector<at::Tensor>> GatherUnitWeights(int u);
  // Whether GatherUnitRange serves this trainer: shard parameters (split), not tensor parallel.
  bool gathers_ranges() const { return shards_ != nullptr && tp_group_ == nullptr; }
  // gathers_ranges(): elements [begin, begin + out.numel()) of unit `u`'s flat weights into
  // `out` (ParameterShards::GatherRange), a collective of every rank. A version is published
  // this way a bucket at a time, so that no rank holds a whole unit to publish it.
  Status GatherUnitRange(int u, int64_t begin, const at::Tensor& out);
  // Tensor parallel (with or without shard parameters): rows [row, row + rows) of the whole
  // float32 tensor `i` of unit `u` (ParameterUnits order; a row is an index of the first
  // dimension), gathered from the ranks holding them, on every tensor-parallel rank (a collective
  // of every rank, as GatherUnitWeights). For a tensor split along its rows (TensorParallelDim 0)
  // the rows must lie inside one rank's range. A version is published this way a few rows at a
  // time, so that no rank holds a whole unit to publish it.
  StatusOr<at::Tensor> GatherWholeRows(int u, int i, int64_t row, int64_t rows);
  // kParameters: seconds the collectives took on their thread, and seconds the trainer waited for
  // them (the part compute did not hide), since the split. Tensor parallel: seconds in its
  // collectives, all waited for (they run on the trainer's thread, between the computations).
  double collective_seconds() const {
    return queue_ ? queue_->busy_seconds() : tp_group_ ? tp_group_->seconds() : 0.0;
  }
  double collective_wait_seconds() const {
    return queue_ ? queue_->wait_seconds() : tp_group_ ? tp_group_->seconds() : 0.0;
  }
  // The sharded optimizer; null when not sharded.
  const ShardedAdamW* sharded() const { return sharded_.get(); }
  // Restores a sharded trainer's state: the weights (as RestoreState), this rank's optimizer
  // slice and the version; all or nothing.
  Status RestoreShardedState(const std::vector<at::Tensor>& weights,
                             const ShardedAdamW::State& state, int64_t version);

  const model::Transformer& model() const { return *model_; }

  // The frozen reference policy of the KL term (TrainOptions::loss.kl): a copy of the weights at
  // the first policy-gradient step that uses the KL term (the model GRPO starts from, after any
  // warm-up), never trained. Null until then.
  const model::Transformer* reference() const { return reference_.get(); }
  // Makes the reference a copy of the current weights (replacing any earlier one).
  void FreezeReference();
  // Replaces the reference with `weights` (one tensor per parameter, in NamedParameters()
  // order); checked first, nothing changes on a mismatch. A checkpoint's reference comes back
  // through here.
  Status RestoreReference(const std::vector<at::Tensor>& weights);
  void DropReference() {
    reference_.reset();
    reference_compute_.reset();
    ref_shards_.reset();
  }
  // Mixed precision (model.dtype): forwards and backwards compute in `dtype` on a cast of the
  // float32 weights, whose gradients, AdamW state and update stay float32; log-probs and losses
  // are float32. float32 (the default) trains the weights directly.
  void SetComputeDtype(at::ScalarType dtype);
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // Sequence packing (trainer.sequence_packing, on by default): a micro-batch's samples are
  // packed end to end into rows as wide as its longest sample (first fit, longest first) with
  // block-diagonal causal attention, and the LM head runs on response positions only. Off: one
  // right-padded row per sample and logits at every position (the eager padded baseline). Both
  // give the same log-probs up to floating-point summation order.
  void SetSequencePacking(bool on) { packing_ = on; }
  bool sequence_packing() const { return packing_; }
  // With sequence packing: shared prompts (PromptSharing; kAuto by default). Same log-probs and
  // gradients up to floating-point summation order.
  void SetPromptSharing(PromptSharing mode) { sharing_ = mode; }
  PromptSharing prompt_sharing() const { return sharing_; }
  // trainer.logprob_chunk_tokens: packed micro-batches compute log-probs and entropies from the
  // LM head's input this many tokens at a time (ops::ChunkedTokenStats), so no [tokens, V] logits
  // tensor is held; 0 materialises the logits (the unchunked baseline).
  void SetLogprobChunkTokens(int64_t n) { chunk_tokens_ = n; }
  // trainer.activation_checkpointing: the training forward keeps only each decoder layer's input
  // and the backward recomputes the layer (model::Transformer::SetActivationCheckpointing): the
  // same update, activation memory one hidden state per layer, about one more forward of work.
  void SetActivationCheckpointing(bool on);
  bool activation_checkpointing() const;
  int64_t version() const { return version_; }

  // AdamW state of one parameter. step 0 = the optimizer has not updated it yet (no moments).
  struct ParamState {
    int64_t step = 0;
    at::Tensor exp_avg;     // float32, the parameter's shape; undefined when step is 0
    at::Tensor exp_avg_sq;  // likewise
  };
  // Per parameter, in model().NamedParameters() order; the tensors are copies. Unsharded
  // trainers only (sharded(): its Get()).
  std::vector<ParamState> OptimizerState() const;
  // Replaces the weights (one tensor per parameter, in NamedParameters() order), the optimizer
  // state and the policy version, all or nothing: on a count, shape or dtype mismatch nothing
  // changes and the error names the parameter. What resuming from a checkpoint needs to continue
  // bit for bit as if never interrupted (the AdamW hyperparameters come from the constructor).
  Status RestoreState(const std::vector<at::Tensor>& weights, const std::vector<ParamState>& state,
                      int64_t version);
  // kParameters or tensor parallel: restores from whole tensors, reading only this rank's slices
  // of them (views of a checkpoint's mapped files will do): the weights and the AdamW state (per
  // parameter in ParameterUnits order; an undefined moment is zero) and the version. A model
  // still whole is split first (over the group SetDataParallel joined). All or nothing once
  // split.
  Status RestoreSplitState(const std::vector<at::Tensor>& weights,
                           const std::vector<ParamState>& state, int64_t version);
  // Data parallel: this trainer's rank and the group's size (0 and 1 without a group).
  int dp_rank() const { return dp_ != nullptr ? dp_->rank() : 0; }
  int dp_size() const { return dp_ != nullptr ? dp_->size() : 1; }

 private:
  Status Validate(const std::vector<TrainSample>& batch, Objective objective,
                  const TrainOptions& options) const;
  // Step and SequenceKl (which catch a kParameters collective failure thrown from a pass).
  StatusOr<std::map<std::string, double>> StepOnce(const std::vector<TrainSample>& batch,
                                                   Objective objective, double lr,
                                                   const TrainOptions& options);
  StatusOr<std::vector<double>> SequenceKlOnce(const std::vector<TrainSample>& batch,
                                               kernels::KlKind kind, double temperature,
                                               int64_t micro_batch_size);
  // kParameters: after a pass that threw, drops the step's gradients and frees what it gathered.
  void AfterFailedPass();
  // One AdamW step on `batch` (all of it, in micro-batches). proximal_version: the version
  // before the Step call (Proximal::kLogLinear's proximal policy).
  StatusOr<std::map<std::string, double>> OptimizerStep(const std::vector<TrainSample>& batch,
                                                        Objective objective, double lr,
                                                        const TrainOptions& options,
                                                        int64_t proximal_version);
  // OptimizerStep's stages, in order: the step's global denominators and loss settings; the
  // forward and backward of every micro-batch, adding up `sums`; the gradients and sums over the
  // ranks; the clipped AdamW update (returns the gradient norm); the step's metrics.
  StatusOr<StepPlan> PlanStep(const std::vector<TrainSample>& batch, Objective objective,
                              const TrainOptions& options);
  Status RunMicroBatches(const std::vector<TrainSample>& batch, Objective objective,
                         const TrainOptions& options, const StepPlan& plan,
                         int64_t proximal_version, StepSums* sums);
  Status SumAcrossRanks(StepSums* sums);
  StatusOr<double> ApplyUpdate(double lr, double grad_clip, double shard_sq);
  std::map<std::string, double> StepMetrics(const StepSums& sums, const StepPlan& plan,
                                            Objective objective, const TrainOptions& options,
                                            double lr, double grad_norm) const;
  // Correction::kM2po: the threshold over the whole batch (every rank's tokens, gathered), from
  // each sample's old_logprobs.
  StatusOr<double> M2poThresholdOf(const std::vector<TrainSample>& batch, double tau);
  // Fills each sample's old_logprobs with the current policy's log-probs (no gradient).
  Status ComputeOldLogprobs(std::vector<TrainSample>* batch, const TrainOptions& options);
  // kParameters: splits the whole model into this rank's slices (see SetSharding); no-op
  // otherwise or once split.
  Status ShardParameters();
  // `state` (per parameter, NamedParameters() order) fits the units of `shards`: counts, steps,
  // the moments' shapes (an undefined moment is zero).
  static Status CheckSliceState(const ParameterShards& shards,
                                const std::vector<ParamState>& state);
  // After the split: this rank's slices of `state` (checked) into the slices' optimizer, in
  // place (one step count per unit).
  void InstallSliceState(const std::vector<ParamState>& state);
  // The number of forward passes every rank runs for `local` of its own: kParameters needs the
  // same on every rank (each forward gathers from all), so the largest over the ranks; `local`
  // otherwise.
  StatusOr<int64_t> PassesOnEveryRank(int64_t local);
  // kParameters: a micro-batch of one token that contributes nothing, so that a rank with fewer
  // micro-batches joins the others' collectives: the policy's forward, then the reference's when
  // `reference` is not null, then the policy's backward when `backward`; then EndPass.
  Status EmptyPass(const model::Transformer* reference, bool backward);
  // kParameters: after a forward of `model` (the policy or the reference), frees what it gathered.
  Status EndPass(const model::Transformer& model);
  // Data parallel: in-place sum over ranks (no-op without a group).
  Status AllReduce(double* values, size_t count);
  // Data parallel: DataLoss unless `ranks_counted` (the sum of one 1.0 per rank, all-reduced with
  // the data) is the group's size. Gloo can complete a collective without a peer that closed its
  // connections (docs/weight-sync.md), so a short count is how a missing rank shows.
  Status CheckAllRanksTookPart(double ranks_counted) const;
  // The state a multi-mini-batch step rolls back to (see the class comment): weights, AdamW
  // moments and step counts, version. Its buffers are allocated once and reused.
  struct Snapshot;
  void TakeSnapshot();
  void RestoreSnapshot();
  struct Optimizer;
  // The step's gradients: dropped (unsharded, kOptimizer) or zeroed views of the flat buffer
  // (kGradients).
  void BeginGradients();
  void DropGradients();
  // Checks shared by RestoreState and RestoreShardedState.
  Status CheckWeights(const std::vector<at::Tensor>& weights) const;
  std::unique_ptr<model::Transformer> model_;
  // model::ParameterUnits of the model's spec (which never changes), made once: GatherWholeRows
  // looks a tensor up in them for every piece of a published version.
  const std::vector<model::ParameterUnit> units_;
  std::unique_ptr<model::Transformer> reference_;  // the KL term's frozen policy
  // reference_ in compute_dtype_ when that differs (made on first use, dropped with reference_).
  std::unique_ptr<model::Transformer> reference_compute_;
  at::ScalarType compute_dtype_ = at::kFloat;
  bool packing_ = true;
  PromptSharing sharing_ = PromptSharing::kAuto;
  int64_t chunk_tokens_ = 1024;
  const model::Transformer& ComputeReference();
  std::unique_ptr<Optimizer> optimizer_;
  ShardedAdamW::Hyper hyper_;
  std::unique_ptr<ShardedAdamW> sharded_;  // trainer.shard other than none
  int64_t version_ = 0;
  comm::Communicator* dp_ = nullptr;
  double dp_timeout_s_ = 600;
  DataParallelOptions dp_options_;
  std::unique_ptr<GradReducer> reducer_;  // data parallel with more than one rank only
  std::unique_ptr<Snapshot> snapshot_;    // after the first step with mini_batches > 1
  Shard shard_mode_ = Shard::kNone;
  // kParameters after the split: the collectives' thread, then the policy's and the reference's
  // slices (declared after the queue: destroyed before it).
  std::unique_ptr<CollectiveQueue> queue_;
  std::unique_ptr<ParameterShards> shards_;
  std::unique_ptr<ParameterShards> ref_shards_;
  // Tensor parallel: the group (over the communicator SetTensorParallel was given) and, per
  // parameter in optimizer order, whether it is split over the ranks (or whole on each).
  std::unique_ptr<model::TensorParallelGroup> tp_group_;
  comm::CommTensorParallel* tp_comm_ = nullptr;  // tp_group_, to rebind
  std::vector<bool> tp_split_;
  // Tensor parallel: `local`, this rank's slice of parameter `name`, gathered whole from every
  // rank's (a collective of the tensor-parallel group).
  StatusOr<at::Tensor> GatherSlices(const std::string& name, const at::Tensor& local);
  // Tensor parallel: the whole tensors `named` (ParameterUnits names and whole shapes) cut to this
  // rank's slices.
  std::vector<at::Tensor> SlicesOf(const std::vector<at::Tensor>& whole) const;
  // kParameters or tensor parallel: a failed collective can surface as an exception from a pass.
  // Per parameter, how many times its gradient's squares count in the global norm on this rank:
  // 1/T for a parameter every tensor-parallel rank holds whole, 1 otherwise; empty without TP.
  std::vector<double> NormWeights() const;
  // ZeRO-1/2: parameter `param`'s whole moment (of this rank's slice of the model), summed from
  // the data-parallel ranks' parts (a collective of the group).
  StatusOr<at::Tensor> ShardedMoment(size_t param, bool second);
  // Split parameters of tensor-parallel slices: each tensor of unit `u` (gathered over the
  // data-parallel group: this rank's slice) gathered whole over the tensor-parallel group; a no-op
  // without tensor parallelism.
  Status GatherUnitSlices(int u, std::vector<at::Tensor>* tensors);
  // Every parameter's name in NamedParameters() (= ParameterUnits) order, also once split.
  std::vector<std::string> ParameterNames() const;
  bool PassesMayThrow() const { return shard_mode_ == Shard::kParameters || tp_group_ != nullptr; }
};

}  // namespace gyre::trainer
