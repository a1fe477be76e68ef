#pragma once
// ServiceSupervisor: one environment or reward server (proto/gyre/v1/env.proto) as Gyre sees
// it. Either an external server at a fixed address, or a command that Gyre starts, waits for
// (until Describe answers with protocol v1) and restarts when it dies, like a worker: a monitor
// thread reaps the process, starts it again on a fresh port and logs both events. Clients take
// the current channel for each call (channel()), so a restart is invisible to them except for
// the sessions the dead process held, which are gone (docs/agents.md).
//
// Thread-safety: every method may be called from any thread.

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gyre/status.h"
#include "gyre/v1/env.pb.h"

namespace grpc {
class Channel;
class Status;
}  // namespace grpc

namespace gyre::agent {

enum class ServiceKind { kEnv, kReward };

struct ServiceOptions {
  ServiceKind kind = ServiceKind::kEnv;  // which service's Describe answers readiness
  std::string what = "env";              // names the service in logs and errors
  std::string address;  // an external server ("host:port"); empty when `command` is set
  // The command that serves: argv, each "{port}" replaced by the port Gyre chose for it (and
  // "{host}" by the loopback address it must listen on).
  std::vector<std::string> command;
  std::string log_path;         // the started server's stdout and stderr (appended)
  double ready_timeout_s = 60;  // from a start until Describe answers
  int max_restarts = 5;         // deaths restarted; the next one fails the service
};

class ServiceSupervisor {
 public:
  // Starts the command (or connects to the address) and waits until Describe answers with
  // protocol v1. Errors name the service, the command or address, and the log to read.
  static StatusOr<std::unique_ptr<ServiceSupervisor>> Start(ServiceOptions options);
  ~ServiceSupervisor();  // stops the monitor; SIGTERM, then SIGKILL, to a started server
  ServiceSupervisor(const ServiceSupervisor&) = delete;
  ServiceSupervisor& operator=(const ServiceSupervisor&) = delete;

  std::shared_ptr<grpc::Channel> channel() const;
  std::string address() const;
  v1::DescribeResponse description() const;
  const ServiceOptions& options() const { return options_; }
  // Deaths restarted so far.
  int restarts() const;
  // The started server's pid (0 for an external one, or while restarting).
  pid_t pid() const;

  // After a call failed with UNAVAILABLE: waits (up to ready_timeout_s) while a restart is under
  // way. Ok once a server is serving; FailedPrecondition when the service has failed for good
  // (more deaths than max_restarts), Unavailable when an external server does not answer.
  Status AwaitServing();

 private:
  explicit ServiceSupervisor(ServiceOptions options);
  Status Launch();  // spawns the command and waits for Describe; mu_ not held
  // Describe on `channel`, waiting for a server still starting up to the deadline.
  grpc::Status Probe(const std::shared_ptr<grpc::Channel>& channel, double timeout_s,
                     v1::DescribeResponse* out) const;
  Status WaitReady(const std::shared_ptr<grpc::Channel>& channel, double timeout_s, pid_t pid,
                   v1::DescribeResponse* out) const;
  void Monitor();

  const ServiceOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<grpc::Channel> channel_;  // guarded by mu_
  std::string address_;                     // guarded by mu_
  v1::DescribeResponse description_;        // guarded by mu_
  pid_t pid_ = 0;                           // guarded by mu_
  int restarts_ = 0;                        // guarded by mu_
  bool restarting_ = false;                 // guarded by mu_
  Status failed_;                           // guarded by mu_: set when the service gave up
  std::atomic<bool> stop_{false};
  std::thread monitor_;
};

}  // namespace gyre::agent
