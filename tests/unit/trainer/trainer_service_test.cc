// TrainerService's directory-taking handlers (Save, SaveState, LoadState) called directly, as the
// gRPC server would: a request without a directory is refused and touches nothing, and a state
// saved by SaveState loads back.
#include "trainer/trainer_service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/file_util.h"
#include "testing/tiny_model.h"

namespace gyre::trainer {
namespace {

JobConfig Config() {
  JobConfig c;
  c.trainer.micro_batch_size = 4;
  c.cluster.bind_host = "127.0.0.1";
  return c;
}

std::unique_ptr<TrainerService> MakeService() {
  auto service = TrainerService::Create(
      Config(), model::Transformer::Create(testing::TinySpec(24, 32, 1, 4, 2, 48), 3, 0.1),
      [](const std::string&) {});
  EXPECT_TRUE(service.ok()) << service.status().ToString();
  return std::move(*service);
}

class TrainerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDirectory() + "/gyre_trainer_service_" + std::to_string(::getpid());
    ASSERT_TRUE(RemoveTree(dir_).ok());
    ASSERT_TRUE(MakeDirs(dir_).ok());
  }
  void TearDown() override { EXPECT_TRUE(RemoveTree(dir_).ok()); }
  std::string dir_;
};

// Seen while adding Save to fuzz_trainer_rpc (docs/reliability.md): Save with an empty directory
// removed the working directory's ".tmp", wrote the model there, and renamed it to "" (which
// failed).
TEST_F(TrainerServiceTest, HandlersWithoutADirectoryAreRefusedAndTouchNothing) {
  auto service = MakeService();
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir(dir_.c_str()), 0);
  ASSERT_TRUE(MakeDirs(".tmp").ok());
  ASSERT_TRUE(WriteFileAtomic(".tmp/keep", "mine").ok());
  grpc::ServerContext ctx;
  v1::SaveRequest save;
  v1::SaveResponse save_resp;
  const grpc::Status s1 = service->Save(&ctx, &save, &save_resp);
  v1::SaveStateRequest save_state;
  v1::SaveStateResponse save_state_resp;
  const grpc::Status s2 = service->SaveState(&ctx, &save_state, &save_state_resp);
  v1::LoadStateRequest load;
  v1::LoadStateResponse load_resp;
  const grpc::Status s3 = service->LoadState(&ctx, &load, &load_resp);
  const auto kept = ReadFileToString(".tmp/keep");
  const auto listing = ListDirectory(".");
  ASSERT_EQ(::chdir(cwd), 0);
  EXPECT_EQ(s1.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s1.error_message(), "Save needs a directory");
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s3.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s3.error_message(), "LoadState needs a directory");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "mine");
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(*listing, std::vector<std::string>{".tmp"});
}

TEST_F(TrainerServiceTest, SavedStateLoadsBackAndAMissingOneIsAnError) {
  auto service = MakeService();
  grpc::ServerContext ctx;
  v1::SaveStateRequest save;
  save.set_directory(dir_ + "/state");
  v1::SaveStateResponse save_resp;
  ASSERT_TRUE(service->SaveState(&ctx, &save, &save_resp).ok());
  v1::LoadStateRequest load;
  load.set_directory(dir_ + "/state");
  v1::LoadStateResponse load_resp;
  const grpc::Status ok = service->LoadState(&ctx, &load, &load_resp);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(load_resp.policy_version(), save_resp.policy_version());
  load.set_directory(dir_ + "/missing");
  const grpc::Status missing = service->LoadState(&ctx, &load, &load_resp);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.error_message().find(dir_ + "/missing"), std::string::npos)
      << missing.error_message();
  v1::SaveRequest model;
  model.set_directory(dir_ + "/model");
  v1::SaveResponse model_resp;
  ASSERT_TRUE(service->Save(&ctx, &model, &model_resp).ok());
  EXPECT_EQ(model_resp.path(), dir_ + "/model");
  EXPECT_TRUE(PathExists(dir_ + "/model/config.json"));
  EXPECT_FALSE(PathExists(dir_ + "/model.tmp"));
}

// SequenceKl (algorithm.kl_in: reward): one KL per sample, 0 at the first call (it freezes the
// reference); a wrong version, an unknown estimator or a malformed sample is refused by name.
TEST_F(TrainerServiceTest, SequenceKlAnswersPerSampleAndRefusesBadRequests) {
  auto service = MakeService();
  grpc::ServerContext ctx;
  v1::SequenceKlRequest req;
  req.set_estimator("k2");
  req.set_temperature(1.0f);
  for (int i = 0; i < 3; ++i) {
    v1::Sample* s = req.add_samples();
    for (int32_t id : {1, 3 + i, 5}) s->add_prompt_ids(id);
    for (int t = 0; t < 2 + i; ++t) s->add_response_ids(7 + i);
  }
  v1::SequenceKlResponse resp;
  ASSERT_TRUE(service->SequenceKl(&ctx, &req, &resp).ok());
  EXPECT_EQ(std::vector<double>(resp.kl().begin(), resp.kl().end()), std::vector<double>(3, 0.0));

  v1::SequenceKlRequest stale = req;
  stale.set_expected_version(4);
  v1::SequenceKlResponse r2;
  grpc::Status st = service->SequenceKl(&ctx, &stale, &r2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(st.error_message(), "KL requested for policy version 4, trainer holds 0");

  v1::SequenceKlRequest bad_estimator = req;
  bad_estimator.set_estimator("none");
  st = service->SequenceKl(&ctx, &bad_estimator, &r2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "SequenceKl: estimator 'none' is not k1, k2 or k3");

  v1::SequenceKlRequest out_of_range = req;
  out_of_range.mutable_samples(1)->set_response_ids(0, 999);
  st = service->SequenceKl(&ctx, &out_of_range, &r2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_EQ(r2.kl_size(), 0);
}

}  // namespace
// The step settings are built once from the job; a name the registry does not know is an error
// naming its key, never a silent default.
TEST(TrainOptionsFromJobTest, ResolvesTheJobsNamesOnceAndRefusesUnknownOnes) {
  JobConfig c = Config();
  c.algorithm.policy_loss = "gmpo";
  c.algorithm.loss_agg = "seq-mean-token-mean";
  c.algorithm.correction = "icepop";
  c.algorithm.kl = "k3";
  c.algorithm.kl_in = "loss";
  auto opts = TrainOptionsFromJob(c);
  ASSERT_TRUE(opts.ok()) << opts.status().ToString();
  EXPECT_EQ(opts->loss.kind, kernels::PolicyLossKind::kGmpo);
  EXPECT_EQ(opts->loss.agg, kernels::LossAgg::kSeqMeanTokenMean);
  EXPECT_EQ(opts->loss.correction, kernels::Correction::kIcePop);
  EXPECT_EQ(opts->loss.kl, kernels::KlKind::kK3);
  EXPECT_EQ(opts->micro_batch_size, 4);

  const struct {
    const char* key;
    void (*set)(JobConfig*);
  } bad[] = {
      {"algorithm.policy_loss", [](JobConfig* j) { j->algorithm.policy_loss = "gpmo"; }},
      {"algorithm.loss_agg", [](JobConfig* j) { j->algorithm.loss_agg = "token_mean"; }},
      {"algorithm.correction", [](JobConfig* j) { j->algorithm.correction = "TIS"; }},
      {"algorithm.kl", [](JobConfig* j) { j->algorithm.kl = "k4"; }},
      {"algorithm.proximal", [](JobConfig* j) { j->algorithm.proximal = "fresh"; }},
  };
  for (const auto& b : bad) {
    JobConfig j = Config();
    b.set(&j);
    auto refused = TrainOptionsFromJob(j);
    ASSERT_FALSE(refused.ok()) << b.key;
    EXPECT_NE(refused.status().message().find(b.key), std::string::npos)
        << refused.status().message();
    auto service = TrainerService::Create(
        j, model::Transformer::Create(testing::TinySpec(24, 32, 1, 4, 2, 48), 3, 0.1),
        [](const std::string&) {});
    EXPECT_FALSE(service.ok()) << b.key;
  }
}

}  // namespace gyre::trainer
