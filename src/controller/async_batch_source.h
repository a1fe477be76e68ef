#pragma once
// AsyncBatchSource: the asynchronous GRPO step (rollout.async). Generation runs ahead of
// training in an AsyncScheduler (controller/async_scheduler.h) under the staleness bound: each
// step admits the groups the admission rule allows, waits for the batch the batching rule makes,
// and scores it. A trained version is published every trainer.publish_every steps, per
// rollout.weight_updates: with generation paused (lockstep, repack: the calls in flight end, or
// their unfinished samples are taken out) or between engine steps of the running calls
// (between_steps, between_steps_repack).
//
// Thread contract: the job thread only (BatchSource). The AsyncScheduler it owns from Begin runs
// its dispatcher and call threads; Shutdown (and End) join them.

#include <memory>

#include "controller/async_scheduler.h"
#include "controller/batch_source.h"
#include "controller/job_state.h"

namespace gyre::controller {

class AsyncBatchSource final : public BatchSource {
 public:
  // `job` (not owned) must outlive the source.
  explicit AsyncBatchSource(JobState* job);
  ~AsyncBatchSource() override { Shutdown(); }

  Status Restore(const ControllerState& state) override;
  // Starts generating at the current version (first the restored groups, if any).
  void Begin() override;
  StatusOr<StepBatch> NextBatch(int step) override;
  Status PublishTrained(int step) override;
  Status Pause() override;
  void Resume() override;
  // Before Begin (the checkpoint after the warm-up) nothing has been admitted yet.
  Status SaveCarried(int step, ControllerState* state) override;
  Status End() override;
  void Shutdown() override;

 private:
  // rollout.weight_updates, parsed once.
  enum class WeightUpdates { kLockstep, kRepack, kBetweenSteps, kBetweenStepsRepack };
  static WeightUpdates ParseWeightUpdates(const std::string& name);

  JobState* job_;
  const WeightUpdates weight_updates_;
  std::unique_ptr<AsyncCarried> restore_;  // what a resume continues, until Begin
  std::unique_ptr<AsyncScheduler> async_;  // from Begin
};

}  // namespace gyre::controller
