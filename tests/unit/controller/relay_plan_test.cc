// The relay fan-out rule (controller/relay_plan.h): its time estimate counted by hand, the choice
// it makes for equal and unequal links, and the planner's averages.

#include "controller/relay_plan.h"

#include <gtest/gtest.h>

namespace gyre::controller {
namespace {

TEST(RelayPlanTest, EstimateCountsTheTrainersCopiesThenEachRoundsBusiestSender) {
  // Direct: one trainer copy per receiver.
  EXPECT_DOUBLE_EQ(RelayPublishSeconds(5, 0, 0.5, 1), 2.5);
  EXPECT_DOUBLE_EQ(RelayPublishSeconds(5, 5, 0.5, 1), 2.5);  // F >= N is direct
  EXPECT_DOUBLE_EQ(RelayPublishSeconds(0, 1, 1, 1), 0);
  // 64 receivers, F = 1: the trainer's copy, then holders 1 -> 2 -> 4 -> ... -> 64 in 6 rounds.
  EXPECT_DOUBLE_EQ(RelayPublishSeconds(64, 1, 1, 1), 7);
  // 64, F = 2: 2 trainer copies; holders 2 -> 6 -> 18 -> 54 (2 copies a round), then the last
  // 10 need one copy from 10 of the 54.
  EXPECT_DOUBLE_EQ(RelayPublishSeconds(64, 2, 1, 1), 2 + 2 + 2 + 2 + 1);
  // 5 receivers, F = 3, trainer copies 0.5 s, relays 1 s: 1.5 s, then 2 waiting from 3 holders.
  EXPECT_DOUBLE_EQ(RelayPublishSeconds(5, 3, 0.5, 1), 2.5);
}

TEST(RelayPlanTest, EqualLinksRelayFromFourReceiversOnWithFanOutOne) {
  EXPECT_EQ(ChooseRelayFanout(1, 1, 1), 0);
  EXPECT_EQ(ChooseRelayFanout(2, 1, 1), 0);
  EXPECT_EQ(ChooseRelayFanout(3, 1, 1), 0);  // 3 either way: no relay on a tie
  EXPECT_EQ(ChooseRelayFanout(4, 1, 1), 1);
  EXPECT_EQ(ChooseRelayFanout(64, 1, 1), 1);
  EXPECT_EQ(ChooseRelayFanout(1000, 1, 1), 1);
}

TEST(RelayPlanTest, AFasterTrainerLinkRelaysLaterAndSlowRelaysNotAtAll) {
  // The trainer's link twice as fast as a worker's: direct up to 5 receivers.
  EXPECT_EQ(ChooseRelayFanout(5, 0.5, 1), 0);
  EXPECT_GT(ChooseRelayFanout(6, 0.5, 1), 0);
  // Relays 100x slower than the trainer's copies: never worth it for 64.
  EXPECT_EQ(ChooseRelayFanout(64, 0.01, 1), 0);
  // A trainer far slower than the workers: the fewest trainer copies.
  EXPECT_EQ(ChooseRelayFanout(64, 100, 1), 1);
  // The cap.
  EXPECT_LE(ChooseRelayFanout(1000, 1, 1, 8), 8);
}

TEST(RelayPlanTest, PlannerAveragesWhatItMeasuredAndAssumesEqualLinksUntilThen) {
  RelayPlanner p;
  EXPECT_EQ(p.Choose(3), 0);
  EXPECT_EQ(p.Choose(8), 1);
  p.ObserveTrainer(2.0, 4);  // 0.5 s a copy; relays not measured: taken as equal
  EXPECT_DOUBLE_EQ(p.trainer_copy_s(), 0.5);
  EXPECT_EQ(p.Choose(8), 1);
  p.ObserveRelay(10.0, 1);  // 10 s a copy
  EXPECT_DOUBLE_EQ(p.relay_copy_s(), 10.0);
  EXPECT_EQ(p.Choose(8), 0);
  p.ObserveRelay(0.0, 1);  // the average moves halfway
  EXPECT_DOUBLE_EQ(p.relay_copy_s(), 5.0);
  p.ObserveRelay(1.0, 0);  // no copies: ignored
  EXPECT_DOUBLE_EQ(p.relay_copy_s(), 5.0);
}

TEST(RelayPlanTest, PlannerKeepsItsChoiceUnlessAnotherIsTenPercentQuicker) {
  RelayPlanner p;
  EXPECT_EQ(p.Choose(4), 1);  // equal links: 3 copies' time against 4 direct
  p.ObserveTrainer(1.0, 1);
  p.ObserveRelay(1.2, 1);  // F = 1 3.4 s, F = 2 3.2 s: 6% is not enough to change
  EXPECT_EQ(ChooseRelayFanout(4, 1.0, 1.2), 2);
  EXPECT_EQ(p.Choose(4), 1);
  p.ObserveRelay(3.8, 1);  // relays now 2.5 s a copy: F = 1 6 s, F = 2 4.5 s, direct 4 s
  EXPECT_DOUBLE_EQ(p.relay_copy_s(), 2.5);
  EXPECT_EQ(p.Choose(4), 0);
  EXPECT_EQ(p.Choose(5), 0);  // another number of receivers: chosen afresh (5 s against 5.5)
}

}  // namespace
}  // namespace gyre::controller
