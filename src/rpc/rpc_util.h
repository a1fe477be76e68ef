#pragma once
// gRPC plumbing shared by every service: status mapping, channels, deadlines, servers.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "gyre/status.h"

namespace gyre::rpc {

// Largest message any Gyre call sends (a generate response or a weight bucket).
constexpr int kMaxMessageBytes = 512 << 20;

Status FromGrpc(const grpc::Status& s, const std::string& what);
grpc::Status ToGrpc(const Status& s);

// An insecure channel (loopback or a trusted cluster network) with Gyre's message limits.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets a deadline `seconds` from now on `ctx`.
void SetDeadline(grpc::ClientContext* ctx, double seconds);

// Builds and starts a server on host:port (port 0 = pick a free one) with the given services.
// On success *bound_address is "host:actual_port".
StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& host, int port,
                                                    const std::vector<grpc::Service*>& services,
                                                    std::string* bound_address);

// Asks the kernel for a free TCP port on `host` (an IPv4 address or "localhost").
StatusOr<int> PickFreePort(const std::string& host);

}  // namespace gyre::rpc
