#include "controller/job_runner.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <utility>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "config/config.h"
#include "controller/batch_source.h"
#include "controller/checkpoint.h"
#include "controller/cluster.h"
#include "controller/evaluation.h"
#include "controller/job_checkpoint.h"
#include "controller/job_endpoint.h"
#include "controller/job_inputs.h"
#include "controller/job_state.h"
#include "controller/signals.h"
#include "controller/step_finisher.h"
#include "controller/warm_up.h"

namespace gyre::controller {

namespace {

// The job's story: set up, publish v0, warm up, evaluate, GRPO steps (a batch, then train and
// publish), evaluate, save. The parts do the work: the Cluster (server, workers, publishes,
// dispatch, the train call), the BatchSource (a step's scored batch, synchronous or
// asynchronous), the StepFinisher (advantages, train, publish, metrics), the warm-up and the
// checkpoint glue. One thread (the caller's) runs it.
class JobRunner {
 public:
  JobRunner(const JobConfig& config, const RunOptions& options, JobDeps deps)
      : opts_(options), deps_(std::move(deps)), job_(config) {
    job_.run_dir = AbsolutePath(config.job.output_dir + "/" + config.job.name);
  }
  ~JobRunner() { Teardown(); }
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  StatusOr<JobResult> Run();

 private:
  // RunOptions::resume, before Setup: reads and checks the newest checkpoint's controller part
  // and opens the run's ledger, changing nothing.
  Status PrepareResume();
  // Everything before the first publish: inputs, run directory, services, cluster, workers.
  Status Setup();
  // The cluster's two phases, with the launchers' files and the metrics endpoint between them.
  Status StartCluster();
  // The GRPO steps from job_.first_step, with their evaluations and checkpoints.
  Status RunSteps(SteadyClock::time_point job_start);
  StatusOr<double> Evaluate(const std::string& tag, int step);
  // summary.json and the metrics' summary record.
  void WriteSummary();
  void Teardown();

  const RunOptions opts_;
  const JobDeps deps_;
  JobState job_;
  std::optional<ResumePoint> resume_;  // the checkpoint being resumed from, if any
  // Declared after job_, whose cluster they use, so destroyed before it.
  std::unique_ptr<BatchSource> source_;
  std::unique_ptr<StepFinisher> finisher_;
  // Evaluation's group ids: a space of their own (high bit set), not saved in checkpoints.
  uint64_t next_eval_group_id_ = uint64_t{1} << 63;
  bool torn_down_ = false;
};

Status JobRunner::PrepareResume() {
  GYRE_ASSIGN_OR_RETURN(ResumePoint point,
                        OpenResumePoint(job_.run_dir, LedgerPath(job_.run_dir), job_.cfg));
  if (point.ledger) job_.ledger = std::move(point.ledger);
  resume_ = std::move(point);
  return Status::Ok();
}

Status JobRunner::Setup() {
  const JobConfig& cfg = job_.cfg;
  job_.progress = std::make_unique<observe::Progress>(
      observe::Progress::ChooseMode(opts_.print_progress, stdout), stdout);
  GYRE_RETURN_IF_ERROR(LoadJobInputs(opts_.reward, &job_));
  GYRE_RETURN_IF_ERROR(MakeDirs(job_.run_dir + "/logs").WithContext("run directory"));
  GYRE_RETURN_IF_ERROR(StartJobServices(&job_));
  MakeScorer(&job_);
  job_.result.run_dir = job_.run_dir;
  if (!resume_) {  // a resumed run keeps its files until the checkpoint has loaded
    // A new run replaces an earlier one's record; its checkpoints must not be resumed later.
    if (PathExists(job_.run_dir + "/checkpoints")) {
      GYRE_LOG_INFO("removing the checkpoints of an earlier run in {}", job_.run_dir);
      GYRE_RETURN_IF_ERROR(RemoveTree(job_.run_dir + "/checkpoints"));
    }
    GYRE_RETURN_IF_ERROR(OpenNewLedger(&job_));
    std::ofstream(job_.run_dir + "/config.yaml") << config::DumpJobConfig(cfg);
    GYRE_ASSIGN_OR_RETURN(
        job_.metrics,
        observe::RunMetrics::Create(job_.run_dir + "/" + cfg.metrics.file, TensorBoardDir(job_)));
  }
  return StartCluster();
}

Status JobRunner::StartCluster() {
  ClusterOptions co;
  co.logs_dir = job_.run_dir + "/logs";
  co.worker_binary = opts_.worker_binary;
  observe::Progress* progress = job_.progress.get();
  co.print = [progress](const std::string& line) { progress->Print(line); };
  co.status = [progress](const std::string& what) { progress->Status(what); };
  // The caller's token first (RunOptions::cancel), then a signal if RunJob installed handlers.
  co.interrupt_reason = [cancel = opts_.cancel, signals = opts_.install_signal_handlers] {
    if (cancel && cancel->cancelled()) return "cancelled: " + cancel->reason();
    return signals ? InterruptReason() : std::string();
  };
  co.clients = deps_.clients;
  co.death_grace_s = deps_.death_grace_s;
  co.on_workers_expected = deps_.on_workers_expected;
  GYRE_ASSIGN_OR_RETURN(job_.cluster, Cluster::Start(job_.cfg, std::move(co)));
  const std::string& address = job_.cluster->address();
  GYRE_LOG_INFO("controller listening on {}; run directory {}", address, job_.run_dir);
  // For launchers (gyre launch slurm's script): where this controller listens, once it does.
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(job_.run_dir + "/controller.address", address + "\n"));
  if (const char* slurm_job = std::getenv("SLURM_JOB_ID")) {
    GYRE_LOG_INFO("running in Slurm job {} (scancel {} stops the whole job)", slurm_job, slurm_job);
    job_.slurm_job_id = slurm_job;
  }
  if (!job_.cfg.metrics.endpoint.empty()) GYRE_RETURN_IF_ERROR(StartJobEndpoint(&job_));
  if (job_.env_service) {
    job_.cluster->scheduler()->SetEnvAddress(
        [env = job_.env_service.get()] { return env->address(); });
  }
  return job_.cluster->StartWorkers();
}

StatusOr<double> JobRunner::Evaluate(const std::string& tag, int step) {
  job_.progress->Status("evaluating (" + tag + ")");
  // Evaluation has its own id space: drawing from the training sequence would make
  // metrics.eval_every or data.eval_size change the training run's ids and seeds.
  GYRE_ASSIGN_OR_RETURN(
      EvalOutcome e,
      EvaluateHeldOut(*job_.problems, *job_.prompts, *job_.scorer, job_.reward->correct_threshold(),
                      job_.cluster->scheduler(), job_.version, &next_eval_group_id_, tag));
  nlohmann::json record = EvalMetrics(tag, e, job_.version);
  record["step"] = step;  // the GRPO steps done before it (0 before RL)
  WriteMetrics(&job_, record);
  job_.progress->Print(EvalProgressLine(tag, e, job_.version));
  return e.accuracy;
}

StatusOr<JobResult> JobRunner::Run() {
  const auto t0 = SteadyClock::now();
  if (opts_.resume) GYRE_RETURN_IF_ERROR(PrepareResume());
  GYRE_RETURN_IF_ERROR(Setup());
  source_ = MakeBatchSource(&job_);
  finisher_ = std::make_unique<StepFinisher>(&job_);
  if (resume_) {
    GYRE_RETURN_IF_ERROR(ResumeJob(&job_, resume_->dir, resume_->state, source_.get()));
  } else {
    GYRE_RETURN_IF_ERROR(Publish(&job_));
    GYRE_RETURN_IF_ERROR(WarmUp(&job_));
    GYRE_ASSIGN_OR_RETURN(job_.result.accuracy_before_rl, Evaluate("before_rl", 0));
    if (job_.cfg.trainer.checkpoint_every > 0) {
      GYRE_RETURN_IF_ERROR(SaveCheckpoint(&job_, source_.get(), 0, t0));
    }
  }
  GYRE_RETURN_IF_ERROR(RunSteps(t0));
  GYRE_RETURN_IF_ERROR(PublishIfBehind(&job_));
  GYRE_ASSIGN_OR_RETURN(job_.result.accuracy_after_rl,
                        Evaluate("after_rl", job_.result.grpo_steps));
  job_.progress->Status("saving the final model");
  GYRE_RETURN_IF_ERROR(job_.cluster->trainers()->SaveModel(job_.run_dir + "/final"));
  job_.progress->Clear();
  job_.result.policy_version = job_.version;
  job_.result.wall_seconds = job_.wall_before + SecondsSince(t0);
  WriteSummary();
  return job_.result;
}

Status JobRunner::RunSteps(SteadyClock::time_point job_start) {
  const JobConfig& cfg = job_.cfg;
  source_->Begin();
  for (int step = job_.first_step; step <= cfg.trainer.steps; ++step) {
    GYRE_RETURN_IF_ERROR(Revive(&job_));
    const auto step_start = SteadyClock::now();
    GYRE_ASSIGN_OR_RETURN(StepBatch batch, source_->NextBatch(step));
    GYRE_RETURN_IF_ERROR(finisher_->Finish(step, step_start, &batch, source_.get()));
    job_.result.grpo_steps = step;
    const bool budget_spent = cfg.trainer.max_generated_tokens > 0 &&
                              job_.generated_tokens >= cfg.trainer.max_generated_tokens;
    if (cfg.metrics.eval_every > 0 && step % cfg.metrics.eval_every == 0 &&
        step != cfg.trainer.steps) {
      // Evaluation needs the workers: rollout for later steps waits meanwhile.
      GYRE_RETURN_IF_ERROR(source_->Pause());
      GYRE_RETURN_IF_ERROR(PublishIfBehind(&job_));
      GYRE_RETURN_IF_ERROR(Evaluate("step_" + std::to_string(step), step).status());
      source_->Resume();
    }
    if (cfg.trainer.checkpoint_every > 0 && step % cfg.trainer.checkpoint_every == 0) {
      GYRE_RETURN_IF_ERROR(SaveCheckpoint(&job_, source_.get(), step, job_start));
    }
    if (budget_spent) {
      GYRE_LOG_INFO("trainer.max_generated_tokens: {} tokens generated after step {}; GRPO ends",
                    job_.generated_tokens, step);
      break;
    }
  }
  return source_->End();
}

void JobRunner::WriteSummary() {
  const JobResult& r = job_.result;
  nlohmann::json summary = {{"accuracy_before_rl", r.accuracy_before_rl},
                            {"accuracy_after_rl", r.accuracy_after_rl},
                            {"grpo_steps", r.grpo_steps},
                            {"policy_version", r.policy_version},
                            {"final_mean_reward", r.final_mean_reward},
                            {"worker_restarts", job_.cluster->pool()->restarts_caught_up()},
                            {"wall_seconds", r.wall_seconds}};
  if (!job_.slurm_job_id.empty()) summary["slurm_job_id"] = job_.slurm_job_id;
  std::ofstream(job_.run_dir + "/summary.json") << summary.dump(2) << "\n";
  WriteMetrics(&job_, {{"phase", "summary"},
                       {"accuracy_before_rl", r.accuracy_before_rl},
                       {"accuracy_after_rl", r.accuracy_after_rl},
                       {"wall_seconds", r.wall_seconds}});
}

void JobRunner::Teardown() {
  if (torn_down_) return;
  torn_down_ = true;
  if (source_) source_->Shutdown();
  if (job_.cluster) job_.cluster->Shutdown();
}

}  // namespace

StatusOr<JobResult> RunJobImpl(const JobConfig& config, const RunOptions& options, JobDeps deps) {
  std::optional<SignalScope> signals;
  if (options.install_signal_handlers) signals.emplace();
  JobRunner runner(config, options, std::move(deps));
  return runner.Run();
}

}  // namespace gyre::controller
