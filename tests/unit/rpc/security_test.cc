// Mutual TLS and the cluster token on real gRPC servers and channels over loopback, with
// certificates made by tools/make-certs.sh (openssl): a client with everything is served; a client
// without the token, with another token, without a certificate, with a certificate from another CA
// or without TLS is refused, with a message that says what to configure, and the server logs it.

#include "rpc/security.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <sstream>

#include "common/file_util.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "rpc/rpc_util.h"
#include "test_paths.h"

namespace gyre::rpc {
namespace {

// A controller that accepts every registration.
class AcceptAll final : public v1::Controller::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    resp->set_worker_id("rollout-" + std::to_string(req->index()));
    return grpc::Status::OK;
  }
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/gyre_security_" + std::to_string(getpid()));
    (void)RemoveTree(*dir_);
    const std::string tool = std::string(GYRE_SOURCE_DIR) + "/tools/make-certs.sh";
    ASSERT_EQ(std::system((tool + " " + *dir_ + "/a > /dev/null").c_str()), 0);
    ASSERT_EQ(std::system((tool + " " + *dir_ + "/b > /dev/null").c_str()), 0);  // a stranger CA
  }
  static void TearDownTestSuite() {
    (void)RemoveTree(*dir_);
    ASSERT_TRUE(ConfigureSecurity({}).ok());
  }
  void SetUp() override {
    log_ = std::make_shared<std::ostringstream>();
    auto logger = std::make_shared<spdlog::logger>(
        "test", std::make_shared<spdlog::sinks::ostream_sink_mt>(*log_));
    spdlog::set_default_logger(logger);
  }
  void TearDown() override { ASSERT_TRUE(ConfigureSecurity({}).ok()); }

  static SecurityOptions Cluster(const std::string& which, bool token) {
    SecurityOptions o;
    o.tls_cert = *dir_ + "/" + which + "/node.pem";
    o.tls_key = *dir_ + "/" + which + "/node.key";
    o.tls_ca = *dir_ + "/" + which + "/ca.pem";
    if (token) o.token_file = *dir_ + "/" + which + "/token";
    return o;
  }
  // Starts the accepting controller with `server` security; returns its address.
  std::string Serve(const SecurityOptions& server) {
    EXPECT_TRUE(ConfigureSecurity(server).ok());
    std::string address;
    auto s = StartServer("127.0.0.1", 0, {&service_}, &address);
    EXPECT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    return address;
  }
  static grpc::Status Call(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::Controller::NewStub(channel);
    grpc::ClientContext ctx;
    SetDeadline(&ctx, 3);
    v1::RegisterRequest req;
    v1::RegisterResponse resp;
    return stub->Register(&ctx, req, &resp);
  }
  // A call from a client configured with `client` (through rpc::MakeChannel).
  static grpc::Status CallAs(const SecurityOptions& client, const std::string& address) {
    EXPECT_TRUE(ConfigureSecurity(client).ok());
    return Call(MakeChannel(address));
  }
  std::string Log() {
    spdlog::default_logger()->flush();
    return log_->str();
  }

  static std::string* dir_;
  AcceptAll service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<std::ostringstream> log_;
};

std::string* SecurityTest::dir_ = nullptr;

TEST_F(SecurityTest, AClientWithTheCertificateAndTheTokenIsServed) {
  const std::string address = Serve(Cluster("a", true));
  const grpc::Status st = CallAs(Cluster("a", true), address);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(Log().find("refused"), std::string::npos) << Log();
}

TEST_F(SecurityTest, AMissingOrWrongTokenIsRefusedWithAClearMessageOnBothSides) {
  const std::string address = Serve(Cluster("a", true));
  grpc::Status st = CallAs(Cluster("a", false), address);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("needs the cluster token: the call carried none"),
            std::string::npos)
      << st.error_message();
  EXPECT_NE(Log().find("refused a call to /gyre.v1.Controller/Register: the call carried no token"),
            std::string::npos)
      << Log();
  // Another token (and its process's TLS files are still the cluster's).
  SecurityOptions other = Cluster("a", false);
  other.token_file = *dir_ + "/b/token";
  st = CallAs(other, address);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("refused the call's token"), std::string::npos)
      << st.error_message();
  EXPECT_NE(Log().find("the call carried a wrong token"), std::string::npos) << Log();
  // What a worker's code sees: a precondition to fix, not something to retry.
  EXPECT_EQ(FromGrpc(st).code(), StatusCode::kFailedPrecondition);
}

TEST_F(SecurityTest, AClientWithoutACertificateIsRefused) {
  const std::string address = Serve(Cluster("a", true));
  auto ca = ReadFileToString(*dir_ + "/a/ca.pem");
  ASSERT_TRUE(ca.ok());
  grpc::SslCredentialsOptions ssl;  // trusts the server, presents nothing
  ssl.pem_root_certs = *ca;
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("gyre");
  const grpc::Status st = Call(grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("needs mutual TLS: the client presented no certificate"),
            std::string::npos)
      << st.error_message();
  EXPECT_NE(Log().find("the client presented no certificate"), std::string::npos) << Log();
}

TEST_F(SecurityTest, AStrangersCertificateOrAPlaintextClientCannotConnect) {
  const std::string address = Serve(Cluster("a", true));
  // A certificate from another CA: the handshake fails (the server does not trust it, and the
  // client does not trust the server's).
  grpc::Status st = CallAs(Cluster("b", true), address);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  // No TLS at all: the connection never completes; the hint says what may be missing.
  st = CallAs({}, address);
  EXPECT_NE(st.error_code(), grpc::StatusCode::OK);
  EXPECT_NE(SecurityHint(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")).find("--tls-cert"),
            std::string::npos);
  // The server's log explains the failed handshakes.
  EXPECT_NE(Log().find("tried to connect; it was refused"), std::string::npos) << Log();
}

TEST_F(SecurityTest, BadFilesAndSettingsAreClearErrors) {
  SecurityOptions o = Cluster("a", true);
  o.tls_ca.clear();
  Status st = ConfigureSecurity(o);
  EXPECT_NE(st.message().find("needs all three"), std::string::npos) << st;
  o = Cluster("a", true);
  o.tls_key = *dir_ + "/a/ca.pem";  // a certificate where the key should be
  st = ConfigureSecurity(o);
  EXPECT_NE(st.message().find("holds no 'PRIVATE KEY' block"), std::string::npos) << st;
  o = Cluster("a", true);
  o.tls_cert = *dir_ + "/nothing.pem";
  st = ConfigureSecurity(o);
  EXPECT_NE(st.message().find("cannot be read"), std::string::npos) << st;
  SecurityOptions token_only;
  token_only.token_file = *dir_ + "/a/token";
  st = ConfigureSecurity(token_only);
  EXPECT_NE(st.message().find("needs TLS"), std::string::npos) << st;
  const std::string short_token = *dir_ + "/short";
  ASSERT_TRUE(WriteFileAtomic(short_token, "abc\n").ok());
  o = Cluster("a", false);
  o.token_file = short_token;
  st = ConfigureSecurity(o);
  EXPECT_NE(st.message().find("at least 16 characters"), std::string::npos) << st;
  // The worker flags carry the same files.
  ASSERT_TRUE(ConfigureSecurity(Cluster("a", true)).ok());
  const auto flags = SecurityFlags();
  ASSERT_EQ(flags.size(), 10u);
  EXPECT_EQ(flags[0], "--tls-cert");
  EXPECT_EQ(flags[9], AbsolutePath(*dir_ + "/a/token"));
}

}  // namespace
}  // namespace gyre::rpc
