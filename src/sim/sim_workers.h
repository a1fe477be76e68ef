#pragma once
// Simulated workers: a rollout service and a trainer service that answer the real protocol
// (proto/gyre/v1/gyre.proto) without a model, spending the time a CostModel says instead of
// computing. The controller cannot tell them from real workers apart from their samples'
// content: every response token is the group's first prompt token (a response shorter than
// max_new_tokens ends with the request's first stop token), every behaviour log-prob is -1, and
// rewards are whatever the task's verifier makes of that. `gyre sim-workers` serves many of
// them from one process, each with its own gRPC server and heartbeat (src/cli/sim_workers.cc).
//
// SimRollout: one generation at a time (as the real engine), simulated continuous batching
// (cost_model.h); GenerateStream sends each group when its last sample finishes; weights arrive
// over the grpc transport only (LoadWeights), and the version is what the trainer sent. A version
// that arrives mid-call labels the tokens of the steps after it (rollout.weight_updates:
// between_steps).
// SimTrainer: TrainStep checks expected_version and advances the version by one; PublishWeights
// (grpc transport only) spends the uplink time, then streams a small token payload to each
// rollout worker so the receipts are real; Save writes simulated.json; SaveState and LoadState
// are refused (a simulated job cannot be checkpointed).
//
// Thread-safe: gRPC calls may arrive concurrently; each service serialises what must be.

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

#include "gyre/v1/gyre.grpc.pb.h"
#include "sim/cost_model.h"

namespace gyre::sim {

class SimRollout final : public v1::Rollout::Service {
 public:
  SimRollout(CostModel cost, std::function<void(const std::string&)> on_stop);

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override;
  grpc::Status GenerateStream(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                              grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status LoadWeights(grpc::ServerContext* ctx, grpc::ServerReader<v1::WeightChunk>* reader,
                           v1::WeightReceipt* receipt) override;
  grpc::Status ReceiveWeights(grpc::ServerContext* ctx, const v1::ReceiveWeightsRequest* req,
                              v1::WeightReceipt* receipt) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  int64_t version() const { return version_.load(); }

 private:
  // Simulates `req` at `version`: `on_group` receives each group's samples (in sample order)
  // when its last one finishes, with the tokens generated since the previous call, and returns
  // false to stop (the caller went away). Returns CANCELLED when `ctx` is cancelled.
  grpc::Status Run(grpc::ServerContext* ctx, const v1::GenerateRequest& req, int64_t version,
                   const std::function<bool(std::vector<v1::Sample>&&, int64_t tokens)>& on_group);

  const CostModel cost_;
  std::function<void(const std::string&)> on_stop_;
  std::mutex generate_mu_;            // one generation at a time
  std::atomic<int64_t> version_{-1};  // -1: no weights received yet
};

class SimTrainer final : public v1::Trainer::Service {
 public:
  SimTrainer(CostModel cost, std::function<void(const std::string&)> on_stop);

  grpc::Status HostGroupStore(grpc::ServerContext* ctx, const v1::HostGroupStoreRequest* req,
                              v1::HostGroupStoreResponse* resp) override;
  grpc::Status JoinGroup(grpc::ServerContext* ctx, const v1::JoinGroupRequest* req,
                         v1::JoinGroupResponse* resp) override;
  grpc::Status TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* req,
                         v1::TrainStepResponse* resp) override;
  grpc::Status PublishWeights(grpc::ServerContext* ctx, const v1::PublishWeightsRequest* req,
                              v1::PublishWeightsResponse* resp) override;
  grpc::Status Save(grpc::ServerContext* ctx, const v1::SaveRequest* req,
                    v1::SaveResponse* resp) override;
  grpc::Status SaveState(grpc::ServerContext* ctx, const v1::SaveStateRequest* req,
                         v1::SaveStateResponse* resp) override;
  grpc::Status LoadState(grpc::ServerContext* ctx, const v1::LoadStateRequest* req,
                         v1::LoadStateResponse* resp) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  int64_t version() const { return version_.load(); }

 private:
  const CostModel cost_;
  std::function<void(const std::string&)> on_stop_;
  std::mutex mu_;  // one train step or publish at a time
  std::atomic<int64_t> version_{0};
};

}  // namespace gyre::sim
