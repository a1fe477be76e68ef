#pragma once
// WeightSender: the sending side of a policy version's publish. A trainer worker answers the
// controller's Trainer.PublishWeights with it, and an embedding program's RolloutFleet sends
// its own weights with it in-process; either way the request names the transport and the
// receivers (PublishWeightsRequest) and the response carries what was sent, per receiver:
//   grpc      a stream of checksummed buckets to each receiver (SendToEach, weight_sync.h);
//   gloo      one two-member group per receiver, this sender rank 0 (weight_broadcast.h);
//   nccl      the same over NCCL, from the device staging buffer;
//   cuda_ipc  nothing is sent: the response carries the staging buffer's IPC handle, manifest
//             and bucket checksums, and each receiver copies from the buffer itself.
// Between versions it keeps what the transports reuse: its groups (a group whose transfer failed
// is dropped; the controller names a new one to re-sync that receiver) and one device staging
// buffer with its CUDA IPC handle (exported again whenever the buffer is reallocated).
//
// Thread contract: not thread-safe; the owner runs one call at a time.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/device_weights.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sync.h"
#include "gyre/status.h"
#include "gyre/v1/gyre.pb.h"

namespace gyre::comm {

class WeightSender {
 public:
  // The request's transport ("" = grpc) when it is one of the four and the request is
  // consistent (one id per address); otherwise kInvalidArgument saying what is wrong.
  static StatusOr<std::string> Transport(const v1::PublishWeightsRequest& req);
  // The request's bucket size and timeout, with their defaults (4 MiB, 60 s).
  static int64_t BucketBytes(const v1::PublishWeightsRequest& req);
  static double TimeoutSeconds(const v1::PublishWeightsRequest& req);

  // grpc or gloo: `payload` in host memory. A receiver's failure is its result's error, not a
  // failed call.
  Status PublishHost(const v1::PublishWeightsRequest& req, const WeightPayload& payload,
                     v1::PublishWeightsResponse* resp);
  // nccl or cuda_ipc: `payload` lies in the staging buffer (StagingBuffer), filled and
  // synchronised by the caller.
  Status PublishDevice(const v1::PublishWeightsRequest& req, const DevicePayload& payload,
                       v1::PublishWeightsResponse* resp);

  // The staging buffer for a version of `bytes` bytes on CUDA `device`, allocated or grown as
  // needed. kFailedPrecondition without CUDA.
  StatusOr<void*> StagingBuffer(uint64_t bytes, int device);

 private:
  Status PublishToGroups(const v1::PublishWeightsRequest& req, const WeightPayload* host_payload,
                         const DevicePayload* device_payload, v1::PublishWeightsResponse* resp);

  std::map<std::string, std::unique_ptr<Communicator>> groups_;  // by group name
  std::unique_ptr<DeviceBuffer> staging_;
  std::string ipc_handle_;
};

}  // namespace gyre::comm
