#pragma once
// ControllerService: the controller's gRPC server. Workers register (role, index, address,
// pid), heartbeat, and report fatal errors here. gRPC threads only record what they hear in the
// WorkerTable; the job thread reads it and decides.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gyre/v1/gyre.grpc.pb.h"

namespace gyre::controller {

struct WorkerInfo {
  std::string id;  // "rollout-0"
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;
  int index = 0;
  std::string address;      // empty until registered
  int64_t pid = 0;          // the pid the worker reported
  int64_t spawned_pid = 0;  // the pid we started (local mode), 0 otherwise
  bool registered = false;
  bool ready = false;  // first heartbeat received: the worker finished initialising
  bool alive = true;
  std::string death;  // how it died, once it did
  int64_t policy_version = -1;
  std::chrono::steady_clock::time_point last_heartbeat;
};

class ControllerService final : public v1::Controller::Service {
 public:
  ControllerService(std::string job_config_yaml, double heartbeat_interval_s,
                    double heartbeat_timeout_s);

  // Declares the workers the job expects; Register accepts only these.
  void Expect(const std::string& id, v1::WorkerRole role, int index, int64_t spawned_pid);

  // Every worker of the job has been declared (Expect). Until then a Register for an id not yet
  // declared is answered UNAVAILABLE, which the worker retries: an external worker may dial as
  // soon as the controller listens, before the job's worker list is complete. After it, such a
  // Register is refused (INVALID_ARGUMENT: wrong --index or role).
  void ExpectNoMore();

  // A dead worker is expected again (local mode: respawned as `spawned_pid`): it must register
  // and heartbeat anew before it counts as ready.
  void ExpectAgain(const std::string& id, int64_t spawned_pid);

  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest* req,
                        v1::ShutdownResponse* resp) override;

  // Job-thread API (thread-safe).
  std::vector<WorkerInfo> Snapshot() const;
  void MarkDead(const std::string& id, const std::string& how);
  // Waits until every expected worker is ready (registered and heartbeating) or one died or
  // `timeout_s` passed.
  bool WaitAllRegistered(double timeout_s, const std::function<bool()>& abort);
  // Workers whose heartbeats stopped for longer than the timeout (marks them dead). A worker
  // that registered but has not sent its first heartbeat (still initialising) is not expired.
  std::vector<std::string> ExpireSilent();
  // A fatal error a worker reported, or "".
  std::string fatal_report() const;
  // From now on, heartbeats are answered with stop = true.
  void RequestStopAll();

 private:
  const std::string config_yaml_;
  const double interval_s_, timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, WorkerInfo> workers_;  // guarded by mu_
  bool all_expected_ = false;                  // guarded by mu_
  std::string fatal_report_;                   // guarded by mu_
  bool stop_all_ = false;                      // guarded by mu_
};

}  // namespace gyre::controller
