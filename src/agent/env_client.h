#pragma once
// EnvClient: Gyre's calls to an environment server (gyre.v1.Env), each with its deadline.
// A call that finds no server (UNAVAILABLE: the process died, or is restarting) waits for the
// supervisor to have one serving and is sent again, at most `retries` times; Step's step_index
// makes a resent step harmless. A restarted server has lost its sessions: their next call comes
// back NOT_FOUND and the caller ends those episodes as truncated (docs/agents.md).
//
// Thread-safety: calls may run concurrently from any threads.

#include <string>

#include "agent/service_supervisor.h"
#include "gyre/status.h"
#include "gyre/v1/env.pb.h"
#include "rpc/clients.h"

namespace gyre::agent {

struct EnvTimeouts {
  double reset_s = 30;  // deadline of one Reset
  double step_s = 30;   // deadline of one Step (the environment's work for one action)
  double close_s = 5;
  int retries = 2;  // resends after UNAVAILABLE
};

class EnvClient {
 public:
  EnvClient(ServiceSupervisor* service, EnvTimeouts timeouts)
      : service_(service), timeouts_(timeouts) {}

  // `cancel` (may be null) ends a call early with kAborted. Step's `timeout_s`, when > 0,
  // replaces EnvTimeouts::step_s for this call (an episode's remaining time).
  Status Reset(const v1::ResetRequest& req, v1::ResetResponse* resp,
               rpc::Cancellation* cancel = nullptr);
  Status Step(const v1::StepRequest& req, v1::StepResponse* resp,
              rpc::Cancellation* cancel = nullptr, double timeout_s = 0);
  // Best effort: a failed Close is logged, not returned (the server drops expired sessions).
  void Close(const std::string& session_id, const std::string& reason);

  const EnvTimeouts& timeouts() const { return timeouts_; }

 private:
  template <typename Req, typename Resp, typename Method>
  Status Call(const char* name, double timeout_s, const Req& req, Resp* resp,
              rpc::Cancellation* cancel, Method method);

  ServiceSupervisor* service_;  // not owned
  const EnvTimeouts timeouts_;
};

}  // namespace gyre::agent
