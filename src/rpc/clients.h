#pragma once
// The controller's view of its workers: a rollout client and a trainer client, each an
// interface with one gRPC implementation here and fakes in tests/fakes/, so that the
// controller's scheduling, publishing and training logic is tested without processes.
//
// Every method blocks until its call ends and returns the worker's status as a Gyre Status with
// the peer's message unchanged (callers add their context with WithContext). A call ends early,
// with kAborted, when its Cancellation is cancelled from another thread.
//
// Thread-safety: clients are thread-safe (concurrent calls on one client are allowed);
// Cancellation is thread-safe.

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "gyre/status.h"
#include "gyre/v1/gyre.pb.h"

namespace gyre::rpc {

// Lets one thread cancel another thread's call. The calling side installs a hook (for gRPC:
// ClientContext::TryCancel) for the duration of the call; Cancel runs it, or, when no call is
// running, makes the next one fail at once.
class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  void Cancel();
  bool cancelled() const;

  // For client implementations: `hook` runs on Cancel (at once if already cancelled) until
  // ClearHook. The hook must not call back into this object.
  void SetHook(std::function<void()> hook);
  void ClearHook();

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;      // guarded by mu_
  std::function<void()> hook_;  // guarded by mu_
};

// One call's deadline and (optional) cancellation.
struct Call {
  double timeout_s = 30;
  Cancellation* cancel = nullptr;  // not owned; may be null
};

class RolloutClient {
 public:
  virtual ~RolloutClient() = default;
  virtual Status Generate(const Call& call, const v1::GenerateRequest& req,
                          v1::GenerateResponse* resp) = 0;
  // Streaming generation (Rollout.GenerateStream): `on_part` runs on the calling thread for each
  // message as it arrives (finished groups and resumed samples, and the counters since the
  // previous message),
  // and may move from it. Returns the call's final status; parts delivered before a failure
  // stay delivered.
  virtual Status GenerateStream(const Call& call, const v1::GenerateRequest& req,
                                const std::function<void(v1::GenerateResponse&)>& on_part) = 0;
  virtual Status ReceiveWeights(const Call& call, const v1::ReceiveWeightsRequest& req,
                                v1::WeightReceipt* receipt) = 0;
  // Peer relay (Rollout.RelayWeights): the worker streams the version it holds to others.
  virtual Status RelayWeights(const Call& call, const v1::RelayWeightsRequest& req,
                              v1::PublishWeightsResponse* resp) = 0;
  // Work stealing (Rollout.Preempt): takes samples still generating out of the worker's streams
  // and returns them unfinished, to be resumed elsewhere.
  virtual Status Preempt(const Call& call, const v1::PreemptRequest& req,
                         v1::PreemptResponse* resp) = 0;
  virtual Status Stop(const Call& call, const v1::StopRequest& req) = 0;
};

class TrainerClient {
 public:
  virtual ~TrainerClient() = default;
  virtual Status HostGroupStore(const Call& call, v1::HostGroupStoreResponse* resp) = 0;
  virtual Status JoinGroup(const Call& call, const v1::JoinGroupRequest& req,
                           v1::JoinGroupResponse* resp) = 0;
  virtual Status TrainStep(const Call& call, const v1::TrainStepRequest& req,
                           v1::TrainStepResponse* resp) = 0;
  virtual Status SequenceKl(const Call& call, const v1::SequenceKlRequest& req,
                            v1::SequenceKlResponse* resp) = 0;
  virtual Status PublishWeights(const Call& call, const v1::PublishWeightsRequest& req,
                                v1::PublishWeightsResponse* resp) = 0;
  virtual Status AbortWeightTransfer(const Call& call, const v1::AbortWeightTransferRequest& req,
                                     v1::AbortWeightTransferResponse* resp) = 0;
  virtual Status Save(const Call& call, const v1::SaveRequest& req, v1::SaveResponse* resp) = 0;
  virtual Status SaveState(const Call& call, const v1::SaveStateRequest& req,
                           v1::SaveStateResponse* resp) = 0;
  virtual Status LoadState(const Call& call, const v1::LoadStateRequest& req,
                           v1::LoadStateResponse* resp) = 0;
  virtual Status Stop(const Call& call, const v1::StopRequest& req) = 0;
};

// Makes the clients of workers at given addresses ("host:port"). The default makes gRPC
// clients; tests substitute fakes.
struct ClientFactory {
  std::function<std::unique_ptr<RolloutClient>(const std::string& address)> rollout;
  std::function<std::unique_ptr<TrainerClient>(const std::string& address)> trainer;
};
ClientFactory GrpcClientFactory();

std::unique_ptr<RolloutClient> MakeGrpcRolloutClient(const std::string& address);
std::unique_ptr<TrainerClient> MakeGrpcTrainerClient(const std::string& address);

}  // namespace gyre::rpc
