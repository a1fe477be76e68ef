#include "controller/job_checkpoint.h"

#include "common/file_util.h"
#include "common/logging.h"
#include "config/config.h"

namespace gyre::controller {

Status OpenNewLedger(JobState* job) {
  const std::string path = LedgerPath(job->run_dir);
  for (const char* suffix : {"", "-wal", "-shm"}) {
    if (PathExists(path + suffix)) GYRE_RETURN_IF_ERROR(RemoveTree(path + suffix));
  }
  GYRE_ASSIGN_OR_RETURN(job->ledger, SampleLedger::Open(path, true));
  return Status::Ok();
}

Status ResumeJob(JobState* job, const std::string& dir, const ControllerState& st,
                 BatchSource* source) {
  const JobConfig& cfg = job->cfg;
  GYRE_RETURN_IF_ERROR(
      job->problems->RestoreState(st.problem_stream).WithContext(dir + "/controller.json"));
  if (!st.sampling_policy.is_null()) {
    GYRE_RETURN_IF_ERROR(
        job->policy->RestoreState(st.sampling_policy).WithContext(dir + "/controller.json"));
  }
  // Every data-parallel rank loads the same state (the ranks hold identical weights and AdamW
  // state), so they continue in lockstep.
  GYRE_ASSIGN_OR_RETURN(const int64_t loaded,
                        job->cluster->trainers()->LoadState(dir + "/trainer"));
  if (loaded != st.policy_version) {
    return FailedPrecondition(dir + ": trainer state is at policy version " +
                              std::to_string(loaded) + ", controller.json at " +
                              std::to_string(st.policy_version));
  }
  // Everything loaded: from here on the run directory continues from the checkpoint.
  job->version = st.policy_version;
  job->next_group_id = st.next_group_id;
  job->generated_tokens = st.generated_tokens;
  if (st.ledger_sequence >= 0) {
    GYRE_RETURN_IF_ERROR(RollBackLedger(job->ledger.get(), st.ledger_sequence));
  } else {
    GYRE_LOG_WARN("{} predates the sample ledger; a new ledger starts at this resume", dir);
    GYRE_RETURN_IF_ERROR(OpenNewLedger(job));
  }
  GYRE_RETURN_IF_ERROR(source->Restore(st));
  job->first_step = st.grpo_step + 1;
  job->wall_before = st.wall_seconds;
  job->result.grpo_steps = st.grpo_step;
  job->result.accuracy_before_rl = st.accuracy_before_rl;
  job->result.final_mean_reward = st.final_mean_reward;
  const std::string metrics_path = job->run_dir + "/" + cfg.metrics.file;
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(job->run_dir + "/config.yaml", config::DumpJobConfig(cfg)));
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(metrics_path, st.metrics_jsonl));
  GYRE_ASSIGN_OR_RETURN(job->metrics, observe::RunMetrics::Resume(
                                          metrics_path, TensorBoardDir(*job), job->first_step));
  if (job->endpoint) job->metrics->SetEndpoint(job->endpoint.get());
  const size_t partial_carried = job->cluster->scheduler()->carried_groups();
  nlohmann::json resumed = {{"phase", "resume"},
                            {"step", st.grpo_step},
                            {"policy_version", job->version},
                            {"checkpoint", dir}};
  if (cfg.rollout.partial_rollouts) resumed["partial_carried_groups"] = partial_carried;
  if (cfg.rollout.async) resumed["async_carried_groups"] = st.carried_groups.size();
  WriteMetrics(job, resumed);
  GYRE_LOG_INFO("resumed from {} at GRPO step {} (policy v{}, {} carried groups)", dir,
                st.grpo_step, job->version, st.carried_groups.size());
  job->progress->Print("resumed from " + dir + " after GRPO step " + std::to_string(st.grpo_step) +
                       " (policy v" + std::to_string(job->version) + ")");
  if (cfg.rollout.partial_rollouts) {
    job->progress->Print("continuing " + std::to_string(partial_carried) +
                         " carried partial-rollout group(s)");
  }
  if (cfg.rollout.async) {
    job->progress->Print("continuing " + std::to_string(st.carried_groups.size()) +
                         " admitted group(s) not yet trained (rollout.async)");
  }
  return Publish(job);
}

Status SaveCheckpoint(JobState* job, BatchSource* source, int step,
                      SteadyClock::time_point job_start) {
  const JobConfig& cfg = job->cfg;
  const auto t0 = SteadyClock::now();
  const std::string final_dir = job->run_dir + "/checkpoints/" + CheckpointName(step);
  job->progress->Status("saving checkpoint " + CheckpointName(step));
  const std::string tmp_dir = final_dir + ".tmp";
  GYRE_RETURN_IF_ERROR(RemoveTree(tmp_dir));
  GYRE_RETURN_IF_ERROR(MakeDirs(tmp_dir));
  StatusOr<int64_t> saved = job->cluster->trainers()->SaveState(tmp_dir + "/trainer");
  if (!saved.ok()) return saved.status().WithContext("checkpoint " + final_dir);
  if (*saved != job->version) {
    return Internal("checkpoint " + final_dir + ": the trainer holds policy version " +
                    std::to_string(*saved) + ", the controller expects " +
                    std::to_string(job->version));
  }
  ControllerState st;
  st.grpo_step = step;
  st.policy_version = job->version;
  st.next_group_id = job->next_group_id;
  st.problem_stream = job->problems->SaveState();
  st.sampling_policy = job->policy->SaveState();
  st.generated_tokens = job->generated_tokens;
  st.accuracy_before_rl = job->result.accuracy_before_rl;
  st.final_mean_reward = job->result.final_mean_reward;
  st.wall_seconds = job->wall_before + SecondsSince(job_start);
  GYRE_ASSIGN_OR_RETURN(st.data_fingerprints, DataFingerprints(cfg.data));
  st.config_yaml = config::DumpJobConfig(cfg);
  GYRE_ASSIGN_OR_RETURN(st.metrics_jsonl, ReadFileToString(job->run_dir + "/" + cfg.metrics.file));
  GYRE_RETURN_IF_ERROR(source->SaveCarried(step, &st));
  GYRE_ASSIGN_OR_RETURN(st.ledger_sequence, job->ledger->LastSequence());
  GYRE_RETURN_IF_ERROR(WriteControllerState(tmp_dir, st));
  GYRE_RETURN_IF_ERROR(CommitCheckpoint(tmp_dir, final_dir, cfg.trainer.checkpoint_keep_last));
  source->Resume();
  GYRE_LOG_INFO("checkpoint {} (policy v{}, {} carried groups) in {:.2f} s", final_dir,
                job->version, st.carried_groups.size(), SecondsSince(t0));
  return Status::Ok();
}

}  // namespace gyre::controller
