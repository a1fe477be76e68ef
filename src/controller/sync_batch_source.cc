#include "controller/sync_batch_source.h"

#include <algorithm>
#include <cmath>

#include "common/clock.h"

namespace gyre::controller {

SyncBatchSource::SyncBatchSource(JobState* job)
    : job_(job),
      partial_(job->cfg.rollout.partial_rollouts),
      top_up_(job->cfg.rollout.budget.policy != "uniform") {}

Status SyncBatchSource::Restore(const ControllerState& state) {
  // Partial rollouts: the groups in flight at the checkpoint continue in the next step, on the
  // same workers as they would have (their kept KV is gone, so their context is prefilled).
  return job_->cluster->scheduler()->RestoreCarried(state.carried_groups, job_->ledger.get());
}

Status SyncBatchSource::SaveCarried(int, ControllerState* state) {
  state->carried_groups = job_->cluster->scheduler()->SaveCarried();
  return Status::Ok();
}

StatusOr<StepBatch> SyncBatchSource::NextBatch(int step) {
  const JobConfig& cfg = job_->cfg;
  RolloutScheduler* scheduler = job_->cluster->scheduler();
  const int want = cfg.rollout.prompts_per_step;
  const v1::SamplingParams sampling = job_->prompts->Training();
  const LedgerSink sink{job_->ledger.get(), step, job_->version};
  StepBatch batch;
  batch.generate_s = 0;
  // Round 0 draws the step's groups; with algorithm.filter_zero_variance, up to
  // algorithm.max_filter_rounds more rounds replace the groups it filtered out.
  int rounds = 0;
  int64_t samples_generated = 0;
  while (true) {
    const int usable = static_cast<int>(batch.scores.group_sizes.size());
    int new_groups = want - usable;
    if (rounds == 0 && partial_) {
      // With partial rollouts, over_provision * prompts_per_step groups are in flight, counting
      // those carried over from the last step.
      const int in_flight = static_cast<int>(std::ceil(cfg.rollout.over_provision * want - 1e-9));
      new_groups = std::max(0, in_flight - static_cast<int>(scheduler->carried_groups()));
    }
    GYRE_ASSIGN_OR_RETURN(std::vector<GroupJob> jobs,
                          DrawGroups(job_, new_groups, step, job_->policy->FirstRound()));
    const auto tg = SteadyClock::now();
    job_->progress->Status(StepActivity(step, "generating"));
    GYRE_ASSIGN_OR_RETURN(
        auto samples,
        partial_ ? scheduler->GeneratePartial(&jobs, want - usable, sampling, job_->version,
                                              &batch.gen, &sink)
                 : scheduler->GenerateAll(jobs, sampling, job_->version, &batch.gen, &sink));
    batch.generate_s += SecondsSince(tg);
    if (!partial_ && top_up_) {
      GYRE_RETURN_IF_ERROR(
          TopUpRound(step, sampling, sink, &jobs, &samples, &batch.gen, &batch.generate_s));
    }
    samples_generated += static_cast<int64_t>(samples.size());
    GYRE_RETURN_IF_ERROR(job_->scorer->Score(jobs, &samples, step, job_->version,
                                             job_->ledger.get(), &batch.scores));
    ++rounds;
    if (!cfg.algorithm.filter_zero_variance ||
        static_cast<int>(batch.scores.group_sizes.size()) >= want ||
        rounds > cfg.algorithm.max_filter_rounds) {
      break;
    }
  }
  batch.rounds = rounds;
  batch.extra = {{"samples_generated", samples_generated}};
  job_->policy->AddMetrics(&batch.extra);
  job_->policy->EndStep();
  job_->draws_this_step = 0;
  return batch;
}

Status SyncBatchSource::TopUpRound(int step, const v1::SamplingParams& sampling,
                                   const LedgerSink& sink, std::vector<GroupJob>* jobs,
                                   std::vector<v1::Sample>* samples, GenerateStats* gen,
                                   double* gen_s) {
  const StepScorer& scorer = *job_->scorer;
  // The first round's rewards (kept by the scorer for Score).
  std::vector<algorithm::GroupRewards> outcome;
  size_t begin = 0;
  for (const GroupJob& j : *jobs) {
    algorithm::GroupRewards g{j.problem.prompt, {}};
    for (int i = 0; i < j.group.n(); ++i) {
      auto r = scorer.PeekReward(j.problem, (*samples)[begin + i]);
      if (r.ok()) g.rewards.push_back(*r);  // a failed reward is counted when scored
    }
    begin += static_cast<size_t>(j.group.n());
    outcome.push_back(std::move(g));
  }
  const std::vector<int> extra = job_->policy->TopUps(outcome);
  // Each top-up is a group of its own (own ids and seed, at most group_size samples), merged
  // into its prompt's group after generation.
  std::vector<GroupJob> topups;
  std::vector<size_t> owner;
  for (size_t g = 0; g < jobs->size(); ++g) {
    for (int left = extra[g]; left > 0;) {
      const int n = std::min(left, job_->cfg.rollout.group_size);
      GYRE_ASSIGN_OR_RETURN(
          GroupJob t, job_->prompts->TrainingGroup((*jobs)[g].problem, job_->next_group_id++, n));
      topups.push_back(std::move(t));
      owner.push_back(g);
      left -= n;
    }
  }
  if (!topups.empty()) {
    GYRE_RETURN_IF_ERROR(job_->ledger->Add(QueuedSamples(topups), {step, job_->version, "", ""}));
    const auto tg = SteadyClock::now();
    GYRE_ASSIGN_OR_RETURN(auto more, job_->cluster->scheduler()->GenerateAll(
                                         topups, sampling, job_->version, gen, &sink));
    *gen_s += SecondsSince(tg);
    // Merge: each group's first-round samples, then its top-ups' in order.
    std::vector<std::vector<v1::Sample>> by_group(jobs->size());
    size_t at = 0;
    for (size_t g = 0; g < jobs->size(); ++g) {
      for (int i = 0; i < (*jobs)[g].group.n(); ++i) {
        by_group[g].push_back(std::move((*samples)[at++]));
      }
    }
    at = 0;
    for (size_t t = 0; t < topups.size(); ++t) {
      for (int i = 0; i < topups[t].group.n(); ++i) {
        auto r = scorer.PeekReward(topups[t].problem, more[at]);
        if (r.ok()) outcome[owner[t]].rewards.push_back(*r);
        by_group[owner[t]].push_back(std::move(more[at++]));
      }
    }
    samples->clear();
    for (size_t g = 0; g < jobs->size(); ++g) {
      (*jobs)[g].group.set_n(static_cast<int32_t>(by_group[g].size()));
      for (auto& smp : by_group[g]) samples->push_back(std::move(smp));
    }
  }
  job_->policy->Observe(outcome);
  return Status::Ok();
}

}  // namespace gyre::controller
