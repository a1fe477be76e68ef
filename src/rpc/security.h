#pragma once
// Transport security for every gRPC channel and server of a Gyre process (docs/security.md):
// TLS with mutual authentication (every process presents a certificate signed by the cluster's
// CA and checks its peer's) and, on top, a shared token that every call carries and every server
// checks. Set once per process, before any channel or server exists; rpc::MakeChannel and
// rpc::StartServer then use it. Unset (the default), channels are plaintext: for loopback and
// trusted networks.
//
// A refused call fails with UNAUTHENTICATED and a message that says what to configure; the
// server logs each kind of refusal (with a count, not once per call). A client that does not
// speak TLS, or whose certificate the CA did not sign, fails its TLS handshake: gRPC's own report
// of it is relayed to the log with that explanation.
//
// Thread contract: ConfigureSecurity is called once, before other threads use gRPC; the rest may
// be called from any thread.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "gyre/config.h"
#include "gyre/status.h"

namespace gyre::rpc {

struct SecurityOptions {
  std::string tls_cert;  // PEM certificate (chain) of this process
  std::string tls_key;   // PEM private key of that certificate
  std::string tls_ca;    // PEM CA bundle that signed the peers' certificates
  // The name every server's certificate must carry (subject alternative name): Gyre dials
  // addresses, not host names, so one cluster-wide name is checked instead.
  std::string server_name = "gyre";
  std::string token_file;  // a file whose first line is the shared token; needs TLS
  bool tls() const { return !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty(); }
  bool empty() const { return !tls() && token_file.empty(); }
};

// The options a job's cluster section names.
SecurityOptions SecurityFromConfig(const ClusterSection& cluster);

// Reads and checks the files (each must exist and hold PEM of the right kind; the token at least
// 16 characters). On success every later channel and server of the process uses them.
Status ConfigureSecurity(const SecurityOptions& options);

// What ConfigureSecurity was given (empty if never called).
const SecurityOptions& CurrentSecurity();

// A job's security (its cluster section; plaintext when it names no files), with a warning when
// the weights would cross the network outside TLS (Gloo or NCCL transport).
Status ConfigureJobSecurity(const ClusterSection& cluster);

// The `gyre worker` flags that give a child process the same settings ({} when unset).
std::vector<std::string> SecurityFlags();

// The credentials MakeChannel and StartServer use.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials();
std::shared_ptr<grpc::ServerCredentials> ServerCredentials();
// Sets the channel arguments security needs (the checked server name).
void AddChannelSecurityArgs(grpc::ChannelArguments* args);

// A hint for a failed call: with security off and UNAVAILABLE, it may be a TLS server. Empty
// when there is nothing to add.
std::string SecurityHint(const grpc::Status& status);

}  // namespace gyre::rpc
