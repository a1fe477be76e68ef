#include "rpc/security.h"

#include <grpc/support/log.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "common/file_util.h"
#include "common/logging.h"

namespace gyre::rpc {

namespace {

struct State {
  SecurityOptions options;
  std::string cert, key, ca, token;
};

State& Global() {
  static State state;
  return state;
}

StatusOr<std::string> ReadPem(const std::string& path, const char* what, const char* marker) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return InvalidArgument(std::string(what) + " " + path +
                           " cannot be read: " + text.status().message());
  }
  if (text->find(marker) == std::string::npos) {
    return InvalidArgument(std::string(what) + " " + path + " holds no '" + marker +
                           "' block (PEM expected)");
  }
  return *text;
}

// Equal-time comparison: how much of the token matched must not show in the timing.
bool SameToken(grpc::string_ref got, const std::string& want) {
  unsigned diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned>(static_cast<unsigned char>(want[i]) ^
                                  static_cast<unsigned char>(i < got.size() ? got.data()[i] : 0));
  }
  return diff == 0;
}

// Counts refusals by reason; logs the first of each kind and then every 100th.
void LogRefusal(const std::string& method, const std::string& reason) {
  static std::mutex mu;
  static std::map<std::string, int64_t> counts;
  int64_t n;
  {
    std::lock_guard<std::mutex> lock(mu);
    n = ++counts[reason];
  }
  if (n == 1 || n % 100 == 0) {
    GYRE_LOG_WARN("refused a call to {}: {} ({} such refusal{} so far)", method, reason, n,
                  n == 1 ? "" : "s");
  }
}

// Checks each call on the server: a verified client certificate (mutual TLS) and the token.
class TokenAndPeerCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAndPeerCheck(std::string token) : token_(std::move(token)) {}
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    std::string method = "?";
    if (auto it = md.find(":path"); it != md.end())
      method.assign(it->second.data(), it->second.size());
    if (!context->IsPeerAuthenticated()) {
      LogRefusal(method, "the client presented no certificate");
      return {grpc::StatusCode::UNAUTHENTICATED,
              "this Gyre endpoint needs mutual TLS: the client presented no certificate (give "
              "it cluster.tls_cert and cluster.tls_key, or gyre worker --tls-cert/--tls-key)"};
    }
    if (token_.empty()) return grpc::Status::OK;
    auto it = md.find("authorization");
    if (it == md.end()) {
      LogRefusal(method, "the call carried no token");
      return {grpc::StatusCode::UNAUTHENTICATED,
              "this Gyre endpoint needs the cluster token: the call carried none (set "
              "cluster.auth_token_file, or gyre worker --token-file)"};
    }
    const grpc::string_ref v = it->second;
    constexpr char kBearer[] = "Bearer ";
    const bool bearer = v.size() > 7 && v.starts_with(kBearer);
    if (!bearer || !SameToken(v.substr(7), token_)) {
      LogRefusal(method, "the call carried a wrong token");
      return {grpc::StatusCode::UNAUTHENTICATED,
              "this Gyre endpoint refused the call's token: it is not the cluster's (check "
              "cluster.auth_token_file / --token-file on both sides)"};
    }
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

class TokenPlugin final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(std::string token) : header_("Bearer " + std::move(token)) {}
  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "gyre-token"; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace("authorization", header_);
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

// gRPC's own log lines (its core logs TLS handshake failures) go to Gyre's log; a failed
// handshake gets an explanation.
void RelayGrpcLog(gpr_log_func_args* args) {
  std::string msg = args->message != nullptr ? args->message : "";
  if (msg.find("Handshake failed") != std::string::npos ||
      msg.find("handshake failed") != std::string::npos) {
    // A client retries: the first failed handshake and every 100th are logged.
    static std::atomic<int64_t> count{0};
    const int64_t n = ++count;
    if (n == 1 || n % 100 == 0) {
      GYRE_LOG_WARN(
          "gRPC: {} (a peer without TLS, or with a certificate that cluster.tls_ca did "
          "not sign, tried to connect; it was refused; {} failed handshake{} so far)",
          msg, n, n == 1 ? "" : "s");
    }
    return;
  }
  if (args->severity == GPR_LOG_SEVERITY_ERROR) GYRE_LOG_WARN("gRPC: {}", msg);
}

}  // namespace

SecurityOptions SecurityFromConfig(const ClusterSection& c) {
  SecurityOptions o;
  o.tls_cert = c.tls_cert;
  o.tls_key = c.tls_key;
  o.tls_ca = c.tls_ca;
  o.server_name = c.tls_server_name;
  o.token_file = c.auth_token_file;
  return o;
}

Status ConfigureSecurity(const SecurityOptions& o) {
  State s;
  s.options = o;
  if (o.tls()) {
    if (o.tls_cert.empty() || o.tls_key.empty() || o.tls_ca.empty()) {
      return InvalidArgument(
          "TLS needs all three of the certificate, its key and the CA bundle "
          "(cluster.tls_cert, cluster.tls_key, cluster.tls_ca; gyre worker --tls-cert, "
          "--tls-key, --tls-ca)");
    }
    GYRE_ASSIGN_OR_RETURN(s.cert, ReadPem(o.tls_cert, "TLS certificate", "BEGIN CERTIFICATE"));
    GYRE_ASSIGN_OR_RETURN(s.key, ReadPem(o.tls_key, "TLS key", "PRIVATE KEY"));
    GYRE_ASSIGN_OR_RETURN(s.ca, ReadPem(o.tls_ca, "TLS CA bundle", "BEGIN CERTIFICATE"));
    if (o.server_name.empty()) return InvalidArgument("the TLS server name must not be empty");
  }
  if (!o.token_file.empty()) {
    if (!o.tls()) {
      return InvalidArgument(
          "a cluster token (cluster.auth_token_file, --token-file) needs TLS: a token sent in "
          "the clear can be read off the network; set cluster.tls_cert, tls_key and tls_ca too");
    }
    auto text = ReadFileToString(o.token_file);
    if (!text.ok()) {
      return InvalidArgument("token file " + o.token_file +
                             " cannot be read: " + text.status().message());
    }
    std::string token = text->substr(0, text->find('\n'));
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
    if (token.size() < 16) {
      return InvalidArgument("token file " + o.token_file +
                             ": the token (its first line) must have at least 16 characters "
                             "(e.g. `openssl rand -hex 32 > " +
                             o.token_file + "`)");
    }
    s.token = token;
  }
  Global() = std::move(s);
  if (o.tls()) gpr_set_log_function(&RelayGrpcLog);
  return Status::Ok();
}

Status ConfigureJobSecurity(const ClusterSection& cluster) {
  const SecurityOptions o = SecurityFromConfig(cluster);
  GYRE_RETURN_IF_ERROR(ConfigureSecurity(o));
  if (o.tls()) {
    GYRE_LOG_INFO("gRPC: mutual TLS (CA {}, server name '{}'){}", o.tls_ca, o.server_name,
                  o.token_file.empty() ? "" : " and a cluster token on every call");
    if (cluster.weight_transport == "gloo" || cluster.weight_transport == "nccl") {
      GYRE_LOG_WARN(
          "cluster.weight_transport: {} sends the weights outside TLS; keep its network "
          "private, or use grpc (inside TLS) or cuda_ipc (one host)",
          cluster.weight_transport);
    }
  }
  return Status::Ok();
}

const SecurityOptions& CurrentSecurity() { return Global().options; }

std::vector<std::string> SecurityFlags() {
  const SecurityOptions& o = Global().options;
  std::vector<std::string> flags;
  if (o.tls()) {
    flags = {"--tls-cert", AbsolutePath(o.tls_cert), "--tls-key",         AbsolutePath(o.tls_key),
             "--tls-ca",   AbsolutePath(o.tls_ca),   "--tls-server-name", o.server_name};
  }
  if (!o.token_file.empty()) {
    flags.push_back("--token-file");
    flags.push_back(AbsolutePath(o.token_file));
  }
  return flags;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() {
  const State& s = Global();
  if (!s.options.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = s.ca;
  ssl.pem_private_key = s.key;
  ssl.pem_cert_chain = s.cert;
  auto creds = grpc::SslCredentials(ssl);
  if (s.token.empty()) return creds;
  return grpc::CompositeChannelCredentials(
      creds, grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenPlugin>(s.token)));
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  const State& s = Global();
  if (!s.options.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = s.ca;
  ssl.pem_key_cert_pairs.push_back({s.key, s.cert});
  auto creds = grpc::SslServerCredentials(ssl);
  creds->SetAuthMetadataProcessor(std::make_shared<TokenAndPeerCheck>(s.token));
  return creds;
}

void AddChannelSecurityArgs(grpc::ChannelArguments* args) {
  const State& s = Global();
  if (s.options.tls()) args->SetSslTargetNameOverride(s.options.server_name);
}

std::string SecurityHint(const grpc::Status& status) {
  if (Global().options.tls() || status.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
  return " (if the peer serves TLS, this process needs its certificate, key and CA: "
         "cluster.tls_cert/tls_key/tls_ca, or gyre worker --tls-cert/--tls-key/--tls-ca)";
}

}  // namespace gyre::rpc
