#pragma once
// gRPC plumbing shared by every service: status mapping, channels, deadlines, servers.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>

#include "common/limits.h"
#include "gyre/status.h"

namespace gyre::rpc {

// Largest message any Gyre call sends (a generate response or a weight bucket).
constexpr int kMaxMessageBytes = static_cast<int>(kMaxRpcMessageBytes);

// "WHAT: peer's message", with the matching code.
Status FromGrpc(const grpc::Status& s, const std::string& what);
// The peer's message unchanged, with the matching code.
Status FromGrpc(const grpc::Status& s);
grpc::Status ToGrpc(const Status& s);

// Logs and returns INTERNAL "METHOD failed: WHAT" (WHAT cut to its first line).
grpc::Status HandlerFailed(const char* method, const char* what);

// The module edge of every RPC handler: runs `body` (returning grpc::Status) and turns an
// exception that escapes it (c10::Error from libtorch, bad_alloc, a YAML or JSON error) into an
// INTERNAL status naming the method and the exception's first line, logged on the server, so the
// client sees what went wrong instead of gRPC's generic UNKNOWN and the server keeps serving.
template <typename Body>
grpc::Status Guarded(const char* method, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return HandlerFailed(method, e.what());
  } catch (...) {
    return HandlerFailed(method, "unknown exception");
  }
}
// A channel with Gyre's message limits and the process's transport security (rpc/security.h:
// plaintext unless ConfigureSecurity set TLS and a token).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets a deadline `seconds` from now on `ctx`.
void SetDeadline(grpc::ClientContext* ctx, double seconds);

// Builds and starts a server on host:port (port 0 = pick a free one) with the given services and
// the process's transport security (rpc/security.h).
// On success *bound_address is "host:actual_port".
StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& host, int port,
                                                    const std::vector<grpc::Service*>& services,
                                                    std::string* bound_address);

// Asks the kernel for a free TCP port on `host` (an IPv4 address or "localhost").
StatusOr<int> PickFreePort(const std::string& host);

}  // namespace gyre::rpc
