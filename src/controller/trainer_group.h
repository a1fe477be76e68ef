#pragma once
// TrainerGroup: the job's trainer workers as one data-parallel group. It forms the group
// (trainer-0 hosts the Gloo store; every trainer joins), shards each batch into token-balanced
// parts of the same global mini-batches a single trainer would take (controller/sharding.h),
// runs the train call on every rank at once and checks that the ranks agree, and saves and
// loads the trainers' state. Trainer-0 speaks for the group (metrics are all-reduced).
//
// Threads: job thread only; a call fans out to one helper thread per rank and joins them.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/worker_pool.h"

namespace gyre::controller {

struct TrainOptions {
  v1::Objective objective = v1::OBJECTIVE_POLICY_GRADIENT;
  double lr = 0;
  double temperature = 1.0;
  bool reset_optimizer = false;  // drop the AdamW state first (trainer.warmup_optimizer_state)
};

class TrainerGroup {
 public:
  // `pool` (not owned) must outlive the group.
  TrainerGroup(const JobConfig& cfg, WorkerPool* pool);

  // Forms the data-parallel group (a no-op with one trainer). Call again after a trainer
  // restart: each formation is a new group name.
  Status Form();

  // One optimizer step on `samples` at policy `version` (the trainers refuse another). Returns
  // trainer-0's metrics and sets *new_version to the version after the step.
  StatusOr<std::map<std::string, double>> Train(const std::vector<v1::Sample>& samples,
                                                int64_t version, const TrainOptions& opts,
                                                int64_t* new_version);

  // algorithm.kl_in: reward: trainer-0's KL to the reference policy of each sample (the sum over
  // its response tokens of algorithm.kl's estimator), at policy `version`, in sample order.
  StatusOr<std::vector<double>> SequenceKl(const std::vector<v1::Sample>& samples, int64_t version,
                                           double temperature);

  // Trainer-0's full state (weights, optimizer, RNG) into `directory`; returns its version.
  StatusOr<int64_t> SaveState(const std::string& directory);
  // Every rank loads `directory` (the ranks hold identical state, so they continue in
  // lockstep); returns the version, which every rank must report the same.
  StatusOr<int64_t> LoadState(const std::string& directory);
  // The model (HF layout) into `directory`, by trainer-0 (with every trainer gathering the
  // model unit by unit for it under trainer.shard: parameters).
  Status SaveModel(const std::string& directory);

 private:
  const JobConfig cfg_;
  WorkerPool* pool_;
  int formations_ = 0;
};

}  // namespace gyre::controller
