#include "controller/job_state.h"

#include "common/logging.h"

namespace gyre::controller {

std::string LedgerPath(const std::string& run_dir) { return run_dir + "/ledger.db"; }

std::string TensorBoardDir(const JobState& job) {
  return job.cfg.metrics.tensorboard ? job.run_dir + "/tensorboard" : std::string();
}

std::string StepActivity(int64_t step, const char* what) {
  return "step " + std::to_string(step) + " " + what;
}

Status Publish(JobState* job) {
  job->progress->Status("sending policy v" + std::to_string(job->version) +
                        " to the rollout workers");
  GYRE_RETURN_IF_ERROR(job->cluster->publisher()->Publish(job->version));
  job->published = job->version;
  return Status::Ok();
}

Status PublishIfBehind(JobState* job) {
  return job->published < job->version ? Publish(job) : Status::Ok();
}

Status Revive(JobState* job) {
  WeightPublisher* publisher = job->cluster->publisher();
  const int64_t version = job->version;
  return job->cluster->pool()->Revive(
      version, [publisher, version](Worker* w) { return publisher->CatchUp(w, version); });
}

StatusOr<std::map<std::string, double>> Train(JobState* job, const std::vector<v1::Sample>& samples,
                                              const TrainOptions& opts) {
  return job->cluster->trainers()->Train(samples, job->version, opts, &job->version);
}

StatusOr<std::vector<GroupJob>> DrawGroups(JobState* job, int count, int step, int n) {
  std::vector<GroupJob> jobs;
  // A sampling policy may skip drawn prompts (rollout.budget.policy: greso); a bounded number of
  // draws keeps a policy that skips nearly everything from drawing forever.
  const int64_t max_draws = 64 * static_cast<int64_t>(count) + 64;
  for (int64_t d = 0; static_cast<int>(jobs.size()) < count && d < max_draws; ++d) {
    Problem problem = job->problems->Next();
    if (job->policy->Skip(problem.prompt, step, job->draws_this_step++)) continue;
    GYRE_ASSIGN_OR_RETURN(GroupJob j,
                          job->prompts->TrainingGroup(problem, job->next_group_id++,
                                                      n > 0 ? n : job->cfg.rollout.group_size));
    jobs.push_back(std::move(j));
  }
  if (!jobs.empty()) {
    GYRE_RETURN_IF_ERROR(job->ledger->Add(QueuedSamples(jobs), {step, job->version, "", ""}));
  }
  return jobs;
}

void WriteMetrics(JobState* job, const nlohmann::json& record) {
  Status st = job->metrics->Write(record);
  if (!st.ok() && !job->metrics_failed) {
    GYRE_LOG_WARN("metrics: {} (the job continues; later failures are not reported)",
                  st.ToString());
    job->metrics_failed = true;
  }
}

}  // namespace gyre::controller
