#pragma once
// Held-out evaluation: every problem of the job's evaluation set, one greedy sample each at the
// current policy version, scored by the job's reward. A reward that fails is counted and
// reported, and left out of the accuracy (never a silent 0).
//
// Thread contract: runs on the caller's thread (the job thread), through the RolloutScheduler.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "controller/prompts.h"
#include "controller/rollout_scheduler.h"
#include "controller/step_scorer.h"
#include "controller/task.h"

namespace gyre::controller {

struct EvalOutcome {
  double accuracy = 0;  // correct / scored, 0 when nothing was scored
  int correct = 0;      // reward >= the reward's correct_threshold()
  int scored = 0;       // problems whose reward was computed
  int reward_errors = 0;
  double seconds = 0;
};

// Evaluates `problems.eval_set()` at policy `version`. Evaluation groups take ids from
// *next_group_id (a space of their own, so evaluating never changes the training run's ids and
// seeds). `tag` names the evaluation in warnings ("before_rl", "step_10", ...).
StatusOr<EvalOutcome> EvaluateHeldOut(const ProblemSource& problems, const PromptEncoder& prompts,
                                      const StepScorer& scorer, double correct_threshold,
                                      RolloutScheduler* scheduler, int64_t version,
                                      uint64_t* next_group_id, const std::string& tag);

// Its metrics.jsonl record ("phase": "eval").
nlohmann::json EvalMetrics(const std::string& tag, const EvalOutcome& e, int64_t version);
// Its progress line: "eval before_rl  held-out accuracy 0.482 (241/500, greedy, policy v1)".
std::string EvalProgressLine(const std::string& tag, const EvalOutcome& e, int64_t version);

}  // namespace gyre::controller
