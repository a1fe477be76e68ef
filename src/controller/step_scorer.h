#pragma once
// StepScorer: the scoring part of a GRPO step (docs/algorithms.md). For a step's groups and their
// samples it
//   - drops samples staler than algorithm.max_staleness (trainer version now minus the oldest
//     version among a sample's tokens),
//   - scores the others with the job's reward on the decoded response (a failed or non-finite
//     reward leaves its sample out and is counted, never a silent 0), minus DAPO's overlong
//     penalty (algorithm.overlong_buffer),
//   - filters groups whose rewards are all equal when algorithm.filter_zero_variance is on,
//   - records each outcome in the sample ledger (scored, or dropped / filtered with the reason),
// and then sets the kept samples' group advantages (algorithm.advantage, through the algorithm
// registry), leaving out MC-GRPO's pivot samples with `median`.
//
// Thread contract: used from one thread at a time (the job's). The tokenizer and the reward are
// not owned and must outlive it; the reward is called from that thread only.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/rollout_scheduler.h"
#include "controller/sample_ledger.h"
#include "gyre/config.h"
#include "gyre/reward.h"
#include "gyre/status.h"
#include "gyre/v1/gyre.pb.h"
#include "text/text_tokenizer.h"

namespace gyre::controller {

// What scoring a step's groups gives: the samples to train (by group, with their rewards) and
// the counts of what was left out.
struct StepScores {
  std::vector<v1::Sample> kept;
  std::vector<float> rewards;        // of kept, in order
  std::vector<int32_t> group_sizes;  // kept samples per kept group, in order
  int reward_errors = 0, stale = 0, correct = 0, scored = 0, filtered_groups = 0;
  // reward.on_failure: zero: failed rewards counted as 0; drop_group: samples left out because
  // another sample of their group failed.
  int reward_zeroed = 0, reward_group_drops = 0;
  // Environment jobs, over every episode of the step: model turns, episodes the environment
  // ended (terminated) and episodes whose environment failed.
  int episodes = 0, env_turns = 0, env_terminated = 0, env_failures = 0;
  double reward_sum = 0;  // over every scored sample (filtered groups included), after shaping
  int overlong = 0;       // scored samples the overlong penalty reached
  // algorithm.advantage: median: the pivot samples SetAdvantages left out (ids), else empty.
  std::vector<uint64_t> pivot_ids;
  std::map<int64_t, int64_t> staleness;  // kept samples by staleness (versions)
};

class StepScorer {
 public:
  // max_new_tokens: rollout.max_new_tokens, the length limit the overlong penalty counts back
  // from (unused while algorithm.overlong_buffer is 0).
  StepScorer(const AlgorithmSection& algorithm, int group_size,
             const text::TextTokenizer* tokenizer, RewardFn* reward, int max_new_tokens = 0)
      : algorithm_(algorithm),
        group_size_(group_size),
        tokenizer_(tokenizer),
        reward_(reward),
        max_new_tokens_(max_new_tokens) {}

  // Scores `samples` (jobs[g].group.n() per group of `jobs`, in order; moved from) for GRPO step
  // `step` with the trainer at `version`, records the outcomes in `ledger` and appends the usable
  // groups to *out. An error only when the ledger cannot record an outcome.
  Status Score(const std::vector<GroupJob>& jobs, std::vector<v1::Sample>* samples, int step,
               int64_t version, SampleLedger* ledger, StepScores* out) const;

  // reward.on_failure (drop_sample, drop_group or zero) and reward.retries. Defaults:
  // drop_sample, no retries.
  void SetFailurePolicy(const std::string& on_failure, int retries) {
    on_failure_ = on_failure;
    retries_ = retries;
  }

  // Environment jobs: a sample whose episode failed (reward_status ERROR from the rollout
  // worker) is a failed reward whatever reward.type says; with `env_reward` (reward.type: env)
  // the others' rewards are the environment's (Sample.reward), not the RewardFn's.
  void SetEpisodes(bool env_reward) {
    episodes_ = true;
    env_reward_ = env_reward;
  }
  // The reward of `sample` for `problem` (its response decoded). An error, whose message says
  // why, when the reward fails or is not finite: the sample must not count as 0.
  StatusOr<double> Reward(const Problem& problem, const v1::Sample& sample) const;
  // Reward() of several samples in one RewardFn::ScoreBatch call (a reward service scores them
  // in parallel requests); failed ones are scored again up to reward.retries times.
  std::vector<StatusOr<double>> Rewards(const std::vector<const Problem*>& problems,
                                        const std::vector<const v1::Sample*>& samples) const;
  // Reward() for a decision before scoring (a sampling policy's first round): a reward that
  // succeeds is kept by sample id, and Score() uses it instead of calling the reward again.
  StatusOr<double> PeekReward(const Problem& problem, const v1::Sample& sample) const;

  // Sets every kept sample's advantage from its group's rewards; returns how many groups had
  // rewards without variance. With algorithm.advantage: median, a group of odd size >= 3 loses
  // its pivot (the first sample whose reward equals the median, advantage 0) from kept, rewards
  // and group_sizes; its id goes to pivot_ids for the caller to record.
  StatusOr<int> SetAdvantages(StepScores* scores) const;

 private:
  const AlgorithmSection algorithm_;
  const int group_size_;
  const text::TextTokenizer* tokenizer_;

  RewardInput Input(const Problem& problem, const v1::Sample& sample) const;

  RewardFn* reward_;
  const int max_new_tokens_;
  std::string on_failure_ = "drop_sample";
  int retries_ = 0;
  bool episodes_ = false, env_reward_ = false;
  mutable std::map<uint64_t, double> cache_;  // PeekReward's rewards until Score uses them
};

// DAPO's overlong penalty of a response of `length` tokens: 0 up to max_new_tokens - buffer,
// then falling linearly to -penalty at max_new_tokens (and beyond); 0 when buffer <= 0.
double OverlongPenalty(int64_t length, int max_new_tokens, int buffer, double penalty);

}  // namespace gyre::controller
