#include "controller/async_batch_source.h"

#include "common/check.h"
#include "common/clock.h"
#include "common/logging.h"

namespace gyre::controller {

AsyncBatchSource::WeightUpdates AsyncBatchSource::ParseWeightUpdates(const std::string& name) {
  if (name == "repack") return WeightUpdates::kRepack;
  if (name == "between_steps") return WeightUpdates::kBetweenSteps;
  if (name == "between_steps_repack") return WeightUpdates::kBetweenStepsRepack;
  GYRE_CHECK(name == "lockstep") << "rollout.weight_updates '" << name << "' was not validated";
  return WeightUpdates::kLockstep;
}

AsyncBatchSource::AsyncBatchSource(JobState* job)
    : job_(job), weight_updates_(ParseWeightUpdates(job->cfg.rollout.weight_updates)) {}

Status AsyncBatchSource::Restore(const ControllerState& state) {
  // The admitted groups not yet trained go back to the scheduler when it starts (Begin).
  restore_ = std::make_unique<AsyncCarried>();
  restore_->groups = state.carried_groups;
  restore_->admitted = state.async_admitted;
  return Status::Ok();
}

void AsyncBatchSource::Begin() {
  async_ =
      std::make_unique<AsyncScheduler>(job_->cfg, job_->cluster->pool(), job_->ledger.get(),
                                       job_->prompts->Training(), job_->version, restore_.get());
  restore_.reset();
}

StatusOr<StepBatch> AsyncBatchSource::NextBatch(int step) {
  // Admission: after step - 1 steps, at most (k + step) * prompts_per_step groups ever.
  job_->progress->Status(StepActivity(step, "waiting for rollouts"));
  GYRE_RETURN_IF_ERROR(async_->Admit(
      step - 1, [&](int64_t count) { return DrawGroups(job_, static_cast<int>(count), step); }));
  GYRE_ASSIGN_OR_RETURN(std::vector<ReadyGroup> ready, async_->NextBatch(job_->version, step));
  const AsyncStats as = async_->stats();
  std::vector<GroupJob> jobs;
  std::vector<v1::Sample> samples;
  for (ReadyGroup& rg : ready) {
    jobs.push_back(std::move(rg.job));
    for (auto& smp : rg.samples) samples.push_back(std::move(smp));
  }
  StepBatch batch;
  GYRE_RETURN_IF_ERROR(
      job_->scorer->Score(jobs, &samples, step, job_->version, job_->ledger.get(), &batch.scores));
  batch.gen = as.generate;
  batch.generate_s = as.wait_s;
  batch.rounds = 1;
  batch.generated_throughout = true;
  batch.extra = {{"async_wait_s", as.wait_s},      {"admitted_groups", as.admitted},
                 {"queued_groups", as.queued},     {"in_flight_groups", as.in_flight},
                 {"ready_groups", as.ready},       {"stolen_samples", as.stolen},
                 {"repacked_samples", as.repacked}};
  batch.extra["published_version"] = job_->published;
  return batch;
}

Status AsyncBatchSource::PublishTrained(int step) {
  // trainer.publish_every: between publishes the workers keep generating with the version they
  // hold; the batching rule still keeps every trained sample within algorithm.max_staleness.
  if (step % job_->cfg.trainer.publish_every != 0) return Status::Ok();
  if (weight_updates_ == WeightUpdates::kBetweenSteps ||
      weight_updates_ == WeightUpdates::kBetweenStepsRepack) {
    // No lockstep: the workers take the version between engine steps of the calls they are
    // running; calls started after the publish need it (and with repacking, the long tails move
    // onto tail workers).
    GYRE_RETURN_IF_ERROR(Publish(job_));
    async_->Resume(job_->version);
    return Status::Ok();
  }
  // Publish to everyone, then continue: calls in flight end first (repack: their unfinished
  // samples are taken out, to continue on the new version), new ones need the new version.
  GYRE_RETURN_IF_ERROR(async_->Pause(weight_updates_ == WeightUpdates::kRepack));
  GYRE_RETURN_IF_ERROR(Publish(job_));
  async_->Resume(job_->version);
  return Status::Ok();
}

Status AsyncBatchSource::Pause() { return async_ ? async_->Pause() : Status::Ok(); }

void AsyncBatchSource::Resume() {
  // The workers hold what was last published.
  if (async_) async_->Resume(job_->published);
}

Status AsyncBatchSource::SaveCarried(int step, ControllerState* state) {
  if (!async_) {  // before the first GRPO step
    state->carried_groups = job_->cluster->scheduler()->SaveCarried();
    state->async_admitted = 0;
    return Status::Ok();
  }
  // No call may be in flight while the state is taken, so generation pauses for the checkpoint
  // (the groups it finishes meanwhile are kept as ready).
  GYRE_RETURN_IF_ERROR(async_->Pause());
  GYRE_ASSIGN_OR_RETURN(AsyncCarried carried, async_->Checkpoint(job_->version, step));
  state->carried_groups = std::move(carried.groups);
  state->async_admitted = carried.admitted;
  return Status::Ok();
}

Status AsyncBatchSource::End() {
  // Generation ran ahead of the last step: what it made for steps that will not run is let go,
  // and the ledger says so, so every sample it holds has ended.
  Shutdown();
  GYRE_ASSIGN_OR_RETURN(
      const int64_t left,
      job_->ledger->DropUnended(
          {job_->cfg.trainer.steps, job_->version, "",
           "the job ended before a step could train it (rollout.async ran ahead)"}));
  GYRE_LOG_INFO("rollout.async: {} samples generated ahead were not trained (ledger: dropped)",
                left);
  return Status::Ok();
}

void AsyncBatchSource::Shutdown() {
  if (async_) async_->Shutdown();
}

}  // namespace gyre::controller
