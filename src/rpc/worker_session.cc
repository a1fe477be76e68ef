#include "rpc/worker_session.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "common/logging.h"
#include "rpc/rpc_util.h"
#include "rpc/security.h"

namespace gyre::rpc {

WorkerSession::WorkerSession(std::string controller_address, v1::WorkerRole role, int index)
    : controller_address_(std::move(controller_address)),
      role_(role),
      index_(index),
      stub_(v1::Controller::NewStub(MakeChannel(controller_address_))) {}

WorkerSession::~WorkerSession() { Shutdown(); }

namespace {

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

}  // namespace

Status WorkerSession::Register(const std::string& own_address, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    v1::RegisterRequest req;
    req.set_role(role_);
    req.set_index(index_);
    req.set_address(own_address);
    req.set_pid(::getpid());
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    req.set_hostname(host);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, 5.0);
    ctx.set_wait_for_ready(true);
    const grpc::Status gs = stub_->Register(&ctx, req, &resp);
    last = FromGrpc(gs, "register with " + controller_address_);
    if (last.ok()) {
      worker_id_ = resp.worker_id();
      job_config_yaml_ = resp.job_config_yaml();
      interval_s_ = resp.heartbeat_interval_s() > 0 ? resp.heartbeat_interval_s() : 1.0;
      timeout_s_ = resp.heartbeat_timeout_s() > 0 ? resp.heartbeat_timeout_s() : 10.0;
      return Status::Ok();
    }
    if (last.code() == StatusCode::kInvalidArgument ||
        last.code() == StatusCode::kFailedPrecondition) {
      return last;  // the controller refused us; retrying will not help
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // A TLS controller never completes a plaintext client's connection: say so if it may be that.
  const std::string hint =
      SecurityHint(grpc::Status(grpc::StatusCode::UNAVAILABLE, last.message()));
  return DeadlineExceeded("could not register with the controller at " + controller_address_ +
                          " within " + FormatSeconds(timeout_s) + ": " + last.message() + hint);
}

void WorkerSession::StartHeartbeats(std::function<int64_t()> version) {
  heartbeat_ = std::thread([this, version] { HeartbeatLoop(version); });
}

void WorkerSession::HeartbeatLoop(std::function<int64_t()> version) {
  auto last_ok = std::chrono::steady_clock::now();
  while (!stop_.load()) {
    v1::HeartbeatRequest req;
    req.set_worker_id(worker_id_);
    req.set_policy_version(version());
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, std::max(1.0, interval_s_ * 2));
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    const auto now = std::chrono::steady_clock::now();
    if (s.ok()) {
      last_ok = now;
      if (resp.stop()) {
        RequestStop("the controller asked this worker to stop");
        break;
      }
    } else if (std::chrono::duration<double>(now - last_ok).count() > timeout_s_) {
      RequestStop("lost the controller at " + controller_address_ + " (no heartbeat answer for " +
                  std::to_string(static_cast<int>(timeout_s_)) + " s): " + s.error_message());
      break;
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_.load(); });
  }
}

std::string WorkerSession::WaitForStop() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stop_.load(); });
  return stop_reason_;
}

bool WorkerSession::WaitForStopFor(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                      [this] { return stop_.load(); });
}

void WorkerSession::RequestStop(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stop_.exchange(true)) stop_reason_ = reason;
  cv_.notify_all();
}

void WorkerSession::ReportFatal(const std::string& reason) {
  v1::ShutdownRequest req;
  req.set_worker_id(worker_id_);
  req.set_reason(reason);
  v1::ShutdownResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 5.0);
  stub_->Shutdown(&ctx, req, &resp);
}

void WorkerSession::Shutdown() {
  RequestStop("shutdown");
  if (heartbeat_.joinable()) heartbeat_.join();
}

}  // namespace gyre::rpc
