// include/gyre/algorithms.h: the public plain-array API against hand-computed values.
#include <gtest/gtest.h>
#include <gyre/algorithms.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

TEST(PublicAlgorithmsTest, NamesComeFromTheRegistry) {
  EXPECT_EQ(gyre::AlgorithmNames("algorithm.policy_loss"),
            (std::vector<std::string>{"ppo", "gspo", "cispo", "sao", "gmpo"}));
  EXPECT_EQ(gyre::AlgorithmNames("algorithm.kl"),
            (std::vector<std::string>{"none", "k1", "k2", "k3"}));
  EXPECT_EQ(gyre::AlgorithmNames("rollout.budget.policy"),
            (std::vector<std::string>{"uniform", "pilot", "variance", "greso"}));
  EXPECT_TRUE(gyre::AlgorithmNames("algorithm.nothing").empty());
}

TEST(PublicAlgorithmsTest, GroupAdvantagesByName) {
  // {1, 0, 0, 1}: mean 0.5, unbiased std sqrt(1/3); {3, 1}: rloo would be 2 * (+-1).
  auto grpo = gyre::GroupAdvantages("grpo", {1, 0, 0, 1}, {4});
  ASSERT_TRUE(grpo.ok()) << grpo.status();
  const double a = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-6);
  EXPECT_NEAR((*grpo)[0], a, 1e-6);
  EXPECT_NEAR((*grpo)[1], -a, 1e-6);
  auto rloo = gyre::GroupAdvantages("rloo", {3, 1}, {2});
  ASSERT_TRUE(rloo.ok());
  EXPECT_EQ(*rloo, (std::vector<float>{2, -2}));
  EXPECT_FALSE(gyre::GroupAdvantages("grpoo", {1, 0}, {2}).ok());
  EXPECT_FALSE(gyre::GroupAdvantages("grpo", {1, 0}, {3}).ok());
}

TEST(PublicAlgorithmsTest, PolicyLossValueAndGradient) {
  // Two tokens of one sequence, ratios 1.5 and 1.1 (logp_old -1), advantage 1, plus a padding
  // token with NaN. CISPO: -clip(1.5) = -1.28 and -1.1, token mean -1.19; every token keeps its
  // gradient -clip(r) / 2.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logp = {static_cast<float>(-1 + std::log(1.5)),
                                   static_cast<float>(-1 + std::log(1.1)), nan};
  const std::vector<float> old = {-1, -1, nan}, adv = {1, 1, nan}, mask = {1, 1, 0};
  gyre::PolicyLossArrays arrays;
  arrays.sequences = 1;
  arrays.tokens_per_sequence = 3;
  arrays.logp = logp.data();
  arrays.logp_old = old.data();
  arrays.advantages = adv.data();
  arrays.mask = mask.data();
  gyre::PolicyLossOptions opts;
  opts.loss = "cispo";
  std::vector<float> grad(3, -9);
  auto v = gyre::PolicyLoss(arrays, opts, grad.data());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_NEAR(v->loss, -1.19, 1e-6);
  EXPECT_NEAR(v->clip_fraction, 0.5, 1e-12);
  EXPECT_EQ(v->tokens, 2);
  EXPECT_NEAR(grad[0], -0.64, 1e-6);
  EXPECT_NEAR(grad[1], -0.55, 1e-6);
  EXPECT_EQ(grad[2], 0.0f);
  // PPO on the same tokens clips the first: no gradient there.
  opts.loss = "ppo";
  v = gyre::PolicyLoss(arrays, opts, grad.data());
  ASSERT_TRUE(v.ok());
  EXPECT_NEAR(v->loss, (-1.28 - 1.1) / 2, 1e-6);
  EXPECT_EQ(grad[0], 0.0f);

  // Bad requests name what to fix.
  opts.loss = "ppoo";
  EXPECT_NE(gyre::PolicyLoss(arrays, opts, nullptr)
                .status()
                .message()
                .find("'ppoo' is not one of ppo, gspo, cispo, sao, gmpo"),
            std::string::npos);
  opts.loss = "ppo";
  opts.kl = "k2";
  EXPECT_NE(gyre::PolicyLoss(arrays, opts, nullptr).status().message().find("needs logp_ref"),
            std::string::npos);
  opts.kl = "none";
  opts.correction = "tis";
  EXPECT_NE(gyre::PolicyLoss(arrays, opts, nullptr).status().message().find("needs logp_rollout"),
            std::string::npos);
  opts.correction = "none";
  arrays.mask = nullptr;
  EXPECT_FALSE(gyre::PolicyLoss(arrays, opts, nullptr).ok());
}

TEST(PublicAlgorithmsTest, KlEstimates) {
  double g = 0;
  auto k3 = gyre::KlEstimate("k3", -1.0, -1.5, &g);  // d = 0.5
  ASSERT_TRUE(k3.ok());
  EXPECT_NEAR(*k3, std::exp(-0.5) + 0.5 - 1, 1e-6);
  EXPECT_NEAR(g, 1 - std::exp(-0.5), 1e-6);
  auto k2 = gyre::KlEstimate("k2", -1.0, -1.5, &g);
  EXPECT_NEAR(*k2, 0.125, 1e-6);
  EXPECT_NEAR(g, 0.5, 1e-6);
  EXPECT_NEAR(*gyre::KlEstimate("k1", -1.0, -1.5, nullptr), 0.5, 1e-6);
  EXPECT_FALSE(gyre::KlEstimate("k4", 0, 0, nullptr).ok());
}

}  // namespace
