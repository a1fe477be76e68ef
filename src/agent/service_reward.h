#pragma once
// ServiceReward: the job's reward computed by a reward server (gyre.v1.Reward, reward.type:
// service). A batch is cut into requests of at most `batch_size` items, up to `concurrency`
// requests in flight. Each item comes back with its own status: a server-side TIMEOUT or ERROR,
// a request past its deadline, or an item the server left out is an error for that item
// (DeadlineExceeded or Internal, with the server's message), never a reward of 0. What the job
// does with failed items is reward.on_failure (controller/step_scorer.h); reward.retries resends
// them first. Request ids are derived from the item ids, so a resent request is recognisable.
//
// Thread contract: ScoreBatch/Score from one thread at a time (RewardFn's contract); it runs
// its requests on threads of its own.

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "agent/service_supervisor.h"
#include "gyre/reward.h"

namespace gyre::agent {

struct RewardServiceOptions {
  double timeout_s = 60;       // deadline of one Score request
  double item_timeout_s = 30;  // the server's budget per item (sent with the request)
  int batch_size = 64;         // items per request
  int concurrency = 4;         // requests in flight
  int retries = 2;             // resends after UNAVAILABLE (a dead or restarting server)
};

class ServiceReward final : public RewardFn {
 public:
  ServiceReward(std::unique_ptr<ServiceSupervisor> service, RewardServiceOptions options)
      : service_(std::move(service)), options_(options) {}

  StatusOr<double> Score(const RewardInput& input) override;
  std::vector<StatusOr<double>> ScoreBatch(const std::vector<RewardInput>& inputs) override;

  ServiceSupervisor* service() { return service_.get(); }

 private:
  // One request of inputs[begin, end) into out[begin, end).
  void ScoreRange(const std::vector<RewardInput>& inputs, size_t begin, size_t end,
                  std::vector<StatusOr<double>>* out);

  std::unique_ptr<ServiceSupervisor> service_;
  const RewardServiceOptions options_;
  const uint64_t nonce_ = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  std::atomic<uint64_t> next_anonymous_{0};
};

}  // namespace gyre::agent
