#pragma once
// StepReport: what a GRPO step writes to metrics.jsonl and prints as its progress line
// (docs/metrics.md), built from the step's scores, generation counters and timings.
//
// Thread contract: plain functions of their arguments.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "controller/rollout_scheduler.h"
#include "controller/step_scorer.h"

namespace gyre::controller {

struct StepRecord {
  int step = 0;
  int steps = 0;        // trainer.steps
  int64_t version = 0;  // the policy version after the step
  const StepScores* scores = nullptr;
  const GenerateStats* gen = nullptr;
  double step_s = 0, generate_s = 0, train_s = 0, publish_s = 0;
  // Generation's time window: the step's generation (synchronous), or the whole step, during
  // all of which rollout runs (rollout.async).
  double window_s = 0;
  int zero_variance_groups = 0;
  int rounds = 1;  // generation rounds (algorithm.filter_zero_variance)
  bool filter_zero_variance = false;
  bool overlong_shaping = false;  // algorithm.overlong_buffer > 0: report the penalised count
  bool median_pivots = false;     // algorithm.advantage: median: report the pivots left out
  // algorithm.kl_in: reward: the kept samples' mean KL to the reference (before kl_coef).
  bool has_kl_reward = false;
  double kl_reward = 0;
  int relay_rounds = -1;         // peer relay rounds of the publish; -1 = no peer relay
  int relay_fanout = 0;          // the publish's relay fan-out (0 = no peer relay)
  int64_t partial_carried = -1;  // partial rollouts: groups carried on; -1 = not partial
  nlohmann::json extra = nlohmann::json::object();  // mode-specific fields (async queues)
  std::map<std::string, double> train;              // the trainer's metrics (loss, ...)
};

// The step's metrics.jsonl record ("phase": "grpo").
nlohmann::json StepMetrics(const StepRecord& r);
// The progress line: "step    3/40  reward 0.412  acc 0.400  ...", without a newline.
std::string StepProgressLine(const StepRecord& r);
// The live status line's summary of the step: "step 3/40  reward 0.412  acc 0.400  812 tok/s".
std::string StepSummary(const StepRecord& r);

}  // namespace gyre::controller
