#include "controller/job_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "agent/service_supervisor.h"
#include "algorithm/lr_schedule.h"
#include "algorithm/sampling_policy.h"
#include "comm/gloo_communicator.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "config/config.h"
#include "controller/async_scheduler.h"
#include "controller/checkpoint.h"
#include "controller/controller_service.h"
#include "controller/evaluation.h"
#include "controller/prompts.h"
#include "controller/rollout_scheduler.h"
#include "controller/sample_ledger.h"
#include "controller/signals.h"
#include "controller/step_report.h"
#include "controller/step_scorer.h"
#include "controller/task.h"
#include "controller/trainer_group.h"
#include "controller/weight_publisher.h"
#include "controller/worker_pool.h"
#include "model/hf_config.h"
#include "observe/metrics_endpoint.h"
#include "observe/progress.h"
#include "observe/run_metrics.h"
#include "rpc/rpc_util.h"
#include "rpc/security.h"
#include "text/episode_chat.h"
#include "text/text_tokenizer.h"

namespace gyre::controller {

namespace {

// The live status line while a GRPO step is in one of its phases: "step 12 training".
std::string StepActivity(int64_t step, const char* what) {
  return "step " + std::to_string(step) + " " + what;
}

// The job's story: set up, publish v0, warm up, evaluate, GRPO steps (generate, score, train,
// publish), evaluate, save. The components do the work: WorkerPool (processes, health,
// restarts), RolloutScheduler (dispatch), TrainerGroup (the train call), WeightPublisher
// (transports and receipts). One thread (the caller's) runs it.
class JobRunner {
 public:
  JobRunner(const JobConfig& config, const RunOptions& options) : cfg_(config), opts_(options) {}
  ~JobRunner() { Teardown(); }

  StatusOr<JobResult> Run();

 private:
  Status Setup();
  StatusOr<double> Evaluate(const std::string& tag, int step);
  Status WarmUp();
  Status GrpoStep(int step);
  // rollout.async: a step's batch comes from the AsyncScheduler, generated ahead of training.
  Status AsyncGrpoStep(int step);
  // After the last async step: stops generation and ends the untrained samples in the ledger.
  Status EndAsync();
  // Draws `count` new prompt groups of n samples (0 = rollout.group_size) for GRPO step `step`
  // and adds their samples to the ledger; the sampling policy may skip drawn prompts.
  StatusOr<std::vector<GroupJob>> DrawGroups(int count, int step, int n = 0);
  // rollout.budget: after the first round of *jobs (*samples, n per group), generates the
  // policy's top-ups and merges them into their groups (jobs' n grows); the policy observes
  // every group's rewards.
  Status TopUpRound(int step, const v1::SamplingParams& sampling, const LedgerSink& sink,
                    std::vector<GroupJob>* jobs, std::vector<v1::Sample>* samples,
                    GenerateStats* gen, double* gen_s);
  // The rest of a step once its groups are scored: advantages, train, ledger, `publish`, metrics
  // (with `extra` fields) and the progress line.
  Status FinishStep(int step, SteadyClock::time_point t0, StepScores* scores,
                    const GenerateStats& gen, double gen_s, int rounds, nlohmann::json extra,
                    const std::function<Status()>& publish);
  Status Publish() {
    progress_->Status("sending policy v" + std::to_string(version_) + " to the rollout workers");
    GYRE_RETURN_IF_ERROR(publisher_->Publish(version_));
    published_ = version_;
    return Status::Ok();
  }
  // trainer.publish_every: the rollout workers may hold an older version than the trainer;
  // evaluation needs the current one. (Asynchronous generation is paused or over meanwhile.)
  Status PublishIfBehind() { return published_ < version_ ? Publish() : Status::Ok(); }
  // Brings restarted rollout workers back: each gets the current version alone first.
  Status Revive() {
    return pool_->Revive(version_, [this](Worker* w) { return publisher_->CatchUp(w, version_); });
  }
  StatusOr<std::map<std::string, double>> Train(const std::vector<v1::Sample>& samples,
                                                const TrainOptions& opts);
  void WriteMetrics(const nlohmann::json& j);
  void Teardown();
  // Checkpoints (controller/checkpoint.h). PrepareResume runs before Setup and reads and checks
  // the controller's part of the newest checkpoint without changing anything; Resume (after
  // Setup) restores the trainer and the controller from it and publishes the restored weights.
  // SaveCheckpoint writes a checkpoint after GRPO step `step` (0 = after the warm-up).
  std::string RunDir() const { return AbsolutePath(cfg_.job.output_dir + "/" + cfg_.job.name); }
  // The sample ledger (controller/sample_ledger.h) of the run.
  std::string LedgerPath() const { return RunDir() + "/ledger.db"; }
  Status OpenNewLedger();
  Status StartEndpoint();
  std::string TensorBoardDir() const {
    return cfg_.metrics.tensorboard ? run_dir_ + "/tensorboard" : std::string();
  }
  Status PrepareResume();
  Status Resume();
  Status SaveCheckpoint(int step, SteadyClock::time_point job_start);

  JobConfig cfg_;
  RunOptions opts_;
  std::unique_ptr<text::TextTokenizer> tokenizer_;
  std::unique_ptr<PromptEncoder> prompts_;
  std::shared_ptr<RewardFn> reward_;
  std::unique_ptr<ProblemSource> problems_;
  std::string run_dir_;
  std::unique_ptr<observe::Progress> progress_;  // the live status line / progress lines
  double grpo_seconds_ = 0;                      // this process's GRPO steps (the ETA)
  int grpo_steps_run_ = 0;
  std::unique_ptr<observe::RunMetrics> metrics_;
  bool metrics_failed_ = false;  // warned once
  std::unique_ptr<ControllerService> service_;
  // metrics.endpoint; declared after service_, which its handlers read, so it stops first.
  std::unique_ptr<observe::MetricsEndpoint> endpoint_;
  std::atomic<int> last_step_{0};  // the last finished GRPO step (/health)
  std::string slurm_job_id_;       // $SLURM_JOB_ID when the controller runs inside Slurm
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<comm::StoreServer> weight_store_;  // gloo/nccl weight transport's rendezvous
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<WeightPublisher> publisher_;
  std::unique_ptr<TrainerGroup> trainers_;
  std::unique_ptr<RolloutScheduler> scheduler_;
  std::unique_ptr<AsyncScheduler> async_;        // rollout.async; destroyed before the pool
  std::unique_ptr<AsyncCarried> async_restore_;  // rollout.async: what a resume continues
  std::unique_ptr<SampleLedger> ledger_;
  std::unique_ptr<StepScorer> scorer_;
  std::unique_ptr<algorithm::SamplingPolicy> policy_;  // rollout.budget
  uint64_t draws_this_step_ = 0;  // prompts drawn in this step (the policy's Skip)
  int64_t generated_tokens_ = 0;  // over the job's GRPO steps (max_generated_tokens)
  int64_t version_ = 0;
  int64_t published_ = -1;  // the version the rollout workers were last sent
  uint64_t next_group_id_ = 0;
  // Evaluation's group ids: a space of their own (high bit set), not saved in checkpoints.
  static constexpr uint64_t kEvalGroupIdBase = uint64_t{1} << 63;
  uint64_t next_eval_group_id_ = kEvalGroupIdBase;
  JobResult result_;
  bool torn_down_ = false;
  std::unique_ptr<agent::ServiceSupervisor> env_service_;  // env.address or env.command
  std::string resume_dir_;        // the checkpoint being resumed from, if any
  ControllerState resume_state_;  // its controller part, read by PrepareResume
  int first_step_ = 1;            // the first GRPO step this process runs
  double wall_before_ = 0;        // job time spent before the resumed checkpoint
};

Status JobRunner::Setup() {
  progress_ = std::make_unique<observe::Progress>(
      observe::Progress::ChooseMode(opts_.print_progress, stdout), stdout);
  GYRE_ASSIGN_OR_RETURN(reward_, ChooseReward(cfg_.reward, opts_.reward));
  if (cfg_.data.chat_template != "none" && cfg_.model.path.empty()) {
    return InvalidArgument("data.chat_template: " + cfg_.data.chat_template +
                           " needs a model.path whose tokenizer has chat tokens");
  }
  if (!cfg_.model.path.empty()) {
    // model.max_seq_len limits every job; with a model directory it must fit the model too.
    GYRE_ASSIGN_OR_RETURN(model::ModelSpec spec, model::LoadHfConfig(cfg_.model.path));
    GYRE_RETURN_IF_ERROR(
        model::EffectiveMaxSeqLen(spec, cfg_.model.max_seq_len, cfg_.model.path + "/config.json")
            .status());
  }
  GYRE_ASSIGN_OR_RETURN(tokenizer_, text::MakeTextTokenizer(cfg_.model));
  GYRE_ASSIGN_OR_RETURN(ProblemSource src, ProblemSource::Create(cfg_.data, cfg_.job.seed));
  problems_ = std::make_unique<ProblemSource>(std::move(src));
  prompts_ = std::make_unique<PromptEncoder>(cfg_, tokenizer_.get());
  if (prompts_->episodes()) {
    // The template is loaded here too (the rollout workers render with it): a bad one fails the
    // job before any process starts, and the warm-up renders its demonstrations with it.
    auto chat =
        text::EpisodeChat::Load(cfg_.env.chat_template, cfg_.model.path, cfg_.env.template_kwargs);
    if (!chat.ok()) return chat.status().WithContext("env.chat_template");
    prompts_->SetEpisodeChat(chat->AsFunction());
  }
  // Every prompt, training and evaluation, must encode and fit before any process starts: a bad
  // record found when drawn could be hours in.
  GYRE_RETURN_IF_ERROR(prompts_->CheckAll(*problems_));

  run_dir_ = RunDir();
  GYRE_RETURN_IF_ERROR(MakeDirs(run_dir_ + "/logs").WithContext("run directory"));
  if (reward_ == nullptr) {  // reward.type: service
    GYRE_ASSIGN_OR_RETURN(reward_, StartRewardService(cfg_.reward, run_dir_ + "/logs/reward.log"));
  }
  if (prompts_->episodes()) {
    GYRE_ASSIGN_OR_RETURN(env_service_, StartEnvService(cfg_.env, run_dir_ + "/logs/env.log"));
    GYRE_LOG_INFO("environment server '{}' at {}", env_service_->description().name(),
                  env_service_->address());
  }
  result_.run_dir = run_dir_;
  const std::string yaml = config::DumpJobConfig(cfg_);
  if (resume_dir_.empty()) {  // a resumed run keeps its files until the checkpoint has loaded
    // A new run replaces an earlier one's record; its checkpoints must not be resumed later.
    if (PathExists(run_dir_ + "/checkpoints")) {
      GYRE_LOG_INFO("removing the checkpoints of an earlier run in {}", run_dir_);
      GYRE_RETURN_IF_ERROR(RemoveTree(run_dir_ + "/checkpoints"));
    }
    GYRE_RETURN_IF_ERROR(OpenNewLedger());
    std::ofstream(run_dir_ + "/config.yaml") << yaml;
    GYRE_ASSIGN_OR_RETURN(metrics_, observe::RunMetrics::Create(run_dir_ + "/" + cfg_.metrics.file,
                                                                TensorBoardDir()));
  }

  GYRE_RETURN_IF_ERROR(rpc::ConfigureJobSecurity(cfg_.cluster));
  service_ = std::make_unique<ControllerService>(yaml, cfg_.cluster.heartbeat_interval_s,
                                                 cfg_.cluster.heartbeat_timeout_s);
  GYRE_ASSIGN_OR_RETURN(server_,
                        rpc::StartServer(cfg_.cluster.bind_host, cfg_.cluster.controller_port,
                                         {service_.get()}, &address_));
  GYRE_LOG_INFO("controller listening on {}; run directory {}", address_, run_dir_);
  // For launchers (gyre launch slurm's script): where this controller listens, once it does.
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(run_dir_ + "/controller.address", address_ + "\n"));
  if (const char* slurm_job = std::getenv("SLURM_JOB_ID")) {
    GYRE_LOG_INFO("running in Slurm job {} (scancel {} stops the whole job)", slurm_job, slurm_job);
    slurm_job_id_ = slurm_job;
  }
  if (!cfg_.metrics.endpoint.empty()) GYRE_RETURN_IF_ERROR(StartEndpoint());
  if (cfg_.cluster.weight_transport == "gloo" || cfg_.cluster.weight_transport == "nccl") {
    GYRE_ASSIGN_OR_RETURN(weight_store_, comm::StoreServer::Start(cfg_.cluster.bind_host));
    GYRE_LOG_INFO("weight rendezvous store on {}", weight_store_->address());
  }
  WorkerPoolOptions po;
  po.controller_address = address_;
  po.worker_binary = !opts_.worker_binary.empty()          ? opts_.worker_binary
                     : !cfg_.cluster.worker_binary.empty() ? cfg_.cluster.worker_binary
                                                           : SelfExecutable();
  po.logs_dir = run_dir_ + "/logs";
  po.print = [this](const std::string& line) { progress_->Print(line); };
  // The caller's token first (RunOptions::cancel), then a signal if RunJob installed handlers.
  po.interrupt_reason = [cancel = opts_.cancel, signals = opts_.install_signal_handlers] {
    if (cancel && cancel->cancelled()) return "cancelled: " + cancel->reason();
    return signals ? InterruptReason() : std::string();
  };
  pool_ = std::make_unique<WorkerPool>(cfg_, service_.get(), std::move(po));
  publisher_ = std::make_unique<WeightPublisher>(
      cfg_, pool_.get(), weight_store_ ? weight_store_->address() : std::string());
  trainers_ = std::make_unique<TrainerGroup>(cfg_, pool_.get());
  scheduler_ = std::make_unique<RolloutScheduler>(cfg_, pool_.get());
  scorer_ = std::make_unique<StepScorer>(cfg_.algorithm, cfg_.rollout.group_size, tokenizer_.get(),
                                         reward_.get(), cfg_.rollout.max_new_tokens);
  scorer_->SetFailurePolicy(cfg_.reward.on_failure, cfg_.reward.retries);
  if (env_service_) {
    scheduler_->SetEnvAddress([env = env_service_.get()] { return env->address(); });
    scorer_->SetEpisodes(cfg_.reward.type == "env");
  }
  policy_ = algorithm::MakeSamplingPolicy(cfg_, reward_->correct_threshold());
  GYRE_RETURN_IF_ERROR(pool_->Start());
  progress_->Status("starting " + std::to_string(cfg_.rollout.workers + cfg_.trainer.workers) +
                    " workers (each loads the model)");
  GYRE_RETURN_IF_ERROR(pool_->WaitRegistered());
  progress_->Status("forming the trainer group");
  return trainers_->Form();
}

StatusOr<double> JobRunner::Evaluate(const std::string& tag, int step) {
  progress_->Status("evaluating (" + tag + ")");
  // Evaluation has its own id space: drawing from the training sequence would make
  // metrics.eval_every or data.eval_size change the training run's ids and seeds.
  GYRE_ASSIGN_OR_RETURN(
      EvalOutcome e, EvaluateHeldOut(*problems_, *prompts_, *scorer_, reward_->correct_threshold(),
                                     scheduler_.get(), version_, &next_eval_group_id_, tag));
  nlohmann::json record = EvalMetrics(tag, e, version_);
  record["step"] = step;  // the GRPO steps done before it (0 before RL)
  WriteMetrics(record);
  progress_->Print(EvalProgressLine(tag, e, version_));
  return e.accuracy;
}

StatusOr<std::map<std::string, double>> JobRunner::Train(const std::vector<v1::Sample>& samples,
                                                         const TrainOptions& opts) {
  return trainers_->Train(samples, version_, opts, &version_);
}

Status JobRunner::WarmUp() {
  const int steps = cfg_.trainer.warmup_sft_steps;
  if (steps <= 0) return Status::Ok();
  const auto t0 = SteadyClock::now();
  constexpr size_t kWindow = 20;
  const double stop_at = cfg_.trainer.warmup_stop_token_accuracy;
  std::vector<double> recent_acc;
  for (int step = 1; step <= steps; ++step) {
    GYRE_RETURN_IF_ERROR(pool_->CheckHealth());
    std::vector<v1::Sample> batch;
    for (int i = 0; i < cfg_.trainer.warmup_sft_batch; ++i) {
      GYRE_ASSIGN_OR_RETURN(v1::Sample s, prompts_->SftSample(problems_->Next()));
      batch.push_back(std::move(s));
    }
    TrainOptions sft;
    sft.objective = v1::OBJECTIVE_SFT;
    sft.lr = cfg_.trainer.warmup_sft_lr;
    GYRE_ASSIGN_OR_RETURN(auto m, Train(batch, sft));
    nlohmann::json j = {{"phase", "warmup"}, {"step", step}, {"policy_version", version_}};
    for (const auto& [k, v] : m) j[k] = v;
    WriteMetrics(j);
    recent_acc.push_back(m["token_accuracy"]);
    if (recent_acc.size() > kWindow) recent_acc.erase(recent_acc.begin());
    double mean_acc = 0;
    for (double a : recent_acc) mean_acc += a / static_cast<double>(recent_acc.size());
    const bool reached = stop_at > 0 && recent_acc.size() == kWindow && mean_acc >= stop_at;
    char line[160];
    std::snprintf(line, sizeof(line), "warmup %4d/%d  loss %.4f  token-acc %.3f  %.1f s", step,
                  steps, m["loss"], m["token_accuracy"], SecondsSince(t0));
    if (step % std::max(1, steps / 5) == 0 || step == steps || reached) {
      progress_->Print(line);
    } else {
      progress_->StepLine("", line);  // live mode only: the line's summary
    }
    if (reached) {
      std::snprintf(line, sizeof(line),
                    "warmup stops at step %d: token accuracy %.3f (mean of %zu steps) >= %.3f",
                    step, mean_acc, kWindow, stop_at);
      progress_->Print(line);
      break;
    }
  }
  return Publish();
}

StatusOr<std::vector<GroupJob>> JobRunner::DrawGroups(int count, int step, int n) {
  std::vector<GroupJob> jobs;
  // A sampling policy may skip drawn prompts (rollout.budget.policy: greso); a bounded number of
  // draws keeps a policy that skips nearly everything from drawing forever.
  const int64_t max_draws = 64 * static_cast<int64_t>(count) + 64;
  for (int64_t d = 0; static_cast<int>(jobs.size()) < count && d < max_draws; ++d) {
    Problem problem = problems_->Next();
    if (policy_->Skip(problem.prompt, step, draws_this_step_++)) continue;
    GYRE_ASSIGN_OR_RETURN(GroupJob j, prompts_->TrainingGroup(problem, next_group_id_++,
                                                              n > 0 ? n : cfg_.rollout.group_size));
    jobs.push_back(std::move(j));
  }
  if (!jobs.empty()) {
    GYRE_RETURN_IF_ERROR(ledger_->Add(QueuedSamples(jobs), {step, version_, "", ""}));
  }
  return jobs;
}

Status JobRunner::GrpoStep(int step) {
  const auto t0 = SteadyClock::now();
  const int want = cfg_.rollout.prompts_per_step;
  const bool partial = cfg_.rollout.partial_rollouts;
  const v1::SamplingParams sampling = prompts_->Training();
  const LedgerSink sink{ledger_.get(), step, version_};
  GenerateStats gen;
  double gen_s = 0;
  StepScores sc_out;
  // Round 0 draws the step's groups; with algorithm.filter_zero_variance, up to
  // algorithm.max_filter_rounds more rounds replace the groups it filtered out.
  int rounds = 0;
  int64_t samples_generated = 0;
  while (true) {
    const int usable = static_cast<int>(sc_out.group_sizes.size());
    int new_groups = want - usable;
    if (rounds == 0 && partial) {
      // With partial rollouts, over_provision * prompts_per_step groups are in flight, counting
      // those carried over from the last step.
      const int in_flight = static_cast<int>(std::ceil(cfg_.rollout.over_provision * want - 1e-9));
      new_groups = std::max(0, in_flight - static_cast<int>(scheduler_->carried_groups()));
    }
    GYRE_ASSIGN_OR_RETURN(std::vector<GroupJob> jobs,
                          DrawGroups(new_groups, step, policy_->FirstRound()));
    const auto tg = SteadyClock::now();
    progress_->Status(StepActivity(step, "generating"));
    GYRE_ASSIGN_OR_RETURN(
        auto samples,
        partial ? scheduler_->GeneratePartial(&jobs, want - usable, sampling, version_, &gen, &sink)
                : scheduler_->GenerateAll(jobs, sampling, version_, &gen, &sink));
    gen_s += SecondsSince(tg);
    if (!partial && cfg_.rollout.budget.policy != "uniform") {
      // rollout.budget: a second round tops groups up; the policy sees every group's rewards.
      // (uniform neither tops up nor observes: its step stays as it was.)
      GYRE_RETURN_IF_ERROR(TopUpRound(step, sampling, sink, &jobs, &samples, &gen, &gen_s));
    }
    samples_generated += static_cast<int64_t>(samples.size());
    GYRE_RETURN_IF_ERROR(scorer_->Score(jobs, &samples, step, version_, ledger_.get(), &sc_out));
    ++rounds;
    if (!cfg_.algorithm.filter_zero_variance ||
        static_cast<int>(sc_out.group_sizes.size()) >= want ||
        rounds > cfg_.algorithm.max_filter_rounds) {
      break;
    }
  }
  nlohmann::json extra = {{"samples_generated", samples_generated}};
  policy_->AddMetrics(&extra);
  policy_->EndStep();
  draws_this_step_ = 0;
  return FinishStep(step, t0, &sc_out, gen, gen_s, rounds, extra, [this] { return Publish(); });
}

Status JobRunner::TopUpRound(int step, const v1::SamplingParams& sampling, const LedgerSink& sink,
                             std::vector<GroupJob>* jobs, std::vector<v1::Sample>* samples,
                             GenerateStats* gen, double* gen_s) {
  // The first round's rewards (kept by the scorer for Score).
  std::vector<algorithm::GroupRewards> outcome;
  size_t begin = 0;
  for (const GroupJob& j : *jobs) {
    algorithm::GroupRewards g{j.problem.prompt, {}};
    for (int i = 0; i < j.group.n(); ++i) {
      auto r = scorer_->PeekReward(j.problem, (*samples)[begin + i]);
      if (r.ok()) g.rewards.push_back(*r);  // a failed reward is counted when scored
    }
    begin += static_cast<size_t>(j.group.n());
    outcome.push_back(std::move(g));
  }
  const std::vector<int> extra = policy_->TopUps(outcome);
  // Each top-up is a group of its own (own ids and seed, at most group_size samples), merged
  // into its prompt's group after generation.
  std::vector<GroupJob> topups;
  std::vector<size_t> owner;
  for (size_t g = 0; g < jobs->size(); ++g) {
    for (int left = extra[g]; left > 0;) {
      const int n = std::min(left, cfg_.rollout.group_size);
      GYRE_ASSIGN_OR_RETURN(GroupJob t,
                            prompts_->TrainingGroup((*jobs)[g].problem, next_group_id_++, n));
      topups.push_back(std::move(t));
      owner.push_back(g);
      left -= n;
    }
  }
  if (!topups.empty()) {
    GYRE_RETURN_IF_ERROR(ledger_->Add(QueuedSamples(topups), {step, version_, "", ""}));
    const auto tg = SteadyClock::now();
    GYRE_ASSIGN_OR_RETURN(auto more,
                          scheduler_->GenerateAll(topups, sampling, version_, gen, &sink));
    *gen_s += SecondsSince(tg);
    // Merge: each group's first-round samples, then its top-ups' in order.
    std::vector<std::vector<v1::Sample>> by_group(jobs->size());
    size_t at = 0;
    for (size_t g = 0; g < jobs->size(); ++g) {
      for (int i = 0; i < (*jobs)[g].group.n(); ++i)
        by_group[g].push_back(std::move((*samples)[at++]));
    }
    at = 0;
    for (size_t t = 0; t < topups.size(); ++t) {
      for (int i = 0; i < topups[t].group.n(); ++i) {
        auto r = scorer_->PeekReward(topups[t].problem, more[at]);
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
  policy_->Observe(outcome);
  return Status::Ok();
}

Status JobRunner::AsyncGrpoStep(int step) {
  const auto t0 = SteadyClock::now();
  // Admission: after step - 1 steps, at most (k + step) * prompts_per_step groups ever.
  progress_->Status(StepActivity(step, "waiting for rollouts"));
  GYRE_RETURN_IF_ERROR(async_->Admit(
      step - 1, [&](int64_t count) { return DrawGroups(static_cast<int>(count), step); }));
  GYRE_ASSIGN_OR_RETURN(std::vector<ReadyGroup> batch, async_->NextBatch(version_, step));
  const AsyncStats as = async_->stats();
  std::vector<GroupJob> jobs;
  std::vector<v1::Sample> samples;
  for (ReadyGroup& rg : batch) {
    jobs.push_back(std::move(rg.job));
    for (auto& smp : rg.samples) samples.push_back(std::move(smp));
  }
  StepScores sc_out;
  GYRE_RETURN_IF_ERROR(scorer_->Score(jobs, &samples, step, version_, ledger_.get(), &sc_out));
  nlohmann::json extra = {{"async_wait_s", as.wait_s},      {"admitted_groups", as.admitted},
                          {"queued_groups", as.queued},     {"in_flight_groups", as.in_flight},
                          {"ready_groups", as.ready},       {"stolen_samples", as.stolen},
                          {"repacked_samples", as.repacked}};
  extra["published_version"] = published_;
  return FinishStep(step, t0, &sc_out, as.generate, as.wait_s, 1, extra, [this, step]() -> Status {
    // trainer.publish_every: between publishes the workers keep generating with the version they
    // hold; the batching rule still keeps every trained sample within algorithm.max_staleness.
    if (step % cfg_.trainer.publish_every != 0) return Status::Ok();
    if (cfg_.rollout.weight_updates == "between_steps" ||
        cfg_.rollout.weight_updates == "between_steps_repack") {
      // No lockstep: the workers take the version between engine steps of the calls they are
      // running; calls started after the publish need it (and with repacking, the long tails
      // move onto tail workers).
      GYRE_RETURN_IF_ERROR(Publish());
      async_->Resume(version_);
      return Status::Ok();
    }
    // Publish to everyone, then continue: calls in flight end first (repack: their unfinished
    // samples are taken out, to continue on the new version), new ones need the new version.
    GYRE_RETURN_IF_ERROR(async_->Pause(cfg_.rollout.weight_updates == "repack"));
    GYRE_RETURN_IF_ERROR(Publish());
    async_->Resume(version_);
    return Status::Ok();
  });
}

Status JobRunner::FinishStep(int step, SteadyClock::time_point t0, StepScores* scores,
                             const GenerateStats& gen, double gen_s, int rounds,
                             nlohmann::json extra, const std::function<Status()>& publish) {
  std::vector<v1::Sample>& kept = scores->kept;
  generated_tokens_ += gen.generated_tokens;
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
                  scores->filtered_groups, rounds);
    extra["useful_groups"] = 0;
  } else {
    // Log-probs are taken at the sampling temperature (greedy sampling: 1).
    const double temperature =
        cfg_.rollout.sampling.temperature > 0 ? cfg_.rollout.sampling.temperature : 1.0;
    if (cfg_.algorithm.kl_in == "reward") {
      // docs/algorithms.md, "KL to the reference policy": each kept sample's reward loses
      // kl_coef times its KL to the reference, before the advantages.
      GYRE_ASSIGN_OR_RETURN(std::vector<double> kl,
                            trainers_->SequenceKl(kept, version_, temperature));
      double sum = 0;
      for (size_t i = 0; i < kept.size(); ++i) {
        const auto shaped = static_cast<float>(scores->rewards[i] - cfg_.algorithm.kl_coef * kl[i]);
        scores->rewards[i] = shaped;
        kept[i].set_reward(shaped);
        sum += kl[i];
      }
      rec.kl_reward = sum / static_cast<double>(kept.size());
      rec.has_kl_reward = true;
    }
    GYRE_ASSIGN_OR_RETURN(rec.zero_variance_groups, scorer_->SetAdvantages(scores));
    // Groups with a learning signal (rollout.budget's figure of merit).
    extra["useful_groups"] =
        static_cast<int64_t>(scores->group_sizes.size()) - rec.zero_variance_groups;
    if (!scores->pivot_ids.empty()) {
      GYRE_RETURN_IF_ERROR(ledger_->Move(
          scores->pivot_ids, SampleState::kFiltered,
          {step, version_, "",
           "median pivot (MC-GRPO): its reward is the group's median, advantage 0, left out of "
           "the step"}));
    }
    const auto tt = SteadyClock::now();
    // The first GRPO step after a warm-up may start from a fresh optimizer state. Decided by the
    // step number alone, so a job resumed from the checkpoint after the warm-up does the same.
    TrainOptions pg;
    pg.lr = algorithm::LearningRate(cfg_.trainer, step);
    pg.temperature = temperature;
    pg.reset_optimizer = step == 1 && cfg_.trainer.warmup_sft_steps > 0 &&
                         cfg_.trainer.warmup_optimizer_state == "reset";
    progress_->Status(StepActivity(step, "training"));
    GYRE_ASSIGN_OR_RETURN(rec.train, Train(kept, pg));
    std::vector<uint64_t> kept_ids;
    for (const auto& k : kept) kept_ids.push_back(k.sample_id());
    GYRE_RETURN_IF_ERROR(ledger_->Move(kept_ids, SampleState::kTrained, {step, version_, "", ""}));
    rec.train_s = SecondsSince(tt);
    const auto tp = SteadyClock::now();
    GYRE_RETURN_IF_ERROR(publish());
    rec.publish_s = SecondsSince(tp);
  }
  rec.step = step;
  rec.steps = cfg_.trainer.steps;
  rec.version = version_;
  rec.scores = scores;
  rec.gen = &gen;
  rec.step_s = SecondsSince(t0);
  rec.generate_s = gen_s;
  rec.window_s = async_ ? rec.step_s : gen_s;
  rec.rounds = rounds;
  rec.filter_zero_variance = cfg_.algorithm.filter_zero_variance;
  rec.overlong_shaping = cfg_.algorithm.overlong_buffer > 0;
  rec.median_pivots = cfg_.algorithm.advantage == "median";
  if (cfg_.cluster.weight_relay_fanout > 0) rec.relay_rounds = publisher_->last_relay_rounds();
  if (cfg_.rollout.partial_rollouts) {
    rec.partial_carried = static_cast<int64_t>(scheduler_->carried_groups());
  }
  rec.extra = std::move(extra);
  result_.final_mean_reward = scores->reward_sum / std::max(1, scores->scored);
  WriteMetrics(StepMetrics(rec));
  last_step_ = step;
  grpo_seconds_ += rec.step_s;
  ++grpo_steps_run_;
  progress_->SetEta(
      observe::FormatDuration(grpo_seconds_ / grpo_steps_run_ * (cfg_.trainer.steps - step)));
  progress_->StepLine(StepProgressLine(rec), StepSummary(rec));
  progress_->Status(step < cfg_.trainer.steps ? "" : "finishing");
  return Status::Ok();
}

void JobRunner::WriteMetrics(const nlohmann::json& j) {
  Status st = metrics_->Write(j);
  if (!st.ok() && !metrics_failed_) {
    // The job goes on: its checkpoints and model matter more than its metrics.
    GYRE_LOG_WARN("metrics: {} (the job continues; later failures are not reported)",
                  st.ToString());
    metrics_failed_ = true;
  }
}

Status JobRunner::StartEndpoint() {
  auto health = [this]() -> nlohmann::json {
    nlohmann::json workers = nlohmann::json::object();
    bool all_alive = true;
    for (const WorkerInfo& w : service_->Snapshot()) {
      workers[w.id] = !w.alive ? "dead" : w.ready ? "ready" : "starting";
      all_alive = all_alive && w.alive;
    }
    return {{"status", all_alive ? "ok" : "degraded"},
            {"job", cfg_.job.name},
            {"step", last_step_.load()},
            {"steps", cfg_.trainer.steps},
            {"slurm_job_id", slurm_job_id_},
            {"workers", workers}};
  };
  GYRE_ASSIGN_OR_RETURN(endpoint_, observe::MetricsEndpoint::Start(cfg_.metrics.endpoint, health));
  endpoint_->SetRefresh([this](observe::MetricsEndpoint* ep) {
    std::map<std::pair<std::string, std::string>, int> states;
    for (const char* role : {"rollout", "trainer"}) {
      for (const char* state : {"starting", "ready", "dead"}) states[{role, state}] = 0;
    }
    for (const WorkerInfo& w : service_->Snapshot()) {
      const char* role = w.role == v1::WORKER_ROLE_TRAINER ? "trainer" : "rollout";
      ++states[{role, !w.alive ? "dead" : w.ready ? "ready" : "starting"}];
    }
    for (const auto& [key, n] : states) {
      ep->Set("gyre_workers", "Workers of each role in each state.", n,
              {{"role", key.first}, {"state", key.second}});
    }
    ep->Set("gyre_steps_planned", "trainer.steps of the job.", cfg_.trainer.steps);
  });
  if (metrics_) metrics_->SetEndpoint(endpoint_.get());
  GYRE_LOG_INFO("serving /metrics and /health on http://{}", endpoint_->address());
  return Status::Ok();
}

StatusOr<JobResult> JobRunner::Run() {
  const auto t0 = SteadyClock::now();
  if (opts_.resume) GYRE_RETURN_IF_ERROR(PrepareResume());
  GYRE_RETURN_IF_ERROR(Setup());
  if (opts_.resume) {
    GYRE_RETURN_IF_ERROR(Resume());
  } else {
    GYRE_RETURN_IF_ERROR(Publish());
    GYRE_RETURN_IF_ERROR(WarmUp());
    GYRE_ASSIGN_OR_RETURN(result_.accuracy_before_rl, Evaluate("before_rl", 0));
    if (cfg_.trainer.checkpoint_every > 0) GYRE_RETURN_IF_ERROR(SaveCheckpoint(0, t0));
  }
  if (cfg_.rollout.async) {
    async_ = std::make_unique<AsyncScheduler>(cfg_, pool_.get(), ledger_.get(),
                                              prompts_->Training(), version_, async_restore_.get());
    async_restore_.reset();
  }
  for (int step = first_step_; step <= cfg_.trainer.steps; ++step) {
    GYRE_RETURN_IF_ERROR(Revive());
    GYRE_RETURN_IF_ERROR(async_ ? AsyncGrpoStep(step) : GrpoStep(step));
    result_.grpo_steps = step;
    const bool budget_spent = cfg_.trainer.max_generated_tokens > 0 &&
                              generated_tokens_ >= cfg_.trainer.max_generated_tokens;
    if (cfg_.metrics.eval_every > 0 && step % cfg_.metrics.eval_every == 0 &&
        step != cfg_.trainer.steps) {
      // Evaluation needs the workers: rollout for later steps waits meanwhile.
      if (async_) GYRE_RETURN_IF_ERROR(async_->Pause());
      GYRE_RETURN_IF_ERROR(PublishIfBehind());
      GYRE_RETURN_IF_ERROR(Evaluate("step_" + std::to_string(step), step).status());
      if (async_) async_->Resume(version_);
    }
    if (cfg_.trainer.checkpoint_every > 0 && step % cfg_.trainer.checkpoint_every == 0) {
      GYRE_RETURN_IF_ERROR(SaveCheckpoint(step, t0));
    }
    if (budget_spent) {
      GYRE_LOG_INFO("trainer.max_generated_tokens: {} tokens generated after step {}; GRPO ends",
                    generated_tokens_, step);
      break;
    }
  }
  if (async_) GYRE_RETURN_IF_ERROR(EndAsync());
  GYRE_RETURN_IF_ERROR(PublishIfBehind());
  GYRE_ASSIGN_OR_RETURN(result_.accuracy_after_rl, Evaluate("after_rl", result_.grpo_steps));
  progress_->Status("saving the final model");
  GYRE_RETURN_IF_ERROR(trainers_->SaveModel(run_dir_ + "/final"));
  progress_->Clear();
  result_.policy_version = version_;
  result_.wall_seconds = wall_before_ + SecondsSince(t0);
  nlohmann::json summary = {{"accuracy_before_rl", result_.accuracy_before_rl},
                            {"accuracy_after_rl", result_.accuracy_after_rl},
                            {"grpo_steps", result_.grpo_steps},
                            {"policy_version", result_.policy_version},
                            {"final_mean_reward", result_.final_mean_reward},
                            {"worker_restarts", pool_->restarts_caught_up()},
                            {"wall_seconds", result_.wall_seconds}};
  if (!slurm_job_id_.empty()) summary["slurm_job_id"] = slurm_job_id_;
  std::ofstream(run_dir_ + "/summary.json") << summary.dump(2) << "\n";
  WriteMetrics({{"phase", "summary"},
                {"accuracy_before_rl", result_.accuracy_before_rl},
                {"accuracy_after_rl", result_.accuracy_after_rl},
                {"wall_seconds", result_.wall_seconds}});
  return result_;
}

Status JobRunner::PrepareResume() {
  GYRE_ASSIGN_OR_RETURN(ResumePoint point, OpenResumePoint(RunDir(), LedgerPath(), cfg_));
  resume_dir_ = std::move(point.dir);
  resume_state_ = std::move(point.state);
  if (point.ledger) ledger_ = std::move(point.ledger);
  return Status::Ok();
}

Status JobRunner::OpenNewLedger() {
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string path = LedgerPath() + suffix;
    if (PathExists(path)) GYRE_RETURN_IF_ERROR(RemoveTree(path));
  }
  GYRE_ASSIGN_OR_RETURN(ledger_, SampleLedger::Open(LedgerPath(), true));
  return Status::Ok();
}

Status JobRunner::Resume() {
  const ControllerState& st = resume_state_;
  GYRE_RETURN_IF_ERROR(
      problems_->RestoreState(st.problem_stream).WithContext(resume_dir_ + "/controller.json"));
  if (!st.sampling_policy.is_null()) {
    GYRE_RETURN_IF_ERROR(
        policy_->RestoreState(st.sampling_policy).WithContext(resume_dir_ + "/controller.json"));
  }
  // Every data-parallel rank loads the same state (the ranks hold identical weights and AdamW
  // state), so they continue in lockstep.
  GYRE_ASSIGN_OR_RETURN(const int64_t loaded, trainers_->LoadState(resume_dir_ + "/trainer"));
  if (loaded != st.policy_version) {
    return FailedPrecondition(resume_dir_ + ": trainer state is at policy version " +
                              std::to_string(loaded) + ", controller.json at " +
                              std::to_string(st.policy_version));
  }
  // Everything loaded: from here on the run directory continues from the checkpoint.
  version_ = st.policy_version;
  next_group_id_ = st.next_group_id;
  generated_tokens_ = st.generated_tokens;
  // Partial rollouts: the groups in flight at the checkpoint continue in the next step, on the
  // same workers as they would have (their kept KV is gone, so their context is prefilled).
  if (st.ledger_sequence >= 0) {
    GYRE_RETURN_IF_ERROR(RollBackLedger(ledger_.get(), st.ledger_sequence));
  } else {
    GYRE_LOG_WARN("{} predates the sample ledger; a new ledger starts at this resume", resume_dir_);
    GYRE_RETURN_IF_ERROR(OpenNewLedger());
  }
  if (cfg_.rollout.async) {
    // The admitted groups not yet trained go back to the asynchronous scheduler (Run).
    async_restore_ = std::make_unique<AsyncCarried>();
    async_restore_->groups = st.carried_groups;
    async_restore_->admitted = st.async_admitted;
  } else {
    GYRE_RETURN_IF_ERROR(scheduler_->RestoreCarried(st.carried_groups, ledger_.get()));
  }
  first_step_ = st.grpo_step + 1;
  wall_before_ = st.wall_seconds;
  result_.grpo_steps = st.grpo_step;
  result_.accuracy_before_rl = st.accuracy_before_rl;
  result_.final_mean_reward = st.final_mean_reward;
  const std::string metrics_path = run_dir_ + "/" + cfg_.metrics.file;
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(run_dir_ + "/config.yaml", config::DumpJobConfig(cfg_)));
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(metrics_path, st.metrics_jsonl));
  GYRE_ASSIGN_OR_RETURN(metrics_,
                        observe::RunMetrics::Resume(metrics_path, TensorBoardDir(), first_step_));
  if (endpoint_) metrics_->SetEndpoint(endpoint_.get());
  nlohmann::json resumed = {{"phase", "resume"},
                            {"step", st.grpo_step},
                            {"policy_version", version_},
                            {"checkpoint", resume_dir_}};
  if (cfg_.rollout.partial_rollouts) {
    resumed["partial_carried_groups"] = scheduler_->carried_groups();
  }
  if (cfg_.rollout.async) resumed["async_carried_groups"] = st.carried_groups.size();
  WriteMetrics(resumed);
  GYRE_LOG_INFO("resumed from {} at GRPO step {} (policy v{}, {} carried groups)", resume_dir_,
                st.grpo_step, version_, st.carried_groups.size());
  progress_->Print("resumed from " + resume_dir_ + " after GRPO step " +
                   std::to_string(st.grpo_step) + " (policy v" + std::to_string(version_) + ")");
  if (cfg_.rollout.partial_rollouts) {
    progress_->Print("continuing " + std::to_string(scheduler_->carried_groups()) +
                     " carried partial-rollout group(s)");
  }
  if (cfg_.rollout.async) {
    progress_->Print("continuing " + std::to_string(st.carried_groups.size()) +
                     " admitted group(s) not yet trained (rollout.async)");
  }
  return Publish();
}

Status JobRunner::SaveCheckpoint(int step, SteadyClock::time_point job_start) {
  const auto t0 = SteadyClock::now();
  const std::string final_dir = run_dir_ + "/checkpoints/" + CheckpointName(step);
  progress_->Status("saving checkpoint " + CheckpointName(step));
  const std::string tmp_dir = final_dir + ".tmp";
  GYRE_RETURN_IF_ERROR(RemoveTree(tmp_dir));
  GYRE_RETURN_IF_ERROR(MakeDirs(tmp_dir));
  StatusOr<int64_t> saved = trainers_->SaveState(tmp_dir + "/trainer");
  if (!saved.ok()) return saved.status().WithContext("checkpoint " + final_dir);
  if (*saved != version_) {
    return Internal("checkpoint " + final_dir + ": the trainer holds policy version " +
                    std::to_string(*saved) + ", the controller expects " +
                    std::to_string(version_));
  }
  ControllerState st;
  st.grpo_step = step;
  st.policy_version = version_;
  st.next_group_id = next_group_id_;
  st.problem_stream = problems_->SaveState();
  st.sampling_policy = policy_->SaveState();
  st.generated_tokens = generated_tokens_;
  st.accuracy_before_rl = result_.accuracy_before_rl;
  st.final_mean_reward = result_.final_mean_reward;
  st.wall_seconds = wall_before_ + SecondsSince(job_start);
  GYRE_ASSIGN_OR_RETURN(st.data_fingerprints, DataFingerprints(cfg_.data));
  st.config_yaml = config::DumpJobConfig(cfg_);
  GYRE_ASSIGN_OR_RETURN(st.metrics_jsonl, ReadFileToString(run_dir_ + "/" + cfg_.metrics.file));
  if (async_) {
    // Asynchronous rollout: no call may be in flight while the state is taken, so generation
    // pauses for the checkpoint (the groups it finishes meanwhile are kept as ready).
    GYRE_RETURN_IF_ERROR(async_->Pause());
    GYRE_ASSIGN_OR_RETURN(AsyncCarried carried, async_->Checkpoint(version_, step));
    st.carried_groups = std::move(carried.groups);
    st.async_admitted = carried.admitted;
  } else {
    st.carried_groups = scheduler_->SaveCarried();
    if (cfg_.rollout.async) st.async_admitted = 0;  // before the first GRPO step
  }
  GYRE_ASSIGN_OR_RETURN(st.ledger_sequence, ledger_->LastSequence());
  GYRE_RETURN_IF_ERROR(WriteControllerState(tmp_dir, st));
  GYRE_RETURN_IF_ERROR(CommitCheckpoint(tmp_dir, final_dir, cfg_.trainer.checkpoint_keep_last));
  if (async_) async_->Resume(published_);  // the workers still hold what was last published
  GYRE_LOG_INFO("checkpoint {} (policy v{}, {} carried groups) in {:.2f} s", final_dir, version_,
                st.carried_groups.size(), SecondsSince(t0));
  return Status::Ok();
}

Status JobRunner::EndAsync() {
  // Generation ran ahead of the last step: what it made for steps that will not run is let go,
  // and the ledger says so, so every sample it holds has ended.
  async_->Shutdown();
  GYRE_ASSIGN_OR_RETURN(
      const int64_t left,
      ledger_->DropUnended(
          {cfg_.trainer.steps, version_, "",
           "the job ended before a step could train it (rollout.async ran ahead)"}));
  GYRE_LOG_INFO("rollout.async: {} samples generated ahead were not trained (ledger: dropped)",
                left);
  return Status::Ok();
}

void JobRunner::Teardown() {
  if (torn_down_) return;
  torn_down_ = true;
  if (async_) async_->Shutdown();
  if (pool_) {
    pool_->Shutdown();
  } else if (service_) {
    service_->RequestStopAll();
  }
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace

StatusOr<JobResult> RunJobImpl(const JobConfig& config, const RunOptions& options) {
  std::optional<SignalScope> signals;
  if (options.install_signal_handlers) signals.emplace();
  JobRunner runner(config, options);
  return runner.Run();
}

}  // namespace gyre::controller
