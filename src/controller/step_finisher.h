#pragma once
// StepFinisher: the rest of a GRPO step once its batch is scored (controller/batch_source.h):
// the KL reward shaping (algorithm.kl_in: reward), the group advantages, the train call, the
// ledger's moves (trained, median pivots filtered), the publish the batch source decides, and
// the step's metrics record, progress line and ETA. A step whose groups were all filtered trains
// nothing and says so; a step with no usable sample fails the job.
//
// Thread contract: the job thread only; it owns no thread.

#include "common/clock.h"
#include "controller/batch_source.h"
#include "controller/job_state.h"

namespace gyre::controller {

class StepFinisher {
 public:
  // `job` (not owned) must outlive the finisher.
  explicit StepFinisher(JobState* job);

  // Finishes GRPO step `step`, begun at `t0`, on `batch` (its scores are shaped and their
  // advantages set in place); `source` publishes the trained version.
  Status Finish(int step, SteadyClock::time_point t0, StepBatch* batch, BatchSource* source);

 private:
  JobState* job_;
  // Decided once from the config.
  const bool kl_in_reward_;     // algorithm.kl_in: reward
  const bool median_pivots_;    // algorithm.advantage: median
  const bool reset_optimizer_;  // trainer.warmup_optimizer_state: reset, after a warm-up
  double grpo_seconds_ = 0;     // this process's GRPO steps (the ETA)
  int grpo_steps_run_ = 0;
};

}  // namespace gyre::controller
