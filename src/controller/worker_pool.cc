#include "controller/worker_pool.h"

#include <cstdio>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "rpc/security.h"

namespace gyre::controller {

WorkerPool::WorkerPool(const JobConfig& cfg, ControllerService* service, WorkerPoolOptions options)
    : cfg_(cfg), service_(service), opts_(std::move(options)) {}

WorkerPool::~WorkerPool() { Shutdown(); }

WorkerPool::Inflight::Inflight(WorkerPool* pool, const std::string& id, rpc::Cancellation* cancel)
    : pool_(pool) {
  std::lock_guard<std::mutex> lock(pool_->mu_);
  if (pool_->deaths_.count(id)) cancel->Cancel();  // already dead: fail fast
  it_ = pool_->inflight_.emplace(id, cancel);
}

WorkerPool::Inflight::~Inflight() {
  std::lock_guard<std::mutex> lock(pool_->mu_);
  pool_->inflight_.erase(it_);
}

std::vector<std::string> WorkerPool::WorkerArgv(const std::string& role, int index) const {
  std::vector<std::string> argv = {opts_.worker_binary,
                                   "worker",
                                   "--role",
                                   role,
                                   "--index",
                                   std::to_string(index),
                                   "--controller",
                                   opts_.controller_address,
                                   "--bind-host",
                                   cfg_.cluster.bind_host};
  // The job's TLS files and token, so that the worker can dial the controller at all.
  for (std::string& f : rpc::SecurityFlags()) argv.push_back(std::move(f));
  return argv;
}

Status WorkerPool::Start() {
  const bool local = cfg_.cluster.mode == "local";
  auto add = [&](v1::WorkerRole role, const char* name, int index) -> Status {
    Worker w;
    w.id = std::string(name) + "-" + std::to_string(index);
    w.role = role;
    w.index = index;
    w.log_path = opts_.logs_dir + "/" + w.id + ".log";
    if (local) {
      GYRE_ASSIGN_OR_RETURN(w.pid, SpawnProcess(WorkerArgv(name, index), w.log_path));
      GYRE_LOG_INFO("started {} (pid {}), log {}", w.id, w.pid, w.log_path);
    }
    service_->Expect(w.id, role, index, w.pid);
    const std::string id = w.id;
    workers_.emplace(id, std::move(w));
    return Status::Ok();
  };
  if (!local) {
    GYRE_LOG_INFO("external mode: waiting for workers to dial {}", opts_.controller_address);
  }
  Status s;
  for (int i = 0; s.ok() && i < cfg_.trainer.workers; ++i) {
    s = add(v1::WORKER_ROLE_TRAINER, "trainer", i);
  }
  for (int i = 0; s.ok() && i < cfg_.rollout.workers; ++i) {
    s = add(v1::WORKER_ROLE_ROLLOUT, "rollout", i);
  }
  if (s.ok()) service_->ExpectNoMore();
  // Started even after a failed spawn, so the children already running are watched and reaped.
  monitor_ = std::thread([this] {
    NameThisThread("gyre-monitor");
    MonitorLoop();
  });
  return s;
}

Status WorkerPool::WaitRegistered() {
  const auto t0 = SteadyClock::now();
  auto interrupted = [this] { return opts_.interrupt_reason && !opts_.interrupt_reason().empty(); };
  if (!service_->WaitAllRegistered(cfg_.cluster.register_timeout_s, interrupted)) {
    GYRE_RETURN_IF_ERROR(CheckHealth());
    std::string missing;
    for (const auto& w : service_->Snapshot()) {
      if (!w.ready) missing += (missing.empty() ? "" : ", ") + w.id;
    }
    return DeadlineExceeded("workers did not register within " +
                            std::to_string(cfg_.cluster.register_timeout_s) + " s: " + missing +
                            " (see " + opts_.logs_dir + "/)");
  }
  for (const auto& info : service_->Snapshot()) {
    Worker& w = workers_.at(info.id);
    w.address = info.address;
    if (w.role == v1::WORKER_ROLE_ROLLOUT) w.rollout = opts_.clients.rollout(info.address);
    if (w.role == v1::WORKER_ROLE_TRAINER) w.trainer = opts_.clients.trainer(info.address);
  }
  GYRE_LOG_INFO("{} workers ready in {:.1f} s", workers_.size(), SecondsSince(t0));
  return Status::Ok();
}

void WorkerPool::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  service_->RequestStopAll();
  // Ask every live worker to stop, briefly; then make sure of it.
  v1::StopRequest req;
  req.set_reason("job finished");
  const rpc::Call call{2.0, nullptr};
  for (auto& [id, w] : workers_) {
    if (w.rollout) (void)w.rollout->Stop(call, req);
    if (w.trainer) (void)w.trainer->Stop(call, req);
  }
  monitor_stop_.store(true);
  if (monitor_.joinable()) monitor_.join();
  for (auto& [id, w] : workers_) {
    if (w.pid > 0) {
      const int st = TerminateProcess(w.pid, 5.0);
      (void)st;  // unused when debug logging is compiled out
      GYRE_LOG_DEBUG("{} {}", id, DescribeWaitStatus(st));
      w.pid = -w.pid;
    }
  }
}

void WorkerPool::MonitorLoop() {
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

void WorkerPool::RecordDeath(const std::string& id, const std::string& how) {
  // Said when it is known, not when the job thread next looks (it may be inside a step).
  GYRE_LOG_WARN("{} declared dead: {}; its calls in flight are cancelled", id, how);
  std::lock_guard<std::mutex> lock(mu_);
  deaths_[id] = how;
  auto range = inflight_.equal_range(id);
  for (auto it = range.first; it != range.second; ++it) it->second->Cancel();
}

int64_t WorkerPool::Incarnation(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = incarnation_.find(id);
  return it == incarnation_.end() ? 0 : it->second;
}

bool WorkerPool::IsDead(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return deaths_.count(id) > 0;
}

Status WorkerPool::CheckHealth() {
  if (opts_.interrupt_reason) {
    if (std::string why = opts_.interrupt_reason(); !why.empty()) return Aborted(why);
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
    const Worker& w = workers_.at(id);
    const std::string last = LastErrorLine(w.log_path);
    const std::string msg = "worker " + id + " died: " + how +
                            (last.empty() ? "" : "; its log ends: " + last) +
                            " (log: " + w.log_path + ")";
    if (w.role == v1::WORKER_ROLE_TRAINER) return Aborted(msg);
    if (cfg_.cluster.on_worker_failure == "fail") return Aborted(msg);
    if (AliveRollouts().empty()) return Aborted(msg + "; no rollout workers are left");
    const bool restart =
        cfg_.cluster.mode == "local" && w.restarts < cfg_.cluster.max_worker_restarts;
    GYRE_LOG_WARN("{}; continuing with {} rollout worker(s){}", msg, AliveRollouts().size(),
                  restart ? "; it will be restarted (restart " + std::to_string(w.restarts + 1) +
                                " of " + std::to_string(cfg_.cluster.max_worker_restarts) + ")"
                          : "");
  }
  return Status::Ok();
}

std::vector<Worker*> WorkerPool::AliveRollouts() {
  std::vector<Worker*> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, w] : workers_) {
    if (w.role == v1::WORKER_ROLE_ROLLOUT && !deaths_.count(id) && !restarting_.count(id)) {
      out.push_back(&w);
    }
  }
  return out;
}

std::vector<Worker*> WorkerPool::Trainers() {
  std::vector<Worker*> out;
  for (int i = 0; i < cfg_.trainer.workers; ++i) {
    out.push_back(&workers_.at("trainer-" + std::to_string(i)));
  }
  return out;
}

Status WorkerPool::DropWorker(Worker* w, const std::string& why) {
  GYRE_LOG_WARN("dropping {}: {}", w->id, why);
  pid_t pid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pid = w->pid;
    if (pid > 0) w->pid = -pid;  // claim it: the monitor no longer polls this pid
    deaths_[w->id] = why;
    auto range = inflight_.equal_range(w->id);
    for (auto it = range.first; it != range.second; ++it) it->second->Cancel();
  }
  if (pid > 0) {
    int st = TerminateProcess(pid, 2.0);
    service_->MarkDead(w->id, why + "; then " + DescribeWaitStatus(st));
  } else {
    service_->MarkDead(w->id, why);
  }
  return CheckHealth();
}

bool WorkerPool::WaitForDeath(const std::string& id, double seconds) {
  const auto t0 = SteadyClock::now();
  while (true) {
    if (IsDead(id)) return true;
    if (SecondsSince(t0) >= seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status WorkerPool::AfterRpcFailure(Worker* w, const Status& s) {
  if (s.ok()) return s;
  WaitForDeath(w->id, opts_.death_grace_s);
  GYRE_RETURN_IF_ERROR(CheckHealth());
  return s;
}

Status WorkerPool::AfterWorkFailure(Worker* w, const std::string& why) {
  if (!WaitForDeath(w->id, opts_.death_grace_s)) GYRE_RETURN_IF_ERROR(DropWorker(w, why));
  return CheckHealth();
}

Status WorkerPool::Revive(int64_t version, const std::function<Status(Worker*)>& catch_up) {
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
      GYRE_RETURN_IF_ERROR(Respawn(&w));
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
      ++incarnation_[id];
    }
    handled_deaths_.erase(id);
    ++w.restarts;
    w.version = -1;
    restart_started_[id] = SteadyClock::now();
    restarting.insert(id);
  }
  info.clear();
  for (auto& i : service_->Snapshot()) info[i.id] = std::move(i);
  for (const auto& id : restarting) {
    Worker& w = workers_.at(id);
    const WorkerInfo& i = info.at(id);
    if (i.alive && i.registered && i.ready) {
      GYRE_RETURN_IF_ERROR(CatchUp(&w, version, catch_up));
    } else if (SecondsSince(restart_started_.at(id)) > cfg_.cluster.register_timeout_s) {
      GYRE_RETURN_IF_ERROR(DropWorker(
          &w, "restarted, but it did not register within " +
                  std::to_string(static_cast<int>(cfg_.cluster.register_timeout_s)) + " s"));
    }
  }
  return CheckHealth();
}

Status WorkerPool::Respawn(Worker* w) {
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
    ++incarnation_[w->id];
  }
  handled_deaths_.erase(w->id);
  w->version = -1;
  w->address.clear();
  w->rollout.reset();
  restart_started_[w->id] = SteadyClock::now();
  GYRE_LOG_INFO("started {} (pid {}), log {}; restart {} of {}, old log {}", w->id, *pid,
                w->log_path, w->restarts, cfg_.cluster.max_worker_restarts, old_log);
  return Status::Ok();
}

Status WorkerPool::CatchUp(Worker* w, int64_t version,
                           const std::function<Status(Worker*)>& catch_up) {
  const auto t0 = SteadyClock::now();
  WorkerInfo info;
  for (auto& i : service_->Snapshot()) {
    if (i.id == w->id) info = std::move(i);
  }
  w->address = info.address;
  w->rollout = opts_.clients.rollout(info.address);
  GYRE_RETURN_IF_ERROR(catch_up(w));
  // A failed transfer is reported as a death (the monitor's, or by dropping the worker); the
  // next step boundary restarts it again if restarts are left.
  if (IsDead(w->id)) return Status::Ok();
  if (w->version != version) {
    return DropWorker(w, "catch-up to policy v" + std::to_string(version) + " got no receipt");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    restarting_.erase(w->id);
  }
  ++restarts_caught_up_;
  GYRE_LOG_INFO("{} caught up to policy v{} in {:.2f} s ({:.1f} s after its restart)", w->id,
                version, SecondsSince(t0), SecondsSince(restart_started_.at(w->id)));
  if (opts_.print) {
    opts_.print(w->id + " restarted (pid " + std::to_string(info.pid) + "), caught up to policy v" +
                std::to_string(version));
  }
  return Status::Ok();
}

}  // namespace gyre::controller
