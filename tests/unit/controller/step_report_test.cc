// StepReport and the evaluation's record: the metrics fields computed from a step's timings
// (the two idle fractions) and the evaluation's metrics line and progress line.
#include "controller/step_report.h"

#include <gtest/gtest.h>

#include "controller/evaluation.h"

namespace gyre::controller {
namespace {

TEST(StepReportTest, IdleFractionsCoverGenerationAndTheWholeStep) {
  StepScores scores;
  GenerateStats gen;
  gen.busy_s = {{"rollout-0", 1.0}, {"rollout-1", 2.0}};
  StepRecord r;
  r.scores = &scores;
  r.gen = &gen;
  r.step_s = 8.0;  // a synchronous step: 4 s generating, then training and publishing
  r.generate_s = 4.0;
  r.window_s = 4.0;
  const nlohmann::json j = StepMetrics(r);
  // Within generation: rollout-0 idled 3 of 4 s, rollout-1 2 of 4 s.
  EXPECT_DOUBLE_EQ(j["rollout_idle_fraction"].get<double>(), (0.75 + 0.5) / 2);
  // Over the step: 7 of 8 s and 6 of 8 s.
  EXPECT_DOUBLE_EQ(j["rollout_step_idle_fraction"].get<double>(), (0.875 + 0.75) / 2);
  EXPECT_DOUBLE_EQ(j["rollout_busy_s"]["rollout-1"].get<double>(), 2.0);

  // Asynchronous: generation's window is the step, and the two fractions agree.
  r.window_s = r.step_s;
  const nlohmann::json a = StepMetrics(r);
  EXPECT_DOUBLE_EQ(a["rollout_idle_fraction"].get<double>(),
                   a["rollout_step_idle_fraction"].get<double>());

  // No rollout worker reported (every group filtered before generating): 0, not NaN.
  gen.busy_s.clear();
  EXPECT_EQ(StepMetrics(r)["rollout_step_idle_fraction"].get<double>(), 0.0);
}

TEST(StepReportTest, EvaluationRecordAndProgressLine) {
  EvalOutcome e;
  e.accuracy = 0.5;
  e.correct = 10;
  e.scored = 20;
  e.seconds = 1.5;
  const nlohmann::json j = EvalMetrics("step_10", e, 42);
  EXPECT_EQ(j["phase"], "eval");
  EXPECT_EQ(j["tag"], "step_10");
  EXPECT_EQ(j["problems"], 20);
  EXPECT_EQ(j["reward_errors"], 0);
  EXPECT_EQ(j["policy_version"], 42);
  EXPECT_EQ(EvalProgressLine("step_10", e, 42),
            "eval step_10    held-out accuracy 0.500 (10/20, greedy, policy v42)");
  e.reward_errors = 3;
  EXPECT_EQ(EvalProgressLine("after_rl", e, 7),
            "eval after_rl   held-out accuracy 0.500 (10/20, greedy, policy v7), 3 reward errors");
}

}  // namespace
}  // namespace gyre::controller
