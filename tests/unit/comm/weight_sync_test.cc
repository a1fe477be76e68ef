#include "comm/weight_sync.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/transformer.h"
#include "rollout/rollout_service.h"
#include "rpc/rpc_util.h"
#include "testing/tiny_model.h"

namespace gyre::comm {
namespace {

model::ModelSpec Spec() { return testing::TinySpec(40, 32, 2, 4, 2, 64); }

// A real rollout service on a loopback port receiving weights from a real client.
class WeightSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<rollout::RolloutService>(model::Transformer::Create(Spec(), 5, 0.1),
                                                         8, nullptr);
    auto server = rpc::StartServer("127.0.0.1", 0, {service_.get()}, &address_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Rollout::NewStub(rpc::MakeChannel(address_));
    source_ = model::Transformer::Create(Spec(), 77, 0.1);
    payload_.version = 3;
    payload_.bytes = model::FlattenParameters(source_->NamedParameters(), &payload_.manifest);
  }
  void TearDown() override { server_->Shutdown(); }

  // Greedy generation on the receiving worker; equal outputs mean equal weights in use.
  std::vector<int32_t> Generate() {
    v1::GenerateRequest req;
    auto* g = req.add_groups();
    for (int32_t id : {1, 5, 9, 12}) g->add_prompt_ids(id);
    g->set_n(1);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_new_tokens(6);
    req.set_min_policy_version(-1);  // also before any weights arrived
    v1::GenerateResponse resp;
    grpc::ClientContext ctx;
    rpc::SetDeadline(&ctx, 10);
    EXPECT_TRUE(stub_->Generate(&ctx, req, &resp).ok());
    version_seen_ = resp.policy_version();
    return {resp.samples(0).response_ids().begin(), resp.samples(0).response_ids().end()};
  }

  std::unique_ptr<rollout::RolloutService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<v1::Rollout::Stub> stub_;
  std::unique_ptr<model::Transformer> source_;
  WeightPayload payload_;
  int64_t version_seen_ = -2;
};

TEST_F(WeightSyncTest, BucketedTransferLoadsExactWeightsAndReturnsReceipt) {
  const int64_t bucket = 4096;  // many buckets
  auto r = SendWeights(stub_.get(), payload_, bucket, 10.0);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t expect_buckets = (payload_.bytes.size() + bucket - 1) / bucket;
  EXPECT_EQ(r->sent_crc32.size(), expect_buckets);
  EXPECT_EQ(r->receipt.version(), 3);
  EXPECT_EQ(r->receipt.bytes(), payload_.bytes.size());
  EXPECT_EQ(service_->version(), 3);
  // The receiver now generates exactly what a model holding the sender's weights generates.
  auto reference = model::Transformer::Create(Spec(), 77, 0.1);
  std::vector<int32_t> want;
  {
    rollout::Engine engine(reference.get(), 1);
    rollout::GenerationRequest g;
    g.prompt = {1, 5, 9, 12};
    g.temperature = 0;
    g.max_new_tokens = 6;
    auto out = engine.Generate({g});
    ASSERT_TRUE(out.ok());
    want = (*out)[0].tokens;
  }
  EXPECT_EQ(Generate(), want);
  EXPECT_EQ(version_seen_, 3);
}

TEST_F(WeightSyncTest, CorruptedBucketIsCaughtAndNothingIsLoaded) {
  const auto before = Generate();
  auto r = SendWeights(stub_.get(), payload_, 4096, 10.0, /*corrupt_bucket=*/2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("bucket 2"), std::string::npos) << r.status();
  EXPECT_EQ(service_->version(), -1);
  EXPECT_EQ(Generate(), before);
}

TEST_F(WeightSyncTest, WrongShapesAreRejectedWithTheTensorName) {
  auto other = model::Transformer::Create(
      [] {
        auto s = Spec();
        s.intermediate_size = 48;
        return s;
      }(),
      1, 0.1);
  WeightPayload p;
  p.version = 9;
  p.bytes = model::FlattenParameters(other->NamedParameters(), &p.manifest);
  auto r = SendWeights(stub_.get(), p, 1 << 20, 10.0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("mlp.gate_proj.weight"), std::string::npos) << r.status();
  EXPECT_EQ(service_->version(), -1);
}

TEST_F(WeightSyncTest, UnreachableReceiverFailsWithinTheDeadline) {
  auto port = rpc::PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok());
  auto dead = v1::Rollout::NewStub(rpc::MakeChannel("127.0.0.1:" + std::to_string(*port)));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = SendWeights(dead.get(), payload_, 4096, 1.0);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

}  // namespace
}  // namespace gyre::comm
