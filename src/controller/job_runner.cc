#include "controller/job_runner.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/gloo_communicator.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "config/config.h"
#include "controller/checkpoint.h"
#include "controller/controller_service.h"
#include "controller/sharding.h"
#include "controller/task.h"
#include "kernels/reference/advantages_ref.h"
#include "model/chat_template.h"
#include "model/hf_config.h"
#include "model/text_tokenizer.h"
#include "ops/advantages.h"
#include "rpc/rpc_util.h"

namespace gyre::controller {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

// Installs SIGINT/SIGTERM handlers for the lifetime of a job and restores the old ones.
class SignalScope {
 public:
  SignalScope() {
    g_signal.store(0);
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ = {}, old_term_ = {};
};

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Worker {
  std::string id;
  v1::WorkerRole role;
  int index;
  pid_t pid = 0;
  std::string log_path;
  std::string address;
  std::unique_ptr<v1::Rollout::Stub> rollout;
  std::unique_ptr<v1::Trainer::Stub> trainer;
  int64_t version = -1;  // last version this worker acknowledged with a receipt
  int restarts = 0;      // times the controller took it back after a death
};

struct GroupJob {
  v1::PromptGroup group;
  Problem problem;
};

class JobRunner {
 public:
  JobRunner(const JobConfig& config, const RunOptions& options) : cfg_(config), opts_(options) {}
  ~JobRunner() { Teardown(); }

  StatusOr<JobResult> Run();

 private:
  Status Setup();
  Status SpawnWorkers();
  void MonitorLoop();
  Status CheckHealth();
  std::vector<Worker*> AliveRollouts();
  std::vector<Worker*> Trainers();  // trainer-0 .. trainer-(M-1)
  template <typename Id>
  Status AfterGenerateFailure(Worker* w, const grpc::Status& s, const std::vector<Id>& groups,
                              std::vector<Id>* retry);
  // Data parallel: trainer-0 hosts the Gloo store; every trainer joins the group.
  Status FormTrainerGroup();
  int trainer_group_formations_ = 0;
  Worker* TrainerWorker() { return &workers_.at("trainer-0"); }
  Status DropWorker(Worker* w, const std::string& why);
  // An RPC to `w` failed with `s`: give the monitor a moment to see whether the process died,
  // so the error names the death (worker, pid, signal) rather than a bare "Socket closed".
  Status AfterRpcFailure(Worker* w, const Status& s);
  bool WaitForDeath(const std::string& id, double seconds);

  // Publishes `version` to every alive rollout worker, or only to *only (a restarted worker's
  // catch-up, see ReviveRollouts).
  Status Publish(int64_t version, const std::vector<Worker*>* only = nullptr);
  // cluster.weight_transport gloo or nccl: the trainer and each rollout worker meet in a
  // two-member group through the controller's store; the trainer broadcasts in buckets.
  Status PublishGroups(int64_t version, const std::vector<Worker*>* only);
  // cluster.weight_transport cuda_ipc: the trainer fills its GPU buffer, then every rollout
  // worker copies from it through a CUDA IPC handle and checks each bucket.
  Status PublishCudaIpc(int64_t version, const std::vector<Worker*>* only);
  // Records a finished transfer (error empty) or handles a failed one (death or drop).
  Status SettleTransfer(Worker* w, int64_t version, const std::string& error);
  std::string WeightGroup(const Worker& w) const;

  // Worker restarts (cluster.max_worker_restarts; docs/design.md, "Worker restarts"). Run by the
  // job thread at each GRPO step boundary, before generation: respawns dead rollout workers
  // (local mode; without waiting for them), and catches up those that have registered since (in
  // external mode: that registered again after being declared dead) by publishing the current
  // version to them alone. Only then do they get work again. Error = the job must end.
  Status ReviveRollouts();
  Status RespawnRollout(Worker* w);
  Status CatchUp(Worker* w);
  std::vector<std::string> WorkerArgv(const std::string& role, int index) const;
  std::string worker_binary_;
  // Respawned or re-registered rollout workers that have not yet received the current version;
  // guarded by mu_. AliveRollouts leaves them out.
  std::set<std::string> restarting_;
  std::map<std::string, Clock::time_point> restart_started_;
  int worker_restarts_ = 0;  // restarts that caught up
  // Gloo weight groups are named with this epoch; a catch-up publish starts a new one, so that
  // the next full publish forms fresh groups with every worker (the trainer keeps only the groups
  // a publish names).
  int weight_epoch_ = 0;
  StatusOr<std::vector<v1::Sample>> GenerateAll(std::vector<GroupJob>* jobs,
                                                const v1::SamplingParams& sampling,
                                                int64_t* generated_tokens);
  // Partial rollouts (rollout.partial_rollouts): runs the carried-over groups plus `jobs` until
  // prompts_per_step groups have finished; replaces *jobs with the finished groups and returns
  // their samples (n per group, in group order). Unfinished samples are kept for the next step.
  StatusOr<std::vector<v1::Sample>> GeneratePartial(std::vector<GroupJob>* jobs,
                                                    const v1::SamplingParams& sampling,
                                                    int64_t* generated_tokens);
  StatusOr<std::vector<int32_t>> EncodePrompt(const Problem& problem) const;
  StatusOr<double> Evaluate(const std::string& tag);
  Status WarmUp();
  Status GrpoStep(int step);
  // `reset_optimizer`: the trainers drop their AdamW state first (trainer.warmup_optimizer_state).
  StatusOr<std::map<std::string, double>> Train(const std::vector<v1::Sample>& samples,
                                                v1::Objective objective, double lr,
                                                double temperature, bool reset_optimizer = false);
  void WriteMetrics(const nlohmann::json& j);
  void Teardown();
  // Checkpoints (controller/checkpoint.h). PrepareResume runs before Setup and reads and checks
  // the controller's part of the newest checkpoint without changing anything; Resume (after
  // Setup) restores the trainer and the controller from it and publishes the restored weights.
  // SaveCheckpoint writes a checkpoint after GRPO step `step` (0 = after the warm-up).
  std::string RunDir() const { return AbsolutePath(cfg_.job.output_dir + "/" + cfg_.job.name); }
  Status PrepareResume();
  Status Resume();
  Status SaveCheckpoint(int step, Clock::time_point job_start);

  JobConfig cfg_;
  RunOptions opts_;
  std::unique_ptr<model::TextTokenizer> tokenizer_;
  std::shared_ptr<RewardFn> reward_;
  std::unique_ptr<ProblemSource> problems_;
  std::string run_dir_;
  std::ofstream metrics_;
  std::unique_ptr<ControllerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::map<std::string, Worker> workers_;
  std::thread monitor_;
  std::atomic<bool> monitor_stop_{false};
  // In-flight RPCs per worker id, so a worker declared dead (e.g. stopped and silent) has its
  // calls cancelled at once instead of running into their deadlines.
  std::multimap<std::string, grpc::ClientContext*> inflight_;  // guarded by mu_
  class InflightCall;
  void RecordDeath(const std::string& id, const std::string& how);
  std::mutex mu_;  // guards Worker::pid (monitor vs job thread), deaths_ and inflight_
  std::map<std::string, std::string> deaths_;  // id -> how it died
  std::set<std::string> handled_deaths_;
  std::unique_ptr<comm::StoreServer> weight_store_;  // gloo weight transport's rendezvous
  int64_t version_ = 0;
  uint64_t next_group_id_ = 0;
  // Evaluation's group ids: a space of their own (high bit set), not saved in checkpoints.
  static constexpr uint64_t kEvalGroupIdBase = uint64_t{1} << 63;
  uint64_t next_eval_group_id_ = kEvalGroupIdBase;
  JobResult result_;
  bool torn_down_ = false;
  std::string resume_dir_;        // the checkpoint being resumed from, if any
  ControllerState resume_state_;  // its controller part, read by PrepareResume
  int first_step_ = 1;            // the first GRPO step this process runs
  double wall_before_ = 0;        // job time spent before the resumed checkpoint
  // Partial rollouts: groups in flight across steps, by group id (oldest first). Checkpoints
  // save them (SaveCheckpoint) and Resume restores them, so a resumed job continues them.
  struct PartialGroup {
    GroupJob job;
    std::map<uint64_t, v1::Sample> finished;    // by sample id
    std::map<uint64_t, v1::Sample> unfinished;  // by sample id; resumed next time
    std::string worker;                         // last worker, preferred for its kept KV
  };
  std::map<uint64_t, PartialGroup> partial_;
  // Engine counters of the current step's generation (all rollout workers).
  int64_t step_prefill_tokens_ = 0, step_prefix_shared_tokens_ = 0, step_resumed_samples_ = 0;
};

Status JobRunner::Setup() {
  if (cfg_.reward.type == "custom") {
    if (!opts_.reward) {
      return InvalidArgument(
          "reward.type is custom but no RewardFn was given (custom rewards "
          "need the C++ API, RunOptions::reward)");
    }
    reward_ = opts_.reward;
  } else {
    if (opts_.reward) {
      return InvalidArgument(
          "reward.type is " + cfg_.reward.type +
          " but a custom RewardFn was given in RunOptions::reward; set reward.type: custom to "
          "use it, or leave RunOptions::reward empty for the built-in reward");
    }
    reward_ = std::make_shared<ExactMatchReward>();
  }
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
  GYRE_ASSIGN_OR_RETURN(tokenizer_, model::MakeTextTokenizer(cfg_.model));
  GYRE_ASSIGN_OR_RETURN(ProblemSource src, ProblemSource::Create(cfg_.data, cfg_.job.seed));
  problems_ = std::make_unique<ProblemSource>(std::move(src));
  // Every prompt, training and evaluation, must encode and fit before any process starts: a bad
  // record found when drawn could be hours in.
  auto check_prompt = [&](const Problem& p, const char* kind) -> Status {
    const std::string where =
        p.where.empty() ? std::string(kind) + " prompt '" + p.prompt + "'" : p.where;
    auto ids = EncodePrompt(p);
    if (!ids.ok()) return InvalidArgument(where + ": " + ids.status().message());
    const int64_t need = static_cast<int64_t>(ids->size()) + cfg_.rollout.max_new_tokens;
    if (need > cfg_.model.max_seq_len) {
      return InvalidArgument(where + ": the prompt's " + std::to_string(ids->size()) +
                             " tokens plus rollout.max_new_tokens " +
                             std::to_string(cfg_.rollout.max_new_tokens) +
                             " exceed model.max_seq_len " + std::to_string(cfg_.model.max_seq_len));
    }
    return Status::Ok();
  };
  for (const auto& p : problems_->eval_set()) GYRE_RETURN_IF_ERROR(check_prompt(p, "eval"));
  for (const auto& p : problems_->train_set()) GYRE_RETURN_IF_ERROR(check_prompt(p, "training"));

  run_dir_ = RunDir();
  GYRE_RETURN_IF_ERROR(MakeDirs(run_dir_ + "/logs").WithContext("run directory"));
  result_.run_dir = run_dir_;
  const std::string yaml = config::DumpJobConfig(cfg_);
  if (resume_dir_.empty()) {  // a resumed run keeps its files until the checkpoint has loaded
    // A new run replaces an earlier one's record; its checkpoints must not be resumed later.
    if (PathExists(run_dir_ + "/checkpoints")) {
      GYRE_LOG_INFO("removing the checkpoints of an earlier run in {}", run_dir_);
      GYRE_RETURN_IF_ERROR(RemoveTree(run_dir_ + "/checkpoints"));
    }
    std::ofstream(run_dir_ + "/config.yaml") << yaml;
    metrics_.open(run_dir_ + "/" + cfg_.metrics.file, std::ios::trunc);
    if (!metrics_) return Unavailable("cannot write " + run_dir_ + "/" + cfg_.metrics.file);
  }

  service_ = std::make_unique<ControllerService>(yaml, cfg_.cluster.heartbeat_interval_s,
                                                 cfg_.cluster.heartbeat_timeout_s);
  GYRE_ASSIGN_OR_RETURN(server_,
                        rpc::StartServer(cfg_.cluster.bind_host, cfg_.cluster.controller_port,
                                         {service_.get()}, &address_));
  GYRE_LOG_INFO("controller listening on {}; run directory {}", address_, run_dir_);
  if (cfg_.cluster.weight_transport == "gloo" || cfg_.cluster.weight_transport == "nccl") {
    GYRE_ASSIGN_OR_RETURN(weight_store_, comm::StoreServer::Start(cfg_.cluster.bind_host));
    GYRE_LOG_INFO("weight rendezvous store on {}", weight_store_->address());
  }
  GYRE_RETURN_IF_ERROR(SpawnWorkers());
  monitor_ = std::thread([this] { MonitorLoop(); });

  const auto t0 = Clock::now();
  if (!service_->WaitAllRegistered(cfg_.cluster.register_timeout_s,
                                   [] { return g_signal.load() != 0; })) {
    GYRE_RETURN_IF_ERROR(CheckHealth());
    std::string missing;
    for (const auto& w : service_->Snapshot()) {
      if (!w.ready) missing += (missing.empty() ? "" : ", ") + w.id;
    }
    return DeadlineExceeded("workers did not register within " +
                            std::to_string(cfg_.cluster.register_timeout_s) + " s: " + missing +
                            " (see " + run_dir_ + "/logs/)");
  }
  for (const auto& info : service_->Snapshot()) {
    Worker& w = workers_.at(info.id);
    w.address = info.address;
    auto channel = rpc::MakeChannel(info.address);
    if (w.role == v1::WORKER_ROLE_ROLLOUT) w.rollout = v1::Rollout::NewStub(channel);
    if (w.role == v1::WORKER_ROLE_TRAINER) w.trainer = v1::Trainer::NewStub(channel);
  }
  GYRE_LOG_INFO("{} workers ready in {:.1f} s", workers_.size(), Seconds(t0));
  if (cfg_.trainer.workers > 1) GYRE_RETURN_IF_ERROR(FormTrainerGroup());
  return Status::Ok();
}

Status JobRunner::SpawnWorkers() {
  const bool local = cfg_.cluster.mode == "local";
  worker_binary_ = !opts_.worker_binary.empty()          ? opts_.worker_binary
                   : !cfg_.cluster.worker_binary.empty() ? cfg_.cluster.worker_binary
                                                         : SelfExecutable();
  auto add = [&](v1::WorkerRole role, const char* name, int index) -> Status {
    Worker w;
    w.id = std::string(name) + "-" + std::to_string(index);
    w.role = role;
    w.index = index;
    w.log_path = run_dir_ + "/logs/" + w.id + ".log";
    if (local) {
      GYRE_ASSIGN_OR_RETURN(w.pid, SpawnProcess(WorkerArgv(name, index), w.log_path));
      GYRE_LOG_INFO("started {} (pid {}), log {}", w.id, w.pid, w.log_path);
    }
    service_->Expect(w.id, role, index, w.pid);
    workers_.emplace(w.id, std::move(w));
    return Status::Ok();
  };
  if (!local) {
    GYRE_LOG_INFO("external mode: waiting for workers to dial {}", address_);
  }
  for (int i = 0; i < cfg_.trainer.workers; ++i) {
    GYRE_RETURN_IF_ERROR(add(v1::WORKER_ROLE_TRAINER, "trainer", i));
  }
  for (int i = 0; i < cfg_.rollout.workers; ++i) {
    GYRE_RETURN_IF_ERROR(add(v1::WORKER_ROLE_ROLLOUT, "rollout", i));
  }
  return Status::Ok();
}

void JobRunner::MonitorLoop() {
  while (!monitor_stop_.load()) {
    for (auto& [id, w] : workers_) {
      pid_t pid = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pid = w.pid;
      }
      if (pid <= 0) continue;
      int st = 0;
      if (!PollExit(pid, &st)) continue;
      const std::string how = "pid " + std::to_string(pid) + " " + DescribeWaitStatus(st);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (w.pid != pid) continue;  // the job thread claimed it (DropWorker) meanwhile
        w.pid = -pid;                // reaped; keep the number for messages
      }
      service_->MarkDead(id, how);
      RecordDeath(id, how);
    }
    for (const auto& id : service_->ExpireSilent()) {
      // Alive but silent (hung, stopped, partitioned): it is dead to the job. A local process is
      // killed so it cannot come back half-way through a later step.
      Worker& w = workers_.at(id);
      pid_t pid = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pid = w.pid;
        if (pid > 0) w.pid = -pid;
      }
      std::string how = "missed heartbeats for " +
                        std::to_string(static_cast<int>(cfg_.cluster.heartbeat_timeout_s)) + " s";
      if (pid > 0) {
        how = "pid " + std::to_string(pid) + " " + how + "; killed it";
        TerminateProcess(pid, 0.0);
      }
      RecordDeath(id, how);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// RAII registration of an RPC's context under a worker id (see inflight_).
class JobRunner::InflightCall {
 public:
  InflightCall(JobRunner* r, const std::string& id, grpc::ClientContext* ctx) : r_(r) {
    std::lock_guard<std::mutex> lock(r_->mu_);
    if (r_->deaths_.count(id)) ctx->TryCancel();  // already dead: fail fast
    it_ = r_->inflight_.emplace(id, ctx);
  }
  ~InflightCall() {
    std::lock_guard<std::mutex> lock(r_->mu_);
    r_->inflight_.erase(it_);
  }
  InflightCall(const InflightCall&) = delete;
  InflightCall& operator=(const InflightCall&) = delete;

 private:
  JobRunner* r_;
  std::multimap<std::string, grpc::ClientContext*>::iterator it_;
};

void JobRunner::RecordDeath(const std::string& id, const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  deaths_[id] = how;
  auto range = inflight_.equal_range(id);
  for (auto it = range.first; it != range.second; ++it) it->second->TryCancel();
}

// Turns what the monitor saw into decisions. Error = the job must end.
Status JobRunner::CheckHealth() {
  if (int sig = g_signal.load(); sig != 0) {
    return Aborted(std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
  }
  const std::string fatal = service_->fatal_report();
  if (!fatal.empty()) return Aborted(fatal);
  std::map<std::string, std::string> deaths;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deaths = deaths_;
  }
  for (const auto& [id, how] : deaths) {
    if (handled_deaths_.count(id)) continue;
    handled_deaths_.insert(id);
    const std::string& log = workers_.at(id).log_path;
    const std::string last = LastErrorLine(log);
    const std::string msg = "worker " + id + " died: " + how +
                            (last.empty() ? "" : "; its log ends: " + last) + " (log: " + log + ")";
    if (workers_.at(id).role == v1::WORKER_ROLE_TRAINER) return Aborted(msg);
    if (cfg_.cluster.on_worker_failure == "fail") return Aborted(msg);
    if (AliveRollouts().empty()) return Aborted(msg + "; no rollout workers are left");
    const Worker& w = workers_.at(id);
    const bool restart =
        cfg_.cluster.mode == "local" && w.restarts < cfg_.cluster.max_worker_restarts;
    GYRE_LOG_WARN("{}; continuing with {} rollout worker(s){}", msg, AliveRollouts().size(),
                  restart ? "; it will be restarted (restart " + std::to_string(w.restarts + 1) +
                                " of " + std::to_string(cfg_.cluster.max_worker_restarts) + ")"
                          : "");
  }
  return Status::Ok();
}

std::vector<Worker*> JobRunner::AliveRollouts() {
  std::vector<Worker*> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, w] : workers_) {
    if (w.role == v1::WORKER_ROLE_ROLLOUT && !deaths_.count(id) && !restarting_.count(id)) {
      out.push_back(&w);
    }
  }
  return out;
}

// A worker that misbehaves without dying (failed RPC, rejected weights) is stopped and dropped,
// so the job never waits on it again.
Status JobRunner::DropWorker(Worker* w, const std::string& why) {
  GYRE_LOG_WARN("dropping {}: {}", w->id, why);
  pid_t pid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pid = w->pid;
    if (pid > 0) w->pid = -pid;  // claim it: the monitor no longer polls this pid
    deaths_[w->id] = why;
  }
  if (pid > 0) {
    int st = TerminateProcess(pid, 2.0);
    service_->MarkDead(w->id, why + "; then " + DescribeWaitStatus(st));
  } else {
    service_->MarkDead(w->id, why);
  }
  return CheckHealth();
}

bool JobRunner::WaitForDeath(const std::string& id, double seconds) {
  const auto t0 = Clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (deaths_.count(id)) return true;
    }
    if (Seconds(t0) >= seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<Worker*> JobRunner::Trainers() {
  std::vector<Worker*> out;
  for (int i = 0; i < cfg_.trainer.workers; ++i) {
    out.push_back(&workers_.at("trainer-" + std::to_string(i)));
  }
  return out;
}

Status JobRunner::FormTrainerGroup() {
  const auto t0 = Clock::now();
  std::vector<Worker*> trainers = Trainers();
  v1::HostGroupStoreResponse store;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, cfg_.cluster.rpc_timeout_s);
    InflightCall inflight(this, trainers[0]->id, &ctx);
    GYRE_RETURN_IF_ERROR(
        AfterRpcFailure(trainers[0], rpc::FromGrpc(trainers[0]->trainer->HostGroupStore(
                                                       &ctx, v1::HostGroupStoreRequest(), &store),
                                                   "data-parallel store")));
  }
  const std::string group = "trainers-" + std::to_string(++trainer_group_formations_);
  std::vector<std::future<Status>> joins;
  for (size_t r = 0; r < trainers.size(); ++r) {
    joins.push_back(std::async(std::launch::async, [this, &trainers, &store, &group, r] {
      Worker* w = trainers[r];
      v1::JoinGroupRequest req;
      req.set_store_address(store.store_address());
      req.set_group(group);
      req.set_rank(static_cast<int32_t>(r));
      req.set_size(static_cast<int32_t>(trainers.size()));
      req.set_timeout_s(cfg_.cluster.register_timeout_s);
      v1::JoinGroupResponse resp;
      grpc::ClientContext ctx;
      rpc::SetDeadline(&ctx, cfg_.cluster.register_timeout_s + 10);
      InflightCall inflight(this, w->id, &ctx);
      return rpc::FromGrpc(w->trainer->JoinGroup(&ctx, req, &resp), "join " + group);
    }));
  }
  for (size_t r = 0; r < trainers.size(); ++r) {
    GYRE_RETURN_IF_ERROR(AfterRpcFailure(trainers[r], joins[r].get()));
  }
  GYRE_LOG_INFO("data-parallel group {} of {} trainers formed in {:.1f} s (store {})", group,
                trainers.size(), Seconds(t0), store.store_address());
  return Status::Ok();
}

Status JobRunner::AfterRpcFailure(Worker* w, const Status& s) {
  if (s.ok()) return s;
  WaitForDeath(w->id, 2.0);
  GYRE_RETURN_IF_ERROR(CheckHealth());
  return s;
}

Status JobRunner::Publish(int64_t version, const std::vector<Worker*>* only) {
  if (weight_store_) return PublishGroups(version, only);
  if (cfg_.cluster.weight_transport == "cuda_ipc") return PublishCudaIpc(version, only);
  const auto t0 = Clock::now();
  v1::PublishWeightsRequest req;
  req.set_version(version);
  req.set_timeout_s(cfg_.cluster.weight_sync_timeout_s);
  req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
  for (Worker* w : only ? *only : AliveRollouts()) {
    req.add_rollout_addresses(w->address);
    req.add_rollout_ids(w->id);
  }
  v1::PublishWeightsResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, cfg_.cluster.weight_sync_timeout_s + 10);
  InflightCall inflight(this, TrainerWorker()->id, &ctx);
  GYRE_RETURN_IF_ERROR(AfterRpcFailure(
      TrainerWorker(), rpc::FromGrpc(TrainerWorker()->trainer->PublishWeights(&ctx, req, &resp),
                                     "publish weights v" + std::to_string(version))));
  for (const auto& r : resp.results()) {
    Worker& w = workers_.at(r.rollout_id());
    if (!r.ok()) {
      // A worker that died mid-transfer is reported by the monitor (with its pid and signal);
      // one that is alive but failed the transfer is stopped and dropped.
      if (!WaitForDeath(w.id, 2.0)) {
        GYRE_RETURN_IF_ERROR(DropWorker(
            &w, "weight transfer of v" + std::to_string(version) + " failed: " + r.error()));
      }
      GYRE_RETURN_IF_ERROR(CheckHealth());
      continue;
    }
    // The receipt must match what was sent, bucket by bucket.
    bool match =
        r.receipt().version() == version && r.receipt().bucket_crc32_size() == r.sent_crc32_size();
    for (int b = 0; match && b < r.sent_crc32_size(); ++b) {
      match = r.receipt().bucket_crc32(b) == r.sent_crc32(b);
    }
    if (!match) {
      GYRE_RETURN_IF_ERROR(
          DropWorker(&w, "receipt for v" + std::to_string(version) + " does not match"));
      continue;
    }
    w.version = version;
  }
  GYRE_LOG_DEBUG("published v{} in {:.3f} s", version, Seconds(t0));
  return CheckHealth();
}

namespace {
std::string HostOf(const std::string& address) { return address.substr(0, address.rfind(':')); }
}  // namespace

std::string JobRunner::WeightGroup(const Worker& w) const {
  return weight_epoch_ == 0 ? "weights/" + w.id
                            : "weights/e" + std::to_string(weight_epoch_) + "/" + w.id;
}

namespace {

// Why a receipt does not confirm `version` as sent (empty when it does): it must match what the
// trainer sent, bucket by bucket.
std::string ReceiptMismatch(const v1::WeightReceipt& receipt, int64_t version,
                            const google::protobuf::RepeatedField<uint32_t>& sent) {
  bool match = receipt.version() == version && receipt.bucket_crc32_size() == sent.size();
  for (int b = 0; match && b < sent.size(); ++b) match = receipt.bucket_crc32(b) == sent.Get(b);
  return match ? "" : "receipt for v" + std::to_string(version) + " does not match";
}

}  // namespace

Status JobRunner::SettleTransfer(Worker* w, int64_t version, const std::string& error) {
  if (error.empty()) {
    w->version = version;
    return Status::Ok();
  }
  // As with gRPC streams: a death is reported by the monitor; a live worker is dropped.
  if (!WaitForDeath(w->id, 2.0)) {
    GYRE_RETURN_IF_ERROR(
        DropWorker(w, "weight transfer of v" + std::to_string(version) + " failed: " + error));
  }
  return CheckHealth();
}

Status JobRunner::PublishCudaIpc(int64_t version, const std::vector<Worker*>* only) {
  const double timeout = cfg_.cluster.weight_sync_timeout_s;
  const auto t0 = Clock::now();
  std::vector<Worker*> rollouts = only ? *only : AliveRollouts();
  // 1. The trainer writes the version into its GPU buffer and answers with the buffer's handle.
  v1::PublishWeightsRequest req;
  req.set_version(version);
  req.set_timeout_s(timeout);
  req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
  req.set_transport("cuda_ipc");
  v1::PublishWeightsResponse resp;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, timeout + 10);
    InflightCall inflight(this, TrainerWorker()->id, &ctx);
    GYRE_RETURN_IF_ERROR(AfterRpcFailure(
        TrainerWorker(), rpc::FromGrpc(TrainerWorker()->trainer->PublishWeights(&ctx, req, &resp),
                                       "publish weights v" + std::to_string(version))));
  }
  // 2. Every rollout worker copies it device-to-device, concurrently, and checks each bucket.
  v1::ReceiveWeightsRequest base;
  base.set_transport("cuda_ipc");
  base.set_timeout_s(timeout);
  base.set_ipc_handle(resp.ipc_handle());
  base.set_version(version);
  *base.mutable_manifest() = resp.manifest();
  base.set_total_bytes(resp.total_bytes());
  base.set_bucket_bytes(resp.bucket_bytes());
  *base.mutable_sent_crc32() = resp.bucket_crc32();
  struct Receive {
    grpc::ClientContext ctx;
    v1::WeightReceipt receipt;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Receive>> receives;
  std::vector<std::unique_ptr<InflightCall>> inflight;
  std::vector<std::future<void>> pending;
  for (Worker* w : rollouts) {
    auto r = std::make_unique<Receive>();
    rpc::SetDeadline(&r->ctx, timeout + 10);
    inflight.push_back(std::make_unique<InflightCall>(this, w->id, &r->ctx));
    Receive* rp = r.get();
    v1::Rollout::Stub* stub = w->rollout.get();
    pending.push_back(std::async(std::launch::async, [rp, stub, &base] {
      rp->status = stub->ReceiveWeights(&rp->ctx, base, &rp->receipt);
    }));
    receives.push_back(std::move(r));
  }
  for (auto& f : pending) f.get();
  inflight.clear();
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const Receive& r = *receives[i];
    const std::string error = r.status.ok()
                                  ? ReceiptMismatch(r.receipt, version, resp.bucket_crc32())
                                  : rpc::FromGrpc(r.status, "receive").ToString();
    GYRE_RETURN_IF_ERROR(SettleTransfer(rollouts[i], version, error));
  }
  GYRE_LOG_DEBUG("published v{} over cuda_ipc in {:.3f} s (trainer side {:.3f} s)", version,
                 Seconds(t0), resp.seconds());
  return CheckHealth();
}

Status JobRunner::PublishGroups(int64_t version, const std::vector<Worker*>* only) {
  const double timeout = cfg_.cluster.weight_sync_timeout_s;
  const std::string transport = cfg_.cluster.weight_transport;
  std::vector<Worker*> rollouts = only ? *only : AliveRollouts();
  v1::PublishWeightsRequest req;
  req.set_version(version);
  req.set_timeout_s(timeout);
  req.set_bucket_bytes(cfg_.cluster.weight_bucket_bytes);
  req.set_transport(transport);
  req.set_store_address(weight_store_->address());
  req.set_bind_host(HostOf(TrainerWorker()->address));
  // Each rollout worker is asked to receive at the same time as the trainer publishes.
  struct Receive {
    grpc::ClientContext ctx;
    v1::ReceiveWeightsRequest req;
    v1::WeightReceipt receipt;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Receive>> receives;
  std::vector<std::unique_ptr<InflightCall>> inflight;
  for (Worker* w : rollouts) {
    const std::string group = WeightGroup(*w);
    req.add_rollout_ids(w->id);
    req.add_rollout_addresses(w->address);
    req.add_groups(group);
    auto r = std::make_unique<Receive>();
    r->req.set_transport(transport);
    r->req.set_store_address(weight_store_->address());
    r->req.set_group(group);
    r->req.set_timeout_s(timeout);
    r->req.set_bind_host(HostOf(w->address));
    rpc::SetDeadline(&r->ctx, timeout + 10);
    inflight.push_back(std::make_unique<InflightCall>(this, w->id, &r->ctx));
    receives.push_back(std::move(r));
  }
  std::vector<std::future<void>> pending;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    Receive* r = receives[i].get();
    v1::Rollout::Stub* stub = rollouts[i]->rollout.get();
    pending.push_back(std::async(std::launch::async, [r, stub] {
      r->status = stub->ReceiveWeights(&r->ctx, r->req, &r->receipt);
    }));
  }
  v1::PublishWeightsResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout + 10);
  Status trainer_status;
  {
    InflightCall trainer_call(this, TrainerWorker()->id, &ctx);
    trainer_status = rpc::FromGrpc(TrainerWorker()->trainer->PublishWeights(&ctx, req, &resp),
                                   "publish weights v" + std::to_string(version));
  }
  if (!trainer_status.ok()) {
    for (auto& r : receives) r->ctx.TryCancel();
  }
  for (auto& f : pending) f.get();
  inflight.clear();
  GYRE_RETURN_IF_ERROR(AfterRpcFailure(TrainerWorker(), trainer_status));
  std::map<std::string, const v1::PublishResult*> sent;
  for (const auto& pr : resp.results()) sent[pr.rollout_id()] = &pr;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    Worker& w = *rollouts[i];
    const Receive& r = *receives[i];
    const v1::PublishResult* pr = sent.count(w.id) ? sent.at(w.id) : nullptr;
    std::string error;
    if (pr == nullptr || !pr->ok()) {
      error = pr ? pr->error() : "the trainer did not report it";
    } else if (!r.status.ok()) {
      error = rpc::FromGrpc(r.status, "receive").ToString();
    } else {
      error = ReceiptMismatch(r.receipt, version, pr->sent_crc32());
    }
    GYRE_RETURN_IF_ERROR(SettleTransfer(&w, version, error));
  }
  GYRE_LOG_DEBUG("published v{} over {}", version, transport);
  return CheckHealth();
}

std::vector<std::string> JobRunner::WorkerArgv(const std::string& role, int index) const {
  return {worker_binary_,        "worker",       "--role", role,          "--index",
          std::to_string(index), "--controller", address_, "--bind-host", cfg_.cluster.bind_host};
}

Status JobRunner::ReviveRollouts() {
  GYRE_RETURN_IF_ERROR(CheckHealth());
  if (cfg_.cluster.on_worker_failure != "continue") return Status::Ok();
  const bool local = cfg_.cluster.mode == "local";
  std::set<std::string> dead, restarting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, how] : deaths_) {
      restarting_.erase(id);  // died again before it caught up: that was another death
      dead.insert(id);
    }
    restarting = restarting_;
  }
  std::map<std::string, WorkerInfo> info;
  for (auto& i : service_->Snapshot()) info[i.id] = std::move(i);
  for (auto& [id, w] : workers_) {
    if (w.role != v1::WORKER_ROLE_ROLLOUT || !dead.count(id)) continue;
    if (local) {
      if (w.restarts >= cfg_.cluster.max_worker_restarts) continue;
      GYRE_RETURN_IF_ERROR(RespawnRollout(&w));
      continue;
    }
    // External mode: a launcher restarted it and it registered again with the same id (the
    // controller service accepts a known id whose worker was declared dead).
    const WorkerInfo& i = info.at(id);
    if (!i.alive || !i.registered) continue;
    GYRE_LOG_INFO("{} registered again (pid {}) after it was declared dead", id, i.pid);
    {
      std::lock_guard<std::mutex> lock(mu_);
      w.pid = 0;
      deaths_.erase(id);
      restarting_.insert(id);
    }
    handled_deaths_.erase(id);
    ++w.restarts;
    w.version = -1;
    restart_started_[id] = Clock::now();
    restarting.insert(id);
  }
  info.clear();
  for (auto& i : service_->Snapshot()) info[i.id] = std::move(i);
  for (const auto& id : restarting) {
    Worker& w = workers_.at(id);
    const WorkerInfo& i = info.at(id);
    if (i.alive && i.registered && i.ready) {
      GYRE_RETURN_IF_ERROR(CatchUp(&w));
    } else if (Seconds(restart_started_.at(id)) > cfg_.cluster.register_timeout_s) {
      GYRE_RETURN_IF_ERROR(DropWorker(
          &w, "restarted, but it did not register within " +
                  std::to_string(static_cast<int>(cfg_.cluster.register_timeout_s)) + " s"));
    }
  }
  return CheckHealth();
}

Status JobRunner::RespawnRollout(Worker* w) {
  ++w->restarts;
  // The dead process's log is kept as <id>.log.<n>; the new one writes <id>.log.
  const std::string old_log = w->log_path + "." + std::to_string(w->restarts);
  if (PathExists(w->log_path)) {
    if (Status s = RenamePath(w->log_path, old_log); !s.ok()) {
      GYRE_LOG_WARN("cannot keep {} as {}: {}", w->log_path, old_log, s.ToString());
    }
  }
  // Before the process exists, so that its registration is not undone.
  service_->ExpectAgain(w->id, 0);
  auto pid = SpawnProcess(WorkerArgv("rollout", w->index), w->log_path);
  if (!pid.ok()) {
    GYRE_LOG_WARN("cannot restart {} (restart {} of {}): {}", w->id, w->restarts,
                  cfg_.cluster.max_worker_restarts, pid.status().ToString());
    service_->MarkDead(w->id, "restart failed: " + pid.status().ToString());
    return Status::Ok();  // stays dead; counted as a restart
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    w->pid = *pid;
    deaths_.erase(w->id);
    restarting_.insert(w->id);
  }
  handled_deaths_.erase(w->id);
  w->version = -1;
  w->address.clear();
  w->rollout.reset();
  restart_started_[w->id] = Clock::now();
  GYRE_LOG_INFO("started {} (pid {}), log {}; restart {} of {}, old log {}", w->id, *pid,
                w->log_path, w->restarts, cfg_.cluster.max_worker_restarts, old_log);
  return Status::Ok();
}

Status JobRunner::CatchUp(Worker* w) {
  const auto t0 = Clock::now();
  WorkerInfo info;
  for (auto& i : service_->Snapshot()) {
    if (i.id == w->id) info = std::move(i);
  }
  w->address = info.address;
  w->rollout = v1::Rollout::NewStub(rpc::MakeChannel(info.address));
  // A fresh Gloo group with this worker (see weight_epoch_).
  if (weight_store_) ++weight_epoch_;
  const std::vector<Worker*> only = {w};
  GYRE_RETURN_IF_ERROR(Publish(version_, &only));
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Publish reports a failed transfer as a death (the monitor's, or by dropping the worker);
    // the next step boundary restarts it again if restarts are left.
    if (deaths_.count(w->id)) return Status::Ok();
  }
  if (w->version != version_) {
    return DropWorker(w, "catch-up to policy v" + std::to_string(version_) + " got no receipt");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    restarting_.erase(w->id);
  }
  ++worker_restarts_;
  GYRE_LOG_INFO("{} caught up to policy v{} in {:.2f} s ({:.1f} s after its restart)", w->id,
                version_, Seconds(t0), Seconds(restart_started_.at(w->id)));
  if (opts_.print_progress) {
    std::printf("%s restarted (pid %lld), caught up to policy v%lld\n", w->id.c_str(),
                static_cast<long long>(info.pid), static_cast<long long>(version_));
    std::fflush(stdout);
  }
  return Status::Ok();
}

StatusOr<std::vector<int32_t>> JobRunner::EncodePrompt(const Problem& problem) const {
  std::string prompt = problem.prompt;
  if (cfg_.data.chat_template != "none") {
    GYRE_ASSIGN_OR_RETURN(auto format, model::ParseChatFormat(cfg_.data.chat_template));
    model::ChatOptions opts;
    opts.enable_thinking = false;
    std::vector<model::ChatMessage> messages = {{"user", problem.prompt}};
    if (problem.is_messages) {
      GYRE_ASSIGN_OR_RETURN(messages, model::ParseMessagesJson(problem.prompt));
    }
    GYRE_ASSIGN_OR_RETURN(prompt, model::RenderChat(format, messages, opts));
  } else if (problem.is_messages) {
    return InvalidArgument("a prompt given as a list of messages needs data.chat_template");
  }
  GYRE_ASSIGN_OR_RETURN(auto ids, tokenizer_->Encode(prompt));
  if (auto bos = tokenizer_->bos_id()) ids.insert(ids.begin(), *bos);
  return ids;
}

// A Generate call that failed: a bad request fails the job; otherwise the worker is waited for
// briefly (the monitor may be about to see it die), dropped either way, and its groups re-queued
// on the survivors.
template <typename Id>
Status JobRunner::AfterGenerateFailure(Worker* w, const grpc::Status& s,
                                       const std::vector<Id>& groups, std::vector<Id>* retry) {
  if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    return rpc::FromGrpc(s, "generate on " + w->id);
  }
  if (!WaitForDeath(w->id, 2.0)) {
    GYRE_RETURN_IF_ERROR(DropWorker(w, "generate failed: " + s.error_message()));
  }
  GYRE_RETURN_IF_ERROR(CheckHealth());
  GYRE_LOG_WARN("re-queueing {} group(s) from {}", groups.size(), w->id);
  retry->insert(retry->end(), groups.begin(), groups.end());
  return Status::Ok();
}

// Sends each group to one alive rollout worker (round robin). Groups whose worker fails are
// re-queued on the workers that are left; results come back in job order.
StatusOr<std::vector<v1::Sample>> JobRunner::GenerateAll(std::vector<GroupJob>* jobs,
                                                         const v1::SamplingParams& sampling,
                                                         int64_t* generated_tokens) {
  std::map<uint64_t, std::vector<v1::Sample>> by_group;
  std::vector<size_t> pending(jobs->size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  *generated_tokens = 0;
  while (!pending.empty()) {
    GYRE_RETURN_IF_ERROR(CheckHealth());
    std::vector<Worker*> alive = AliveRollouts();
    if (alive.empty()) return Aborted("no rollout workers are alive");
    std::vector<std::vector<size_t>> assign(alive.size());
    for (size_t k = 0; k < pending.size(); ++k) assign[k % alive.size()].push_back(pending[k]);
    std::vector<std::future<std::pair<grpc::Status, v1::GenerateResponse>>> futures;
    for (size_t a = 0; a < alive.size(); ++a) {
      v1::GenerateRequest req;
      *req.mutable_sampling() = sampling;
      req.set_min_policy_version(version_);
      for (size_t j : assign[a]) *req.add_groups() = (*jobs)[j].group;
      Worker* w = alive[a];
      const double timeout = cfg_.cluster.rpc_timeout_s;
      futures.push_back(std::async(std::launch::async, [this, w, req, timeout] {
        grpc::ClientContext ctx;
        rpc::SetDeadline(&ctx, timeout);
        InflightCall inflight(this, w->id, &ctx);
        v1::GenerateResponse resp;
        grpc::Status s =
            req.groups_size() == 0 ? grpc::Status::OK : w->rollout->Generate(&ctx, req, &resp);
        return std::make_pair(s, std::move(resp));
      }));
    }
    std::vector<size_t> retry;
    for (size_t a = 0; a < alive.size(); ++a) {
      auto [s, resp] = futures[a].get();
      if (s.ok()) {
        *generated_tokens += resp.generated_tokens();
        step_prefill_tokens_ += resp.prefill_tokens();
        step_prefix_shared_tokens_ += resp.prefix_shared_tokens();
        for (auto& sample : *resp.mutable_samples()) {
          by_group[sample.group_id()].push_back(std::move(sample));
        }
        continue;
      }
      GYRE_RETURN_IF_ERROR(AfterGenerateFailure(alive[a], s, assign[a], &retry));
    }
    pending = retry;
  }
  std::vector<v1::Sample> out;
  for (const auto& j : *jobs) {
    auto& v = by_group[j.group.group_id()];
    if (static_cast<int>(v.size()) != j.group.n()) {
      return Internal("group " + std::to_string(j.group.group_id()) + " came back with " +
                      std::to_string(v.size()) + " samples, expected " +
                      std::to_string(j.group.n()));
    }
    for (auto& s : v) out.push_back(std::move(s));
  }
  return out;
}

StatusOr<std::vector<v1::Sample>> JobRunner::GeneratePartial(std::vector<GroupJob>* jobs,
                                                             const v1::SamplingParams& sampling,
                                                             int64_t* generated_tokens) {
  const int n = cfg_.rollout.group_size;
  for (GroupJob& j : *jobs) partial_[j.group.group_id()].job = std::move(j);
  jobs->clear();
  *generated_tokens = 0;
  auto completed = [&] {
    int64_t c = 0;
    for (const auto& [gid, pg] : partial_) c += static_cast<int>(pg.finished.size()) == n;
    return c;
  };
  std::vector<uint64_t> pending;
  for (const auto& [gid, pg] : partial_) {
    if (static_cast<int>(pg.finished.size()) < n) pending.push_back(gid);
  }
  while (completed() < cfg_.rollout.prompts_per_step && !pending.empty()) {
    GYRE_RETURN_IF_ERROR(CheckHealth());
    std::vector<Worker*> alive = AliveRollouts();
    if (alive.empty()) return Aborted("no rollout workers are alive");
    // A group goes back to the worker that holds its kept KV when that one is alive.
    std::vector<std::vector<uint64_t>> assign(alive.size());
    size_t rr = 0;
    for (uint64_t gid : pending) {
      size_t a = alive.size();
      for (size_t k = 0; k < alive.size(); ++k) {
        if (alive[k]->id == partial_[gid].worker) a = k;
      }
      if (a == alive.size()) a = rr++ % alive.size();
      assign[a].push_back(gid);
    }
    const int64_t still = cfg_.rollout.prompts_per_step - completed();
    std::vector<std::future<std::pair<grpc::Status, v1::GenerateResponse>>> futures;
    for (size_t a = 0; a < alive.size(); ++a) {
      v1::GenerateRequest req;
      *req.mutable_sampling() = sampling;
      req.set_min_policy_version(version_);
      const int64_t share = static_cast<int64_t>(assign[a].size());
      const int64_t target =
          std::min<int64_t>(share, (still * share + static_cast<int64_t>(pending.size()) - 1) /
                                       static_cast<int64_t>(pending.size()));
      req.set_target_finished_groups(static_cast<int32_t>(target));
      for (uint64_t gid : assign[a]) {
        PartialGroup& pg = partial_[gid];
        bool started = !pg.finished.empty();
        for (const auto& [sid, sample] : pg.unfinished) started |= sample.response_ids_size() > 0;
        if (!started) {
          *req.add_groups() = pg.job.group;  // not started: the whole group, prefix shared
        } else {
          for (const auto& [sid, sample] : pg.unfinished) *req.add_resume() = sample;
          step_resumed_samples_ += static_cast<int64_t>(pg.unfinished.size());
        }
      }
      Worker* w = alive[a];
      const double timeout = cfg_.cluster.rpc_timeout_s;
      futures.push_back(std::async(std::launch::async, [this, w, req, timeout] {
        grpc::ClientContext ctx;
        rpc::SetDeadline(&ctx, timeout);
        InflightCall inflight(this, w->id, &ctx);
        v1::GenerateResponse resp;
        grpc::Status s = req.groups_size() == 0 && req.resume_size() == 0
                             ? grpc::Status::OK
                             : w->rollout->Generate(&ctx, req, &resp);
        return std::make_pair(s, std::move(resp));
      }));
    }
    std::vector<uint64_t> retry;
    for (size_t a = 0; a < alive.size(); ++a) {
      auto [s, resp] = futures[a].get();
      if (s.ok()) {
        *generated_tokens += resp.generated_tokens();
        step_prefill_tokens_ += resp.prefill_tokens();
        step_prefix_shared_tokens_ += resp.prefix_shared_tokens();
        for (auto& sample : *resp.mutable_samples()) {
          PartialGroup& pg = partial_[sample.group_id()];
          pg.unfinished.erase(sample.sample_id());
          pg.finished[sample.sample_id()] = std::move(sample);
        }
        for (auto& sample : *resp.mutable_unfinished()) {
          PartialGroup& pg = partial_[sample.group_id()];
          pg.unfinished[sample.sample_id()] = std::move(sample);
          pg.worker = alive[a]->id;
        }
        continue;
      }
      GYRE_RETURN_IF_ERROR(AfterGenerateFailure(alive[a], s, assign[a], &retry));
    }
    pending = retry;
  }
  // The finished groups leave the ledger of groups in flight; the others carry over.
  std::vector<v1::Sample> out;
  for (auto it = partial_.begin(); it != partial_.end();) {
    if (static_cast<int>(it->second.finished.size()) != n) {
      ++it;
      continue;
    }
    for (auto& [sid, sample] : it->second.finished) out.push_back(std::move(sample));
    jobs->push_back(std::move(it->second.job));
    it = partial_.erase(it);
  }
  return out;
}

StatusOr<double> JobRunner::Evaluate(const std::string& tag) {
  const auto t0 = Clock::now();
  std::vector<GroupJob> jobs;
  for (const auto& p : problems_->eval_set()) {
    GroupJob j;
    j.problem = p;
    // Evaluation has its own id space: drawing from the training sequence would make
    // metrics.eval_every or data.eval_size change the training run's ids and seeds.
    j.group.set_group_id(next_eval_group_id_++);
    GYRE_ASSIGN_OR_RETURN(auto ids, EncodePrompt(p));
    j.group.mutable_prompt_ids()->Add(ids.begin(), ids.end());
    j.group.set_n(1);
    j.group.set_seed(0);
    jobs.push_back(std::move(j));
  }
  v1::SamplingParams greedy;
  greedy.set_temperature(0.0f);
  greedy.set_top_p(1.0f);
  greedy.set_max_new_tokens(cfg_.rollout.max_new_tokens);
  for (int32_t id : tokenizer_->stop_ids()) greedy.add_stop_token_ids(id);
  for (const std::string& stop : cfg_.rollout.stop_strings) greedy.add_stop_strings(stop);
  int64_t tokens = 0;
  GYRE_ASSIGN_OR_RETURN(auto samples, GenerateAll(&jobs, greedy, &tokens));
  int correct = 0, scored = 0, reward_errors = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    RewardInput in;
    in.prompt = jobs[i].problem.prompt;
    in.answer = jobs[i].problem.answer;
    std::vector<int32_t> resp(samples[i].response_ids().begin(), samples[i].response_ids().end());
    in.response = tokenizer_->Decode(resp);
    in.finished = samples[i].finish_reason() == v1::FINISH_REASON_STOP;
    auto r = reward_->Score(in);
    if (!r.ok() || !std::isfinite(*r)) {
      // As in training: counted and reported, and left out of the accuracy, never a silent 0.
      ++reward_errors;
      if (reward_errors <= 3) {
        GYRE_LOG_WARN("eval {}: reward failed for problem {}: {}", tag, i,
                      r.ok() ? "non-finite value" : r.status().ToString());
      }
      continue;
    }
    ++scored;
    if (*r >= reward_->correct_threshold()) ++correct;
  }
  const double acc = scored ? static_cast<double>(correct) / scored : 0.0;
  WriteMetrics({{"phase", "eval"},
                {"tag", tag},
                {"accuracy", acc},
                {"problems", scored},
                {"reward_errors", reward_errors},
                {"policy_version", version_},
                {"seconds", Seconds(t0)}});
  if (opts_.print_progress) {
    std::printf(
        "eval %-10s held-out accuracy %.3f (%d/%d, greedy, policy v%lld)%s\n", tag.c_str(), acc,
        correct, scored, static_cast<long long>(version_),
        reward_errors ? (", " + std::to_string(reward_errors) + " reward errors").c_str() : "");
    std::fflush(stdout);
  }
  return acc;
}

StatusOr<std::map<std::string, double>> JobRunner::Train(const std::vector<v1::Sample>& samples,
                                                         v1::Objective objective, double lr,
                                                         double temperature, bool reset_optimizer) {
  std::vector<Worker*> trainers = Trainers();
  const int ranks = static_cast<int>(trainers.size());
  std::vector<v1::TrainStepRequest> reqs(ranks);
  for (auto& req : reqs) {
    req.set_expected_version(version_);
    req.set_objective(objective);
    req.set_lr(static_cast<float>(lr));
    req.set_temperature(static_cast<float>(temperature));
    req.set_reset_optimizer_state(reset_optimizer);
  }
  if (ranks == 1) {
    for (const auto& s : samples) *reqs[0].add_samples() = s;
  } else {
    // Token-balanced shards of the same global mini-batches a single trainer would take.
    std::vector<int64_t> tokens;
    for (const auto& s : samples) tokens.push_back(s.prompt_ids_size() + s.response_ids_size());
    const int minis =
        objective == v1::OBJECTIVE_SFT
            ? 1
            : std::max(1, std::min(cfg_.trainer.mini_batches, static_cast<int>(samples.size())));
    const DpShards shards = ShardBatch(tokens, ranks, minis);
    for (int r = 0; r < ranks; ++r) {
      for (size_t i : shards.samples[r]) *reqs[r].add_samples() = samples[i];
      for (int32_t n : shards.mini_batch_sizes[r]) reqs[r].add_mini_batch_sizes(n);
    }
  }
  std::vector<v1::TrainStepResponse> resps(ranks);
  std::vector<std::future<Status>> calls;
  for (int r = 0; r < ranks; ++r) {
    calls.push_back(std::async(std::launch::async, [this, &trainers, &reqs, &resps, r] {
      grpc::ClientContext ctx;
      rpc::SetDeadline(&ctx, cfg_.cluster.rpc_timeout_s);
      InflightCall inflight(this, trainers[r]->id, &ctx);
      return rpc::FromGrpc(trainers[r]->trainer->TrainStep(&ctx, reqs[r], &resps[r]),
                           "train step on trainer-" + std::to_string(r));
    }));
  }
  Status first_error;
  for (int r = 0; r < ranks; ++r) {
    Status s = AfterRpcFailure(trainers[r], calls[r].get());
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  GYRE_RETURN_IF_ERROR(first_error);
  for (int r = 1; r < ranks; ++r) {
    if (resps[r].policy_version() != resps[0].policy_version()) {
      return Internal("data-parallel trainers disagree on the policy version: trainer-0 has " +
                      std::to_string(resps[0].policy_version()) + ", trainer-" + std::to_string(r) +
                      " has " + std::to_string(resps[r].policy_version()));
    }
  }
  version_ = resps[0].policy_version();
  // Metrics are all-reduced by the ranks, so rank 0 speaks for the group.
  return std::map<std::string, double>(resps[0].metrics().begin(), resps[0].metrics().end());
}

Status JobRunner::WarmUp() {
  const int steps = cfg_.trainer.warmup_sft_steps;
  if (steps <= 0) return Status::Ok();
  const auto t0 = Clock::now();
  constexpr size_t kWindow = 20;
  const double stop_at = cfg_.trainer.warmup_stop_token_accuracy;
  std::vector<double> recent_acc;
  for (int step = 1; step <= steps; ++step) {
    GYRE_RETURN_IF_ERROR(CheckHealth());
    std::vector<v1::Sample> batch;
    for (int i = 0; i < cfg_.trainer.warmup_sft_batch; ++i) {
      Problem p = problems_->Next();
      if (p.answer.empty()) {
        return InvalidArgument("supervised warm-up needs answers; prompt '" + p.prompt +
                               "' has none (set trainer.warmup_sft_steps: 0)");
      }
      v1::Sample s;
      GYRE_ASSIGN_OR_RETURN(auto prompt, EncodePrompt(p));
      GYRE_ASSIGN_OR_RETURN(auto answer, tokenizer_->Encode(p.answer));
      answer.push_back(tokenizer_->stop_ids().front());
      s.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
      s.mutable_response_ids()->Add(answer.begin(), answer.end());
      batch.push_back(std::move(s));
    }
    GYRE_ASSIGN_OR_RETURN(auto m, Train(batch, v1::OBJECTIVE_SFT, cfg_.trainer.warmup_sft_lr, 1.0));
    nlohmann::json j = {{"phase", "warmup"}, {"step", step}, {"policy_version", version_}};
    for (const auto& [k, v] : m) j[k] = v;
    WriteMetrics(j);
    recent_acc.push_back(m["token_accuracy"]);
    if (recent_acc.size() > kWindow) recent_acc.erase(recent_acc.begin());
    double mean_acc = 0;
    for (double a : recent_acc) mean_acc += a / static_cast<double>(recent_acc.size());
    const bool reached = stop_at > 0 && recent_acc.size() == kWindow && mean_acc >= stop_at;
    if (opts_.print_progress && (step % std::max(1, steps / 5) == 0 || step == steps || reached)) {
      std::printf("warmup %4d/%d  loss %.4f  token-acc %.3f  %.1f s\n", step, steps, m["loss"],
                  m["token_accuracy"], Seconds(t0));
      std::fflush(stdout);
    }
    if (reached) {
      if (opts_.print_progress) {
        std::printf("warmup stops at step %d: token accuracy %.3f (mean of %zu steps) >= %.3f\n",
                    step, mean_acc, kWindow, stop_at);
      }
      break;
    }
  }
  return Publish(version_);
}

Status JobRunner::GrpoStep(int step) {
  const auto t0 = Clock::now();
  const int n = cfg_.rollout.group_size;
  std::vector<GroupJob> jobs;
  // With partial rollouts, over_provision * prompts_per_step groups are in flight, counting
  // those carried over from the last step.
  const int in_flight = static_cast<int>(
      std::ceil(cfg_.rollout.over_provision * cfg_.rollout.prompts_per_step - 1e-9));
  const int new_groups = cfg_.rollout.partial_rollouts
                             ? std::max(0, in_flight - static_cast<int>(partial_.size()))
                             : cfg_.rollout.prompts_per_step;
  step_prefill_tokens_ = step_prefix_shared_tokens_ = step_resumed_samples_ = 0;
  for (int g = 0; g < new_groups; ++g) {
    GroupJob j;
    j.problem = problems_->Next();
    const uint64_t gid = next_group_id_++;
    j.group.set_group_id(gid);
    GYRE_ASSIGN_OR_RETURN(auto ids, EncodePrompt(j.problem));
    j.group.mutable_prompt_ids()->Add(ids.begin(), ids.end());
    j.group.set_n(n);
    j.group.set_first_sample_id(gid * static_cast<uint64_t>(n));
    j.group.set_seed(SplitMix64(cfg_.job.seed ^ SplitMix64(gid)));
    jobs.push_back(std::move(j));
  }
  const auto& sc = cfg_.rollout.sampling;
  v1::SamplingParams sampling;
  sampling.set_temperature(static_cast<float>(sc.temperature));
  sampling.set_top_k(sc.top_k);
  sampling.set_top_p(static_cast<float>(sc.top_p));
  sampling.set_min_p(static_cast<float>(sc.min_p));
  sampling.set_max_new_tokens(cfg_.rollout.max_new_tokens);
  for (int32_t id : tokenizer_->stop_ids()) sampling.add_stop_token_ids(id);
  for (const std::string& stop : cfg_.rollout.stop_strings) sampling.add_stop_strings(stop);
  int64_t gen_tokens = 0;
  const auto tg = Clock::now();
  GYRE_ASSIGN_OR_RETURN(auto samples, cfg_.rollout.partial_rollouts
                                          ? GeneratePartial(&jobs, sampling, &gen_tokens)
                                          : GenerateAll(&jobs, sampling, &gen_tokens));
  const double gen_s = Seconds(tg);

  // Rewards. A failed reward leaves its sample out (and is counted), never a silent 0.
  std::vector<v1::Sample> kept;
  std::vector<float> rewards;
  std::vector<int32_t> group_sizes;
  int reward_errors = 0, stale = 0, correct = 0;
  double reward_sum = 0;
  for (size_t g = 0; g < jobs.size(); ++g) {
    int32_t size = 0;
    for (int i = 0; i < n; ++i) {
      v1::Sample& s = samples[g * n + i];
      // Staleness: (trainer version now) - (oldest version among its tokens).
      int64_t oldest = version_;
      for (int64_t v : s.versions()) oldest = std::min(oldest, v);
      if (version_ - oldest > cfg_.algorithm.max_staleness) {
        ++stale;
        continue;
      }
      RewardInput in;
      in.prompt = jobs[g].problem.prompt;
      in.answer = jobs[g].problem.answer;
      std::vector<int32_t> resp(s.response_ids().begin(), s.response_ids().end());
      in.response = tokenizer_->Decode(resp);
      in.finished = s.finish_reason() == v1::FINISH_REASON_STOP;
      auto r = reward_->Score(in);
      if (!r.ok() || !std::isfinite(*r)) {
        ++reward_errors;
        s.set_reward_status(v1::REWARD_STATUS_ERROR);
        if (reward_errors <= 3) {
          GYRE_LOG_WARN("reward failed for sample {}: {}", s.sample_id(),
                        r.ok() ? "non-finite value" : r.status().ToString());
        }
        continue;
      }
      s.set_reward(static_cast<float>(*r));
      s.set_reward_status(v1::REWARD_STATUS_OK);
      reward_sum += *r;
      if (*r >= reward_->correct_threshold()) ++correct;
      rewards.push_back(static_cast<float>(*r));
      kept.push_back(std::move(s));
      ++size;
    }
    if (size > 0) group_sizes.push_back(size);
  }
  if (kept.empty()) {
    return FailedPrecondition("step " + std::to_string(step) + ": no usable samples (" +
                              std::to_string(stale) + " stale, " + std::to_string(reward_errors) +
                              " reward errors)");
  }
  kernels::AdvantageKind kind;
  kernels::ParseAdvantageKind(cfg_.algorithm.advantage, &kind);
  std::vector<uint8_t> zero_var;
  GYRE_ASSIGN_OR_RETURN(auto adv, ops::GroupAdvantages(rewards, group_sizes, kind, &zero_var));
  for (size_t i = 0; i < kept.size(); ++i) kept[i].set_advantage(adv[i]);
  int zero_var_groups = 0;
  for (uint8_t z : zero_var) zero_var_groups += z;

  const auto tt = Clock::now();
  // The first GRPO step after a warm-up may start from a fresh optimizer state. Decided by the
  // step number alone, so a job resumed from the checkpoint after the warm-up does the same.
  const bool reset_optimizer = step == 1 && cfg_.trainer.warmup_sft_steps > 0 &&
                               cfg_.trainer.warmup_optimizer_state == "reset";
  GYRE_ASSIGN_OR_RETURN(auto m, Train(kept, v1::OBJECTIVE_POLICY_GRADIENT, cfg_.trainer.lr,
                                      sc.temperature > 0 ? sc.temperature : 1.0, reset_optimizer));
  const double train_s = Seconds(tt);
  const auto tp = Clock::now();
  GYRE_RETURN_IF_ERROR(Publish(version_));
  const double publish_s = Seconds(tp);
  const double step_s = Seconds(t0);
  const double mean_reward = reward_sum / static_cast<double>(kept.size());
  const double accuracy = static_cast<double>(correct) / static_cast<double>(kept.size());
  const double tok_s = gen_s > 0 ? static_cast<double>(gen_tokens) / gen_s : 0.0;
  result_.final_mean_reward = mean_reward;
  nlohmann::json j = {{"phase", "grpo"},
                      {"step", step},
                      {"policy_version", version_},
                      {"mean_reward", mean_reward},
                      {"accuracy", accuracy},
                      {"samples", kept.size()},
                      {"generated_tokens", gen_tokens},
                      {"tokens_per_s", tok_s},
                      {"step_time_s", step_s},
                      {"generate_s", gen_s},
                      {"train_s", train_s},
                      {"publish_s", publish_s},
                      {"zero_variance_groups", zero_var_groups},
                      {"reward_errors", reward_errors},
                      {"stale_dropped", stale}};
  j["prefill_tokens"] = step_prefill_tokens_;
  j["prefix_shared_tokens"] = step_prefix_shared_tokens_;
  if (cfg_.rollout.partial_rollouts) {
    j["partial_resumed_samples"] = step_resumed_samples_;
    j["partial_carried_groups"] = partial_.size();
  }
  for (const auto& [k, v] : m) j[k] = v;
  WriteMetrics(j);
  if (opts_.print_progress) {
    std::printf("step %4d/%d  reward %.3f  acc %.3f  %7.0f tok/s  %.2f s  (v%lld, loss %+.4f)\n",
                step, cfg_.trainer.steps, mean_reward, accuracy, tok_s, step_s,
                static_cast<long long>(version_), m["loss"]);
    std::fflush(stdout);
  }
  return Status::Ok();
}

void JobRunner::WriteMetrics(const nlohmann::json& j) {
  metrics_ << j.dump() << "\n";
  metrics_.flush();
}

StatusOr<JobResult> JobRunner::Run() {
  const auto t0 = Clock::now();
  if (opts_.resume) GYRE_RETURN_IF_ERROR(PrepareResume());
  GYRE_RETURN_IF_ERROR(Setup());
  if (opts_.resume) {
    GYRE_RETURN_IF_ERROR(Resume());
  } else {
    GYRE_RETURN_IF_ERROR(Publish(version_));
    GYRE_RETURN_IF_ERROR(WarmUp());
    GYRE_ASSIGN_OR_RETURN(result_.accuracy_before_rl, Evaluate("before_rl"));
    if (cfg_.trainer.checkpoint_every > 0) GYRE_RETURN_IF_ERROR(SaveCheckpoint(0, t0));
  }
  for (int step = first_step_; step <= cfg_.trainer.steps; ++step) {
    GYRE_RETURN_IF_ERROR(ReviveRollouts());
    GYRE_RETURN_IF_ERROR(GrpoStep(step));
    result_.grpo_steps = step;
    if (cfg_.metrics.eval_every > 0 && step % cfg_.metrics.eval_every == 0 &&
        step != cfg_.trainer.steps) {
      GYRE_RETURN_IF_ERROR(Evaluate("step_" + std::to_string(step)).status());
    }
    if (cfg_.trainer.checkpoint_every > 0 && step % cfg_.trainer.checkpoint_every == 0) {
      GYRE_RETURN_IF_ERROR(SaveCheckpoint(step, t0));
    }
  }
  GYRE_ASSIGN_OR_RETURN(result_.accuracy_after_rl, Evaluate("after_rl"));
  {
    v1::SaveRequest req;
    req.set_directory(run_dir_ + "/final");
    v1::SaveResponse resp;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, cfg_.cluster.rpc_timeout_s);
    GYRE_RETURN_IF_ERROR(AfterRpcFailure(
        TrainerWorker(),
        rpc::FromGrpc(TrainerWorker()->trainer->Save(&ctx, req, &resp), "save final model")));
  }
  result_.policy_version = version_;
  result_.wall_seconds = wall_before_ + Seconds(t0);
  nlohmann::json summary = {{"accuracy_before_rl", result_.accuracy_before_rl},
                            {"accuracy_after_rl", result_.accuracy_after_rl},
                            {"grpo_steps", result_.grpo_steps},
                            {"policy_version", result_.policy_version},
                            {"final_mean_reward", result_.final_mean_reward},
                            {"worker_restarts", worker_restarts_},
                            {"wall_seconds", result_.wall_seconds}};
  std::ofstream(run_dir_ + "/summary.json") << summary.dump(2) << "\n";
  WriteMetrics({{"phase", "summary"},
                {"accuracy_before_rl", result_.accuracy_before_rl},
                {"accuracy_after_rl", result_.accuracy_after_rl},
                {"wall_seconds", result_.wall_seconds}});
  return result_;
}

Status JobRunner::PrepareResume() {
  auto latest = FindLatestCheckpoint(RunDir() + "/checkpoints");
  if (!latest.ok()) {
    return Status(latest.status().code(),
                  latest.status().message() +
                      (cfg_.trainer.checkpoint_every > 0
                           ? " (the first checkpoint is written after the warm-up)"
                           : " (checkpoints are written with trainer.checkpoint_every > 0)"));
  }
  resume_dir_ = *latest;
  GYRE_ASSIGN_OR_RETURN(resume_state_, ReadControllerState(resume_dir_));
  const std::string where = resume_dir_ + "/config.yaml";
  GYRE_ASSIGN_OR_RETURN(JobConfig saved, config::ParseJobConfig(resume_state_.config_yaml, where));
  GYRE_RETURN_IF_ERROR(CheckResumeCompatible(saved, cfg_, where));
  if (resume_state_.grpo_step > cfg_.trainer.steps) {
    return FailedPrecondition(resume_dir_ + " is after GRPO step " +
                              std::to_string(resume_state_.grpo_step) + ", beyond trainer.steps " +
                              std::to_string(cfg_.trainer.steps));
  }
  GYRE_ASSIGN_OR_RETURN(auto fingerprints, DataFingerprints(cfg_.data));
  if (fingerprints != resume_state_.data_fingerprints) {
    return FailedPrecondition(resume_dir_ +
                              "/controller.json: the dataset files changed since the checkpoint "
                              "was written (size or content of data.train_path / data.eval_path)");
  }
  if (!IsDirectory(resume_dir_ + "/trainer")) {
    return NotFound(resume_dir_ + "/trainer: missing (the trainer's part of the checkpoint)");
  }
  if (cfg_.rollout.partial_rollouts && resume_state_.format_version < 2) {
    return FailedPrecondition(resume_dir_ +
                              "/controller.json: written by a Gyre that did not save "
                              "partial-rollout groups (format_version " +
                              std::to_string(resume_state_.format_version) +
                              "); a job with rollout.partial_rollouts cannot resume it exactly");
  }
  return CheckCarriedGroupsFit(resume_state_.carried_groups, cfg_,
                               resume_dir_ + "/carried_groups.pb");
}

Status JobRunner::Resume() {
  const ControllerState& st = resume_state_;
  GYRE_RETURN_IF_ERROR(
      problems_->RestoreState(st.problem_stream).WithContext(resume_dir_ + "/controller.json"));
  // Every data-parallel rank loads the same state (the ranks hold identical weights and AdamW
  // state), so they continue in lockstep.
  v1::LoadStateRequest req;
  req.set_directory(resume_dir_ + "/trainer");
  for (Worker* w : Trainers()) {
    v1::LoadStateResponse resp;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, cfg_.cluster.rpc_timeout_s);
    GYRE_RETURN_IF_ERROR(
        AfterRpcFailure(w, rpc::FromGrpc(w->trainer->LoadState(&ctx, req, &resp),
                                         "resume " + w->id + " from " + resume_dir_)));
    if (resp.policy_version() != st.policy_version) {
      return FailedPrecondition(resume_dir_ + ": trainer state is at policy version " +
                                std::to_string(resp.policy_version()) + ", controller.json at " +
                                std::to_string(st.policy_version));
    }
  }
  // Everything loaded: from here on the run directory continues from the checkpoint.
  version_ = st.policy_version;
  next_group_id_ = st.next_group_id;
  // Partial rollouts: the groups in flight at the checkpoint continue in the next step, on the
  // same workers as they would have (their kept KV is gone, so their context is prefilled).
  partial_.clear();
  for (const v1::CarriedGroup& cg : st.carried_groups) {
    PartialGroup pg;
    pg.job.group = cg.group();
    pg.job.problem.prompt = cg.prompt();
    pg.job.problem.answer = cg.answer();
    pg.job.problem.is_messages = cg.prompt_is_messages();
    for (const v1::Sample& f : cg.finished()) pg.finished[f.sample_id()] = f;
    for (const v1::Sample& u : cg.unfinished()) pg.unfinished[u.sample_id()] = u;
    pg.worker = cg.worker();
    partial_[cg.group().group_id()] = std::move(pg);
  }
  first_step_ = st.grpo_step + 1;
  wall_before_ = st.wall_seconds;
  result_.grpo_steps = st.grpo_step;
  result_.accuracy_before_rl = st.accuracy_before_rl;
  result_.final_mean_reward = st.final_mean_reward;
  const std::string metrics_path = run_dir_ + "/" + cfg_.metrics.file;
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(run_dir_ + "/config.yaml", config::DumpJobConfig(cfg_)));
  GYRE_RETURN_IF_ERROR(WriteFileAtomic(metrics_path, st.metrics_jsonl));
  metrics_.open(metrics_path, std::ios::app);
  if (!metrics_) return Unavailable("cannot write " + metrics_path);
  nlohmann::json resumed = {{"phase", "resume"},
                            {"step", st.grpo_step},
                            {"policy_version", version_},
                            {"checkpoint", resume_dir_}};
  if (cfg_.rollout.partial_rollouts) resumed["partial_carried_groups"] = partial_.size();
  WriteMetrics(resumed);
  GYRE_LOG_INFO("resumed from {} at GRPO step {} (policy v{}, {} carried groups)", resume_dir_,
                st.grpo_step, version_, partial_.size());
  if (opts_.print_progress) {
    std::printf("resumed from %s after GRPO step %d (policy v%lld)\n", resume_dir_.c_str(),
                st.grpo_step, static_cast<long long>(version_));
    if (cfg_.rollout.partial_rollouts) {
      std::printf("continuing %zu carried partial-rollout group(s)\n", partial_.size());
    }
    std::fflush(stdout);
  }
  return Publish(version_);
}

Status JobRunner::SaveCheckpoint(int step, Clock::time_point job_start) {
  const auto t0 = Clock::now();
  const std::string final_dir = run_dir_ + "/checkpoints/" + CheckpointName(step);
  const std::string tmp_dir = final_dir + ".tmp";
  GYRE_RETURN_IF_ERROR(RemoveTree(tmp_dir));
  GYRE_RETURN_IF_ERROR(MakeDirs(tmp_dir));
  v1::SaveStateRequest req;
  req.set_directory(tmp_dir + "/trainer");
  v1::SaveStateResponse resp;
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, cfg_.cluster.rpc_timeout_s);
  InflightCall inflight(this, TrainerWorker()->id, &ctx);
  GYRE_RETURN_IF_ERROR(AfterRpcFailure(
      TrainerWorker(), rpc::FromGrpc(TrainerWorker()->trainer->SaveState(&ctx, req, &resp),
                                     "save checkpoint " + final_dir)));
  if (resp.policy_version() != version_) {
    return Internal("checkpoint " + final_dir + ": the trainer holds policy version " +
                    std::to_string(resp.policy_version()) + ", the controller expects " +
                    std::to_string(version_));
  }
  ControllerState st;
  st.grpo_step = step;
  st.policy_version = version_;
  st.next_group_id = next_group_id_;
  st.problem_stream = problems_->SaveState();
  st.accuracy_before_rl = result_.accuracy_before_rl;
  st.final_mean_reward = result_.final_mean_reward;
  st.wall_seconds = wall_before_ + Seconds(job_start);
  GYRE_ASSIGN_OR_RETURN(st.data_fingerprints, DataFingerprints(cfg_.data));
  st.config_yaml = config::DumpJobConfig(cfg_);
  GYRE_ASSIGN_OR_RETURN(st.metrics_jsonl, ReadFileToString(run_dir_ + "/" + cfg_.metrics.file));
  for (const auto& [gid, pg] : partial_) {
    v1::CarriedGroup cg;
    *cg.mutable_group() = pg.job.group;
    cg.set_prompt(pg.job.problem.prompt);
    cg.set_answer(pg.job.problem.answer);
    cg.set_prompt_is_messages(pg.job.problem.is_messages);
    for (const auto& [sid, f] : pg.finished) *cg.add_finished() = f;
    for (const auto& [sid, u] : pg.unfinished) *cg.add_unfinished() = u;
    cg.set_worker(pg.worker);
    st.carried_groups.push_back(std::move(cg));
  }
  GYRE_RETURN_IF_ERROR(WriteControllerState(tmp_dir, st));
  GYRE_RETURN_IF_ERROR(CommitCheckpoint(tmp_dir, final_dir, cfg_.trainer.checkpoint_keep_last));
  GYRE_LOG_INFO("checkpoint {} (policy v{}, {} carried groups) in {:.2f} s", final_dir, version_,
                st.carried_groups.size(), Seconds(t0));
  return Status::Ok();
}

void JobRunner::Teardown() {
  if (torn_down_) return;
  torn_down_ = true;
  if (service_) service_->RequestStopAll();
  // Ask every live worker to stop, briefly; then make sure of it.
  for (auto& [id, w] : workers_) {
    v1::StopRequest req;
    req.set_reason("job finished");
    v1::StopResponse resp;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 2.0);
    if (w.rollout) w.rollout->Stop(&ctx, req, &resp);
    if (w.trainer) w.trainer->Stop(&ctx, req, &resp);
  }
  monitor_stop_.store(true);
  if (monitor_.joinable()) monitor_.join();
  for (auto& [id, w] : workers_) {
    if (w.pid > 0) {
      int st = TerminateProcess(w.pid, 5.0);
      GYRE_LOG_DEBUG("{} {}", id, DescribeWaitStatus(st));
      w.pid = -w.pid;
    }
  }
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace

StatusOr<JobResult> RunJobImpl(const JobConfig& config, const RunOptions& options) {
  SignalScope signals;
  JobRunner runner(config, options);
  return runner.Run();
}

}  // namespace gyre::controller
