#include "rpc/clients.h"

#include "gyre/v1/gyre.grpc.pb.h"
#include "rpc/rpc_util.h"

namespace gyre::rpc {

void Cancellation::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (hook_) hook_();
}

bool Cancellation::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void Cancellation::SetHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = std::move(hook);
  if (cancelled_ && hook_) hook_();
}

void Cancellation::ClearHook() {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = nullptr;
}

namespace {

// Runs one unary gRPC call with the Call's deadline, cancellable through its Cancellation.
template <typename Fn>
Status Unary(const Call& call, Fn&& fn) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, call.timeout_s);
  if (call.cancel) call.cancel->SetHook([&ctx] { ctx.TryCancel(); });
  grpc::Status s = fn(&ctx);
  if (call.cancel) call.cancel->ClearHook();
  return FromGrpc(s);
}

class GrpcRolloutClient final : public RolloutClient {
 public:
  explicit GrpcRolloutClient(const std::string& address)
      : stub_(v1::Rollout::NewStub(MakeChannel(address))) {}

  Status Generate(const Call& call, const v1::GenerateRequest& req,
                  v1::GenerateResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->Generate(ctx, req, resp); });
  }
  Status GenerateStream(const Call& call, const v1::GenerateRequest& req,
                        const std::function<void(v1::GenerateResponse&)>& on_part) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, call.timeout_s);
    if (call.cancel) call.cancel->SetHook([&ctx] { ctx.TryCancel(); });
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->GenerateStream(&ctx, req);
    v1::GenerateResponse part;
    while (reader->Read(&part)) {
      on_part(part);
      part.Clear();
    }
    grpc::Status s = reader->Finish();
    if (call.cancel) call.cancel->ClearHook();
    return FromGrpc(s);
  }
  Status ReceiveWeights(const Call& call, const v1::ReceiveWeightsRequest& req,
                        v1::WeightReceipt* receipt) override {
    return Unary(
        call, [&](grpc::ClientContext* ctx) { return stub_->ReceiveWeights(ctx, req, receipt); });
  }
  Status RelayWeights(const Call& call, const v1::RelayWeightsRequest& req,
                      v1::PublishWeightsResponse* resp) override {
    return Unary(call,
                 [&](grpc::ClientContext* ctx) { return stub_->RelayWeights(ctx, req, resp); });
  }
  Status Preempt(const Call& call, const v1::PreemptRequest& req,
                 v1::PreemptResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->Preempt(ctx, req, resp); });
  }
  Status Stop(const Call& call, const v1::StopRequest& req) override {
    v1::StopResponse resp;
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->Stop(ctx, req, &resp); });
  }

 private:
  std::unique_ptr<v1::Rollout::Stub> stub_;
};

class GrpcTrainerClient final : public TrainerClient {
 public:
  explicit GrpcTrainerClient(const std::string& address)
      : stub_(v1::Trainer::NewStub(MakeChannel(address))) {}

  Status HostGroupStore(const Call& call, v1::HostGroupStoreResponse* resp) override {
    v1::HostGroupStoreRequest req;
    return Unary(call,
                 [&](grpc::ClientContext* ctx) { return stub_->HostGroupStore(ctx, req, resp); });
  }
  Status JoinGroup(const Call& call, const v1::JoinGroupRequest& req,
                   v1::JoinGroupResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->JoinGroup(ctx, req, resp); });
  }
  Status TrainStep(const Call& call, const v1::TrainStepRequest& req,
                   v1::TrainStepResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->TrainStep(ctx, req, resp); });
  }
  Status SequenceKl(const Call& call, const v1::SequenceKlRequest& req,
                    v1::SequenceKlResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->SequenceKl(ctx, req, resp); });
  }
  Status PublishWeights(const Call& call, const v1::PublishWeightsRequest& req,
                        v1::PublishWeightsResponse* resp) override {
    return Unary(call,
                 [&](grpc::ClientContext* ctx) { return stub_->PublishWeights(ctx, req, resp); });
  }
  Status AbortWeightTransfer(const Call& call, const v1::AbortWeightTransferRequest& req,
                             v1::AbortWeightTransferResponse* resp) override {
    return Unary(
        call, [&](grpc::ClientContext* ctx) { return stub_->AbortWeightTransfer(ctx, req, resp); });
  }
  Status Save(const Call& call, const v1::SaveRequest& req, v1::SaveResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->Save(ctx, req, resp); });
  }
  Status SaveState(const Call& call, const v1::SaveStateRequest& req,
                   v1::SaveStateResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->SaveState(ctx, req, resp); });
  }
  Status LoadState(const Call& call, const v1::LoadStateRequest& req,
                   v1::LoadStateResponse* resp) override {
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->LoadState(ctx, req, resp); });
  }
  Status Stop(const Call& call, const v1::StopRequest& req) override {
    v1::StopResponse resp;
    return Unary(call, [&](grpc::ClientContext* ctx) { return stub_->Stop(ctx, req, &resp); });
  }

 private:
  std::unique_ptr<v1::Trainer::Stub> stub_;
};

}  // namespace

std::unique_ptr<RolloutClient> MakeGrpcRolloutClient(const std::string& address) {
  return std::make_unique<GrpcRolloutClient>(address);
}

std::unique_ptr<TrainerClient> MakeGrpcTrainerClient(const std::string& address) {
  return std::make_unique<GrpcTrainerClient>(address);
}

ClientFactory GrpcClientFactory() { return {MakeGrpcRolloutClient, MakeGrpcTrainerClient}; }

}  // namespace gyre::rpc
