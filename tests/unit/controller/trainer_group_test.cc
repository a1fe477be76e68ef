// TrainerGroup over fake trainers: group formation, sharding of a batch over the ranks, the
// version check, state save and load.

#include "controller/trainer_group.h"

#include <gtest/gtest.h>

#include <set>

#include "fakes/fake_job.h"

namespace gyre::controller {
namespace {

using testing::FakeJob;
using testing::FakeJobConfig;

std::vector<v1::Sample> Batch(int count) {
  std::vector<v1::Sample> out;
  for (int i = 0; i < count; ++i) {
    v1::Sample s;
    s.set_sample_id(static_cast<uint64_t>(i));
    s.add_prompt_ids(1);
    for (int t = 0; t <= i % 4; ++t) s.add_response_ids(t);
    out.push_back(std::move(s));
  }
  return out;
}

TEST(TrainerGroupTest, FormingTheGroupJoinsEveryRankUnderANewName) {
  FakeJob job(FakeJobConfig(1, 3));
  ASSERT_TRUE(job.Start().ok());
  TrainerGroup group(job.cfg, job.pool.get());
  ASSERT_TRUE(group.Form().ok());
  ASSERT_TRUE(group.Form().ok());
  for (int r = 0; r < 3; ++r) {
    const auto joins = job.cluster.trainer[r]->join_calls();
    ASSERT_EQ(joins.size(), 2u);
    EXPECT_EQ(joins[0].group(), "trainers-1");
    EXPECT_EQ(joins[1].group(), "trainers-2");
    EXPECT_EQ(joins[0].rank(), r);
    EXPECT_EQ(joins[0].size(), 3);
    EXPECT_EQ(joins[0].store_address(), "127.0.0.1:1");  // what trainer-0 hosts
  }
}

TEST(TrainerGroupTest, OneTrainerNeedsNoGroupAndGetsTheWholeBatch) {
  FakeJob job(FakeJobConfig(1, 1));
  ASSERT_TRUE(job.Start().ok());
  TrainerGroup group(job.cfg, job.pool.get());
  ASSERT_TRUE(group.Form().ok());
  EXPECT_TRUE(job.cluster.trainer[0]->join_calls().empty());
  TrainOptions opts;
  opts.lr = 0.01;
  opts.temperature = 0.7;
  opts.reset_optimizer = true;
  int64_t version = -1;
  auto m = group.Train(Batch(5), 3, opts, &version);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(version, 4);
  EXPECT_DOUBLE_EQ(m->at("loss"), 0.5);
  const auto calls = job.cluster.trainer[0]->train_calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].samples_size(), 5);
  EXPECT_EQ(calls[0].expected_version(), 3);
  EXPECT_FLOAT_EQ(calls[0].lr(), 0.01f);
  EXPECT_FLOAT_EQ(calls[0].temperature(), 0.7f);
  EXPECT_TRUE(calls[0].reset_optimizer_state());
  EXPECT_EQ(calls[0].mini_batch_sizes_size(), 0);
}

TEST(TrainerGroupTest, TheRanksShareEverySampleOnceInTheSameMiniBatches) {
  JobConfig cfg = FakeJobConfig(1, 2);
  cfg.trainer.mini_batches = 2;
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  TrainerGroup group(job.cfg, job.pool.get());
  int64_t version = -1;
  ASSERT_TRUE(group.Train(Batch(8), 0, TrainOptions(), &version).ok());
  EXPECT_EQ(version, 1);
  std::multiset<uint64_t> seen;
  for (int r = 0; r < 2; ++r) {
    const auto calls = job.cluster.trainer[r]->train_calls();
    ASSERT_EQ(calls.size(), 1u);
    ASSERT_EQ(calls[0].mini_batch_sizes_size(), 2) << "rank " << r;
    int sum = 0;
    for (int n : calls[0].mini_batch_sizes()) sum += n;
    EXPECT_EQ(sum, calls[0].samples_size());
    for (const auto& s : calls[0].samples()) seen.insert(s.sample_id());
  }
  EXPECT_EQ(seen, (std::multiset<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(TrainerGroupTest, RanksThatDisagreeOnTheVersionAreAnError) {
  FakeJob job(FakeJobConfig(1, 2));
  ASSERT_TRUE(job.Start().ok());
  job.cluster.trainer[1]->on_train_step = [](const v1::TrainStepRequest& req,
                                             v1::TrainStepResponse* resp) {
    resp->set_policy_version(req.expected_version() + 2);
    return Status::Ok();
  };
  TrainerGroup group(job.cfg, job.pool.get());
  int64_t version = 9;
  auto m = group.Train(Batch(4), 0, TrainOptions(), &version);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            "data-parallel trainers disagree on the policy version: trainer-0 has 1, trainer-1 "
            "has 2");
  EXPECT_EQ(version, 9);  // unchanged
}

TEST(TrainerGroupTest, AFailedRankIsNamed) {
  FakeJob job(FakeJobConfig(1, 2));
  ASSERT_TRUE(job.Start().ok());
  job.cluster.trainer[1]->on_train_step = [](const v1::TrainStepRequest&, v1::TrainStepResponse*) {
    return InvalidArgument("sample 3: logprobs length 2 != response length 3");
  };
  TrainerGroup group(job.cfg, job.pool.get());
  int64_t version = 0;
  auto m = group.Train(Batch(4), 0, TrainOptions(), &version);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            "train step on trainer-1: sample 3: logprobs length 2 != response length 3");
}

TEST(TrainerGroupTest, LoadStateNeedsEveryRankAtTheSameVersion) {
  FakeJob job(FakeJobConfig(1, 2));
  ASSERT_TRUE(job.Start().ok());
  TrainerGroup group(job.cfg, job.pool.get());
  job.cluster.trainer[0]->saved_version = 5;
  job.cluster.trainer[1]->saved_version = 5;
  auto v = group.LoadState("/ckpt/trainer");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 5);
  auto saved = group.SaveState("/ckpt2/trainer");
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(*saved, 5);
  job.cluster.trainer[1]->saved_version = 4;
  v = group.LoadState("/ckpt/trainer");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message(), "/ckpt/trainer: trainer-1 loaded policy version 4, trainer-0 5");
}

}  // namespace
}  // namespace gyre::controller
