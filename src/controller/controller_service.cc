#include "controller/controller_service.h"

#include "common/logging.h"
#include "rpc/rpc_util.h"

namespace gyre::controller {

ControllerService::ControllerService(std::string job_config_yaml, double heartbeat_interval_s,
                                     double heartbeat_timeout_s)
    : config_yaml_(std::move(job_config_yaml)),
      interval_s_(heartbeat_interval_s),
      timeout_s_(heartbeat_timeout_s) {}

void ControllerService::Expect(const std::string& id, v1::WorkerRole role, int index,
                               int64_t spawned_pid) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerInfo& w = workers_[id];
  w.id = id;
  w.role = role;
  w.index = index;
  w.spawned_pid = spawned_pid;
  w.last_heartbeat = std::chrono::steady_clock::now();
}

void ControllerService::ExpectNoMore() {
  std::lock_guard<std::mutex> lock(mu_);
  all_expected_ = true;
}

void ControllerService::ExpectAgain(const std::string& id, int64_t spawned_pid) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerInfo& w = workers_.at(id);
  w.spawned_pid = spawned_pid;
  w.address.clear();
  w.pid = 0;
  w.registered = false;
  w.ready = false;
  w.alive = true;
  w.death.clear();
  w.policy_version = -1;
  w.last_heartbeat = std::chrono::steady_clock::now();
}

grpc::Status ControllerService::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                                         v1::RegisterResponse* resp) {
  return rpc::Guarded("Register", [&]() -> grpc::Status {
    const char* role = req->role() == v1::WORKER_ROLE_ROLLOUT   ? "rollout"
                       : req->role() == v1::WORKER_ROLE_TRAINER ? "trainer"
                                                                : nullptr;
    if (role == nullptr) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "register: role is unspecified");
    }
    const std::string id = std::string(role) + "-" + std::to_string(req->index());
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(id);
    if (it == workers_.end() && !all_expected_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "register: the controller is still setting up the job's workers; " + id +
                              " will be retried");
    }
    if (it == workers_.end()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "register: this job has no worker " + id +
                              " (check --index and the "
                              "job's rollout.workers / trainer.workers)");
    }
    WorkerInfo& w = it->second;
    if (w.registered && w.alive) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "register: " + id +
                                                                " is already "
                                                                "registered (pid " +
                                                                std::to_string(w.pid) + ")");
    }
    w.address = req->address();
    w.pid = req->pid();
    w.registered = true;
    w.ready = false;
    w.alive = true;
    w.last_heartbeat = std::chrono::steady_clock::now();
    resp->set_worker_id(id);
    resp->set_job_config_yaml(config_yaml_);
    resp->set_heartbeat_interval_s(interval_s_);
    resp->set_heartbeat_timeout_s(timeout_s_);
    GYRE_LOG_INFO("{} registered: pid {} at {}", id, req->pid(), req->address());
    cv_.notify_all();
    return grpc::Status::OK;
  });
}

grpc::Status ControllerService::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                          v1::HeartbeatResponse* resp) {
  return rpc::Guarded("Heartbeat", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(req->worker_id());
    if (it == workers_.end() || !it->second.registered) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker " + req->worker_id());
    }
    it->second.last_heartbeat = std::chrono::steady_clock::now();
    if (!it->second.ready) cv_.notify_all();
    it->second.ready = true;
    it->second.policy_version = req->policy_version();
    resp->set_stop(stop_all_ || !it->second.alive);
    return grpc::Status::OK;
  });
}

grpc::Status ControllerService::Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest* req,
                                         v1::ShutdownResponse* resp) {
  return rpc::Guarded("Shutdown", [&]() -> grpc::Status {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string msg = req->worker_id() + " reported a fatal error: " + req->reason();
    GYRE_LOG_ERROR("{}", msg);
    if (fatal_report_.empty()) fatal_report_ = msg;
    cv_.notify_all();
    return grpc::Status::OK;
  });
}

std::vector<WorkerInfo> ControllerService::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

void ControllerService::MarkDead(const std::string& id, const std::string& how) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end() || !it->second.alive) return;
  it->second.alive = false;
  it->second.death = how;
  cv_.notify_all();
}

bool ControllerService::WaitAllRegistered(double timeout_s, const std::function<bool()>& abort) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    bool all = true;
    for (const auto& [id, w] : workers_) {
      if (!w.alive) return false;
      all = all && w.registered && w.ready;
    }
    if (all) return true;
    if (!fatal_report_.empty() || abort() || std::chrono::steady_clock::now() >= deadline) {
      return false;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

std::vector<std::string> ControllerService::ExpireSilent() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [id, w] : workers_) {
    // A worker heartbeats once it has initialised (loaded its model, built its engine); until
    // then cluster.register_timeout_s bounds it (WorkerPool), not the heartbeat timeout: loading
    // a real model on a busy host can take longer than that.
    if (!w.alive || !w.registered || !w.ready) continue;
    if (std::chrono::duration<double>(now - w.last_heartbeat).count() > timeout_s_) {
      w.alive = false;
      w.death = "missed heartbeats for more than " + std::to_string(timeout_s_) + " s";
      out.push_back(id);
    }
  }
  return out;
}

std::string ControllerService::fatal_report() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_report_;
}

void ControllerService::RequestStopAll() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_all_ = true;
}

}  // namespace gyre::controller
