#pragma once
// TrainerService: the gRPC face of a trainer worker. TrainStep runs one optimizer step on the
// batch the controller sends; PublishWeights streams the current policy version to every
// rollout worker named in the request, concurrently and each within its deadline (gRPC streams;
// with transport "gloo" or "nccl" one two-member group per rollout worker; with "cuda_ipc" it
// fills a device buffer whose IPC handle the controller hands to colocated rollout workers); Save
// writes an HF-style directory (config.json + model.safetensors); SaveState / LoadState write and
// restore the resumable state of a checkpoint. With trainer.workers > 1 the controller forms a Gloo
// group of the trainers (HostGroupStore, JoinGroup) and each TrainStep carries one rank's shard.
// Calls are serialised by a mutex.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.h"
#include "comm/device_weights.h"
#include "comm/gloo_communicator.h"
#include "comm/weight_broadcast.h"
#include "comm/weight_sender.h"
#include "comm/weight_sync.h"
#include "gyre/config.h"
#include "gyre/v1/gyre.grpc.pb.h"
#include "trainer/policy_trainer.h"

namespace gyre::trainer {

// The step settings a job gives every TrainStep (trainer.micro_batch_size, mini_batches,
// grad_clip; algorithm.*: the policy loss, aggregation, correction, KL, proximal policy, ...),
// built once when the trainer reads the job. The names resolve through the algorithm registry
// (a policy loss the program registered through include_torch/gyre/torch.h becomes user_loss);
// InvalidArgument naming the key for one it does not know.
StatusOr<TrainOptions> TrainOptionsFromJob(const JobConfig& config);

class TrainerService final : public v1::Trainer::Service {
 public:
  // Fails (InvalidArgument) when the job's step settings do not resolve (TrainOptionsFromJob).
  static StatusOr<std::unique_ptr<TrainerService>> Create(
      const JobConfig& config, std::unique_ptr<model::Transformer> model,
      std::function<void(const std::string&)> on_stop);

  TrainerService(const JobConfig& config, TrainOptions step_options,
                 std::unique_ptr<model::Transformer> model,
                 std::function<void(const std::string&)> on_stop);

  // Data-parallel rendezvous (see gyre.proto): rank 0 hosts the store, every rank joins.
  grpc::Status HostGroupStore(grpc::ServerContext* ctx, const v1::HostGroupStoreRequest* req,
                              v1::HostGroupStoreResponse* resp) override;
  grpc::Status JoinGroup(grpc::ServerContext* ctx, const v1::JoinGroupRequest* req,
                         v1::JoinGroupResponse* resp) override;
  grpc::Status TrainStep(grpc::ServerContext* ctx, const v1::TrainStepRequest* req,
                         v1::TrainStepResponse* resp) override;
  grpc::Status SequenceKl(grpc::ServerContext* ctx, const v1::SequenceKlRequest* req,
                          v1::SequenceKlResponse* resp) override;
  grpc::Status PublishWeights(grpc::ServerContext* ctx, const v1::PublishWeightsRequest* req,
                              v1::PublishWeightsResponse* resp) override;
  // Ends a publish's transfers to receivers that failed or died (WeightSender::AbortReceivers);
  // runs beside the PublishWeights call it ends.
  grpc::Status AbortWeightTransfer(grpc::ServerContext* ctx,
                                   const v1::AbortWeightTransferRequest* req,
                                   v1::AbortWeightTransferResponse* resp) override;
  grpc::Status Save(grpc::ServerContext* ctx, const v1::SaveRequest* req,
                    v1::SaveResponse* resp) override;
  // The full resumable state into / from a directory the controller names (trainer_state.h).
  grpc::Status SaveState(grpc::ServerContext* ctx, const v1::SaveStateRequest* req,
                         v1::SaveStateResponse* resp) override;
  grpc::Status LoadState(grpc::ServerContext* ctx, const v1::LoadStateRequest* req,
                         v1::LoadStateResponse* resp) override;
  grpc::Status Stop(grpc::ServerContext* ctx, const v1::StopRequest* req,
                    v1::StopResponse* resp) override;

  // The policy version; callable while a call holds the service (then the last one seen).
  int64_t version() const;

 private:
  // nccl and cuda_ipc: the current version into the sender's staging buffer (under mu_).
  // PublishWeights of a trainer whose parameters are split (trainer.shard: parameters or
  // trainer.tensor_parallel): every rank gathers the model a bucket at a time; trainer-0 streams
  // each piece to the receivers as it comes (comm::PayloadStream, bounded to one bucket), so no
  // rank holds a whole unit, let alone the version. Holds mu_ throughout.
  Status PublishFromSlices(const v1::PublishWeightsRequest& req, const std::string& transport,
                           v1::PublishWeightsResponse* resp);
  Status FlattenToDevice(double timeout, comm::DevicePayload* payload);
  // JoinGroup's group: NCCL for a model on a GPU (in a build with NCCL), Gloo otherwise. Blocks
  // until every rank joined or `timeout_s` passed; reads only the model's device (fixed), so it
  // runs without mu_.
  StatusOr<std::unique_ptr<comm::Communicator>> FormGroup(const v1::JoinGroupRequest& req,
                                                          double timeout_s);

  JobConfig config_;
  const TrainOptions step_options_;    // TrainOptionsFromJob(config_)
  at::ScalarType dtype_ = at::kFloat;  // model.dtype: compute and published weights
  mutable std::mutex mu_;
  PolicyTrainer trainer_;                         // guarded by mu_
  mutable std::atomic<int64_t> last_version_{0};  // trainer_.version() when last read
  std::unique_ptr<comm::StoreServer> store_;      // rank 0 of a data-parallel group
  std::unique_ptr<comm::Communicator> group_;     // guarded by mu_
  std::unique_ptr<comm::Communicator> tp_group_;  // tensor parallel; guarded by mu_
  std::function<void(const std::string&)> on_stop_;
  // The sending side of publishes: its weight groups and device staging buffer are kept between
  // versions. weights_mu_ serialises publishes.
  std::mutex weights_mu_;
  comm::WeightSender sender_;    // guarded by weights_mu_, but for AbortReceivers (any thread)
  bool logged_publish_ = false;  // guarded by mu_
};

}  // namespace gyre::trainer
