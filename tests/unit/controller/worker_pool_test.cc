// WorkerPool: real child processes (a shell script standing in for `gyre worker`) and fake
// clients. Deaths by signal and by silence, on_worker_failure, cancellation of a dead worker's
// calls, restarts and catch-up.

#include "controller/worker_pool.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "common/file_util.h"
#include "controller/controller_service.h"
#include "fakes/fake_job.h"

namespace gyre::controller {
namespace {

using testing::FakeCluster;
using testing::FakeJob;
using testing::FakeJobConfig;

// An executable that ignores its arguments and lives until killed. ctest runs these tests as
// parallel processes: each writes its own copy (named by pid) and renames it into place, so no
// test ever execs a script another one is rewriting (an empty script exits at once).
std::string SleeperBinary() {
  const std::string path =
      ::testing::TempDir() + "/gyre_fake_worker." + std::to_string(getpid()) + ".sh";
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << "#!/bin/sh\nexec sleep 600\n";
  chmod(tmp.c_str(), 0755);
  std::rename(tmp.c_str(), path.c_str());
  return path;
}

template <typename Cond>
bool WaitUntil(Cond cond, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!cond()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

JobConfig LocalConfig(int rollouts, int trainers) {
  JobConfig cfg = FakeJobConfig(rollouts, trainers);
  cfg.cluster.mode = "local";
  return cfg;
}

WorkerPoolOptions LocalOptions() {
  WorkerPoolOptions o;
  o.worker_binary = SleeperBinary();
  o.controller_address = "127.0.0.1:1";
  return o;
}

TEST(WorkerPoolTest, ExternalWorkersGetClientsOnceRegistered) {
  FakeJob job(FakeJobConfig(3, 2));
  ASSERT_TRUE(job.Start().ok());
  ASSERT_EQ(job.pool->AliveRollouts().size(), 3u);
  ASSERT_EQ(job.pool->Trainers().size(), 2u);
  EXPECT_EQ(job.pool->Trainers()[1]->id, "trainer-1");
  for (Worker* w : job.pool->AliveRollouts()) {
    ASSERT_NE(w->rollout, nullptr);
    EXPECT_EQ(w->address, "fake-" + w->id + ":1");
  }
  EXPECT_TRUE(job.pool->CheckHealth().ok());
  job.Stop();
  for (const auto& r : job.cluster.rollout) EXPECT_EQ(r->stops(), 1);  // asked to stop once
}

TEST(WorkerPoolTest, AKilledRolloutWorkerIsNamedWithItsSignalAndTheJobContinues) {
  FakeJob job(LocalConfig(2, 1));
  ASSERT_TRUE(job.Start(LocalOptions()).ok());
  Worker* w = job.pool->Get("rollout-1");
  const pid_t pid = w->pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(job.pool->WaitForDeath("rollout-1", 10));
  EXPECT_TRUE(job.pool->CheckHealth().ok());  // on_worker_failure: continue
  ASSERT_EQ(job.pool->AliveRollouts().size(), 1u);
  EXPECT_EQ(job.pool->AliveRollouts()[0]->id, "rollout-0");
  const auto info = job.service.Snapshot();
  for (const auto& i : info) {
    if (i.id == "rollout-1") {
      EXPECT_FALSE(i.alive);
      EXPECT_EQ(i.death, "pid " + std::to_string(pid) + " killed by signal 9 (Killed)");
    }
  }
}

TEST(WorkerPoolTest, ADeathFailsTheJobWhenConfiguredTo) {
  JobConfig cfg = LocalConfig(2, 1);
  cfg.cluster.on_worker_failure = "fail";
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start(LocalOptions()).ok());
  const pid_t pid = job.pool->Get("rollout-0")->pid;
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(job.pool->WaitForDeath("rollout-0", 10));
  Status s = job.pool->CheckHealth();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(
      s.message().find("worker rollout-0 died: pid " + std::to_string(pid) + " killed by signal 9"),
      std::string::npos)
      << s;
}

TEST(WorkerPoolTest, ADeadTrainerAlwaysEndsTheJob) {
  FakeJob job(LocalConfig(1, 2));
  ASSERT_TRUE(job.Start(LocalOptions()).ok());
  ASSERT_EQ(kill(job.pool->Get("trainer-1")->pid, SIGKILL), 0);
  ASSERT_TRUE(job.pool->WaitForDeath("trainer-1", 10));
  Status s = job.pool->CheckHealth();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("worker trainer-1 died"), std::string::npos) << s;
}

TEST(WorkerPoolTest, ASilentWorkerIsDeclaredDeadAndItsCallsAreCancelled) {
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.cluster.heartbeat_timeout_s = 0.5;
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start().ok());
  job.cluster.rollout[1]->generate_delay_s = 30;
  Worker* w = job.pool->Get("rollout-1");
  auto call = std::async(std::launch::async, [&] {
    v1::GenerateResponse resp;
    return job.pool->Invoke(w->id, 60, [&](const rpc::Call& c) {
      return w->rollout->Generate(c, v1::GenerateRequest(), &resp);
    });
  });
  const auto t0 = std::chrono::steady_clock::now();
  job.Silence("rollout-1");
  ASSERT_EQ(call.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_EQ(call.get().code(), StatusCode::kAborted);
  EXPECT_TRUE(job.pool->IsDead("rollout-1"));
  EXPECT_TRUE(job.pool->CheckHealth().ok());
  // A call to a worker already dead fails at once.
  v1::GenerateResponse resp;
  Status late = job.pool->Invoke(w->id, 60, [&](const rpc::Call& c) {
    return w->rollout->Generate(c, v1::GenerateRequest(), &resp);
  });
  EXPECT_EQ(late.code(), StatusCode::kAborted);
}

TEST(WorkerPoolTest, ADeadRolloutWorkerIsRestartedAndCaughtUpBeforeItGetsWork) {
  FakeJob job(LocalConfig(2, 1));
  ASSERT_TRUE(job.Start(LocalOptions()).ok());
  Worker* w = job.pool->Get("rollout-1");
  const pid_t first = w->pid;
  std::ofstream(w->log_path) << "the first process's log\n";
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(job.pool->WaitForDeath("rollout-1", 10));
  int catch_ups = 0;
  auto catch_up = [&](Worker* x) {
    ++catch_ups;
    x->version = 7;  // what a publish with a matching receipt does
    return Status::Ok();
  };
  ASSERT_TRUE(job.pool->Revive(7, catch_up).ok());
  // Respawned, not yet registered: no work for it, no catch-up yet.
  EXPECT_GT(w->pid, 0);
  EXPECT_NE(w->pid, first);
  EXPECT_EQ(catch_ups, 0);
  EXPECT_EQ(job.pool->AliveRollouts().size(), 1u);
  EXPECT_TRUE(PathExists(w->log_path + ".1"));  // the dead process's log is kept
  ASSERT_TRUE(FakeCluster::Register(&job.service, v1::WORKER_ROLE_ROLLOUT, 1).ok());
  ASSERT_TRUE(job.pool->Revive(7, catch_up).ok());
  EXPECT_EQ(catch_ups, 1);
  EXPECT_EQ(job.pool->AliveRollouts().size(), 2u);
  EXPECT_EQ(job.pool->restarts_caught_up(), 1);
  EXPECT_EQ(w->restarts, 1);
}

TEST(WorkerPoolTest, ACatchUpWithoutAReceiptDropsTheWorker) {
  FakeJob job(LocalConfig(2, 1));
  ASSERT_TRUE(job.Start(LocalOptions()).ok());
  ASSERT_EQ(kill(job.pool->Get("rollout-0")->pid, SIGKILL), 0);
  ASSERT_TRUE(job.pool->WaitForDeath("rollout-0", 10));
  auto no_receipt = [](Worker*) { return Status::Ok(); };
  ASSERT_TRUE(job.pool->Revive(3, no_receipt).ok());
  ASSERT_TRUE(FakeCluster::Register(&job.service, v1::WORKER_ROLE_ROLLOUT, 0).ok());
  ASSERT_TRUE(job.pool->Revive(3, no_receipt).ok());
  EXPECT_TRUE(job.pool->IsDead("rollout-0"));
  EXPECT_EQ(job.pool->AliveRollouts().size(), 1u);
  EXPECT_EQ(job.pool->restarts_caught_up(), 0);
  for (const auto& i : job.service.Snapshot()) {
    if (i.id == "rollout-0") {
      EXPECT_NE(i.death.find("catch-up to policy v3 got no receipt"), std::string::npos) << i.death;
    }
  }
}

TEST(WorkerPoolTest, NoRestartsLeftMeansTheWorkerStaysDead) {
  JobConfig cfg = LocalConfig(2, 1);
  cfg.cluster.max_worker_restarts = 0;
  FakeJob job(cfg);
  ASSERT_TRUE(job.Start(LocalOptions()).ok());
  const pid_t pid = job.pool->Get("rollout-1")->pid;
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE(job.pool->WaitForDeath("rollout-1", 10));
  ASSERT_TRUE(job.pool->Revive(0, [](Worker*) { return Status::Ok(); }).ok());
  EXPECT_EQ(job.pool->Get("rollout-1")->pid, -pid);  // not respawned
  EXPECT_EQ(job.pool->AliveRollouts().size(), 1u);
}

// A worker that registered and is still initialising (loading its model: no heartbeat yet) is
// not declared dead by the heartbeat timeout; register_timeout_s bounds it instead. Once it has
// heartbeated, silence longer than the timeout does expire it.
TEST(ControllerServiceTest, AWorkerStillInitialisingIsNotExpiredByTheHeartbeatTimeout) {
  ControllerService service("job: {}\n", 0.05, 0.2);
  service.Expect("rollout-0", v1::WORKER_ROLE_ROLLOUT, 0, 0);
  v1::RegisterRequest reg;
  reg.set_role(v1::WORKER_ROLE_ROLLOUT);
  reg.set_index(0);
  reg.set_address("127.0.0.1:1");
  v1::RegisterResponse reg_resp;
  grpc::ServerContext ctx;
  ASSERT_TRUE(service.Register(&ctx, &reg, &reg_resp).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(service.ExpireSilent().empty());
  EXPECT_TRUE(service.Snapshot().at(0).alive);
  v1::HeartbeatRequest hb;
  hb.set_worker_id("rollout-0");
  v1::HeartbeatResponse hb_resp;
  ASSERT_TRUE(service.Heartbeat(&ctx, &hb, &hb_resp).ok());
  EXPECT_TRUE(service.Snapshot().at(0).ready);
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(service.ExpireSilent(), std::vector<std::string>{"rollout-0"});
  EXPECT_FALSE(service.Snapshot().at(0).alive);
}

// An external worker can dial before the controller has listed the job's workers (netns_test
// once lost rollout-1 that way: refused as unknown, it exited). Until the list is complete an
// unknown worker is told to retry; after it, it is refused.
TEST(ControllerServiceTest, AnUnknownWorkerRetriesUntilTheJobsWorkersAreListed) {
  ControllerService service("job: {}\n", 0.05, 0.2);
  v1::RegisterRequest reg;
  reg.set_role(v1::WORKER_ROLE_ROLLOUT);
  reg.set_index(1);
  reg.set_address("127.0.0.1:1");
  v1::RegisterResponse resp;
  grpc::ServerContext ctx;
  service.Expect("rollout-0", v1::WORKER_ROLE_ROLLOUT, 0, 0);
  EXPECT_EQ(service.Register(&ctx, &reg, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  service.Expect("rollout-1", v1::WORKER_ROLE_ROLLOUT, 1, 0);
  service.ExpectNoMore();
  EXPECT_TRUE(service.Register(&ctx, &reg, &resp).ok());
  EXPECT_EQ(resp.worker_id(), "rollout-1");
  reg.set_index(2);
  const grpc::Status refused = service.Register(&ctx, &reg, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.error_message().find("this job has no worker rollout-2"), std::string::npos)
      << refused.error_message();
}

}  // namespace
}  // namespace gyre::controller
