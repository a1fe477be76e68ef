// RolloutScheduler over fake rollout workers: dispatch, re-queueing after a failure, bad
// requests, and partial rollouts carried across calls.

#include "controller/rollout_scheduler.h"

#include <gtest/gtest.h>

#include <set>

#include "common/file_util.h"
#include "fakes/fake_job.h"

namespace gyre::controller {
namespace {

using testing::FakeJob;
using testing::FakeJobConfig;

std::vector<GroupJob> MakeJobs(int count, int n, uint64_t first_gid = 0) {
  std::vector<GroupJob> jobs;
  for (int g = 0; g < count; ++g) {
    GroupJob j;
    const uint64_t gid = first_gid + static_cast<uint64_t>(g);
    j.group.set_group_id(gid);
    j.group.add_prompt_ids(1);
    j.group.add_prompt_ids(static_cast<int32_t>(gid));
    j.group.set_n(n);
    j.group.set_first_sample_id(gid * static_cast<uint64_t>(n));
    j.problem.prompt = "p" + std::to_string(gid);
    jobs.push_back(std::move(j));
  }
  return jobs;
}

std::set<uint64_t> GroupsSentTo(const testing::FakeRollout& r) {
  std::set<uint64_t> out;
  for (const auto& req : r.generate_calls()) {
    for (const auto& g : req.groups()) out.insert(g.group_id());
  }
  return out;
}

TEST(RolloutSchedulerTest, GroupsAreSpreadOverTheWorkersAndComeBackInJobOrder) {
  FakeJob job(FakeJobConfig(3, 1));
  ASSERT_TRUE(job.Start().ok());
  RolloutScheduler sched(job.cfg, job.pool.get());
  // Worker 0 is the slowest, so its answers arrive last; the result is still in job order.
  job.cluster.rollout[0]->generate_delay_s = 0.05;
  const auto jobs = MakeJobs(6, 2);
  GenerateStats stats;
  auto samples = sched.GenerateAll(jobs, v1::SamplingParams(), 0, &stats);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 12u);
  for (size_t i = 0; i < samples->size(); ++i) {
    EXPECT_EQ((*samples)[i].sample_id(), i);
    EXPECT_EQ((*samples)[i].group_id(), i / 2);
  }
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(GroupsSentTo(*job.cluster.rollout[w]).size(), 2u) << "rollout-" << w;
  }
  EXPECT_EQ(stats.generated_tokens, 12 * testing::kFakeResponseLen);
  // Each worker's time in Generate, for its busy fraction.
  ASSERT_EQ(stats.busy_s.size(), 3u);
  EXPECT_GE(stats.busy_s.at("rollout-0"), 0.05);
  EXPECT_LT(stats.busy_s.at("rollout-1"), stats.busy_s.at("rollout-0"));
}

TEST(RolloutSchedulerTest, AFailedWorkerIsDroppedAndItsGroupsRunOnTheOthers) {
  FakeJob job(FakeJobConfig(3, 1));
  ASSERT_TRUE(job.Start().ok());
  RolloutScheduler sched(job.cfg, job.pool.get());
  job.cluster.rollout[1]->on_generate = [](const v1::GenerateRequest&, v1::GenerateResponse*) {
    return Unavailable("Socket closed");
  };
  const auto jobs = MakeJobs(6, 2);
  GenerateStats stats;
  auto samples = sched.GenerateAll(jobs, v1::SamplingParams(), 0, &stats);
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(samples->size(), 12u);
  EXPECT_TRUE(job.pool->IsDead("rollout-1"));
  EXPECT_EQ(job.pool->AliveRollouts().size(), 2u);
  // rollout-1's two groups went to the survivors.
  EXPECT_EQ(
      GroupsSentTo(*job.cluster.rollout[0]).size() + GroupsSentTo(*job.cluster.rollout[2]).size(),
      6u);
}

TEST(RolloutSchedulerTest, ABadRequestFailsTheJobNamingTheWorker) {
  FakeJob job(FakeJobConfig(2, 1));
  ASSERT_TRUE(job.Start().ok());
  RolloutScheduler sched(job.cfg, job.pool.get());
  job.cluster.rollout[0]->on_generate = [](const v1::GenerateRequest&, v1::GenerateResponse*) {
    return InvalidArgument("prompt too long");
  };
  GenerateStats stats;
  auto samples = sched.GenerateAll(MakeJobs(2, 1), v1::SamplingParams(), 0, &stats);
  ASSERT_FALSE(samples.ok());
  EXPECT_EQ(samples.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(samples.status().message(), "generate on rollout-0: prompt too long");
  EXPECT_FALSE(job.pool->IsDead("rollout-0"));  // a bad request is not the worker's fault
}

TEST(RolloutSchedulerTest, NoWorkersLeftIsAnError) {
  JobConfig cfg = FakeJobConfig(1, 1);
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  RolloutScheduler sched(job.cfg, job.pool.get());
  job.cluster.rollout[0]->on_generate = [](const v1::GenerateRequest&, v1::GenerateResponse*) {
    return Unavailable("Socket closed");
  };
  GenerateStats stats;
  auto samples = sched.GenerateAll(MakeJobs(2, 1), v1::SamplingParams(), 0, &stats);
  ASSERT_FALSE(samples.ok());
  EXPECT_NE(samples.status().message().find("no rollout workers are left"), std::string::npos)
      << samples.status();
}

// A fake engine for partial rollouts: of the groups it is given, it finishes the first
// `target_finished_groups` and returns the others' samples unfinished with one token each.
Status PartialEngine(const v1::GenerateRequest& req, v1::GenerateResponse* resp) {
  int finished = 0;
  for (const auto& g : req.groups()) {
    const bool finish = finished < req.target_finished_groups();
    finished += finish;
    for (auto& s : testing::FakeSamples(g, 0)) {
      if (!finish) {
        s.mutable_response_ids()->Truncate(1);
        s.mutable_logprobs()->Truncate(1);
        s.mutable_versions()->Truncate(1);
        s.set_finish_reason(v1::FINISH_REASON_ABORT);
        *resp->add_unfinished() = std::move(s);
      } else {
        *resp->add_samples() = std::move(s);
      }
    }
  }
  for (const auto& r : req.resume()) *resp->add_samples() = r;  // resumed ones finish
  return Status::Ok();
}

TEST(RolloutSchedulerTest, PartialRolloutsCarryUnfinishedGroupsToTheWorkerThatHeldThem) {
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.rollout.partial_rollouts = true;
  cfg.rollout.prompts_per_step = 2;
  cfg.rollout.group_size = 2;
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  for (auto& r : job.cluster.rollout) r->on_generate = PartialEngine;
  RolloutScheduler sched(job.cfg, job.pool.get());
  auto jobs = MakeJobs(4, 2);
  GenerateStats stats;
  auto samples = sched.GeneratePartial(&jobs, 2, v1::SamplingParams(), 0, &stats);
  ASSERT_TRUE(samples.ok()) << samples.status();
  // Groups 0, 2 went to rollout-0 and 1, 3 to rollout-1; each finished one of its two.
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].group.group_id(), 0u);
  EXPECT_EQ(jobs[1].group.group_id(), 1u);
  EXPECT_EQ(samples->size(), 4u);
  EXPECT_EQ(sched.carried_groups(), 2u);
  EXPECT_EQ(stats.resumed_samples, 0);

  // Saved and restored (a checkpoint), the carried groups resume where their KV is.
  RolloutScheduler restored(job.cfg, job.pool.get());
  ASSERT_TRUE(restored.RestoreCarried(sched.SaveCarried(), nullptr).ok());
  ASSERT_EQ(restored.carried_groups(), 2u);
  std::vector<GroupJob> none;
  GenerateStats stats2;
  samples = restored.GeneratePartial(&none, 2, v1::SamplingParams(), 0, &stats2);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(none.size(), 2u);
  EXPECT_EQ(none[0].group.group_id(), 2u);
  EXPECT_EQ(none[1].group.group_id(), 3u);
  EXPECT_EQ(none[0].problem.prompt, "p2");
  EXPECT_EQ(samples->size(), 4u);
  EXPECT_EQ(stats2.resumed_samples, 4);
  EXPECT_EQ(restored.carried_groups(), 0u);
  const auto last0 = job.cluster.rollout[0]->generate_calls().back();
  ASSERT_EQ(last0.resume_size(), 2);
  EXPECT_EQ(last0.resume(0).group_id(), 2u);
  EXPECT_EQ(last0.resume(0).response_ids_size(), 1);  // its token came back with it
  const auto last1 = job.cluster.rollout[1]->generate_calls().back();
  ASSERT_EQ(last1.resume_size(), 2);
  EXPECT_EQ(last1.resume(0).group_id(), 3u);
}

TEST(RolloutSchedulerTest, TheLedgerFollowsEverySampleThroughAFailedWorker) {
  FakeJob job(FakeJobConfig(2, 1));
  ASSERT_TRUE(job.Start().ok());
  const std::string path = job.logs_dir + "/ledger.db";
  (void)RemoveTree(path);
  auto ledger = SampleLedger::Open(path, true);
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  const auto jobs = MakeJobs(4, 2);
  std::vector<NewSample> queued;
  for (const auto& j : jobs) {
    for (int i = 0; i < 2; ++i) {
      queued.push_back({j.group.first_sample_id() + static_cast<uint64_t>(i), j.group.group_id(),
                        j.problem.prompt});
    }
  }
  ASSERT_TRUE((*ledger)->Add(queued, {1, 0, "", ""}).ok());
  job.cluster.rollout[0]->on_generate = [](const v1::GenerateRequest&, v1::GenerateResponse*) {
    return Unavailable("Socket closed");
  };
  RolloutScheduler sched(job.cfg, job.pool.get());
  const LedgerSink sink{ledger->get(), 1, 0};
  GenerateStats stats;
  auto samples = sched.GenerateAll(jobs, v1::SamplingParams(), 0, &stats, &sink);
  ASSERT_TRUE(samples.ok()) << samples.status();
  auto counts = (*ledger)->Counts();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->of(SampleState::kFinished), 8);
  // Sample 0 (group 0) went to rollout-0, failed there, went back to the queue, then finished
  // on rollout-1.
  auto h = (*ledger)->History(0);
  ASSERT_TRUE(h.ok());
  std::vector<std::string> moves;
  for (const auto& e : *h) {
    moves.push_back(std::string(SampleStateName(e.to)) + "@" + e.context.worker);
  }
  EXPECT_EQ(moves, (std::vector<std::string>{"queued@", "generating@rollout-0", "queued@rollout-0",
                                             "generating@rollout-1", "finished@rollout-1"}));
  EXPECT_EQ((*h)[2].context.reason, "generate failed: Socket closed");
  // Evaluation (no sink) leaves the ledger alone.
  const auto before = (*ledger)->LastSequence();
  ASSERT_TRUE(sched.GenerateAll(MakeJobs(1, 1, 100), v1::SamplingParams(), 0, &stats).ok());
  EXPECT_EQ(*(*ledger)->LastSequence(), *before);
}

}  // namespace
}  // namespace gyre::controller
