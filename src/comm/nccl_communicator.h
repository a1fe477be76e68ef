#pragma once
// NCCL on GPU memory, with a non-blocking communicator so that no call can hang forever:
// ncclCommInitRankConfig runs with config.blocking = 0, every operation is followed by polling
// ncclCommGetAsyncError and the stream until it completes or the deadline passes, and an expired
// deadline or Abort() ends the communicator with ncclCommAbort.
//
// Rendezvous: one member calls NewNcclUniqueId() and the rendezvous (the controller) hands the
// 128-byte id to every member, which then calls CreateNcclCommunicator with its rank.
//
// Built only with CUDA (GYRE_WITH_CUDA); otherwise every function returns kFailedPrecondition.
// NCCL types stay in nccl_communicator.cc.

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "gyre/status.h"

namespace gyre::comm {

// True when this build has NCCL.
bool NcclCompiled();

// A fresh NCCL unique id (ncclGetUniqueId), as its raw 128 bytes.
StatusOr<std::string> NewNcclUniqueId();

struct NcclOptions {
  std::string unique_id;  // from NewNcclUniqueId() on one member, via the rendezvous
  int rank = 0;
  int size = 1;
  int device = 0;  // CUDA device this member uses
  // How long to wait for every member to join.
  double connect_timeout_s = 60;
};

// Joins the group. Errors: kInvalidArgument (bad options), kFailedPrecondition (no CUDA device
// or no NCCL in this build), kDeadlineExceeded (members missing at the connect timeout; the
// half-made communicator is aborted), kUnavailable (NCCL errors).
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions& options);

}  // namespace gyre::comm
