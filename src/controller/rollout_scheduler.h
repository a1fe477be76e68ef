#pragma once
// RolloutScheduler: dispatches prompt groups to the rollout workers and collects their samples.
// It knows which worker holds which group, re-queues the groups of a worker that fails on the
// survivors (a bad request fails the job instead), and, with partial rollouts
// (rollout.partial_rollouts), keeps the groups in flight across steps: a step ends when
// rollout.prompts_per_step groups have finished; unfinished samples keep their tokens and
// per-token versions and resume next time, on the worker that holds their KV when it is alive.
//
// Threads: job thread only; a dispatch round fans out one helper thread per worker and joins
// them.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/task.h"
#include "controller/worker_pool.h"
#include "gyre/v1/checkpoint.pb.h"

namespace gyre::controller {

// A prompt group and the problem it was drawn from.
struct GroupJob {
  v1::PromptGroup group;
  Problem problem;
};

// Engine counters of one generation (all rollout workers).
struct GenerateStats {
  int64_t generated_tokens = 0;
  int64_t prefill_tokens = 0;
  int64_t prefix_shared_tokens = 0;
  int64_t resumed_samples = 0;  // partial rollouts: unfinished samples sent back to an engine
};

class RolloutScheduler {
 public:
  // `pool` (not owned) must outlive the scheduler.
  RolloutScheduler(const JobConfig& cfg, WorkerPool* pool);

  // Runs every group of `jobs` to completion, each on one alive worker (round robin), with
  // workers that hold policy `min_version` or newer. Returns the samples n per group, in job
  // order; adds to *stats.
  StatusOr<std::vector<v1::Sample>> GenerateAll(const std::vector<GroupJob>& jobs,
                                                const v1::SamplingParams& sampling,
                                                int64_t min_version, GenerateStats* stats);

  // Partial rollouts: adds `jobs` to the groups in flight and generates until
  // rollout.prompts_per_step of them have finished. Replaces *jobs with the finished groups
  // (oldest first) and returns their samples (n per group, in group order); the others carry
  // over to the next call.
  StatusOr<std::vector<v1::Sample>> GeneratePartial(std::vector<GroupJob>* jobs,
                                                    const v1::SamplingParams& sampling,
                                                    int64_t min_version, GenerateStats* stats);

  // Groups in flight (partial rollouts), for checkpoints and back.
  size_t carried_groups() const { return partial_.size(); }
  std::vector<v1::CarriedGroup> SaveCarried() const;
  void RestoreCarried(const std::vector<v1::CarriedGroup>& groups);

 private:
  // A Generate call that failed: a bad request fails the job; otherwise the worker is waited
  // for briefly, dropped either way, and its groups go to *retry.
  template <typename Id>
  Status AfterGenerateFailure(Worker* w, const Status& s, const std::vector<Id>& groups,
                              std::vector<Id>* retry);

  const JobConfig cfg_;
  WorkerPool* pool_;
  struct PartialGroup {
    GroupJob job;
    std::map<uint64_t, v1::Sample> finished;    // by sample id
    std::map<uint64_t, v1::Sample> unfinished;  // by sample id; resumed next time
    std::string worker;                         // last worker, preferred for its kept KV
  };
  std::map<uint64_t, PartialGroup> partial_;  // by group id (oldest first)
};

}  // namespace gyre::controller
