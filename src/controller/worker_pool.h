#pragma once
// WorkerPool: the job's worker processes and the clients to them. It spawns the workers (local
// mode) or waits for them to dial in (external mode), watches them from a monitor thread (child
// exits, missed heartbeats), turns deaths into decisions per cluster.on_worker_failure, stops
// workers that misbehave without dying, restarts dead rollout workers and lets the caller catch
// them up to the current policy before they get work again.
//
// Threads: one job thread calls everything except where noted; the monitor thread (owned,
// joined by Shutdown) only records deaths and cancels the dead worker's calls in flight. Worker
// objects are owned by the pool and stay valid until it is destroyed; their `version`,
// `address` and clients are touched by the job thread only.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "controller/controller_service.h"
#include "gyre/config.h"
#include "rpc/clients.h"

namespace gyre::controller {

struct Worker {
  std::string id;  // "rollout-0", "trainer-1"
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  int index = 0;
  pid_t pid = 0;  // local mode: > 0 while the pool owns a live child; -pid once reaped
  std::string log_path;
  std::string address;
  std::unique_ptr<rpc::RolloutClient> rollout;
  std::unique_ptr<rpc::TrainerClient> trainer;
  int64_t version = -1;  // last version this worker acknowledged with a receipt
  int restarts = 0;      // times the pool took it back after a death
};

struct WorkerPoolOptions {
  std::string controller_address;  // what spawned workers dial
  std::string worker_binary;       // local mode: the `gyre` executable to spawn
  std::string logs_dir;            // <logs_dir>/<id>.log
  rpc::ClientFactory clients = rpc::GrpcClientFactory();
  // Prints a line about a restart for the user (the job's progress output); null = silent.
  std::function<void(const std::string&)> print;
  // How long a failed call waits for the monitor to report the worker dead before the pool
  // decides on a live worker (a death then gets its pid and signal in the message).
  double death_grace_s = 2.0;
  // Why the job must stop now ("interrupted by SIGINT"), or "" (also when unset). Any thread.
  std::function<std::string()> interrupt_reason;
};

class WorkerPool {
 public:
  // `service` (not owned) must outlive the pool.
  WorkerPool(const JobConfig& cfg, ControllerService* service, WorkerPoolOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Declares the workers to the service, spawns them in local mode and starts the monitor.
  Status Start();
  // Waits until every worker registered and heartbeats, then makes the clients to them.
  Status WaitRegistered();
  // Asks every live worker to stop (briefly), joins the monitor, terminates what is left.
  // Idempotent.
  void Shutdown();

  // Turns what the monitor saw into decisions. Error = the job must end: an interrupt, a
  // worker's fatal report, a dead trainer, a dead rollout worker under on_worker_failure: fail,
  // or no rollout workers left.
  Status CheckHealth();
  // Rollout workers that may get work: not dead and not waiting to catch up.
  std::vector<Worker*> AliveRollouts();
  std::vector<Worker*> Trainers();  // trainer-0 .. trainer-(M-1)
  Worker* Get(const std::string& id) { return &workers_.at(id); }
  bool IsDead(const std::string& id);
  // How many times `id` came back after a death (0 for its first process). A result of a call
  // made to an earlier incarnation says nothing about the current one. Any thread.
  int64_t Incarnation(const std::string& id);

  // A worker that misbehaves without dying (failed RPC, rejected weights) is stopped and
  // dropped, so the job never waits on it again. Returns CheckHealth().
  Status DropWorker(Worker* w, const std::string& why);
  // Waits up to `seconds` for the monitor to report `id` dead; returns whether it did.
  bool WaitForDeath(const std::string& id, double seconds);
  // An RPC to `w` failed with `s`: gives the monitor a moment to see whether the process died,
  // so the error names the death (worker, pid, signal) rather than a bare "Socket closed".
  Status AfterRpcFailure(Worker* w, const Status& s);
  // The error handling of a call whose failure ends a worker's share of work but not the job:
  // the worker is waited for briefly, dropped when still alive, then CheckHealth().
  Status AfterWorkFailure(Worker* w, const std::string& why);

  // Runs fn(call) as a call to worker `id` with a deadline of `timeout_s`; the call is cancelled
  // as soon as the worker is declared dead (and fails at once if it already is). Any thread.
  template <typename Fn>
  Status Invoke(const std::string& id, double timeout_s, Fn&& fn);
  // The same with the caller's cancellation, so that the caller may cancel it too.
  template <typename Fn>
  Status Invoke(const std::string& id, double timeout_s, rpc::Cancellation* cancel, Fn&& fn);

  // Worker restarts (cluster.max_worker_restarts; docs/design.md, "Worker restarts"). Called by
  // the job thread at step boundaries: respawns dead rollout workers (local mode; without
  // waiting for them), and for each that has registered since (external mode: registered again
  // after being declared dead) calls catch_up(w), which must bring it to `version` (a publish
  // to it alone). Only then does it get work again. Error = the job must end.
  Status Revive(int64_t version, const std::function<Status(Worker*)>& catch_up);
  int restarts_caught_up() const { return restarts_caught_up_; }

 private:
  class Inflight;
  void MonitorLoop();
  void RecordDeath(const std::string& id, const std::string& how);
  Status Respawn(Worker* w);
  Status CatchUp(Worker* w, int64_t version, const std::function<Status(Worker*)>& catch_up);
  std::vector<std::string> WorkerArgv(const std::string& role, int index) const;

  const JobConfig cfg_;
  ControllerService* service_;
  WorkerPoolOptions opts_;
  std::map<std::string, Worker> workers_;  // fixed after Start
  std::thread monitor_;
  std::atomic<bool> monitor_stop_{false};
  bool shut_down_ = false;

  std::mutex mu_;  // guards Worker::pid (monitor vs job thread), deaths_, inflight_, restarting_
  std::map<std::string, std::string> deaths_;  // id -> how it died
  // In-flight calls per worker id, so a worker declared dead (e.g. stopped and silent) has its
  // calls cancelled at once instead of running into their deadlines.
  std::multimap<std::string, rpc::Cancellation*> inflight_;
  // Respawned or re-registered rollout workers that have not yet caught up; AliveRollouts
  // leaves them out.
  std::set<std::string> restarting_;
  std::map<std::string, int64_t> incarnation_;

  std::set<std::string> handled_deaths_;  // job thread only
  std::map<std::string, std::chrono::steady_clock::time_point> restart_started_;
  int restarts_caught_up_ = 0;
};

// RAII registration of a call's cancellation under a worker id (see inflight_).
class WorkerPool::Inflight {
 public:
  Inflight(WorkerPool* pool, const std::string& id, rpc::Cancellation* cancel);
  ~Inflight();
  Inflight(const Inflight&) = delete;
  Inflight& operator=(const Inflight&) = delete;

 private:
  WorkerPool* pool_;
  std::multimap<std::string, rpc::Cancellation*>::iterator it_;
};

template <typename Fn>
Status WorkerPool::Invoke(const std::string& id, double timeout_s, Fn&& fn) {
  rpc::Cancellation cancel;
  return Invoke(id, timeout_s, &cancel, std::forward<Fn>(fn));
}

template <typename Fn>
Status WorkerPool::Invoke(const std::string& id, double timeout_s, rpc::Cancellation* cancel,
                          Fn&& fn) {
  Inflight reg(this, id, cancel);
  return fn(rpc::Call{timeout_s, cancel});
}

}  // namespace gyre::controller
