#include "kernels/reference/policy_loss_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "algorithm/registry.h"

namespace gyre::kernels {
namespace {

const float kNan = std::numeric_limits<float>::quiet_NaN();

// Owns the [S, T] arrays behind a PolicyLossInputs.
struct Batch {
  int64_t S, T;
  std::vector<float> logp, logp_old, logp_rollout, logp_ref, advantages, mask;

  Batch(int64_t s, int64_t t)
      : S(s),
        T(t),
        logp(s * t, 0.0f),
        logp_old(s * t, 0.0f),
        logp_rollout(s * t, 0.0f),
        logp_ref(s * t, 0.0f),
        advantages(s * t, 0.0f),
        mask(s * t, 1.0f) {}

  PolicyLossInputs Inputs() const {
    PolicyLossInputs in;
    in.S = S;
    in.T = T;
    in.logp = logp.data();
    in.logp_old = logp_old.data();
    in.logp_rollout = logp_rollout.data();
    in.logp_ref = logp_ref.data();
    in.advantages = advantages.data();
    in.mask = mask.data();
    return in;
  }
};

// A single token with log-ratio `log_ratio` and advantage `adv`.
Batch OneToken(double log_ratio, float adv) {
  Batch b(1, 1);
  b.logp_old[0] = -1.0f;
  b.logp[0] = static_cast<float>(-1.0 + log_ratio);
  b.advantages[0] = adv;
  return b;
}

struct Outcome {
  PolicyLossStats stats;
  std::vector<float> grad;
};

Outcome Compute(const Batch& b, const PolicyLossParams& p) {
  Outcome o{{}, std::vector<float>(b.S * b.T, -99.0f)};
  o.stats = PolicyLossRef(b.Inputs(), p, o.grad.data());
  return o;
}

// The names live in the registry, which maps each to its kernel value.
TEST(PolicyLossRefTest, AggregationAndKlNamesComeFromTheRegistry) {
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum, LossAgg::kSeqMeanTokenMean,
                      LossAgg::kSeqMeanTokenSumNorm}) {
    auto parsed = algorithm::LossAggFor(algorithm::NameOf(agg));
    ASSERT_TRUE(parsed.ok()) << algorithm::NameOf(agg);
    EXPECT_EQ(*parsed, agg);
  }
  EXPECT_EQ(*algorithm::LossAggFor("seq-mean-token-sum-norm"), LossAgg::kSeqMeanTokenSumNorm);
  EXPECT_FALSE(algorithm::LossAggFor("token_mean").ok());

  for (KlKind kl : {KlKind::kNone, KlKind::kK1, KlKind::kK2, KlKind::kK3}) {
    auto parsed = algorithm::KlKindFor(algorithm::NameOf(kl));
    ASSERT_TRUE(parsed.ok()) << algorithm::NameOf(kl);
    EXPECT_EQ(*parsed, kl);
  }
  EXPECT_FALSE(algorithm::KlKindFor("K3").ok());
}

TEST(PolicyLossRefTest, PositiveAdvantageClipsAboveOnePlusEpsHigh) {
  // r = 1.5 > 1.28: max(-1.5, -1.28) = -1.28, the clipped branch, so no gradient.
  const Outcome o = Compute(OneToken(std::log(1.5), 1.0f), {});
  EXPECT_NEAR(o.stats.loss, -1.28, 1e-6);
  EXPECT_EQ(o.grad[0], 0.0f);
  EXPECT_EQ(o.stats.clip_frac, 1.0);
  // 0.5 * log(1.5)^2
  EXPECT_NEAR(o.stats.approx_kl, 0.08220097694658271, 1e-6);
}

TEST(PolicyLossRefTest, PositiveAdvantageBelowRangeIsUnclipped) {
  // r = 0.5: max(-0.5, -0.8) = -0.5; d(-A r)/dlogp = -A r = -0.5.
  const Outcome o = Compute(OneToken(std::log(0.5), 1.0f), {});
  EXPECT_NEAR(o.stats.loss, -0.5, 1e-6);
  EXPECT_NEAR(o.grad[0], -0.5, 1e-6);
  EXPECT_EQ(o.stats.clip_frac, 0.0);
  EXPECT_NEAR(o.stats.approx_kl, 0.2402265069591007, 1e-6);  // 0.5 * log(0.5)^2
}

TEST(PolicyLossRefTest, NegativeAdvantageClipsBelowOneMinusEpsLow) {
  // r = 0.5, A = -1: max(0.5, 0.8) = 0.8, clipped.
  const Outcome o = Compute(OneToken(std::log(0.5), -1.0f), {});
  EXPECT_NEAR(o.stats.loss, 0.8, 1e-6);
  EXPECT_EQ(o.grad[0], 0.0f);
  EXPECT_EQ(o.stats.clip_frac, 1.0);
}

TEST(PolicyLossRefTest, InsideTheTrustRegionIsUnclipped) {
  // r = 1.2, A = -1: L = 1.2 and dL/dlogp = 1.2.
  const Outcome o = Compute(OneToken(std::log(1.2), -1.0f), {});
  EXPECT_NEAR(o.stats.loss, 1.2, 1e-6);
  EXPECT_NEAR(o.grad[0], 1.2, 1e-6);
  EXPECT_EQ(o.stats.clip_frac, 0.0);
}

TEST(PolicyLossRefTest, DualClipCapsNegativeAdvantageLoss) {
  // r = 4, A = -1: max(4, 1.28) = 4, capped at -A c = 3 with no gradient.
  const Batch b = OneToken(std::log(4.0), -1.0f);
  const Outcome capped = Compute(b, {});
  EXPECT_NEAR(capped.stats.loss, 3.0, 1e-6);
  EXPECT_EQ(capped.grad[0], 0.0f);
  EXPECT_EQ(capped.stats.dual_clip_frac, 1.0);
  EXPECT_EQ(capped.stats.clip_frac, 0.0);

  PolicyLossParams off;
  off.dual_clip_c = 1.0f;
  const Outcome uncapped = Compute(b, off);
  EXPECT_NEAR(uncapped.stats.loss, 4.0, 1e-5);
  EXPECT_NEAR(uncapped.grad[0], 4.0, 1e-5);
  EXPECT_EQ(uncapped.stats.dual_clip_frac, 0.0);

  // A = -2, r = 2: L = 4 is below the cap 6, so it keeps its gradient -A r = 4.
  const Outcome below = Compute(OneToken(std::log(2.0), -2.0f), {});
  EXPECT_NEAR(below.stats.loss, 4.0, 1e-5);
  EXPECT_NEAR(below.grad[0], 4.0, 1e-5);

  // The dual clip never applies to positive advantages.
  const Outcome positive = Compute(OneToken(std::log(4.0), 1.0f), {});
  EXPECT_NEAR(positive.stats.loss, -1.28, 1e-6);
  EXPECT_EQ(positive.stats.dual_clip_frac, 0.0);
}

TEST(PolicyLossRefTest, LogRatioIsClampedAtTwenty) {
  // log-ratio 25 is clamped to 20: L = -A e^20 with A = -1 (dual clip off), and no gradient.
  Batch b = OneToken(25.0, -1.0f);
  PolicyLossParams p;
  p.dual_clip_c = 0.0f;
  const Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss / 485165195.4097903, 1.0, 1e-6);
  EXPECT_EQ(o.grad[0], 0.0f);
}

PolicyLossParams Kind(PolicyLossKind kind) {
  PolicyLossParams p;
  p.kind = kind;
  return p;
}

TEST(PolicyLossRefTest, PolicyLossKindNamesRoundTrip) {
  for (PolicyLossKind kind : {PolicyLossKind::kPpo, PolicyLossKind::kGspo, PolicyLossKind::kCispo,
                              PolicyLossKind::kSao, PolicyLossKind::kGmpo}) {
    auto parsed = algorithm::PolicyLossKindFor(algorithm::NameOf(kind));
    ASSERT_TRUE(parsed.ok()) << algorithm::NameOf(kind);
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_FALSE(algorithm::PolicyLossKindFor("GSPO").ok());
  EXPECT_FALSE(algorithm::PolicyLossKindFor("").ok());
  EXPECT_STREQ(algorithm::NameOf(PolicyLossKind::kCispo), "cispo");
  EXPECT_STREQ(algorithm::NameOf(PolicyLossKind::kGmpo), "gmpo");
}

// One sequence of two tokens with log ratios x0, x1 and advantage A on both.
Batch TwoTokens(double x0, double x1, float adv) {
  Batch b(1, 2);
  b.logp_old = {-1.0f, -2.0f};
  b.logp = {static_cast<float>(-1.0 + x0), static_cast<float>(-2.0 + x1)};
  b.advantages = {adv, adv};
  return b;
}

TEST(PolicyLossRefTest, GspoUsesTheSequenceMeanLogRatio) {
  // x = (-0.1 + 0.3) / 2 = 0.1, r = e^0.1 = 1.1051709 inside [0.8, 1.28]: every token's term is
  // -r, so the token mean is -r and each token's gradient is -r / 2.
  const Batch b = TwoTokens(-0.1, 0.3, 1.0f);
  const Outcome gspo = Compute(b, Kind(PolicyLossKind::kGspo));
  EXPECT_NEAR(gspo.stats.loss, -1.1051709180756477, 1e-6);
  EXPECT_NEAR(gspo.grad[0], -0.5525854590378238, 1e-6);
  EXPECT_NEAR(gspo.grad[1], -0.5525854590378238, 1e-6);
  EXPECT_EQ(gspo.stats.clip_frac, 0.0);
  // PPO on the same tokens clips the second (e^0.3 = 1.3498588 > 1.28):
  // (-e^-0.1 - 1.28) / 2 = (-0.9048374 - 1.28) / 2.
  const Outcome ppo = Compute(b, {});
  EXPECT_NEAR(ppo.stats.loss, -1.0924187090180120, 1e-6);
  EXPECT_EQ(ppo.stats.clip_frac, 0.5);

  // x = (0.1 + 0.5) / 2 = 0.3, r = 1.3498588 > 1.28: the whole sequence is clipped.
  const Outcome clipped = Compute(TwoTokens(0.1, 0.5, 1.0f), Kind(PolicyLossKind::kGspo));
  EXPECT_NEAR(clipped.stats.loss, -1.28, 1e-6);
  EXPECT_EQ(clipped.grad[0], 0.0f);
  EXPECT_EQ(clipped.grad[1], 0.0f);
  EXPECT_EQ(clipped.stats.clip_frac, 1.0);
}

TEST(PolicyLossRefTest, GspoHasNoDualClip) {
  // x = log 4, A = -1: max(4, 0.8) = 4. PPO would cap at 3; GSPO keeps 4 and the gradient
  // -A r / 2 = 2 per token.
  const Batch b = TwoTokens(std::log(4.0), std::log(4.0), -1.0f);
  const Outcome o = Compute(b, Kind(PolicyLossKind::kGspo));
  EXPECT_NEAR(o.stats.loss, 4.0, 1e-6);
  EXPECT_NEAR(o.grad[0], 2.0, 1e-6);
  EXPECT_EQ(o.stats.dual_clip_frac, 0.0);
  EXPECT_NEAR(Compute(b, {}).stats.loss, 3.0, 1e-6);
}

// GMPO (arXiv:2507.20673) by hand: two sequences under seq-mean-token-mean, the paper's objective
// -A exp(mean_t clip(x_t)), with the clip in log space on the side that favours the update.
TEST(PolicyLossRefTest, GmpoTakesTheGeometricMeanOfTheClippedRatios) {
  Batch b(2, 3);
  b.logp_old = {-1.0f, -1.0f, -1.0f, -2.0f, -2.0f, kNan};
  // Sequence 0, A = +1: ratios 1.5, 0.5, 1.1; 1.5 is above hi = 1.28 and is capped there.
  // Sequence 1, A = -1: ratios 0.5, 1.5; 0.5 is below lo = 0.8 and is floored there. Its third
  // token is padding (mask 0, NaN inputs).
  b.logp = {static_cast<float>(-1.0 + std::log(1.5)), static_cast<float>(-1.0 + std::log(0.5)),
            static_cast<float>(-1.0 + std::log(1.1)), static_cast<float>(-2.0 + std::log(0.5)),
            static_cast<float>(-2.0 + std::log(1.5)), kNan};
  b.advantages = {1.0f, 1.0f, 1.0f, -1.0f, -1.0f, kNan};
  b.mask = {1, 1, 1, 1, 1, 0};
  PolicyLossParams p = Kind(PolicyLossKind::kGmpo);
  p.agg = LossAgg::kSeqMeanTokenMean;
  const Outcome o = Compute(b, p);
  const double g0 = std::cbrt(1.28 * 0.5 * 1.1);  // exp(X_0)
  const double g1 = std::sqrt(0.8 * 1.5);         // exp(X_1)
  // Each sequence contributes -A exp(X); seq-mean-token-mean averages the two.
  EXPECT_NEAR(o.stats.loss, (-g0 + g1) / 2, 1e-6);
  EXPECT_NEAR(o.stats.pg_loss, o.stats.loss, 1e-12);
  // d/d logp_t of -A exp(X) / 2 = -A exp(X) / (2 n): 0 for a clipped token.
  EXPECT_EQ(o.grad[0], 0.0f);
  EXPECT_NEAR(o.grad[1], -g0 / 6, 1e-6);
  EXPECT_NEAR(o.grad[2], -g0 / 6, 1e-6);
  EXPECT_EQ(o.grad[3], 0.0f);
  EXPECT_NEAR(o.grad[4], g1 / 4, 1e-6);
  EXPECT_EQ(o.grad[5], 0.0f);
  EXPECT_NEAR(o.stats.clip_frac, 2.0 / 5, 1e-12);
  EXPECT_EQ(o.stats.dual_clip_frac, 0.0);

  // Unlike GSPO, one outlier token does not clip the whole sequence: GSPO on sequence 0 takes
  // the unclipped mean ratio (1.5 * 0.5 * 1.1)^(1/3) = 0.938, inside [0.8, 1.28].
  Batch one(1, 3);
  one.logp_old = {b.logp_old[0], b.logp_old[1], b.logp_old[2]};
  one.logp = {b.logp[0], b.logp[1], b.logp[2]};
  one.advantages = {1.0f, 1.0f, 1.0f};
  EXPECT_NEAR(Compute(one, Kind(PolicyLossKind::kGspo)).stats.loss, -std::cbrt(1.5 * 0.5 * 1.1),
              1e-6);
  EXPECT_NEAR(Compute(one, Kind(PolicyLossKind::kGmpo)).stats.loss, -g0, 1e-6);
}

TEST(PolicyLossRefTest, CispoKeepsTheGradientOfClippedTokens) {
  // r = 1.5, A = 1: L = -clip(r) = -1.28 and the gradient is the detached weight times -A: -1.28.
  const Outcome above = Compute(OneToken(std::log(1.5), 1.0f), Kind(PolicyLossKind::kCispo));
  EXPECT_NEAR(above.stats.loss, -1.28, 1e-6);
  EXPECT_NEAR(above.grad[0], -1.28, 1e-6);
  EXPECT_EQ(above.stats.clip_frac, 1.0);
  // r = 0.5, A = -1: weight clip(0.5) = 0.8, L = 0.8, gradient 0.8 (PPO: clipped, gradient 0).
  const Outcome below = Compute(OneToken(std::log(0.5), -1.0f), Kind(PolicyLossKind::kCispo));
  EXPECT_NEAR(below.stats.loss, 0.8, 1e-6);
  EXPECT_NEAR(below.grad[0], 0.8, 1e-6);
  EXPECT_EQ(below.stats.clip_frac, 1.0);
  // r = 1.1 inside, A = 2: L = -2.2, gradient -2.2, nothing clipped.
  const Outcome inside = Compute(OneToken(std::log(1.1), 2.0f), Kind(PolicyLossKind::kCispo));
  EXPECT_NEAR(inside.stats.loss, -2.2, 1e-6);
  EXPECT_NEAR(inside.grad[0], -2.2, 1e-6);
  EXPECT_EQ(inside.stats.clip_frac, 0.0);
  // r = 4, A = -1: the weight is capped at 1.28 and there is no dual clip: L = 1.28.
  const Outcome far = Compute(OneToken(std::log(4.0), -1.0f), Kind(PolicyLossKind::kCispo));
  EXPECT_NEAR(far.stats.loss, 1.28, 1e-6);
  EXPECT_NEAR(far.grad[0], 1.28, 1e-6);
  EXPECT_EQ(far.stats.dual_clip_frac, 0.0);
}

TEST(PolicyLossRefTest, SaoMasksTokensOutsideTheBandOnBothSides) {
  const PolicyLossParams sao = Kind(PolicyLossKind::kSao);
  // r = 0.5 with A = 1: PPO keeps -0.5 with gradient -0.5; SAO masks it.
  const Outcome low = Compute(OneToken(std::log(0.5), 1.0f), sao);
  EXPECT_EQ(low.stats.loss, 0.0);
  EXPECT_EQ(low.grad[0], 0.0f);
  EXPECT_EQ(low.stats.clip_frac, 1.0);
  EXPECT_EQ(low.stats.tokens, 1.0);  // masked tokens stay in the denominator
  // r = 1.5 with A = 1: masked, L = 0 (PPO: -1.28).
  const Outcome high = Compute(OneToken(std::log(1.5), 1.0f), sao);
  EXPECT_EQ(high.stats.loss, 0.0);
  EXPECT_EQ(high.grad[0], 0.0f);
  // r = 1.2 with A = -1: inside, L = 1.2, gradient 1.2.
  const Outcome inside = Compute(OneToken(std::log(1.2), -1.0f), sao);
  EXPECT_NEAR(inside.stats.loss, 1.2, 1e-6);
  EXPECT_NEAR(inside.grad[0], 1.2, 1e-6);
  EXPECT_EQ(inside.stats.clip_frac, 0.0);
  // Token mean over one masked and one kept token: (0 + 1.2) / 2.
  Batch two = TwoTokens(std::log(0.5), std::log(1.2), -1.0f);
  const Outcome mixed = Compute(two, sao);
  EXPECT_NEAR(mixed.stats.loss, 0.6, 1e-6);
  EXPECT_EQ(mixed.grad[0], 0.0f);
  EXPECT_NEAR(mixed.grad[1], 0.6, 1e-6);
  EXPECT_EQ(mixed.stats.clip_frac, 0.5);
}

TEST(PolicyLossRefTest, TruncatedImportanceWeightIsCappedAndDetached) {
  // Two on-policy tokens (r = 1, A = 1, so L = -1 and dL/dlogp = -1) with behaviour weights
  // exp(log 3) = 3 -> capped to 2, and exp(log 1.5) = 1.5.
  Batch b(1, 2);
  b.logp = {-1.0f, -2.0f};
  b.logp_old = b.logp;
  b.logp_rollout = {static_cast<float>(-1.0 - std::log(3.0)),
                    static_cast<float>(-2.0 - std::log(1.5))};
  b.advantages = {1.0f, 1.0f};
  PolicyLossParams p;
  p.correction = Correction::kTis;
  const Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss, (-2.0 - 1.5) / 2, 1e-6);
  EXPECT_NEAR(o.stats.pg_loss, o.stats.loss, 1e-12);
  EXPECT_NEAR(o.grad[0], -2.0 / 2, 1e-6);
  EXPECT_NEAR(o.grad[1], -1.5 / 2, 1e-6);
  EXPECT_NEAR(o.stats.tis_mean, 1.75, 1e-6);
  EXPECT_NEAR(o.stats.tis_max, 2.0, 1e-6);

  const Outcome off = Compute(b, {});
  EXPECT_NEAR(off.stats.loss, -1.0, 1e-6);
  EXPECT_EQ(off.stats.tis_mean, 1.0);
  EXPECT_EQ(off.stats.tis_max, 1.0);
}

TEST(PolicyLossRefTest, SequenceLevelTisWeighsEveryTokenOfASequenceAlike) {
  // Sequence 0: d = log 1.2 and log 1.5 on its two masked tokens (the third is padding, NaN), so
  // w = min(1.2 * 1.5, 2) = 1.8 for both. Sequence 1: d = log 3 on one token, w = min(3, 2) = 2.
  // On-policy (r = 1), A = 1: each token's L = -1 and dL/dlogp = -1; token-mean over 3 tokens.
  Batch b(2, 3);
  b.logp = {-1.0f, -2.0f, kNan, -0.5f, kNan, kNan};
  b.logp_old = b.logp;
  b.logp_rollout = {static_cast<float>(-1.0 - std::log(1.2)),
                    static_cast<float>(-2.0 - std::log(1.5)),
                    kNan,
                    static_cast<float>(-0.5 - std::log(3.0)),
                    kNan,
                    kNan};
  b.advantages = {1.0f, 1.0f, kNan, 1.0f, kNan, kNan};
  b.mask = {1, 1, 0, 1, 0, 0};
  PolicyLossParams p;
  p.correction = Correction::kSeqTis;
  const Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss, (-1.8 - 1.8 - 2.0) / 3, 1e-6);
  EXPECT_NEAR(o.grad[0], -1.8 / 3, 1e-6);
  EXPECT_NEAR(o.grad[1], -1.8 / 3, 1e-6);
  EXPECT_EQ(o.grad[2], 0.0f);
  EXPECT_NEAR(o.grad[3], -2.0 / 3, 1e-6);
  EXPECT_NEAR(o.stats.tis_mean, (1.8 + 1.8 + 2.0) / 3, 1e-6);
  EXPECT_NEAR(o.stats.tis_max, 2.0, 1e-6);
  EXPECT_EQ(o.stats.corr_masked_frac, 0.0);

  // Token-level TIS on the same batch weighs them 1.2, 1.5 and 2.
  p.correction = Correction::kTis;
  EXPECT_NEAR(Compute(b, p).stats.loss, (-1.2 - 1.5 - 2.0) / 3, 1e-6);
}

TEST(PolicyLossRefTest, IcePopMasksTokensOutsideTheBandButKeepsThemInTheDenominator) {
  // Four on-policy tokens, A = 1, behaviour weights exp(d) = 0.4, 0.8, 1.9, 2.5 and the band
  // [0.5, 2]: the first and last leave the policy term; the middle two keep their weight.
  Batch b(1, 4);
  b.logp = {-1.0f, -1.0f, -1.0f, -1.0f};
  b.logp_old = b.logp;
  const double e[] = {0.4, 0.8, 1.9, 2.5};
  for (int t = 0; t < 4; ++t) b.logp_rollout[t] = static_cast<float>(-1.0 - std::log(e[t]));
  b.advantages = {1.0f, 1.0f, 1.0f, 1.0f};
  PolicyLossParams p;
  p.correction = Correction::kIcePop;
  p.icepop_low = 0.5f;
  p.icepop_high = 2.0f;
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenMean, LossAgg::kSeqMeanTokenSum}) {
    p.agg = agg;
    const Outcome o = Compute(b, p);
    // token-mean and seq-mean-token-mean both divide by all 4 tokens; seq-mean-token-sum by 1.
    const double denom = agg == LossAgg::kSeqMeanTokenSum ? 1.0 : 4.0;
    EXPECT_NEAR(o.stats.loss, (-0.8 - 1.9) / denom, 1e-5) << algorithm::NameOf(agg);
    EXPECT_EQ(o.grad[0], 0.0f);
    EXPECT_NEAR(o.grad[1], -0.8 / denom, 1e-5);
    EXPECT_NEAR(o.grad[2], -1.9 / denom, 1e-5);
    EXPECT_EQ(o.grad[3], 0.0f);
    EXPECT_NEAR(o.stats.corr_masked_frac, 0.5, 1e-12);
    EXPECT_NEAR(o.stats.tis_mean, (0.8 + 1.9) / 4, 1e-5);
  }
}

TEST(PolicyLossRefTest, M2poThresholdLeavesOutTheFewestLargestValues) {
  // Mean of {0.01, 0.02, 0.03, 0.5, 0.9} = 0.292 > 0.04. Without 0.9: 0.14; without 0.5 too:
  // 0.02 <= 0.04, so the two largest go and the threshold is 0.5.
  const double x[] = {0.5, 0.01, 0.9, 0.03, 0.02};
  EXPECT_EQ(M2poThreshold(x, 5, 0.04), 0.5);
  EXPECT_EQ(M2poThreshold(x, 5, 0.15), 0.9);  // leaving out 0.9 is enough (0.14 <= 0.15)
  EXPECT_EQ(M2poThreshold(x, 5, 0.3), std::numeric_limits<double>::infinity());
  EXPECT_EQ(M2poThreshold(x, 5, 0.001), 0.01);  // every value must go
  EXPECT_EQ(M2poThreshold(nullptr, 0, 0.04), std::numeric_limits<double>::infinity());
  // Ties: {1, 1, 0}: leaving out one 1 gives mean 0.5 > 0.1, both give 0: threshold 1, and both
  // tokens at 1 are masked whatever their order.
  const double ties[] = {1.0, 0.0, 1.0};
  EXPECT_EQ(M2poThreshold(ties, 3, 0.1), 1.0);
  const double tie_rest[] = {1.0, 1.0, 0.0};
  EXPECT_EQ(M2poThreshold(tie_rest, 3, 0.6), 1.0);  // one 1 is enough, but both are at 1
}

TEST(PolicyLossRefTest, M2poMasksTokensAtOrAboveTheThreshold) {
  // d = 0.1, -0.7, 0.3 (d^2 = 0.01, 0.49, 0.09); threshold 0.05 masks the last two. On-policy,
  // A = -1 (L = 1, dL/dlogp = 1), seq-mean-token-mean over one sequence of 3 tokens.
  Batch b(1, 3);
  b.logp = {-1.0f, -2.0f, -3.0f};
  b.logp_old = b.logp;
  const double d[] = {0.1, -0.7, 0.3};
  for (int t = 0; t < 3; ++t) b.logp_rollout[t] = static_cast<float>(b.logp_old[t] - d[t]);
  b.advantages = {-1.0f, -1.0f, -1.0f};
  PolicyLossParams p;
  p.correction = Correction::kM2po;
  p.agg = LossAgg::kSeqMeanTokenMean;
  p.m2po_threshold = 0.05;
  const Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss, 1.0 / 3, 1e-6);
  EXPECT_NEAR(o.grad[0], 1.0 / 3, 1e-6);
  EXPECT_EQ(o.grad[1], 0.0f);
  EXPECT_EQ(o.grad[2], 0.0f);
  EXPECT_NEAR(o.stats.corr_masked_frac, 2.0 / 3, 1e-12);
  EXPECT_NEAR(o.stats.tis_mean, 1.0 / 3, 1e-12);

  // The default threshold (+inf) masks nothing: w = 1 everywhere.
  p.m2po_threshold = std::numeric_limits<double>::infinity();
  EXPECT_NEAR(Compute(b, p).stats.loss, 1.0, 1e-6);
}

TEST(PolicyLossRefTest, KlTermStaysOnTokensTheCorrectionMasks) {
  // IcePop masks the only token (exp(d) = 3 > 2), so the policy term is 0 but the k1 KL term
  // (logp - logp_ref = 0.5, coefficient 0.1) remains, with its gradient.
  Batch b(1, 1);
  b.logp = {-1.0f};
  b.logp_old = b.logp;
  b.logp_rollout = {static_cast<float>(-1.0 - std::log(3.0))};
  b.logp_ref = {-1.5f};
  b.advantages = {1.0f};
  PolicyLossParams p;
  p.correction = Correction::kIcePop;
  p.kl = KlKind::kK1;
  p.kl_coef = 0.1f;
  const Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.pg_loss, 0.0, 1e-12);
  EXPECT_NEAR(o.stats.loss, 0.05, 1e-6);
  EXPECT_NEAR(o.grad[0], 0.1, 1e-6);
}

TEST(PolicyLossRefTest, LogLinearProximalAlphaInterpolatesByVersion) {
  // Token from version 4, proximal (the version before the step) 6, current 7: 2/3 of the way.
  EXPECT_NEAR(LogLinearProximalAlpha(4, 6, 7), 2.0 / 3, 1e-15);
  EXPECT_EQ(LogLinearProximalAlpha(6, 6, 6), 1.0);  // on-policy: the proximal is the current
  EXPECT_EQ(LogLinearProximalAlpha(5, 6, 6), 1.0);  // first mini-batch: current == proximal
  EXPECT_EQ(LogLinearProximalAlpha(6, 6, 8), 0.0);  // proximal == behaviour
  EXPECT_EQ(LogLinearProximalAlpha(9, 6, 7), 1.0);  // no older behaviour: use the current
}

TEST(PolicyLossRefTest, CorrectionNamesRoundTrip) {
  for (Correction c : {Correction::kNone, Correction::kTis, Correction::kSeqTis,
                       Correction::kIcePop, Correction::kM2po}) {
    auto parsed = algorithm::CorrectionFor(algorithm::NameOf(c));
    ASSERT_TRUE(parsed.ok()) << algorithm::NameOf(c);
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_FALSE(algorithm::CorrectionFor("TIS").ok());
}

TEST(PolicyLossRefTest, EachKlEstimatorAndItsGradient) {
  // A = 0 leaves only the KL term. d = logp - logp_ref = -1 - (-1.5) = 0.5.
  Batch b(1, 1);
  b.logp = {-1.0f};
  b.logp_old = b.logp;
  b.logp_ref = {-1.5f};
  struct Case {
    KlKind kind;
    double value, grad;
  };
  const Case cases[] = {
      {KlKind::kK1, 0.5, 1.0},                                 // d, 1
      {KlKind::kK2, 0.125, 0.5},                               // d^2 / 2, d
      {KlKind::kK3, 0.10653065971263342, 0.3934693402873666},  // e^-d + d - 1, 1 - e^-d
  };
  for (const Case& c : cases) {
    PolicyLossParams p;
    p.kl = c.kind;
    p.kl_coef = 0.1f;
    const Outcome o = Compute(b, p);
    EXPECT_NEAR(o.stats.kl, c.value, 1e-7) << algorithm::NameOf(c.kind);
    EXPECT_NEAR(o.stats.loss, 0.1 * c.value, 1e-7) << algorithm::NameOf(c.kind);
    EXPECT_EQ(o.stats.pg_loss, 0.0);
    EXPECT_NEAR(o.grad[0], 0.1 * c.grad, 1e-7) << algorithm::NameOf(c.kind);
  }

  // k3 at d = -2: e^2 - 3 = 4.389 is inside the clamp; gradient 1 - e^2.
  PolicyLossParams p;
  p.kl = KlKind::kK3;
  p.kl_coef = 1.0f;
  b.logp_ref = {1.0f};
  Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.kl, 4.38905609893065, 1e-6);
  EXPECT_NEAR(o.grad[0], -6.38905609893065, 1e-5);
  // At d = -5, e^5 - 6 = 142.4 is clamped to 10 and the gradient vanishes.
  b.logp_ref = {4.0f};
  o = Compute(b, p);
  EXPECT_EQ(o.stats.kl, 10.0);
  EXPECT_EQ(o.grad[0], 0.0f);
}

TEST(PolicyLossRefTest, KlIsAddedToTheTisWeightedPolicyTerm) {
  // A = 1, r = 1: L = -1, w = 2 (capped), k1 = 0.5, coef 0.5: l = 2 * -1 + 0.5 * 0.5 = -1.75.
  Batch b(1, 1);
  b.logp = {-1.0f};
  b.logp_old = {-1.0f};
  b.logp_rollout = {-3.0f};
  b.logp_ref = {-1.5f};
  b.advantages = {1.0f};
  PolicyLossParams p;
  p.correction = Correction::kTis;
  p.kl = KlKind::kK1;
  p.kl_coef = 0.5f;
  const Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss, -1.75, 1e-6);
  EXPECT_NEAR(o.stats.pg_loss, -2.0, 1e-6);
  EXPECT_NEAR(o.stats.kl, 0.5, 1e-6);
  EXPECT_NEAR(o.grad[0], 2 * -1.0 + 0.5 * 1.0, 1e-6);
}

// Two sequences of length 3 with mask {1, 1, 0} and {1, 0, 0}, on-policy (r = 1, so l = -A and
// dl/dlogp = -A), A = {1, 2, *} and {4, *, *}; masked-out entries hold NaN to prove they are
// skipped. Per-sequence sums: -3 (2 tokens) and -4 (1 token).
Batch AggregationBatch() {
  Batch b(2, 3);
  b.logp = {-1.0f, -1.0f, kNan, -1.0f, kNan, kNan};
  b.logp_old = b.logp;
  b.advantages = {1.0f, 2.0f, kNan, 4.0f, kNan, kNan};
  b.mask = {1, 1, 0, 1, 0, 0};
  return b;
}

TEST(PolicyLossRefTest, EachAggregationMode) {
  const Batch b = AggregationBatch();
  struct Case {
    LossAgg agg;
    double loss;
    std::vector<double> grad;
  };
  const Case cases[] = {
      // (-1 - 2 - 4) / 3 tokens
      {LossAgg::kTokenMean, -7.0 / 3, {-1.0 / 3, -2.0 / 3, 0, -4.0 / 3, 0, 0}},
      // (-3 + -4) / 2 sequences
      {LossAgg::kSeqMeanTokenSum, -3.5, {-0.5, -1.0, 0, -2.0, 0, 0}},
      // (-3 / 2 + -4 / 1) / 2
      {LossAgg::kSeqMeanTokenMean, -2.75, {-0.25, -0.5, 0, -2.0, 0, 0}},
      // (-3 + -4) / (2 sequences * 4)
      {LossAgg::kSeqMeanTokenSumNorm, -0.875, {-0.125, -0.25, 0, -0.5, 0, 0}},
  };
  for (const Case& c : cases) {
    PolicyLossParams p;
    p.agg = c.agg;
    p.norm_max_len = 4;
    const Outcome o = Compute(b, p);
    EXPECT_NEAR(o.stats.loss, c.loss, 1e-9) << algorithm::NameOf(c.agg);
    EXPECT_EQ(o.stats.tokens, 3.0);
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(o.grad[i], c.grad[i], 1e-7) << algorithm::NameOf(c.agg);
  }

  // norm_max_len <= 0 falls back to T = 3: -7 / (2 * 3).
  PolicyLossParams p;
  p.agg = LossAgg::kSeqMeanTokenSumNorm;
  EXPECT_NEAR(Compute(b, p).stats.loss, -7.0 / 6, 1e-9);
}

TEST(PolicyLossRefTest, GlobalDenominatorsReplaceLocalCounts) {
  const Batch b = AggregationBatch();
  PolicyLossParams p;
  p.global_tokens = 10;
  Outcome o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss, -0.7, 1e-9);  // -7 / 10
  EXPECT_NEAR(o.grad[3], -0.4, 1e-7);     // -4 / 10
  EXPECT_EQ(o.stats.tokens, 3.0);         // the local count is still reported

  p = {};
  p.agg = LossAgg::kSeqMeanTokenSum;
  p.global_seqs = 5;
  o = Compute(b, p);
  EXPECT_NEAR(o.stats.loss, -1.4, 1e-9);  // -7 / 5

  p.agg = LossAgg::kSeqMeanTokenMean;
  EXPECT_NEAR(Compute(b, p).stats.loss, -1.1, 1e-9);  // (-1.5 - 4) / 5

  p.agg = LossAgg::kSeqMeanTokenSumNorm;
  p.norm_max_len = 4;
  EXPECT_NEAR(Compute(b, p).stats.loss, -0.35, 1e-9);  // -7 / (5 * 4)
}

TEST(PolicyLossRefTest, FullyMaskedSequencesDoNotCountAsSequences) {
  Batch b(3, 3);
  const Batch a = AggregationBatch();
  std::copy(a.logp.begin(), a.logp.end(), b.logp.begin());
  std::copy(a.logp_old.begin(), a.logp_old.end(), b.logp_old.begin());
  std::copy(a.advantages.begin(), a.advantages.end(), b.advantages.begin());
  std::copy(a.mask.begin(), a.mask.end(), b.mask.begin());
  b.mask[6] = b.mask[7] = b.mask[8] = 0.0f;
  b.advantages[6] = 100.0f;
  PolicyLossParams p;
  p.agg = LossAgg::kSeqMeanTokenSum;
  EXPECT_NEAR(Compute(b, p).stats.loss, -3.5, 1e-9);
  p.agg = LossAgg::kSeqMeanTokenMean;
  EXPECT_NEAR(Compute(b, p).stats.loss, -2.75, 1e-9);
}

TEST(PolicyLossRefTest, EmptyMaskGivesZeroNotNan) {
  Batch b = AggregationBatch();
  b.mask.assign(6, 0.0f);
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum, LossAgg::kSeqMeanTokenMean,
                      LossAgg::kSeqMeanTokenSumNorm}) {
    PolicyLossParams p;
    p.agg = agg;
    const Outcome o = Compute(b, p);
    EXPECT_EQ(o.stats.loss, 0.0) << algorithm::NameOf(agg);
    EXPECT_EQ(o.stats.tokens, 0.0);
    EXPECT_EQ(o.stats.clip_frac, 0.0);
    for (float g : o.grad) EXPECT_EQ(g, 0.0f);
  }
}

TEST(PolicyLossRefTest, MissingInputsAreLoud) {
  Batch b(1, 2);
  PolicyLossInputs in = b.Inputs();
  in.logp_rollout = nullptr;
  PolicyLossParams p;
  p.correction = Correction::kTis;
  std::vector<float> grad(2, 0.0f);
  PolicyLossStats s = PolicyLossRef(in, p, grad.data());
  EXPECT_TRUE(std::isnan(s.loss));
  EXPECT_TRUE(std::isnan(grad[0]));

  in = b.Inputs();
  in.logp_ref = nullptr;
  p = {};
  p.kl = KlKind::kK2;
  s = PolicyLossRef(in, p, nullptr);
  EXPECT_TRUE(std::isnan(s.loss));
  EXPECT_TRUE(std::isnan(s.kl));
}

TEST(PolicyLossRefTest, GradientIsOptional) {
  const Batch b = AggregationBatch();
  const PolicyLossStats s = PolicyLossRef(b.Inputs(), {}, nullptr);
  EXPECT_NEAR(s.loss, -7.0 / 3, 1e-9);
}

// Distance in log-ratio space from every kink of the loss: the clip bounds, the dual-clip cap and
// the k3 clamp. Finite differences are only meaningful away from them.
bool NearKink(double log_ratio, double kl_d, const PolicyLossParams& p, double margin) {
  const double kinks[] = {std::log(1.0 - p.clip_eps_low), std::log(1.0 + p.clip_eps_high),
                          std::log(static_cast<double>(p.dual_clip_c))};
  for (double k : kinks) {
    if (std::abs(log_ratio - k) < margin) return true;
  }
  // k3 reaches 10 at d ~ -2.53 and d ~ 11; the test keeps |d| < 2.
  return std::abs(kl_d) > 2.0;
}

class PolicyLossGradientTest : public testing::TestWithParam<LossAgg> {};

TEST_P(PolicyLossGradientTest, MatchesCentralFiniteDifferences) {
  constexpr int64_t kS = 4, kT = 7;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> old_dist(-3.0f, -0.1f);
  std::uniform_real_distribution<float> ratio_dist(-0.6f, 1.4f);  // spans both clips and dual
  std::uniform_real_distribution<float> small(-0.5f, 0.5f);
  std::normal_distribution<float> adv_dist(0.0f, 1.0f);
  std::bernoulli_distribution keep(0.7);

  PolicyLossParams p;
  p.agg = GetParam();
  p.correction = Correction::kTis;
  p.tis_cap = 1.3f;
  p.kl = KlKind::kK3;
  p.kl_coef = 0.25f;
  p.norm_max_len = 10;

  constexpr double kMargin = 0.01;
  Batch b(kS, kT);
  for (int64_t i = 0; i < kS * kT; ++i) {
    // Redraw until the token sits away from every kink.
    do {
      b.logp_old[i] = old_dist(rng);
      b.logp[i] = b.logp_old[i] + ratio_dist(rng);
      b.logp_ref[i] = b.logp[i] + 1.5f * small(rng);
    } while (NearKink(static_cast<double>(b.logp[i]) - b.logp_old[i],
                      static_cast<double>(b.logp[i]) - b.logp_ref[i], p, kMargin));
    b.logp_rollout[i] = b.logp_old[i] + small(rng);
    b.advantages[i] = adv_dist(rng);
    b.mask[i] = keep(rng) ? 1.0f : 0.0f;
  }
  // Pin one token on each constant branch so every run checks that their gradients vanish:
  // dual clip (A < 0, r = e^1.3 > 3) and the upper PPO clip (A > 0, r = e^0.4 > 1.28).
  b.logp[1] = b.logp_old[1] + 1.3f;
  b.advantages[1] = -1.0f;
  b.logp[2] = b.logp_old[2] + 0.4f;
  b.advantages[2] = 1.0f;
  for (int64_t i : {0, 1, 2}) {
    b.logp_ref[i] = b.logp[i];
    b.mask[i] = 1.0f;
  }

  std::vector<float> grad(kS * kT);
  const PolicyLossStats base = PolicyLossRef(b.Inputs(), p, grad.data());
  EXPECT_GT(base.clip_frac, 0.0);
  EXPECT_GT(base.dual_clip_frac, 0.0);
  EXPECT_LT(base.tis_mean, base.tis_max);

  constexpr float kStep = 1e-3f;
  for (int64_t i = 0; i < kS * kT; ++i) {
    Batch plus = b, minus = b;
    plus.logp[i] = b.logp[i] + kStep;
    minus.logp[i] = b.logp[i] - kStep;
    // The float inputs round the step; divide by the step actually taken.
    const double h = static_cast<double>(plus.logp[i]) - minus.logp[i];
    const double fd = (PolicyLossRef(plus.Inputs(), p, nullptr).loss -
                       PolicyLossRef(minus.Inputs(), p, nullptr).loss) /
                      h;
    EXPECT_NEAR(grad[i], fd, 1e-6 + 1e-4 * std::abs(fd)) << "token " << i;
    if (b.mask[i] == 0.0f) {
      EXPECT_EQ(grad[i], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, PolicyLossGradientTest,
                         testing::Values(LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum,
                                         LossAgg::kSeqMeanTokenMean, LossAgg::kSeqMeanTokenSumNorm),
                         [](const testing::TestParamInfo<LossAgg>& info) {
                           std::string name = algorithm::NameOf(info.param);
                           std::string out;
                           for (char c : name) {
                             if (c != '-') out += c;
                           }
                           return out;
                         });

// Every policy-loss kind against central finite differences, with KL and the kinds' own
// constant branches. The sequence kinds' gradient is exact only with a weight constant over each
// sequence (the header), so the test uses seq-tis there.
class PolicyLossKindGradientTest
    : public testing::TestWithParam<std::tuple<PolicyLossKind, LossAgg>> {};

TEST_P(PolicyLossKindGradientTest, MatchesCentralFiniteDifferences) {
  constexpr int64_t kS = 5, kT = 6;
  const auto [kind, agg] = GetParam();
  PolicyLossParams p;
  p.kind = kind;
  p.agg = agg;
  const bool sequence_kind = kind == PolicyLossKind::kGspo || kind == PolicyLossKind::kGmpo;
  p.correction = sequence_kind ? Correction::kSeqTis : Correction::kTis;
  p.tis_cap = 1.3f;
  p.kl = KlKind::kK2;
  p.kl_coef = 0.25f;
  p.norm_max_len = 9;

  std::mt19937 rng(23);
  std::uniform_real_distribution<float> old_dist(-3.0f, -0.1f);
  std::uniform_real_distribution<float> ratio_dist(-0.6f, 1.4f);
  std::uniform_real_distribution<float> small(-0.5f, 0.5f);
  std::normal_distribution<float> adv_dist(0.0f, 1.0f);
  std::bernoulli_distribution keep(0.75);
  const double kinks[] = {std::log(1.0 - p.clip_eps_low), std::log(1.0 + p.clip_eps_high),
                          std::log(static_cast<double>(p.dual_clip_c))};
  auto near_kink = [&](double x) {
    for (double k : kinks) {
      if (std::abs(x - k) < 0.01) return true;
    }
    return false;
  };

  Batch b(kS, kT);
  for (int64_t s = 0; s < kS; ++s) {
    const float adv = adv_dist(rng);  // one advantage per sequence, as the trainer gives
    bool retry = true;
    while (retry) {
      retry = false;
      double x_sum = 0.0, n = 0.0;
      for (int64_t t = 0; t < kT; ++t) {
        const int64_t i = s * kT + t;
        b.logp_old[i] = old_dist(rng);
        b.logp[i] = b.logp_old[i] + ratio_dist(rng);
        b.logp_ref[i] = b.logp[i] + small(rng);
        b.logp_rollout[i] = b.logp_old[i] + small(rng);
        b.advantages[i] = adv;
        b.mask[i] = t == 0 || keep(rng) ? 1.0f : 0.0f;
        const double x = static_cast<double>(b.logp[i]) - b.logp_old[i];
        if (b.mask[i] != 0.0f) {
          x_sum += x;
          n += 1.0;
        }
        if (kind != PolicyLossKind::kGspo && near_kink(x)) retry = true;
      }
      if (kind == PolicyLossKind::kGspo && near_kink(x_sum / n)) retry = true;
    }
  }

  std::vector<float> grad(kS * kT);
  const PolicyLossStats base = PolicyLossRef(b.Inputs(), p, grad.data());
  EXPECT_GT(base.clip_frac, 0.0);  // the batch reaches the kind's clipped or masked branch
  EXPECT_LT(base.clip_frac, 1.0);

  constexpr float kStep = 1e-3f;
  for (int64_t i = 0; i < kS * kT; ++i) {
    Batch plus = b, minus = b;
    plus.logp[i] = b.logp[i] + kStep;
    minus.logp[i] = b.logp[i] - kStep;
    const double h = static_cast<double>(plus.logp[i]) - minus.logp[i];
    const double fd = (PolicyLossRef(plus.Inputs(), p, nullptr).loss -
                       PolicyLossRef(minus.Inputs(), p, nullptr).loss) /
                      h;
    if (kind == PolicyLossKind::kCispo && b.mask[i] != 0.0f) {
      // Where CISPO's weight is clipped its loss is flat in logp but its gradient is not (the
      // detached-weight form, checked by CispoKeepsTheGradientOfClippedTokens): no finite
      // difference to compare with.
      const double r = std::exp(static_cast<double>(b.logp[i]) - b.logp_old[i]);
      if (r < 1.0 - p.clip_eps_low || r > 1.0 + p.clip_eps_high) continue;
    }
    EXPECT_NEAR(grad[i], fd, 1e-6 + 1e-4 * std::abs(fd)) << "token " << i;
    if (b.mask[i] == 0.0f) {
      EXPECT_EQ(grad[i], 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, PolicyLossKindGradientTest,
    testing::Combine(testing::ValuesIn(algorithm::BuiltinPolicyLossKinds()),
                     testing::Values(LossAgg::kTokenMean, LossAgg::kSeqMeanTokenMean,
                                     LossAgg::kSeqMeanTokenSumNorm)),
    [](const testing::TestParamInfo<PolicyLossKindGradientTest::ParamType>& info) {
      std::string name = std::string(algorithm::NameOf(std::get<0>(info.param))) + "_" +
                         algorithm::NameOf(std::get<1>(info.param));
      std::string out;
      for (char c : name) {
        if (c != '-') out += c;
      }
      return out;
    });

}  // namespace
}  // namespace gyre::kernels
