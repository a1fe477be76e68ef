#include "agent/env_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/logging.h"
#include "gyre/v1/env.grpc.pb.h"
#include "rpc/rpc_util.h"

namespace gyre::agent {

template <typename Req, typename Resp, typename Method>
Status EnvClient::Call(const char* name, double timeout_s, const Req& req, Resp* resp,
                       rpc::Cancellation* cancel, Method method) {
  const std::string what = fmt::format("env {} (session {})", name, req.session_id());
  const auto start = std::chrono::steady_clock::now();
  auto left = [&] {
    return timeout_s -
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int busy = 0;  // answers of a server at its concurrency limit so far
  for (int attempt = 0;; ++attempt) {
    auto stub = v1::Env::NewStub(service_->channel());
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, std::max(0.001, left()));
    if (cancel != nullptr) cancel->SetHook([&ctx] { ctx.TryCancel(); });
    grpc::Status s = ((*stub).*method)(&ctx, req, resp);
    if (cancel != nullptr) cancel->ClearHook();
    if (s.ok()) return Status::Ok();
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return DeadlineExceeded(fmt::format("{}: no answer within {:g} s", what, timeout_s));
    }
    if (s.error_code() == grpc::StatusCode::CANCELLED && cancel != nullptr && cancel->cancelled()) {
      return Aborted(what + ": cancelled");
    }
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // The server is at its concurrency limit and did not start the call: ask again after a
      // growing pause, within the call's deadline.
      const double pause = std::min(0.2, 0.01 * static_cast<double>(1 << std::min(busy++, 5)));
      if (left() > pause) {
        std::this_thread::sleep_for(std::chrono::duration<double>(pause));
        --attempt;
        continue;
      }
      return DeadlineExceeded(fmt::format(
          "{}: the server stayed at its concurrency limit for {:g} s", what, timeout_s));
    }
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || attempt >= timeouts_.retries) {
      return rpc::FromGrpc(s, what);
    }
    Status serving = service_->AwaitServing();
    if (!serving.ok()) return serving.WithContext(what);
  }
}

Status EnvClient::Reset(const v1::ResetRequest& req, v1::ResetResponse* resp,
                        rpc::Cancellation* cancel) {
  return Call("Reset", timeouts_.reset_s, req, resp, cancel, &v1::Env::Stub::Reset);
}

Status EnvClient::Step(const v1::StepRequest& req, v1::StepResponse* resp,
                       rpc::Cancellation* cancel, double timeout_s) {
  return Call("Step", timeout_s > 0 ? timeout_s : timeouts_.step_s, req, resp, cancel,
              &v1::Env::Stub::Step);
}

void EnvClient::Close(const std::string& session_id, const std::string& reason) {
  v1::CloseRequest req;
  req.set_session_id(session_id);
  req.set_reason(reason);
  v1::CloseResponse resp;
  Status s = Call("Close", timeouts_.close_s, req, &resp, nullptr, &v1::Env::Stub::Close);
  if (!s.ok()) GYRE_LOG_DEBUG("{}", s.ToString());
}

}  // namespace gyre::agent
