#pragma once
// Gloo over TCP, through libtorch's c10d ProcessGroupGloo, for CPU memory.
//
// Rendezvous: one process (the controller in a job, the parent in `gyre bench weight-sync`) runs
// a StoreServer, a c10d TCPStore listening on a port the OS chooses. It hands out the store's
// address and a group name; every member then calls CreateGlooCommunicator with its rank. The
// members exchange their own Gloo listening addresses (also OS-chosen ports) through the store,
// so no port is ever fixed. A group that has to be formed again (after a dead member or an
// expired deadline) uses a new group name, so stale keys from the old group are never read.
//
// Torch and Gloo types stay in gloo_communicator.cc.

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "gyre/status.h"

namespace gyre::comm {

// A c10d TCPStore server bound to `host` on an OS-chosen port. Owned by the rendezvous process;
// the store lives until the object is destroyed. Thread-safe (the store serves its own clients).
class StoreServer {
 public:
  // `host`: the IPv4 address to listen on (loopback by default in Gyre).
  static StatusOr<std::unique_ptr<StoreServer>> Start(const std::string& host);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // "host:port", what members pass as GlooOptions::store_address.
  std::string address() const;
  int port() const;

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A key-value pair in the store at `address` (keys are namespaced under "gyre/"): how a member
// hands others a small secret such as an NCCL unique id. StoreGet waits up to `timeout_s` for the
// key to be set (kDeadlineExceeded after that).
Status StoreSet(const std::string& address, const std::string& key, const std::string& value,
                double timeout_s);
StatusOr<std::string> StoreGet(const std::string& address, const std::string& key,
                               double timeout_s);

struct GlooOptions {
  std::string store_address;  // "host:port" of a StoreServer, from the rendezvous
  std::string group;          // names this group in the store; a new name for each formation
  int rank = 0;
  int size = 1;
  // The address this member's Gloo device listens on (port chosen by the OS). Peers connect to
  // it, so on a cluster it is the host's address on the network the job uses.
  std::string bind_host = "127.0.0.1";
  // How long to wait for every member to join the group.
  double connect_timeout_s = 60;
};

// Joins the group (blocks until all `size` members joined, or the connect timeout). Errors:
// kInvalidArgument for bad options, kUnavailable / kDeadlineExceeded when the group cannot form.
StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const GlooOptions& options);

}  // namespace gyre::comm
