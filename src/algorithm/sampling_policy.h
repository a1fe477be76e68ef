#pragma once
// SamplingPolicy: the rollout budget per prompt (rollout.budget, docs/algorithms.md, "Rollout
// budget per prompt"). The controller's synchronous step consults it three times:
//   1. while drawing prompts: Skip() may leave a drawn prompt out (it is not generated);
//   2. FirstRound() samples for every drawn prompt; after they are scored, TopUps() says how
//      many more each group gets (one more generation round), so groups may end up with
//      different sizes;
//   3. Observe() sees every group's final rewards (filtered ones included) once per round;
//      AddMetrics() then reports and EndStep() closes the step.
// Built-in policies: uniform (every prompt rollout.group_size samples, today's behaviour),
// pilot (pilot-then-commit), variance (top-ups to the highest reward variance) and greso
// (skip prompts whose recent groups all had equal rewards). Their state (per-prompt history,
// adaptive probability) goes into checkpoints through SaveState/RestoreState.
//
// Thread contract: job thread only.

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gyre/config.h"
#include "gyre/status.h"

namespace gyre::algorithm {

// One group as the policy sees it: its prompt (the history key) and its rewards so far.
struct GroupRewards {
  std::string prompt;
  std::vector<double> rewards;
};

class SamplingPolicy {
 public:
  virtual ~SamplingPolicy() = default;

  // Whether to leave out a prompt drawn for GRPO step `step`; `draw` numbers the step's draws
  // (0, 1, ...) so the decision is a pure function of the state, the step and the draw.
  virtual bool Skip(const std::string& prompt, int step, uint64_t draw) {
    (void)prompt;
    (void)step;
    (void)draw;
    return false;
  }
  // Samples of a newly drawn prompt in the first round.
  virtual int FirstRound() const = 0;
  // Extra samples per group after the first round (same order; 0 = none).
  virtual std::vector<int> TopUps(const std::vector<GroupRewards>& groups) const {
    return std::vector<int>(groups.size(), 0);
  }
  // Every group of a round with its final rewards.
  virtual void Observe(const std::vector<GroupRewards>& groups) { (void)groups; }
  // Per-step metrics fields (e.g. skipped prompts); called after the step's last Observe.
  virtual void AddMetrics(nlohmann::json* j) const { (void)j; }
  // The step is over (after AddMetrics): adaptive policies update here.
  virtual void EndStep() {}
  // Checkpoint state (null when the policy has none) and back; RestoreState checks everything
  // before it changes anything.
  virtual nlohmann::json SaveState() const { return nullptr; }
  virtual Status RestoreState(const nlohmann::json& state) {
    (void)state;
    return Status::Ok();
  }
};

// The policy rollout.budget.policy names, for a job whose rewards count as correct at
// `correct_threshold` (the reward's; pilot's accuracy band uses it).
std::unique_ptr<SamplingPolicy> MakeSamplingPolicy(const JobConfig& cfg, double correct_threshold);

// The unbiased variance of `v` (0 for fewer than two values).
double RewardVariance(const std::vector<double>& v);

}  // namespace gyre::algorithm
