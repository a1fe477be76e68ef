#pragma once
// BatchSource: where a GRPO step's scored batch comes from, and how a trained version reaches
// the rollout workers. A job uses one, chosen from its config when it starts (MakeBatchSource):
//   SyncBatchSource   (controller/sync_batch_source.h) generates each step's groups when the
//                     step starts and publishes every trained version (the synchronous loop);
//   AsyncBatchSource  (controller/async_batch_source.h, rollout.async) takes each step's groups
//                     from generation that runs ahead of training under the staleness bound
//                     (AsyncScheduler), and publishes per trainer.publish_every and
//                     rollout.weight_updates.
// The job runner's loop is the same for both: Begin, then per step NextBatch, the step
// finisher (which calls PublishTrained after training), Pause and Resume around an evaluation
// or a checkpoint (SaveCarried), and End after the last step.
//
// Thread contract: the job thread only. An implementation may own threads (the asynchronous
// scheduler's dispatcher); Shutdown joins them and is idempotent.

#include <memory>
#include <nlohmann/json.hpp>

#include "controller/checkpoint.h"
#include "controller/rollout_scheduler.h"
#include "controller/step_scorer.h"
#include "gyre/status.h"

namespace gyre::controller {

struct JobState;

// One GRPO step's batch, scored and ready to train (controller/step_finisher.h).
struct StepBatch {
  StepScores scores;
  GenerateStats gen;      // the engines' counters of the generation behind it
  double generate_s = 0;  // seconds the step waited for generation
  int rounds = 1;         // generation rounds (algorithm.filter_zero_variance)
  // Generation ran during the whole step, not only while the step waited for it (its time
  // window for throughput figures is the step's).
  bool generated_throughout = false;
  nlohmann::json extra = nlohmann::json::object();  // mode-specific metrics fields
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // A resumed job: takes back the groups a checkpoint carried (partial rollouts, or
  // rollout.async's admitted groups not yet trained). Before Begin.
  virtual Status Restore(const ControllerState& state) = 0;
  // Before the first GRPO step this process runs, with the rollout workers at the current
  // version.
  virtual void Begin() = 0;
  // Generates (or takes) and scores the batch of GRPO step `step` at the current version.
  virtual StatusOr<StepBatch> NextBatch(int step) = 0;
  // After step `step` trained: sends the new version to the rollout workers as this mode does.
  virtual Status PublishTrained(int step) = 0;
  // The rollout workers are the caller's until Resume (evaluation, checkpoints): no generation
  // of this source is in flight meanwhile.
  virtual Status Pause() = 0;
  // Generation continues with the version last published.
  virtual void Resume() = 0;
  // Into `state`, the groups a checkpoint after step `step` carries; with generation paused
  // (Pause) where it runs ahead.
  virtual Status SaveCarried(int step, ControllerState* state) = 0;
  // After the last step: generation stops, and what it made for steps that will not run is let
  // go (and the ledger says so).
  virtual Status End() = 0;
  // Stops whatever the source runs; idempotent.
  virtual void Shutdown() = 0;
};

// The job's batch source per rollout.async. `job` (not owned) must outlive it.
std::unique_ptr<BatchSource> MakeBatchSource(JobState* job);

}  // namespace gyre::controller
