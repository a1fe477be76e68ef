#pragma once
// SyncBatchSource: the synchronous GRPO step (rollout.async: false). Each step draws its prompt
// groups when it starts and generates them with the current policy (RolloutScheduler): every
// group at once, or with partial rollouts (rollout.partial_rollouts) until
// rollout.prompts_per_step of the groups in flight have finished, the others carrying over. With
// rollout.budget a second round tops groups up as the sampling policy decides; with
// algorithm.filter_zero_variance up to algorithm.max_filter_rounds more rounds replace the groups
// filtered out. Every trained version is published at once.
//
// Thread contract: the job thread only (BatchSource); it owns no thread.

#include "controller/batch_source.h"
#include "controller/job_state.h"

namespace gyre::controller {

class SyncBatchSource final : public BatchSource {
 public:
  // `job` (not owned) must outlive the source.
  explicit SyncBatchSource(JobState* job);

  Status Restore(const ControllerState& state) override;
  void Begin() override {}
  StatusOr<StepBatch> NextBatch(int step) override;
  Status PublishTrained(int) override { return Publish(job_); }
  Status Pause() override { return Status::Ok(); }
  void Resume() override {}
  Status SaveCarried(int step, ControllerState* state) override;
  Status End() override { return Status::Ok(); }
  void Shutdown() override {}

 private:
  // rollout.budget: after the first round of *jobs (*samples, n per group), generates the
  // policy's top-ups and merges them into their groups (jobs' n grows); the policy observes every
  // group's rewards.
  Status TopUpRound(int step, const v1::SamplingParams& sampling, const LedgerSink& sink,
                    std::vector<GroupJob>* jobs, std::vector<v1::Sample>* samples,
                    GenerateStats* gen, double* gen_s);

  JobState* job_;
  const bool partial_;  // rollout.partial_rollouts
  // rollout.budget.policy is not uniform: a second round tops groups up, and the policy sees
  // every group's rewards (uniform neither tops up nor observes).
  const bool top_up_;
};

}  // namespace gyre::controller
