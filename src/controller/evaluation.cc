#include "controller/evaluation.h"

#include <cstdio>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"

namespace gyre::controller {

StatusOr<EvalOutcome> EvaluateHeldOut(const ProblemSource& problems, const PromptEncoder& prompts,
                                      const StepScorer& scorer, double correct_threshold,
                                      RolloutScheduler* scheduler, int64_t version,
                                      uint64_t* next_group_id, const std::string& tag) {
  const auto t0 = SteadyClock::now();
  std::vector<GroupJob> jobs;
  for (const Problem& p : problems.eval_set()) {
    GYRE_ASSIGN_OR_RETURN(GroupJob j, prompts.EvalGroup(p, (*next_group_id)++));
    jobs.push_back(std::move(j));
  }
  GenerateStats stats;
  GYRE_ASSIGN_OR_RETURN(auto samples,
                        scheduler->GenerateAll(jobs, prompts.Greedy(), version, &stats));
  EvalOutcome e;
  std::vector<const Problem*> asked;
  std::vector<const v1::Sample*> answers;
  for (size_t i = 0; i < samples.size(); ++i) {
    asked.push_back(&jobs[i].problem);
    answers.push_back(&samples[i]);
  }
  std::vector<StatusOr<double>> rewards = scorer.Rewards(asked, answers);
  for (size_t i = 0; i < samples.size(); ++i) {
    const StatusOr<double>& r = rewards[i];
    if (!r.ok()) {
      ++e.reward_errors;
      if (e.reward_errors <= 3) {
        GYRE_LOG_WARN("eval {}: reward failed for problem {}: {}", tag, i, r.status().message());
      }
      continue;
    }
    ++e.scored;
    if (*r >= correct_threshold) ++e.correct;
  }
  e.accuracy = e.scored ? static_cast<double>(e.correct) / e.scored : 0.0;
  e.seconds = SecondsSince(t0);
  return e;
}

nlohmann::json EvalMetrics(const std::string& tag, const EvalOutcome& e, int64_t version) {
  return {{"phase", "eval"},
          {"tag", tag},
          {"accuracy", e.accuracy},
          {"problems", e.scored},
          {"reward_errors", e.reward_errors},
          {"policy_version", version},
          {"seconds", e.seconds}};
}

std::string EvalProgressLine(const std::string& tag, const EvalOutcome& e, int64_t version) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "eval %-10s held-out accuracy %.3f (%d/%d, greedy, policy v%lld)",
                tag.c_str(), e.accuracy, e.correct, e.scored, static_cast<long long>(version));
  std::string line = buf;
  if (e.reward_errors) line += ", " + std::to_string(e.reward_errors) + " reward errors";
  return line;
}

}  // namespace gyre::controller
