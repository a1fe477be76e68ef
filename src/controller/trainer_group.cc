#include "controller/trainer_group.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "common/clock.h"
#include "common/logging.h"
#include "controller/sharding.h"

namespace gyre::controller {

TrainerGroup::TrainerGroup(const JobConfig& cfg, WorkerPool* pool) : cfg_(cfg), pool_(pool) {}

Status TrainerGroup::Form() {
  std::vector<Worker*> trainers = pool_->Trainers();
  if (trainers.size() < 2) return Status::Ok();
  const auto t0 = SteadyClock::now();
  v1::HostGroupStoreResponse store;
  Worker* t0w = trainers[0];
  GYRE_RETURN_IF_ERROR(pool_->AfterRpcFailure(
      t0w, pool_->Invoke(t0w->id, cfg_.cluster.rpc_timeout_s, [&](const rpc::Call& c) {
        return t0w->trainer->HostGroupStore(c, &store).WithContext("data-parallel store");
      })));
  const std::string group = "trainers-" + std::to_string(++formations_);
  std::vector<std::future<Status>> joins;
  for (size_t r = 0; r < trainers.size(); ++r) {
    joins.push_back(std::async(std::launch::async, [this, &trainers, &store, &group, r] {
      Worker* w = trainers[r];
      v1::JoinGroupRequest req;
      req.set_store_address(store.store_address());
      req.set_group(group);
      req.set_rank(static_cast<int32_t>(r));
      req.set_size(static_cast<int32_t>(trainers.size()));
      req.set_tensor_parallel(cfg_.trainer.tensor_parallel);
      req.set_timeout_s(cfg_.cluster.register_timeout_s);
      v1::JoinGroupResponse resp;
      return pool_->Invoke(w->id, cfg_.cluster.register_timeout_s + 10, [&](const rpc::Call& c) {
        return w->trainer->JoinGroup(c, req, &resp).WithContext("join " + group);
      });
    }));
  }
  std::vector<Status> results;
  for (auto& j : joins) results.push_back(j.get());
  for (size_t r = 0; r < trainers.size(); ++r) {
    GYRE_RETURN_IF_ERROR(pool_->AfterRpcFailure(trainers[r], results[r]));
  }
  GYRE_LOG_INFO("data-parallel group {} of {} trainers formed in {:.1f} s (store {})", group,
                trainers.size(), SecondsSince(t0), store.store_address());
  return Status::Ok();
}

StatusOr<std::map<std::string, double>> TrainerGroup::Train(const std::vector<v1::Sample>& samples,
                                                            int64_t version,
                                                            const TrainOptions& opts,
                                                            int64_t* new_version) {
  std::vector<Worker*> trainers = pool_->Trainers();
  const int ranks = static_cast<int>(trainers.size());
  // Tensor parallel: the T trainers of data-parallel rank d (trainers d T .. d T + T - 1) compute
  // one model together on the same shard of the batch.
  const int tp = std::max(1, cfg_.trainer.tensor_parallel);
  const int dp_ranks = ranks / tp;
  std::vector<v1::TrainStepRequest> reqs(ranks);
  for (auto& req : reqs) {
    req.set_expected_version(version);
    req.set_objective(opts.objective);
    req.set_lr(static_cast<float>(opts.lr));
    req.set_temperature(static_cast<float>(opts.temperature));
    req.set_reset_optimizer_state(opts.reset_optimizer);
  }
  if (dp_ranks == 1) {
    for (int r = 0; r < ranks; ++r) {
      for (const auto& s : samples) *reqs[r].add_samples() = s;
    }
  } else {
    // Token-balanced shards of the same global mini-batches a single trainer would take.
    std::vector<int64_t> tokens;
    for (const auto& s : samples) tokens.push_back(s.prompt_ids_size() + s.response_ids_size());
    // A trainer that shares prompts computes a group's prompt once if it holds the whole group.
    std::vector<uint64_t> groups;
    if (cfg_.trainer.sequence_packing && cfg_.trainer.prompt_sharing != "off") {
      for (const auto& s : samples) groups.push_back(s.group_id());
    }
    const int minis =
        opts.objective == v1::OBJECTIVE_SFT
            ? 1
            : std::max(1, std::min(cfg_.trainer.mini_batches, static_cast<int>(samples.size())));
    const DpShards shards = ShardBatch(tokens, dp_ranks, minis, groups);
    for (int r = 0; r < ranks; ++r) {
      const int d = r / tp;
      for (size_t i : shards.samples[d]) *reqs[r].add_samples() = samples[i];
      for (int32_t n : shards.mini_batch_sizes[d]) reqs[r].add_mini_batch_sizes(n);
    }
  }
  std::vector<v1::TrainStepResponse> resps(ranks);
  std::vector<std::future<Status>> calls;
  for (int r = 0; r < ranks; ++r) {
    calls.push_back(std::async(std::launch::async, [this, &trainers, &reqs, &resps, r] {
      Worker* w = trainers[r];
      return pool_->Invoke(w->id, cfg_.cluster.rpc_timeout_s, [&](const rpc::Call& c) {
        return w->trainer->TrainStep(c, reqs[r], &resps[r])
            .WithContext("train step on trainer-" + std::to_string(r));
      });
    }));
  }
  std::vector<Status> results;
  for (auto& c : calls) results.push_back(c.get());
  Status first_error;
  for (int r = 0; r < ranks; ++r) {
    Status s = pool_->AfterRpcFailure(trainers[r], results[r]);
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  GYRE_RETURN_IF_ERROR(first_error);
  for (int r = 1; r < ranks; ++r) {
    if (resps[r].policy_version() != resps[0].policy_version()) {
      return Internal("data-parallel trainers disagree on the policy version: trainer-0 has " +
                      std::to_string(resps[0].policy_version()) + ", trainer-" + std::to_string(r) +
                      " has " + std::to_string(resps[r].policy_version()));
    }
  }
  *new_version = resps[0].policy_version();
  // Metrics are all-reduced by the ranks, so rank 0 speaks for the group.
  return std::map<std::string, double>(resps[0].metrics().begin(), resps[0].metrics().end());
}

StatusOr<std::vector<double>> TrainerGroup::SequenceKl(const std::vector<v1::Sample>& samples,
                                                       int64_t version, double temperature) {
  // The trainers that compute a forward together, all on the same samples: trainer-0 alone, or
  // with trainer.shard: parameters every trainer (each forward gathers from all), or with
  // tensor parallelism the T trainers holding one model. Trainer-0's answer is the result.
  std::vector<Worker*> trainers = pool_->Trainers();
  if (cfg_.trainer.shard != "parameters") {
    trainers.resize(std::min<size_t>(
        trainers.size(), static_cast<size_t>(std::max(1, cfg_.trainer.tensor_parallel))));
  }
  Worker* w = trainers.front();
  v1::SequenceKlRequest req;
  req.set_expected_version(version);
  req.set_estimator(cfg_.algorithm.kl);
  req.set_temperature(static_cast<float>(temperature));
  for (const auto& s : samples) *req.add_samples() = s;
  std::vector<v1::SequenceKlResponse> resps(trainers.size());
  std::vector<std::future<Status>> calls;
  for (size_t r = 0; r < trainers.size(); ++r) {
    calls.push_back(std::async(std::launch::async, [this, &trainers, &req, &resps, r] {
      Worker* t = trainers[r];
      return pool_->Invoke(t->id, cfg_.cluster.rpc_timeout_s, [&](const rpc::Call& c) {
        return t->trainer->SequenceKl(c, req, &resps[r])
            .WithContext("KL to the reference policy on " + t->id);
      });
    }));
  }
  Status first_error;
  for (size_t r = 0; r < trainers.size(); ++r) {
    Status s = pool_->AfterRpcFailure(trainers[r], calls[r].get());
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  GYRE_RETURN_IF_ERROR(first_error);
  const v1::SequenceKlResponse& resp = resps[0];
  if (resp.kl_size() != static_cast<int>(samples.size())) {
    return Internal(w->id + " returned " + std::to_string(resp.kl_size()) + " KL values for " +
                    std::to_string(samples.size()) + " samples");
  }
  return std::vector<double>(resp.kl().begin(), resp.kl().end());
}

StatusOr<int64_t> TrainerGroup::SaveState(const std::string& directory) {
  // Unsharded, trainer-0 holds the whole state. Sharded (trainer.shard), every trainer writes its
  // slice of the optimizer state into the same directory, at the same time; the checkpoint is
  // complete once all of them returned.
  // Tensor parallel: every trainer gathers the slices with the others of its group, trainer-0
  // writes.
  std::vector<Worker*> trainers = pool_->Trainers();
  if (cfg_.trainer.shard == "none" && cfg_.trainer.tensor_parallel <= 1) trainers.resize(1);
  v1::SaveStateRequest req;
  req.set_directory(directory);
  std::vector<v1::SaveStateResponse> resps(trainers.size());
  std::vector<std::future<Status>> calls;
  for (size_t r = 0; r < trainers.size(); ++r) {
    calls.push_back(std::async(std::launch::async, [this, &trainers, &req, &resps, &directory, r] {
      Worker* w = trainers[r];
      return pool_->Invoke(w->id, cfg_.cluster.rpc_timeout_s, [&](const rpc::Call& c) {
        return w->trainer->SaveState(c, req, &resps[r])
            .WithContext("save trainer state " + directory + " on " + w->id);
      });
    }));
  }
  Status first_error;
  for (size_t r = 0; r < trainers.size(); ++r) {
    Status s = pool_->AfterRpcFailure(trainers[r], calls[r].get());
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  GYRE_RETURN_IF_ERROR(first_error);
  for (size_t r = 1; r < trainers.size(); ++r) {
    if (resps[r].policy_version() != resps[0].policy_version()) {
      return Internal("data-parallel trainers saved different policy versions: " +
                      std::to_string(resps[0].policy_version()) + " and " +
                      std::to_string(resps[r].policy_version()));
    }
  }
  return resps[0].policy_version();
}

StatusOr<int64_t> TrainerGroup::LoadState(const std::string& directory) {
  v1::LoadStateRequest req;
  req.set_directory(directory);
  int64_t version = -1;
  for (Worker* w : pool_->Trainers()) {
    v1::LoadStateResponse resp;
    GYRE_RETURN_IF_ERROR(pool_->AfterRpcFailure(
        w, pool_->Invoke(w->id, cfg_.cluster.rpc_timeout_s, [&](const rpc::Call& c) {
          return w->trainer->LoadState(c, req, &resp)
              .WithContext("resume " + w->id + " from " + directory);
        })));
    if (version >= 0 && resp.policy_version() != version) {
      return FailedPrecondition(directory + ": " + w->id + " loaded policy version " +
                                std::to_string(resp.policy_version()) + ", trainer-0 " +
                                std::to_string(version));
    }
    version = resp.policy_version();
  }
  return version;
}

Status TrainerGroup::SaveModel(const std::string& directory) {
  // trainer.shard: parameters or tensor parallelism: every trainer gathers the model with the
  // others, trainer-0 writes it.
  std::vector<Worker*> trainers = pool_->Trainers();
  if (cfg_.trainer.shard != "parameters" && cfg_.trainer.tensor_parallel <= 1) trainers.resize(1);
  v1::SaveRequest req;
  req.set_directory(directory);
  std::vector<v1::SaveResponse> resps(trainers.size());
  std::vector<std::future<Status>> calls;
  for (size_t r = 0; r < trainers.size(); ++r) {
    calls.push_back(std::async(std::launch::async, [this, &trainers, &req, &resps, r] {
      Worker* w = trainers[r];
      return pool_->Invoke(w->id, cfg_.cluster.rpc_timeout_s, [&](const rpc::Call& c) {
        return w->trainer->Save(c, req, &resps[r]).WithContext("save final model on " + w->id);
      });
    }));
  }
  Status first_error;
  for (size_t r = 0; r < trainers.size(); ++r) {
    Status s = pool_->AfterRpcFailure(trainers[r], calls[r].get());
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  return first_error;
}

}  // namespace gyre::controller
