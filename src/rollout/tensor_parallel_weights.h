#pragma once
// Weight updates of a tensor-parallel rollout worker (rollout.tensor_parallel; docs/rollout.md,
// "Tensor parallelism"). Rank 0 receives a policy version (grpc or gloo) and hands every rank its
// slices over the worker's group, one tensor at a time, as the tensors complete: over grpc
// straight from the stream's buckets (SliceSender::Add as each bucket passes its checks), so that
// rank 0 never holds the whole version. A split tensor is scattered: each rank receives only its
// slice (the vocabulary's shorter last slices padded to rank 0's); a replicated one (norms) is
// broadcast whole. Every rank copies its slice into a staging copy of its parameters
// (model/tensor_parallel.h); once the transfer ended and every rank has every tensor, all ranks
// copy the staging into their parameters. A transfer that fails on the way, a bad manifest or a
// rank that misses a tensor changes no rank's parameters. Besides its parameters, a rank holds its
// staging (its share of the model) and one slice; rank 0 also holds one whole tensor, its parts
// when they are not its rows as they are (column splits, a padded vocabulary) and one bucket of
// the stream.
//
// Over gloo from a publisher that knows the worker's layout (the controller's
// PublishWeightsRequest.receiver_tensor_parallel) no rank passes slices on: every rank joins a
// two-member group of its own with the publisher and receives only its slices, as a version of
// their own (comm/sliced_payload.h), checksummed per bucket; the ranks load only when every one
// has all of its slices (ReceiveDirectSlices). Each rank then receives exactly its bytes.
//
// Every weight update starts with rank 0 saying which way the slices come (AnnounceRoute, then
// SliceSender; or AnnounceRoute with a route, then ReceiveDirectSlices on every rank); the other
// ranks hear it (ReceiveRoute) and follow (ReceiveSlices or ReceiveDirectSlices), in the same
// order (as the swap of RolloutEngine::UpdateWeights and of each follower's Follow). Collective
// failures throw std::runtime_error (TensorParallelGroup's convention); the engine turns them into
// its Status.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/weight_broadcast.h"
#include "gyre/status.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace gyre::rollout {

// Rank 0's side of one weight update.
class SliceSender {
 public:
  // `slices`: this rank's parameters (not owned; they must outlive the sender).
  SliceSender(const model::NamedTensors& slices, model::TensorParallelGroup* group);

  // The version's manifest and payload size: an error when it does not name exactly the whole
  // parameters of the slices (by name, with shapes that slice to theirs, in float32, bfloat16 or
  // float16, inside the payload); the other ranks then learn from Finish that nothing comes.
  Status Begin(const std::vector<model::TensorEntry>& manifest, uint64_t payload_bytes);
  // The payload's bytes [offset, offset + size), in order, after Begin: each tensor they complete
  // goes to every rank's staging.
  Status Add(uint64_t offset, const uint8_t* data, size_t size);
  // The transfer's outcome. When it is Ok and every tensor arrived, every rank that has all of them
  // loads its staging into its parameters and the result is Ok when all did; otherwise no rank
  // changes anything and the error says why.
  Status Finish(const Status& transfer);

 private:
  struct Pending {
    size_t slice = 0;  // index into slices_
    const model::TensorEntry* entry = nullptr;
    at::ScalarType dtype = at::kFloat;
  };
  void SendCurrent();

  const model::NamedTensors& slices_;
  model::TensorParallelGroup* const group_;
  std::vector<model::TensorEntry> manifest_;
  std::vector<Pending> order_;  // by payload offset
  std::vector<at::Tensor> staging_;
  size_t next_ = 0;      // the tensor being assembled
  at::Tensor current_;   // its bytes, as they arrive
  uint64_t filled_ = 0;  // bytes of current_ written
  bool begun_ = false;
};

// Every other rank: receives the version rank 0 sends into a staging copy of `slices` (this
// rank's parameters) and loads it when every rank has all of it. An error, with nothing loaded,
// when rank 0 refused the version, the transfer failed, a tensor does not slice to this rank's
// shape or another rank missed one.
Status ReceiveSlices(const model::NamedTensors& slices, model::TensorParallelGroup* group);

// Where each rank of the worker takes its slices of a version from, straight from the publisher.
struct DirectRoute {
  std::string store_address;  // the rendezvous store of the publisher's groups
  std::string group;          // the worker's: rank r joins group + "-tp" + r
  std::string bind_host;      // the address the ranks' Gloo devices listen on ("": loopback)
  double timeout_s = 60;      // forming the group and receiving the version
};

// Rank 0: tells the other ranks how this update's slices come: from rank 0 over the group
// (route null; SliceSender follows) or to every rank from the publisher (ReceiveDirectSlices).
void AnnounceRoute(model::TensorParallelGroup* group, const DirectRoute* route);
// The other ranks: the route rank 0 announced, or nullopt when ReceiveSlices follows.
std::optional<DirectRoute> ReceiveRoute(model::TensorParallelGroup* group);

// What a rank keeps between direct updates: its group with the publisher (formed again when it
// was aborted or the route names another) and the buffer its slices arrive in.
struct DirectReceiver {
  std::unique_ptr<comm::Communicator> comm;
  std::string group;
  comm::WeightPayload payload;
};

// Every rank of `group`: receives this rank's slices of a version from the publisher over
// `receiver`'s group, checks that they are exactly `slices` (names, shapes), and loads them when
// every rank received and checked its own; otherwise no rank changes anything and the error
// says which ranks failed. The receipt is this rank's, except that on every rank its checksums are
// every rank's buckets in rank order and its bytes their sum (what the publisher reports).
StatusOr<comm::Receipt> ReceiveDirectSlices(const DirectRoute& route, DirectReceiver* receiver,
                                            const model::NamedTensors& slices,
                                            model::TensorParallelGroup* group);

}  // namespace gyre::rollout
