#pragma once
// JobState: what the parts of a GRPO job share. JobRunner (controller/job_runner.cc) owns one
// and drives the job; the warm-up, the batch sources, the step finisher and the checkpoint glue
// each take a pointer to it for the job's duration. It holds the job's inputs (config,
// tokenizer, prompts, reward, problem stream), its cluster, ledger and scorer, its progress
// output and metrics, and the counters a checkpoint saves (policy version, group ids, tokens
// generated). The functions below are the small steps several parts take (publish, draw,
// train, write a metrics record).
//
// Thread contract: the job thread only, except `last_step`, which the metrics endpoint's
// /health handler reads from its own thread.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/service_supervisor.h"
#include "algorithm/sampling_policy.h"
#include "controller/cluster.h"
#include "controller/prompts.h"
#include "controller/rollout_scheduler.h"
#include "controller/sample_ledger.h"
#include "controller/step_scorer.h"
#include "controller/task.h"
#include "controller/trainer_group.h"
#include "gyre/job.h"
#include "observe/metrics_endpoint.h"
#include "observe/progress.h"
#include "observe/run_metrics.h"
#include "text/text_tokenizer.h"

namespace gyre::controller {

struct JobState {
  explicit JobState(const JobConfig& config) : cfg(config) {}
  JobState(const JobState&) = delete;
  JobState& operator=(const JobState&) = delete;

  const JobConfig cfg;
  std::string run_dir;  // job.output_dir/job.name, absolute

  // Inputs, loaded before any process starts (controller/job_inputs.h).
  std::unique_ptr<text::TextTokenizer> tokenizer;
  std::unique_ptr<PromptEncoder> prompts;
  std::shared_ptr<RewardFn> reward;
  std::unique_ptr<ProblemSource> problems;
  std::unique_ptr<agent::ServiceSupervisor> env_service;  // env.address or env.command

  std::unique_ptr<observe::Progress> progress;  // the live status line / progress lines
  std::unique_ptr<observe::RunMetrics> metrics;
  bool metrics_failed = false;  // a failed write was warned about (once)
  std::string slurm_job_id;     // $SLURM_JOB_ID when the controller runs inside Slurm

  std::unique_ptr<Cluster> cluster;
  // metrics.endpoint; declared after the cluster, whose service its handlers read, so that it
  // stops first.
  std::unique_ptr<observe::MetricsEndpoint> endpoint;
  std::unique_ptr<SampleLedger> ledger;
  std::unique_ptr<StepScorer> scorer;
  std::unique_ptr<algorithm::SamplingPolicy> policy;  // rollout.budget

  int64_t version = 0;            // the trainer's policy version
  int64_t published = -1;         // the version the rollout workers were last sent
  uint64_t next_group_id = 0;     // training groups' ids (and with them their seeds)
  uint64_t draws_this_step = 0;   // prompts drawn in this step (the sampling policy's Skip)
  int64_t generated_tokens = 0;   // over the job's GRPO steps (trainer.max_generated_tokens)
  int first_step = 1;             // the first GRPO step this process runs
  double wall_before = 0;         // job time spent before the resumed checkpoint
  std::atomic<int> last_step{0};  // the last finished GRPO step (/health)
  JobResult result;
};

// The sample ledger's path in `run_dir`.
std::string LedgerPath(const std::string& run_dir);
// Where the run's TensorBoard events go ("" without metrics.tensorboard).
std::string TensorBoardDir(const JobState& job);

// The live status line while GRPO step `step` is in one of its phases: "step 12 training".
std::string StepActivity(int64_t step, const char* what);

// Sends the current version to every alive rollout worker. Error = the job must end.
Status Publish(JobState* job);
// trainer.publish_every: the rollout workers may hold an older version than the trainer;
// evaluation needs the current one. (Asynchronous generation is paused or over meanwhile.)
Status PublishIfBehind(JobState* job);
// Brings restarted rollout workers back: each gets the current version alone first.
Status Revive(JobState* job);

// One optimizer step of the trainer group on `samples` at the current version; the version
// advances to the trainers'. Returns trainer-0's metrics.
StatusOr<std::map<std::string, double>> Train(JobState* job, const std::vector<v1::Sample>& samples,
                                              const TrainOptions& opts);

// Draws `count` new prompt groups of n samples (0 = rollout.group_size) for GRPO step `step` and
// adds their samples to the ledger; the sampling policy may skip drawn prompts.
StatusOr<std::vector<GroupJob>> DrawGroups(JobState* job, int count, int step, int n = 0);

// Appends `record` to metrics.jsonl (and TensorBoard, the endpoint). A failure is logged once
// and the job goes on: its checkpoints and model matter more than its metrics.
void WriteMetrics(JobState* job, const nlohmann::json& record);

}  // namespace gyre::controller
