// The rollout-budget policies' decisions against values worked out by hand.

#include "algorithm/sampling_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gyre::algorithm {
namespace {

JobConfig Config(const std::string& policy) {
  JobConfig c;
  c.rollout.group_size = 8;
  c.rollout.budget.policy = policy;
  c.rollout.budget.pilot_samples = 4;
  return c;
}

TEST(SamplingPolicyTest, UniformGivesEveryPromptTheWholeGroupAndNoTopUps) {
  auto p = MakeSamplingPolicy(Config("uniform"), 1.0);
  EXPECT_EQ(p->FirstRound(), 8);
  EXPECT_EQ(p->TopUps({{"a", {1, 0}}, {"b", {1, 1}}}), (std::vector<int>{0, 0}));
  EXPECT_FALSE(p->Skip("a", 1, 0));
  EXPECT_TRUE(p->SaveState().is_null());
}

TEST(SamplingPolicyTest, PilotCommitsTheRestOfTheGroupInsideTheAccuracyBand) {
  JobConfig c = Config("pilot");
  c.rollout.budget.pilot_low = 0.25;
  c.rollout.budget.pilot_high = 0.75;
  auto p = MakeSamplingPolicy(c, 1.0);
  EXPECT_EQ(p->FirstRound(), 4);
  // Accuracies 0, 0.25, 0.5, 0.75, 1 (rewards >= 1 count as correct; 0.9 does not).
  const std::vector<GroupRewards> groups = {{"a", {0, 0, 0, 0}}, {"b", {1, 0, 0.9, 0}},
                                            {"c", {1, 1, 0, 0}}, {"d", {1, 1, 1, 0}},
                                            {"e", {1, 1, 1, 1}}, {"f", {}}};  // every reward failed
  EXPECT_EQ(p->TopUps(groups), (std::vector<int>{0, 4, 4, 4, 0, 0}));
  // A custom correct threshold: 0.9 counts at 0.5.
  auto q = MakeSamplingPolicy(c, 0.5);
  EXPECT_EQ(q->TopUps({{"b", {1, 0, 0.9, 0}}}), (std::vector<int>{4}));
}

TEST(SamplingPolicyTest, VarianceGivesTheBudgetToTheHighestVarianceGroupsInChunks) {
  JobConfig c = Config("variance");
  c.rollout.budget.topup_chunk = 2;
  c.rollout.budget.topup_max_group = 12;
  auto p = MakeSamplingPolicy(c, 1.0);
  EXPECT_EQ(p->FirstRound(), 4);
  // Three groups of 4: budget 3 * (8 - 4) = 12. Variances (unbiased): {1,1,0,0} = 1/3,
  // {1,0,0,0} = 1/4, {1,1,1,1} = 0. Round robin in variance order, 2 at a time, capped at 12
  // samples (8 extra) per group: a gets 2, b 2, a 2, b 2, a 2, b 2 = 12.
  const std::vector<GroupRewards> groups = {
      {"b", {1, 0, 0, 0}}, {"a", {1, 1, 0, 0}}, {"z", {1, 1, 1, 1}}};
  EXPECT_EQ(p->TopUps(groups), (std::vector<int>{6, 6, 0}));
  // One group with variance: it takes up to its cap (12 - 4 = 8), the rest is not spent.
  EXPECT_EQ(p->TopUps({{"a", {1, 1, 0, 0}}, {"z", {0, 0, 0, 0}}}), (std::vector<int>{8, 0}));
  // No group with variance: nothing.
  EXPECT_EQ(p->TopUps({{"z", {0, 0, 0, 0}}}), (std::vector<int>{0}));
  EXPECT_NEAR(RewardVariance({1, 1, 0, 0}), 1.0 / 3, 1e-15);
  EXPECT_EQ(RewardVariance({3}), 0.0);
}

TEST(SamplingPolicyTest, GresoSkipsPromptsWithEqualRewardStreaksAndAdaptsItsProbability) {
  JobConfig c = Config("greso");
  c.rollout.budget.greso_streak = 2;
  c.rollout.budget.greso_initial = 1.0;  // skip every eligible prompt
  c.rollout.budget.greso_target = 0.25;
  c.rollout.budget.greso_step = 0.25;
  auto p = MakeSamplingPolicy(c, 1.0);
  EXPECT_EQ(p->FirstRound(), 8);
  // "easy" is all-correct twice, "hard" once, "mixed" varies.
  p->Observe({{"easy", {1, 1}}, {"hard", {0, 0}}, {"mixed", {1, 0}}});
  p->Observe({{"easy", {1, 1}}, {"mixed", {0, 0}}});
  EXPECT_TRUE(p->Skip("easy", 3, 0));
  EXPECT_FALSE(p->Skip("hard", 3, 1));   // a streak of 1 < 2
  EXPECT_FALSE(p->Skip("mixed", 3, 2));  // its streak restarted at the second group
  EXPECT_FALSE(p->Skip("unseen", 3, 3));
  nlohmann::json m;
  p->AddMetrics(&m);
  EXPECT_EQ(m["skipped_prompts"], 1);
  EXPECT_EQ(m["skip_probability"], 1.0);
  EXPECT_EQ(m["history_prompts"], 3);
  // 4 of the 5 groups had equal rewards (0.8 > target 0.25): p stays at its maximum 1.
  p->EndStep();
  p->AddMetrics(&m);
  EXPECT_EQ(m["skipped_prompts"], 0);
  EXPECT_EQ(m["skip_probability"], 1.0);
  // A step of varied groups only: p falls by greso_step to 0.75, then 0.5.
  p->Observe({{"mixed", {1, 0}}});
  p->EndStep();
  p->Observe({{"mixed", {1, 0}}});
  p->EndStep();
  p->AddMetrics(&m);
  EXPECT_EQ(m["skip_probability"], 0.5);

  // The state round-trips into a fresh policy, which then decides alike.
  const nlohmann::json state = p->SaveState();
  EXPECT_EQ(state["streaks"]["easy"], 2);
  auto q = MakeSamplingPolicy(c, 1.0);
  ASSERT_TRUE(q->RestoreState(state).ok());
  EXPECT_EQ(q->SaveState(), state);
  int same = 0;
  for (uint64_t d = 0; d < 200; ++d) same += p->Skip("easy", 9, d) == q->Skip("easy", 9, d);
  EXPECT_EQ(same, 200);
  // At p = 0.5 about half of 200 draws skip (a deterministic function of seed, step and draw).
  int skipped = 0;
  for (uint64_t d = 0; d < 200; ++d) skipped += q->Skip("easy", 10, d);
  EXPECT_GT(skipped, 70);
  EXPECT_LT(skipped, 130);
}

TEST(SamplingPolicyTest, GresoRefusesABrokenStateAndKeepsItsOwn) {
  JobConfig c = Config("greso");
  auto p = MakeSamplingPolicy(c, 1.0);
  p->Observe({{"easy", {1, 1}}});
  const nlohmann::json good = p->SaveState();
  for (const nlohmann::json& bad :
       {nlohmann::json(nullptr), nlohmann::json{{"policy", "pilot"}},
        nlohmann::json{{"policy", "greso"}, {"skip_probability", 2.0}, {"streaks", {}}},
        nlohmann::json{{"policy", "greso"}, {"skip_probability", 0.5}, {"streaks", 3}},
        nlohmann::json{
            {"policy", "greso"}, {"skip_probability", 0.5}, {"streaks", {{"easy", -1}}}}}) {
    const Status s = p->RestoreState(bad);
    EXPECT_FALSE(s.ok()) << bad.dump();
    EXPECT_NE(s.message().find("sampling policy state"), std::string::npos) << s.message();
    EXPECT_EQ(p->SaveState(), good) << bad.dump();
  }
}

}  // namespace
}  // namespace gyre::algorithm
