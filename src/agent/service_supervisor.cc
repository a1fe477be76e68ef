#include "agent/service_supervisor.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "common/logging.h"
#include "common/subprocess.h"
#include "gyre/v1/env.grpc.pb.h"
#include "rpc/rpc_util.h"

namespace gyre::agent {
namespace {

constexpr const char* kLoopback = "127.0.0.1";

std::string Join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string Substitute(std::string arg, const std::string& key, const std::string& value) {
  for (size_t at = arg.find(key); at != std::string::npos; at = arg.find(key, at + value.size())) {
    arg.replace(at, key.size(), value);
  }
  return arg;
}

// A channel that reconnects within 100 ms to a server that is starting (gRPC's default backoff
// starts at 1 s and grows), with Gyre's message limits.
std::shared_ptr<grpc::Channel> ServiceChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(rpc::kMaxMessageBytes);
  args.SetMaxSendMessageSize(rpc::kMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

grpc::Status ServiceSupervisor::Probe(const std::shared_ptr<grpc::Channel>& channel,
                                      double timeout_s, v1::DescribeResponse* out) const {
  grpc::ClientContext ctx;
  rpc::SetDeadline(&ctx, timeout_s);
  ctx.set_wait_for_ready(true);  // a server still starting is waited for, up to the deadline
  v1::DescribeRequest req;
  if (options_.kind == ServiceKind::kReward) {
    return v1::Reward::NewStub(channel)->Describe(&ctx, req, out);
  }
  return v1::Env::NewStub(channel)->Describe(&ctx, req, out);
}

ServiceSupervisor::ServiceSupervisor(ServiceOptions options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<ServiceSupervisor>> ServiceSupervisor::Start(ServiceOptions options) {
  if (options.address.empty() == options.command.empty()) {
    return InvalidArgument(options.what + ": set exactly one of address (a running server) and " +
                           "command (a server for Gyre to start)");
  }
  std::unique_ptr<ServiceSupervisor> s(new ServiceSupervisor(std::move(options)));
  if (!s->options_.address.empty()) {
    auto channel = ServiceChannel(s->options_.address);
    v1::DescribeResponse d;
    GYRE_RETURN_IF_ERROR(s->WaitReady(channel, s->options_.ready_timeout_s, 0, &d));
    std::lock_guard<std::mutex> lock(s->mu_);
    s->channel_ = channel;
    s->address_ = s->options_.address;
    s->description_ = d;
    return s;
  }
  GYRE_RETURN_IF_ERROR(s->Launch());
  s->monitor_ = std::thread([p = s.get()] { p->Monitor(); });
  return s;
}

ServiceSupervisor::~ServiceSupervisor() {
  stop_ = true;
  cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  pid_t pid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pid = pid_;
    pid_ = 0;
  }
  if (pid > 0) TerminateProcess(pid, 5.0);
}

Status ServiceSupervisor::WaitReady(const std::shared_ptr<grpc::Channel>& channel, double timeout_s,
                                    pid_t pid, v1::DescribeResponse* out) const {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  grpc::Status last;
  while (std::chrono::steady_clock::now() < deadline && !stop_) {
    if (pid > 0) {
      int ws = 0;
      if (PollExit(pid, &ws)) {
        return Unavailable(options_.what + " server (" + Join(options_.command) + ") " +
                           DescribeWaitStatus(ws) + " before it served; see " + options_.log_path);
      }
    }
    last = Probe(channel, 0.5, out);
    if (last.ok()) {
      if (out->protocol() != v1::ENV_PROTOCOL_V1) {
        return FailedPrecondition(options_.what + " server at " + (pid > 0 ? "a started " : "") +
                                  "address speaks protocol " + std::to_string(out->protocol()) +
                                  "; Gyre speaks gyre.v1 protocol 1 (update its gyre_env SDK)");
      }
      return Status::Ok();
    }
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
        last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return rpc::FromGrpc(last, options_.what + " server: Describe failed");
    }
  }
  std::string where =
      pid > 0 ? "started with `" + Join(options_.command) + "` (log: " + options_.log_path + ")"
              : "at " + options_.address;
  return Unavailable(options_.what + " server " + where + " did not answer Describe within " +
                     fmt::format("{:g}", timeout_s) + " s (last error: " + last.error_message() +
                     ")");
}

Status ServiceSupervisor::Launch() {
  GYRE_ASSIGN_OR_RETURN(int port, rpc::PickFreePort(kLoopback));
  std::vector<std::string> argv;
  for (const auto& a : options_.command) {
    argv.push_back(Substitute(Substitute(a, "{port}", std::to_string(port)), "{host}", kLoopback));
  }
  if (argv.empty() || argv[0].empty()) return InvalidArgument(options_.what + ": empty command");
  // SpawnProcess takes a path: a bare program name is looked up on PATH with /usr/bin/env.
  if (argv[0].find('/') == std::string::npos) argv.insert(argv.begin(), "/usr/bin/env");
  GYRE_ASSIGN_OR_RETURN(pid_t pid, SpawnProcess(argv, options_.log_path));
  const std::string address = std::string(kLoopback) + ":" + std::to_string(port);
  auto channel = ServiceChannel(address);
  v1::DescribeResponse d;
  Status ready = WaitReady(channel, options_.ready_timeout_s, pid, &d);
  if (!ready.ok()) {
    TerminateProcess(pid, 2.0);
    return ready;
  }
  GYRE_LOG_INFO("{} server {} serving on {} (pid {})", options_.what, d.name(), address, pid);
  std::lock_guard<std::mutex> lock(mu_);
  channel_ = channel;
  address_ = address;
  description_ = d;
  pid_ = pid;
  return Status::Ok();
}

void ServiceSupervisor::Monitor() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_.load(); });
    }
    if (stop_) return;
    pid_t pid;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pid = pid_;
    }
    int ws = 0;
    if (pid <= 0 || !PollExit(pid, &ws)) continue;
    int restarts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pid_ = 0;
      restarting_ = true;
      restarts = ++restarts_;
    }
    if (restarts > options_.max_restarts) {
      GYRE_LOG_ERROR("{} server {}; {} restarts already (max_restarts), giving up", options_.what,
                     DescribeWaitStatus(ws), options_.max_restarts);
      std::lock_guard<std::mutex> lock(mu_);
      failed_ =
          FailedPrecondition(options_.what + " server died " + std::to_string(restarts) +
                             " times (max_restarts " + std::to_string(options_.max_restarts) +
                             "); last: " + DescribeWaitStatus(ws) + "; see " + options_.log_path);
      restarting_ = false;
      cv_.notify_all();
      return;
    }
    GYRE_LOG_WARN("{} server {}; restarting it ({} of at most {})", options_.what,
                  DescribeWaitStatus(ws), restarts, options_.max_restarts);
    Status s = Launch();
    std::lock_guard<std::mutex> lock(mu_);
    restarting_ = false;
    if (!s.ok()) {
      GYRE_LOG_ERROR("{} server restart failed: {}", options_.what, s.ToString());
      failed_ = s.WithContext(options_.what + " server restart");
    }
    cv_.notify_all();
    if (!s.ok()) return;
  }
}

Status ServiceSupervisor::AwaitServing() {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>((options_.ready_timeout_s + 2) * 1000));
  while (!stop_) {
    std::shared_ptr<grpc::Channel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
      if (!restarting_ && (pid_ > 0 || options_.command.empty())) channel = channel_;
    }
    // A server that answers is serving; one that died is noticed by the monitor within 100 ms,
    // which restarts it (restarting_) and installs the new channel.
    v1::DescribeResponse d;
    if (channel != nullptr && Probe(channel, 0.3, &d).ok()) return Status::Ok();
    if (options_.command.empty()) {
      return Unavailable(options_.what + " server at " + options_.address + " is unreachable");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Unavailable(options_.what + " server is not serving again after " +
                         fmt::format("{:g}", options_.ready_timeout_s + 2) + " s");
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(50));
  }
  return Aborted(options_.what + " service is shutting down");
}

std::shared_ptr<grpc::Channel> ServiceSupervisor::channel() const {
  std::lock_guard<std::mutex> lock(mu_);
  return channel_;
}

std::string ServiceSupervisor::address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return address_;
}

v1::DescribeResponse ServiceSupervisor::description() const {
  std::lock_guard<std::mutex> lock(mu_);
  return description_;
}

int ServiceSupervisor::restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

pid_t ServiceSupervisor::pid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pid_;
}

}  // namespace gyre::agent
