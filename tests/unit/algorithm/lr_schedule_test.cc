// Learning-rate schedules against hand-computed values: the linear warm-up, constant, and
// cosine decay to lr * lr_min_ratio at trainer.steps.
#include "algorithm/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace gyre::algorithm {
namespace {

TrainerSection Trainer(const std::string& schedule, int steps, int warmup, double min_ratio) {
  TrainerSection t;
  t.lr = 1e-3;
  t.lr_schedule = schedule;
  t.steps = steps;
  t.lr_warmup_steps = warmup;
  t.lr_min_ratio = min_ratio;
  return t;
}

TEST(LrScheduleTest, ConstantWithoutWarmUpIsExactlyTheConfiguredRate) {
  const TrainerSection t = Trainer("constant", 10, 0, 0.0);
  for (int step : {1, 5, 10, 11}) EXPECT_EQ(LearningRate(t, step), 1e-3) << step;
}

TEST(LrScheduleTest, WarmUpRampsLinearlyThenHolds) {
  const TrainerSection t = Trainer("constant", 10, 4, 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 0.25e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2), 0.5e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 1e-3);
  EXPECT_EQ(LearningRate(t, 5), 1e-3);
  EXPECT_EQ(LearningRate(t, 10), 1e-3);
}

TEST(LrScheduleTest, CosineDecaysToTheFloorAtTheLastStep) {
  // 2 warm-up steps, then 8 steps of cosine from 1e-3 down to 1e-4.
  const TrainerSection t = Trainer("cosine", 10, 2, 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1), 0.5e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2), 1e-3);
  // Step 6: p = 4 / 8 = 0.5, cos(pi / 2) = 0: halfway between 1e-4 and 1e-3.
  EXPECT_NEAR(LearningRate(t, 6), 5.5e-4, 1e-15);
  // Step 4: p = 0.25: 1e-4 + 9e-4 * (1 + cos(pi / 4)) / 2.
  EXPECT_NEAR(LearningRate(t, 4), 1e-4 + 9e-4 * (1 + std::sqrt(0.5)) / 2, 1e-15);
  EXPECT_NEAR(LearningRate(t, 10), 1e-4, 1e-15);
  EXPECT_NEAR(LearningRate(t, 12), 1e-4, 1e-15);  // past trainer.steps: the last step's rate
  // It never rises after the warm-up.
  for (int s = 3; s <= 10; ++s) EXPECT_LE(LearningRate(t, s), LearningRate(t, s - 1)) << s;
}

TEST(LrScheduleTest, CosineWithNoStepsLeftAfterTheWarmUpEndsAtTheFloor) {
  const TrainerSection t = Trainer("cosine", 3, 3, 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(t, 3), 1e-3);
  EXPECT_NEAR(LearningRate(t, 4), 0.0, 1e-18);
}

}  // namespace
}  // namespace gyre::algorithm
