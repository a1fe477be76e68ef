#include "rpc/rpc_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "rpc/security.h"

namespace gyre::rpc {

Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return FromGrpc(s).WithContext(what);
}

Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  StatusCode code = StatusCode::kInternal;
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      code = StatusCode::kInvalidArgument;
      break;
    case grpc::StatusCode::NOT_FOUND:
      code = StatusCode::kNotFound;
      break;
    case grpc::StatusCode::ALREADY_EXISTS:
      code = StatusCode::kAlreadyExists;
      break;
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNAUTHENTICATED:  // refused credentials: fix the configuration
    case grpc::StatusCode::PERMISSION_DENIED:
      code = StatusCode::kFailedPrecondition;
      break;
    case grpc::StatusCode::OUT_OF_RANGE:
      code = StatusCode::kOutOfRange;
      break;
    case grpc::StatusCode::UNAVAILABLE:
      code = StatusCode::kUnavailable;
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      code = StatusCode::kDeadlineExceeded;
      break;
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
      code = StatusCode::kAborted;
      break;
    case grpc::StatusCode::DATA_LOSS:
      code = StatusCode::kDataLoss;
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      code = StatusCode::kUnimplemented;
      break;
    default:
      break;
  }
  return Status(code, s.error_message());
}

grpc::Status HandlerFailed(const char* method, const char* what) {
  const std::string msg =
      std::string(method) + " failed: " + FirstLine(what == nullptr ? "" : what);
  GYRE_LOG_ERROR("{}", msg);
  return grpc::Status(grpc::StatusCode::INTERNAL, msg);
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case StatusCode::kOutOfRange:
      code = grpc::StatusCode::OUT_OF_RANGE;
      break;
    case StatusCode::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    case StatusCode::kAborted:
      code = grpc::StatusCode::ABORTED;
      break;
    case StatusCode::kDataLoss:
      code = grpc::StatusCode::DATA_LOSS;
      break;
    case StatusCode::kUnimplemented:
      code = grpc::StatusCode::UNIMPLEMENTED;
      break;
    default:
      break;
  }
  return grpc::Status(code, s.message());
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Each worker gets its own TCP connection; no subchannel sharing between stubs of one process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  AddChannelSecurityArgs(&args);
  return grpc::CreateCustomChannel(address, ChannelCredentials(), args);
}

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

StatusOr<std::unique_ptr<grpc::Server>> StartServer(const std::string& host, int port,
                                                    const std::vector<grpc::Service*>& services,
                                                    std::string* bound_address) {
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default, and then two processes that start together can be given
  // the same port (seen: a trainer and a rollout worker both on one port, the kernel splitting
  // connections between them). Each server's port must be its own.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int selected = 0;
  builder.AddListeningPort(host + ":" + std::to_string(port), ServerCredentials(), &selected);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || selected == 0) {
    return Unavailable("cannot listen on " + host + ":" + std::to_string(port) +
                       " (address in use or not local?)");
  }
  *bound_address = host + ":" + std::to_string(selected);
  return server;
}

StatusOr<PortReservation> PortReservation::Make(const std::string& host) {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  const std::string ip = host == "localhost" ? "127.0.0.1" : host;
  if (::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("bind host '" + host + "' is not an IPv4 address");
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  // gRPC's listener sets SO_REUSEADDR too; two such sockets may share a port while neither
  // listens, so the server can bind the port this socket holds.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return Unavailable("cannot bind " + host + ": " + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return Unavailable(std::string("getsockname: ") + std::strerror(err));
  }
  return PortReservation(fd, static_cast<int>(ntohs(addr.sin_port)));
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(other.fd_), port_(other.port_) {
  other.fd_ = -1;
}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = other.fd_;
    port_ = other.port_;
    other.fd_ = -1;
  }
  return *this;
}

PortReservation::~PortReservation() { Release(); }

void PortReservation::Release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

StatusOr<int> PickFreePort(const std::string& host) {
  GYRE_ASSIGN_OR_RETURN(PortReservation reservation, PortReservation::Make(host));
  return reservation.port();
}

}  // namespace gyre::rpc
