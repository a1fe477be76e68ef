#pragma once
// WorkerSession: a worker process's link to its controller. Register() announces the worker's
// role, index and own server address and receives the effective job configuration; then a
// heartbeat thread reports liveness every interval. The session ends (stop_requested() turns
// true) when the controller asks the worker to stop or cannot be reached for longer than the
// heartbeat timeout, so a worker never outlives its job.
//
// Thread-safety: Register() once from the main thread; the rest is thread-safe.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gyre/status.h"
#include "gyre/v1/gyre.grpc.pb.h"

namespace gyre::rpc {

class WorkerSession {
 public:
  WorkerSession(std::string controller_address, v1::WorkerRole role, int index);
  ~WorkerSession();

  // Retries until the controller answers or `timeout_s` passes.
  Status Register(const std::string& own_address, double timeout_s);

  const std::string& worker_id() const { return worker_id_; }
  const std::string& job_config_yaml() const { return job_config_yaml_; }

  // Starts the heartbeat thread. `version` is read each beat and reported.
  void StartHeartbeats(std::function<int64_t()> version);

  // Blocks until a stop is requested (by the controller, by RequestStop, or by losing the
  // controller). Returns the reason.
  std::string WaitForStop();
  // Like WaitForStop, but gives up after `seconds`; returns whether a stop was requested.
  bool WaitForStopFor(double seconds);
  void RequestStop(const std::string& reason);
  bool stop_requested() const { return stop_.load(); }

  // Tells the controller this worker is exiting because of `reason` (best effort, 5 s).
  void ReportFatal(const std::string& reason);

  void Shutdown();  // joins the heartbeat thread; idempotent

 private:
  void HeartbeatLoop(std::function<int64_t()> version);

  std::string controller_address_;
  v1::WorkerRole role_;
  int index_;
  std::unique_ptr<v1::Controller::Stub> stub_;
  std::string worker_id_;
  std::string job_config_yaml_;
  double interval_s_ = 1.0;
  double timeout_s_ = 10.0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::string stop_reason_;  // guarded by mu_
  std::thread heartbeat_;
};

}  // namespace gyre::rpc
