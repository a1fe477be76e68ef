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
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "controller/sample_ledger.h"
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
  // Seconds each rollout worker spent in Generate calls (by worker id), for its busy fraction.
  std::map<std::string, double> busy_s;
};

// Where the scheduler records its samples' moves (queued -> generating on dispatch, back to
// queued when their worker fails, generating -> finished), with the step and version they
// happen at. Null = not recorded (evaluation).
struct LedgerSink {
  SampleLedger* ledger = nullptr;  // not owned
  int64_t step = -1;
  int64_t version = -1;
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
                                                int64_t min_version, GenerateStats* stats,
                                                const LedgerSink* sink = nullptr);

  // Partial rollouts: adds `jobs` to the groups in flight and generates until `target_groups`
  // of them have finished (or none is left unfinished). Replaces *jobs with the finished groups
  // (oldest first) and returns their samples (n per group, in group order); the others carry
  // over to the next call.
  StatusOr<std::vector<v1::Sample>> GeneratePartial(std::vector<GroupJob>* jobs,
                                                    int64_t target_groups,
                                                    const v1::SamplingParams& sampling,
                                                    int64_t min_version, GenerateStats* stats,
                                                    const LedgerSink* sink = nullptr);

  // Environment jobs: GenerateAll's requests name the environment server at `address()` (asked
  // at each dispatch: a restarted server listens elsewhere), and their groups run as episodes.
  void SetEnvAddress(std::function<std::string()> address) { env_address_ = std::move(address); }

  // Groups in flight (partial rollouts), for checkpoints and back.
  size_t carried_groups() const { return partial_.size(); }
  std::vector<v1::CarriedGroup> SaveCarried() const;
  // `ledger` (may be null) tells which of their samples are in flight (generating).
  Status RestoreCarried(const std::vector<v1::CarriedGroup>& groups, SampleLedger* ledger);

 private:
  // A Generate call that failed: a bad request fails the job; otherwise the worker is waited
  // for briefly, dropped either way, and its groups go to *retry.
  template <typename Id>
  Status AfterGenerateFailure(Worker* w, const Status& s, const std::vector<Id>& groups,
                              std::vector<Id>* retry);
  // Ledger moves. Dispatched: the request's samples that are not yet generating. Failed: the
  // ones sent to `w` that are still generating go back to queued.
  Status RecordDispatch(const LedgerSink* sink, const Worker& w, const v1::GenerateRequest& req);
  Status RecordFailure(const LedgerSink* sink, const Worker& w, const v1::GenerateRequest& req,
                       const std::string& why);
  Status RecordFinished(const LedgerSink* sink, const Worker& w, const v1::GenerateResponse& resp);

  const JobConfig cfg_;
  WorkerPool* pool_;
  struct PartialGroup {
    GroupJob job;
    std::map<uint64_t, v1::Sample> finished;    // by sample id
    std::map<uint64_t, v1::Sample> unfinished;  // by sample id; resumed next time
    std::string worker;                         // last worker, preferred for its kept KV
  };
  std::map<uint64_t, PartialGroup> partial_;  // by group id (oldest first)
  std::set<uint64_t> generating_;             // sample ids the ledger holds as generating
  std::function<std::string()> env_address_;  // empty: no environment
};

}  // namespace gyre::controller
