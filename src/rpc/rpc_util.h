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

// A TCP port held for a server that starts later. The kernel hands out a free port to a bound
// socket (SO_REUSEADDR, never listening) and, while that socket stays open, gives the port to no
// other process; StartServer can still bind it, because neither socket listens before gRPC's
// does. Close the reservation once the server is up. Picking a port and closing it at once (as
// PickFreePort does) leaves a window in which a second process starting alongside is given the
// same port: seen in CI as a trainer and a rollout worker registering one address.
class PortReservation {
 public:
  static StatusOr<PortReservation> Make(const std::string& host);
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  int port() const { return port_; }
  // Lets the port go (the destructor does too).
  void Release();

 private:
  PortReservation(int fd, int port) : fd_(fd), port_(port) {}
  int fd_ = -1;
  int port_ = 0;
};

// Asks the kernel for a free TCP port on `host` (an IPv4 address or "localhost") and lets it go at
// once: for a port handed to a child process. A server in this process should hold a
// PortReservation instead.
StatusOr<int> PickFreePort(const std::string& host);

}  // namespace gyre::rpc
