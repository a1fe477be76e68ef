#pragma once
// RolloutService: the gRPC face of a rollout worker. Generate runs the engine on the groups it
// is given and labels every token with the policy version the worker holds; LoadWeights
// receives a new version from a trainer (see comm/weight_sync.h). A mutex serialises the two,
// so a weight update never lands in the middle of a generation.

#include <atomic>
#include <memory>
#include <mutex>

#include "comm/communicator.h"
#include "comm/weight_sync.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "model/transformer.h"
#include "rollout/engine.h"

namespace gyre::rollout {

class RolloutService final : public v1::Rollout::Service {
 public:
  RolloutService(std::unique_ptr<model::Transformer> model, int64_t max_batch,
                 std::function<void(const std::string&)> on_stop);

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override;
  grpc::Status LoadWeights(grpc::ServerContext* ctx, grpc::ServerReader<v1::WeightChunk>* reader,
                           v1::WeightReceipt* receipt) override;
  // Gloo transport: joins (or reuses) this worker's two-member group with the trainer, receives
  // one version, checks every bucket, then loads it under the model lock.
  grpc::Status ReceiveWeights(grpc::ServerContext* ctx, const v1::ReceiveWeightsRequest* req,
                              v1::WeightReceipt* receipt) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  int64_t version() const { return version_.load(); }

 private:
  std::mutex mu_;  // guards model_ and engine_ use
  std::unique_ptr<model::Transformer> model_;
  Engine engine_;
  std::atomic<int64_t> version_{-1};  // -1: no weights received yet
  std::function<void(const std::string&)> on_stop_;
  // Gloo weight plane; weights_mu_ serialises ReceiveWeights calls and guards these.
  std::mutex weights_mu_;
  std::string weight_group_;
  std::unique_ptr<comm::Communicator> weight_comm_;
  comm::WeightPayload weight_payload_;  // reused between versions
};

}  // namespace gyre::rollout
