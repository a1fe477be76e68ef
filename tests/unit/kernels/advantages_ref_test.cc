#include "kernels/reference/advantages_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "algorithm/registry.h"

namespace gyre::kernels {
namespace {

constexpr float kEps = 1e-6f;

struct Result {
  std::vector<float> advantages;
  std::vector<uint8_t> zero_variance;
};

Result Compute(const std::vector<float>& rewards, const std::vector<int32_t>& offsets,
               AdvantageKind kind) {
  const int32_t groups = static_cast<int32_t>(offsets.size()) - 1;
  Result r{std::vector<float>(rewards.size(), -123.0f), std::vector<uint8_t>(groups, 7)};
  GroupAdvantagesRef(rewards.data(), offsets.data(), groups, kind, kEps, r.advantages.data(),
                     r.zero_variance.data());
  return r;
}

void ExpectAdvantages(const Result& r, const std::vector<double>& expected) {
  ASSERT_EQ(r.advantages.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(r.advantages[i], expected[i], 1e-6) << "sample " << i;
  }
}

// The names live in the registry, which maps each to its kernel kind.
TEST(AdvantagesRefTest, EveryKindHasOneRegistryNameAndUnknownNamesAreRefused) {
  for (AdvantageKind kind :
       {AdvantageKind::kGrpo, AdvantageKind::kGrpoNoStd, AdvantageKind::kRloo,
        AdvantageKind::kMedian, AdvantageKind::kReinforcePpBaseline, AdvantageKind::kReinforcePp}) {
    const std::string name = algorithm::NameOf(kind);
    auto entry = algorithm::Find(algorithm::Family::kAdvantage, name);
    ASSERT_TRUE(entry.ok()) << name;
    EXPECT_EQ(entry->advantage_kind, kind) << name;
    EXPECT_EQ(entry->batch_advantage, nullptr) << name;
  }
  EXPECT_STREQ(algorithm::NameOf(AdvantageKind::kReinforcePpBaseline), "reinforce_pp_baseline");
  for (const std::string bad : {"", "GRPO", "grpo ", "reinforce++", "dr_grpo"}) {
    EXPECT_FALSE(algorithm::Find(algorithm::Family::kAdvantage, bad).ok()) << bad;
  }
}

// One group {1, 0, 0, 1}: mean 0.5; unbiased variance (4 * 0.25) / 3 = 1/3.
TEST(AdvantagesRefTest, GrpoDividesByUnbiasedStdPlusEps) {
  const Result r = Compute({1, 0, 0, 1}, {0, 4}, AdvantageKind::kGrpo);
  // 0.5 / (sqrt(1/3) + 1e-6) = 0.5 / 0.5773512691896258
  const double a = 0.8660239037870368;
  ExpectAdvantages(r, {a, -a, -a, a});
  EXPECT_EQ(r.zero_variance[0], 0);
}

TEST(AdvantagesRefTest, GrpoNoStdSubtractsTheMean) {
  ExpectAdvantages(Compute({1, 0, 0, 1}, {0, 4}, AdvantageKind::kGrpoNoStd),
                   {0.5, -0.5, -0.5, 0.5});
}

TEST(AdvantagesRefTest, RlooScalesByNOverNMinusOne) {
  // 4/3 * +-0.5; equivalently R_i minus the mean of the other three (1 - 1/3, 0 - 2/3).
  const double a = 2.0 / 3.0;
  ExpectAdvantages(Compute({1, 0, 0, 1}, {0, 4}, AdvantageKind::kRloo), {a, -a, -a, a});
}

TEST(AdvantagesRefTest, MedianUsesTheMiddleValue) {
  // Odd: median of {3, 1, 2} is 2.
  ExpectAdvantages(Compute({3, 1, 2}, {0, 3}, AdvantageKind::kMedian), {1, -1, 0});
  // Even: median of {4, 1, 2, 10} is (2 + 4) / 2 = 3.
  ExpectAdvantages(Compute({4, 1, 2, 10}, {0, 4}, AdvantageKind::kMedian), {1, -2, -1, 7});
}

// Groups of 3, 1 and 2: {1, 2, 3} (mean 2, unbiased std 1), {5} alone, {2, 2} equal.
const std::vector<float> kUnevenRewards = {1, 2, 3, 5, 2, 2};
const std::vector<int32_t> kUnevenOffsets = {0, 3, 4, 6};

TEST(AdvantagesRefTest, UnevenGroupsWithSingletonAndZeroVariance) {
  const double g = 1.0 / (1.0 + 1e-6);  // (R - 2) / (1 + eps) for R - 2 = 1
  const Result grpo = Compute(kUnevenRewards, kUnevenOffsets, AdvantageKind::kGrpo);
  ExpectAdvantages(grpo, {-g, 0, g, 0, 0, 0});
  EXPECT_EQ(grpo.zero_variance, (std::vector<uint8_t>{0, 1, 1}));

  ExpectAdvantages(Compute(kUnevenRewards, kUnevenOffsets, AdvantageKind::kGrpoNoStd),
                   {-1, 0, 1, 0, 0, 0});
  // 3/2 * {-1, 0, 1}; the group of one gets 0 rather than a division by zero.
  ExpectAdvantages(Compute(kUnevenRewards, kUnevenOffsets, AdvantageKind::kRloo),
                   {-1.5, 0, 1.5, 0, 0, 0});
  ExpectAdvantages(Compute(kUnevenRewards, kUnevenOffsets, AdvantageKind::kMedian),
                   {-1, 0, 1, 0, 0, 0});
  for (AdvantageKind kind : {AdvantageKind::kGrpoNoStd, AdvantageKind::kRloo,
                             AdvantageKind::kMedian, AdvantageKind::kReinforcePpBaseline}) {
    EXPECT_EQ(Compute(kUnevenRewards, kUnevenOffsets, kind).zero_variance, grpo.zero_variance);
  }
}

TEST(AdvantagesRefTest, ReinforcePpBaselineWhitensOverTheBatch) {
  // Groups {1, 0} and {3, 3}: centred {0.5, -0.5, 0, 0}; batch mean 0; unbiased std
  // sqrt(0.5 / 3) = sqrt(1/6) = 0.408248290463863; 0.5 / (0.408248290463863 + 1e-6).
  const double a = 1.2247418713989375;
  const Result r = Compute({1, 0, 3, 3}, {0, 2, 4}, AdvantageKind::kReinforcePpBaseline);
  ExpectAdvantages(r, {a, -a, 0, 0});
  EXPECT_EQ(r.zero_variance, (std::vector<uint8_t>{0, 1}));

  // The whitening shifts by the batch mean of the centred values: groups {0, 2} and {1, 1, 4}
  // centre to {-1, 1} and {-1, -1, 2}; batch mean 0 again; squares sum to 8, std sqrt(8 / 4).
  const double s = std::sqrt(2.0) + 1e-6;
  ExpectAdvantages(Compute({0, 2, 1, 1, 4}, {0, 2, 5}, AdvantageKind::kReinforcePpBaseline),
                   {-1 / s, 1 / s, -1 / s, -1 / s, 2 / s});
}

TEST(AdvantagesRefTest, ReinforcePpWhitensTheRawRewardsOverTheBatch) {
  // No group baseline: {1, 0, 3, 3} has batch mean 1.75, deviations {-0.75, -1.75, 1.25, 1.25},
  // squares summing to 6.75, unbiased std sqrt(6.75 / 3) = 1.5.
  const double s = 1.5 + 1e-6;
  const Result r = Compute({1, 0, 3, 3}, {0, 2, 4}, AdvantageKind::kReinforcePp);
  ExpectAdvantages(r, {-0.75 / s, -1.75 / s, 1.25 / s, 1.25 / s});
  // The all-equal group {3, 3} is still flagged, though its advantages are not 0 here.
  EXPECT_EQ(r.zero_variance, (std::vector<uint8_t>{0, 1}));
  // The same batch as one group differs from reinforce_pp_baseline only by the group mean, which
  // whitening removes: one group gives identical advantages.
  const Result one = Compute({1, 0, 3, 3}, {0, 4}, AdvantageKind::kReinforcePp);
  const Result baseline = Compute({1, 0, 3, 3}, {0, 4}, AdvantageKind::kReinforcePpBaseline);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(one.advantages[i], baseline.advantages[i], 1e-6);
}

TEST(AdvantagesRefTest, SingleSampleBatchIsZero) {
  for (AdvantageKind kind :
       {AdvantageKind::kGrpo, AdvantageKind::kGrpoNoStd, AdvantageKind::kRloo,
        AdvantageKind::kMedian, AdvantageKind::kReinforcePpBaseline, AdvantageKind::kReinforcePp}) {
    const Result r = Compute({0.7f}, {0, 1}, kind);
    EXPECT_EQ(r.advantages[0], 0.0f) << algorithm::NameOf(kind);
    EXPECT_EQ(r.zero_variance[0], 1);
  }
}

TEST(AdvantagesRefTest, AllEqualGroupsGiveExactlyZero) {
  // 0.1f is not exact in binary; the mean must still cancel exactly.
  const std::vector<float> rewards(5, 0.1f);
  for (AdvantageKind kind : {AdvantageKind::kGrpo, AdvantageKind::kGrpoNoStd, AdvantageKind::kRloo,
                             AdvantageKind::kMedian, AdvantageKind::kReinforcePpBaseline}) {
    const Result r = Compute(rewards, {0, 5}, kind);
    for (float a : r.advantages) EXPECT_EQ(a, 0.0f) << algorithm::NameOf(kind);
    EXPECT_EQ(r.zero_variance[0], 1);
  }
}

TEST(AdvantagesRefTest, NanRewardPropagatesInItsGroup) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Result r = Compute({1, nan, 0, 1}, {0, 2, 4}, AdvantageKind::kGrpo);
  EXPECT_TRUE(std::isnan(r.advantages[0]));
  EXPECT_TRUE(std::isnan(r.advantages[1]));
  EXPECT_FALSE(std::isnan(r.advantages[2]));
  EXPECT_EQ(r.zero_variance, (std::vector<uint8_t>{0, 0}));
}

TEST(AdvantagesRefTest, ZeroVarianceOutputIsOptional) {
  std::vector<float> out(4);
  const std::vector<float> rewards = {1, 0, 0, 1};
  const std::vector<int32_t> offsets = {0, 4};
  GroupAdvantagesRef(rewards.data(), offsets.data(), 1, AdvantageKind::kGrpoNoStd, kEps, out.data(),
                     nullptr);
  EXPECT_EQ(out, (std::vector<float>{0.5f, -0.5f, -0.5f, 0.5f}));
}

TEST(AdvantagesRefTest, BroadcastPutsSequenceValueOnMaskedTokens) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values = {2.0f, -1.0f, nan};
  const std::vector<float> mask = {1, 1, 0,  //
                                   0, 1, 1,  //
                                   0, 0, 0};
  std::vector<float> out(9, 5.0f);
  BroadcastToTokensRef(values.data(), mask.data(), 3, 3, out.data());
  // The NaN sequence is fully masked out, so padding stays clean.
  EXPECT_EQ(out, (std::vector<float>{2, 2, 0, 0, -1, -1, 0, 0, 0}));
}

}  // namespace
}  // namespace gyre::kernels
