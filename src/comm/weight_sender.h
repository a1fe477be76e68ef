#pragma once
// WeightSender: the sending side of a policy version's publish. A trainer worker answers the
// controller's Trainer.PublishWeights with it, and an embedding program's RolloutFleet sends
// its own weights with it in-process; either way the request names the transport and the
// receivers (PublishWeightsRequest) and the response carries what was sent, per receiver:
//   grpc      a stream of checksummed buckets to each receiver (SendToEach, weight_sync.h);
//   gloo      one two-member group per receiver, this sender rank 0 (weight_broadcast.h); a
//             tensor-parallel receiver (receiver_tensor_parallel T) is T members, each in a
//             group of its own and sent only its slices (sliced_payload.h);
//   nccl      the same over NCCL, from the device staging buffer;
//   cuda_ipc  nothing is sent: the response carries the staging buffer's IPC handle, manifest
//             and bucket checksums, and each receiver copies from the buffer itself.
// Between versions it keeps what the transports reuse: its groups (a group whose transfer failed
// is dropped; the controller names a new one to re-sync that receiver) and one device staging
// buffer with its CUDA IPC handle (exported again whenever the buffer is reallocated).
//
// A transfer to one receiver can be ended early (AbortReceivers): the controller does so when
// that receiver fails or is declared dead, so that a publish does not wait for the deadline of
// a host that is gone.
//
// Thread contract: the owner runs one publish at a time; AbortReceivers may be called from any
// thread, also while a publish runs.

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
  // The processes each receiver is (receiver_tensor_parallel, at least 1), and the group name of
  // rank `rank` of receiver `receiver` (the receiver's group itself when it is one process).
  static int ReceiverRanks(const v1::PublishWeightsRequest& req);
  static std::string MemberGroup(const v1::PublishWeightsRequest& req, int receiver, int rank);

  // grpc or gloo: `payload` in host memory. A receiver's failure is its result's error, not a
  // failed call. A streamed payload is read by receiver i as reader i, or over gloo with
  // tensor-parallel receivers by rank r of receiver i as reader i * T + r: it must be made for
  // that many readers.
  Status PublishHost(const v1::PublishWeightsRequest& req, const WeightPayload& payload,
                     v1::PublishWeightsResponse* resp);
  // nccl or cuda_ipc: `payload` lies in the staging buffer (StagingBuffer), filled and
  // synchronised by the caller.
  Status PublishDevice(const v1::PublishWeightsRequest& req, const DevicePayload& payload,
                       v1::PublishWeightsResponse* resp);

  // The staging buffer for a version of `bytes` bytes on CUDA `device`, allocated or grown as
  // needed. kFailedPrecondition without CUDA.
  StatusOr<void*> StagingBuffer(uint64_t bytes, int device);

  // Ends the transfers of publish `publish_id` (PublishWeightsRequest.publish_id) to each of
  // `rollout_ids`: the receiver's group is aborted (gloo, nccl) or its stream cancelled (grpc),
  // so the publish returns without waiting for that receiver's deadline, with its result an
  // error. A request that arrives before the publish reaches that receiver takes effect when it
  // does; one for a publish that has ended does nothing. Returns how many transfers it ended
  // at once (the rest are remembered for the publish). publish_id 0 (unset) matches nothing.
  int AbortReceivers(uint64_t publish_id, const std::vector<std::string>& rollout_ids);

 private:
  Status PublishToGroups(const v1::PublishWeightsRequest& req, const WeightPayload* host_payload,
                         const DevicePayload* device_payload, v1::PublishWeightsResponse* resp);
  // The publish in progress, as AbortReceivers sees it.
  void BeginPublish(uint64_t publish_id);
  void EndPublish();
  // A receiver's transfer has started: ended at once when it was asked for already.
  void Track(const std::string& rollout_id, Communicator* group);
  void Track(const std::string& rollout_id, rpc::Cancellation* stream);
  bool AbortRequested(const std::string& rollout_id);

  std::map<std::string, std::unique_ptr<Communicator>> groups_;  // by group name
  // Groups still forming when their receiver's transfer was ended; dropped once formed or failed.
  std::vector<std::future<StatusOr<std::unique_ptr<Communicator>>>> abandoned_;

  std::mutex abort_mu_;      // guards the four members below
  uint64_t publishing_ = 0;  // the publish_id in progress; 0 between publishes
  // rollout id -> its group (a tensor-parallel rollout worker's: one per rank)
  std::multimap<std::string, Communicator*> live_groups_;
  std::map<std::string, rpc::Cancellation*> live_streams_;     // rollout id -> its grpc stream
  std::set<std::pair<uint64_t, std::string>> abort_requests_;  // (publish_id, rollout id)
  std::unique_ptr<DeviceBuffer> staging_;
  std::string ipc_handle_;
};

}  // namespace gyre::comm
