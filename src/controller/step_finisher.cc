#include "controller/step_finisher.h"

#include <algorithm>

#include "algorithm/lr_schedule.h"
#include "common/logging.h"
#include "controller/step_report.h"

namespace gyre::controller {

StepFinisher::StepFinisher(JobState* job)
    : job_(job),
      kl_in_reward_(job->cfg.algorithm.kl_in == "reward"),
      median_pivots_(job->cfg.algorithm.advantage == "median"),
      reset_optimizer_(job->cfg.trainer.warmup_sft_steps > 0 &&
                       job->cfg.trainer.warmup_optimizer_state == "reset") {}

Status StepFinisher::Finish(int step, SteadyClock::time_point t0, StepBatch* batch,
                            BatchSource* source) {
  const JobConfig& cfg = job_->cfg;
  StepScores* scores = &batch->scores;
  std::vector<v1::Sample>& kept = scores->kept;
  job_->generated_tokens += batch->gen.generated_tokens;
  if (kept.empty() && scores->filtered_groups == 0) {
    return FailedPrecondition("step " + std::to_string(step) + ": no usable samples (" +
                              std::to_string(scores->stale) + " stale, " +
                              std::to_string(scores->reward_errors) + " reward errors)");
  }
  StepRecord rec;
  if (kept.empty()) {
    // Every group was filtered in every round: no update this step (the policy and its version
    // stay), which the metrics and the progress line show.
    GYRE_LOG_WARN("step {}: all {} groups had zero reward variance in {} round(s); no update", step,
                  scores->filtered_groups, batch->rounds);
    batch->extra["useful_groups"] = 0;
  } else {
    // Log-probs are taken at the sampling temperature (greedy sampling: 1).
    const double temperature =
        cfg.rollout.sampling.temperature > 0 ? cfg.rollout.sampling.temperature : 1.0;
    if (kl_in_reward_) {
      // docs/algorithms.md, "KL to the reference policy": each kept sample's reward loses
      // kl_coef times its KL to the reference, before the advantages.
      GYRE_ASSIGN_OR_RETURN(std::vector<double> kl, job_->cluster->trainers()->SequenceKl(
                                                        kept, job_->version, temperature));
      double sum = 0;
      for (size_t i = 0; i < kept.size(); ++i) {
        const auto shaped = static_cast<float>(scores->rewards[i] - cfg.algorithm.kl_coef * kl[i]);
        scores->rewards[i] = shaped;
        kept[i].set_reward(shaped);
        sum += kl[i];
      }
      rec.kl_reward = sum / static_cast<double>(kept.size());
      rec.has_kl_reward = true;
    }
    GYRE_ASSIGN_OR_RETURN(rec.zero_variance_groups, job_->scorer->SetAdvantages(scores));
    // Groups with a learning signal (rollout.budget's figure of merit).
    batch->extra["useful_groups"] =
        static_cast<int64_t>(scores->group_sizes.size()) - rec.zero_variance_groups;
    if (!scores->pivot_ids.empty()) {
      GYRE_RETURN_IF_ERROR(job_->ledger->Move(
          scores->pivot_ids, SampleState::kFiltered,
          {step, job_->version, "",
           "median pivot (MC-GRPO): its reward is the group's median, advantage 0, left out of "
           "the step"}));
    }
    const auto tt = SteadyClock::now();
    // The first GRPO step after a warm-up may start from a fresh optimizer state. Decided by the
    // step number alone, so a job resumed from the checkpoint after the warm-up does the same.
    TrainOptions pg;
    pg.lr = algorithm::LearningRate(cfg.trainer, step);
    pg.temperature = temperature;
    pg.reset_optimizer = step == 1 && reset_optimizer_;
    job_->progress->Status(StepActivity(step, "training"));
    GYRE_ASSIGN_OR_RETURN(rec.train, Train(job_, kept, pg));
    std::vector<uint64_t> kept_ids;
    for (const auto& k : kept) kept_ids.push_back(k.sample_id());
    GYRE_RETURN_IF_ERROR(
        job_->ledger->Move(kept_ids, SampleState::kTrained, {step, job_->version, "", ""}));
    rec.train_s = SecondsSince(tt);
    const auto tp = SteadyClock::now();
    GYRE_RETURN_IF_ERROR(source->PublishTrained(step));
    rec.publish_s = SecondsSince(tp);
  }
  rec.step = step;
  rec.steps = cfg.trainer.steps;
  rec.version = job_->version;
  rec.scores = scores;
  rec.gen = &batch->gen;
  rec.step_s = SecondsSince(t0);
  rec.generate_s = batch->generate_s;
  rec.window_s = batch->generated_throughout ? rec.step_s : batch->generate_s;
  rec.rounds = batch->rounds;
  rec.filter_zero_variance = cfg.algorithm.filter_zero_variance;
  rec.overlong_shaping = cfg.algorithm.overlong_buffer > 0;
  rec.median_pivots = median_pivots_;
  if (const int fanout = job_->cluster->publisher()->last_relay_fanout(); fanout > 0) {
    rec.relay_fanout = fanout;
    rec.relay_rounds = job_->cluster->publisher()->last_relay_rounds();
  }
  if (cfg.rollout.partial_rollouts) {
    rec.partial_carried = static_cast<int64_t>(job_->cluster->scheduler()->carried_groups());
  }
  rec.extra = std::move(batch->extra);
  job_->result.final_mean_reward = scores->reward_sum / std::max(1, scores->scored);
  WriteMetrics(job_, StepMetrics(rec));
  job_->last_step = step;
  grpo_seconds_ += rec.step_s;
  ++grpo_steps_run_;
  job_->progress->SetEta(
      observe::FormatDuration(grpo_seconds_ / grpo_steps_run_ * (cfg.trainer.steps - step)));
  job_->progress->StepLine(StepProgressLine(rec), StepSummary(rec));
  job_->progress->Status(step < cfg.trainer.steps ? "" : "finishing");
  return Status::Ok();
}

}  // namespace gyre::controller
