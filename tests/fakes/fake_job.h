#pragma once
// A controller-side job over fake workers (tests/fakes/fake_clients.h): a real
// ControllerService and WorkerPool in external mode, a FakeCluster that registers every worker,
// and a heartbeat thread that keeps each registered worker alive until the test silences it.
// Used by the unit tests of WorkerPool, WeightPublisher, TrainerGroup and RolloutScheduler.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/file_util.h"
#include "controller/controller_service.h"
#include "controller/worker_pool.h"
#include "fakes/fake_clients.h"

namespace gyre::testing {

inline JobConfig FakeJobConfig(int rollouts, int trainers) {
  JobConfig cfg;
  cfg.cluster.mode = "external";
  cfg.cluster.heartbeat_timeout_s = 60;
  cfg.cluster.register_timeout_s = 10;
  cfg.cluster.rpc_timeout_s = 30;
  cfg.cluster.weight_sync_timeout_s = 30;
  cfg.rollout.workers = rollouts;
  cfg.trainer.workers = trainers;
  return cfg;
}

class FakeJob {
 public:
  explicit FakeJob(const JobConfig& cfg)
      : cfg(cfg),
        cluster(cfg.rollout.workers, cfg.trainer.workers),
        service("job: {}\n", 0.05, cfg.cluster.heartbeat_timeout_s) {
    logs_dir = ::testing::TempDir() + "/fake_job_logs_" +
               ::testing::UnitTest::GetInstance()->current_test_info()->name();
    (void)MakeDirs(logs_dir);
  }
  ~FakeJob() { Stop(); }

  // Makes the pool, registers every fake worker and waits for the pool to see them.
  Status Start(controller::WorkerPoolOptions opts = {}) {
    opts.clients = cluster.Factory();
    opts.death_grace_s = death_grace_s;  // fakes fail at once; no process to wait for
    opts.logs_dir = logs_dir;
    pool = std::make_unique<controller::WorkerPool>(cfg, &service, std::move(opts));
    GYRE_RETURN_IF_ERROR(pool->Start());
    GYRE_RETURN_IF_ERROR(cluster.RegisterAll(&service));
    beats_ = std::thread([this] {
      while (!stop_.load()) {
        std::set<std::string> silent;
        {
          std::lock_guard<std::mutex> lock(mu_);
          silent = silent_;
        }
        for (const auto& w : service.Snapshot()) {
          if (w.registered && w.alive && !silent.count(w.id)) {
            (void)FakeCluster::Heartbeat(&service, w.id);
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    return pool->WaitRegistered();
  }

  // The worker stops heartbeating (hung or partitioned), or starts again.
  void Silence(const std::string& id, bool silent = true) {
    std::lock_guard<std::mutex> lock(mu_);
    if (silent) {
      silent_.insert(id);
    } else {
      silent_.erase(id);
    }
  }

  void Stop() {
    if (pool) pool->Shutdown();
    stop_.store(true);
    if (beats_.joinable()) beats_.join();
  }

  JobConfig cfg;
  FakeCluster cluster;
  controller::ControllerService service;
  std::string logs_dir;
  double death_grace_s = 0.2;
  std::unique_ptr<controller::WorkerPool> pool;

 private:
  std::thread beats_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::set<std::string> silent_;
};

}  // namespace gyre::testing
