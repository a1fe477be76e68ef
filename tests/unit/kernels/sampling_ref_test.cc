#include "kernels/reference/sampling_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <vector>

namespace gyre::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Draw {
  int32_t token;
  float logprob;
  float kept_mass;
};

SamplingRowParams Params(float temperature, int32_t top_k = 0, float top_p = 1.0f,
                         float min_p = 0.0f, uint64_t seed = 1234, uint64_t position = 0) {
  return {temperature, top_k, top_p, min_p, seed, position};
}

Draw SampleOne(const std::vector<float>& logits, const SamplingRowParams& params) {
  Draw d;
  SampleRowsRef(logits.data(), 1, static_cast<int64_t>(logits.size()), &params, &d.token,
                &d.logprob, &d.kept_mass);
  return d;
}

// Samples the same row at positions 0..n-1 in one batched call; returns per-token counts.
std::vector<int64_t> CountDraws(const std::vector<float>& row, SamplingRowParams params, int64_t n,
                                std::vector<float>* kept_mass = nullptr) {
  const int64_t vocab = static_cast<int64_t>(row.size());
  std::vector<float> logits(n * vocab);
  std::vector<SamplingRowParams> params_rows(n, params);
  for (int64_t r = 0; r < n; ++r) {
    std::copy(row.begin(), row.end(), logits.begin() + r * vocab);
    params_rows[r].position = static_cast<uint64_t>(r);
  }
  std::vector<int32_t> tokens(n);
  std::vector<float> logprobs(n), masses(n);
  SampleRowsRef(logits.data(), n, vocab, params_rows.data(), tokens.data(), logprobs.data(),
                masses.data());
  std::vector<int64_t> counts(vocab, 0);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_GE(tokens[r], 0);
    EXPECT_LT(tokens[r], vocab);
    ++counts[tokens[r]];
  }
  if (kept_mass != nullptr) *kept_mass = masses;
  return counts;
}

std::vector<float> LogitsFromProbs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

TEST(SamplingRefTest, GreedyTakesArgmaxWithTiesToLowestId) {
  const std::vector<float> logits = {1.0f, 5.0f, 5.0f, 2.0f};
  for (uint64_t position = 0; position < 50; ++position) {
    const Draw d = SampleOne(logits, Params(0.0f, 0, 1.0f, 0.0f, 99, position));
    EXPECT_EQ(d.token, 1);
    // log_softmax at T = 1: 5 - log(e^1 + 2 e^5 + e^2).
    EXPECT_NEAR(d.logprob, -0.7266316204306138, 1e-6);
    EXPECT_EQ(d.kept_mass, 1.0f);
  }
  // Truncation settings are irrelevant to greedy, and a negative temperature is greedy too.
  EXPECT_EQ(SampleOne(logits, Params(0.0f, 1, 0.1f, 0.9f)).token, 1);
  EXPECT_EQ(SampleOne(logits, Params(-1.0f)).token, 1);
}

TEST(SamplingRefTest, LogprobIsOverTheFullVocabularyAtTemperature) {
  // T = 0.5 makes z = {2, 4, 6, 0}; top_k = 1 keeps token 2 only, but the logprob is still
  // log_softmax(z)[2] = 6 - log(e^2 + e^4 + e^6 + e^0) over the whole row.
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.0f};
  const Draw d = SampleOne(logits, Params(0.5f, 1));
  EXPECT_EQ(d.token, 2);
  EXPECT_NEAR(d.logprob, -0.14507793896078258, 1e-6);
  // kept_mass is token 2's untruncated probability e^6 / (e^2 + e^4 + e^6 + 1).
  EXPECT_NEAR(d.kept_mass, 0.8649548767993754, 1e-6);
}

TEST(SamplingRefTest, LogSoftmaxAtMatchesHandValues) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  // 3 - log(e + e^2 + e^3)
  EXPECT_NEAR(LogSoftmaxAt(logits.data(), 3, 1.0f, 2), -0.40760596444438013, 1e-6);
  // T = 2: 0.5 - log(e^0.5 + e^1 + e^1.5)
  EXPECT_NEAR(LogSoftmaxAt(logits.data(), 3, 2.0f, 0), -1.6802696706417346, 1e-6);
  // temperature <= 0 is read as 1, the greedy convention.
  EXPECT_EQ(LogSoftmaxAt(logits.data(), 3, 0.0f, 2), LogSoftmaxAt(logits.data(), 3, 1.0f, 2));
  EXPECT_TRUE(std::isnan(LogSoftmaxAt(logits.data(), 3, 1.0f, 3)));
  EXPECT_TRUE(std::isnan(LogSoftmaxAt(logits.data(), 3, 1.0f, -1)));
}

TEST(SamplingRefTest, SampledLogprobEqualsLogSoftmaxAt) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(37);
  for (float& x : logits) x = normal(rng);
  for (uint64_t position = 0; position < 200; ++position) {
    const Draw d = SampleOne(logits, Params(0.8f, 10, 0.9f, 0.0f, 5, position));
    EXPECT_EQ(d.logprob, LogSoftmaxAt(logits.data(), 37, 0.8f, d.token));
  }
}

TEST(SamplingRefTest, TopKKeepsTiesAtTheBoundary) {
  // top_k = 2: the 2nd largest logit is 2, shared by tokens 1 and 2, so both stay with token 0.
  const std::vector<float> logits = {3.0f, 2.0f, 2.0f, 1.0f, 0.0f};
  std::vector<float> masses;
  const std::vector<int64_t> counts = CountDraws(logits, Params(1.0f, 2), 20000, &masses);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_EQ(counts[4], 0);
  // (e^3 + 2 e^2) / (e^3 + 2 e^2 + e + 1)
  const double e = std::exp(1.0);
  const double expected = (e * e * e + 2 * e * e) / (e * e * e + 2 * e * e + e + 1);
  EXPECT_NEAR(masses[0], expected, 1e-6);
}

TEST(SamplingRefTest, DisabledTruncationKeepsEverything) {
  const std::vector<float> logits = {0.0f, -1.0f, -2.0f, -3.0f, -4.0f};
  for (const SamplingRowParams& params :
       {Params(1.0f, 0, 1.0f, 0.0f), Params(1.0f, 5, 1.0f, 0.0f), Params(1.0f, 100, 1.5f, -1.0f)}) {
    std::vector<float> masses;
    const std::vector<int64_t> counts = CountDraws(logits, params, 20000, &masses);
    for (int64_t c : counts) EXPECT_GT(c, 0);
    EXPECT_NEAR(masses[0], 1.0f, 1e-6);
  }
}

TEST(SamplingRefTest, TopPKeepsTheSmallestSetReachingTheMass) {
  const std::vector<float> logits = LogitsFromProbs({0.5, 0.3, 0.15, 0.05});
  // 0.5 < 0.75 <= 0.5 + 0.3: tokens 0 and 1.
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 0.75f)).kept_mass, 0.8, 1e-6);
  // 0.8 < 0.81 <= 0.95: tokens 0, 1, 2.
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 0.81f)).kept_mass, 0.95, 1e-6);
  // The top token is always kept, even for top_p = 0.
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 0.0f)).kept_mass, 0.5, 1e-6);
  const std::vector<int64_t> counts = CountDraws(logits, Params(1.0f, 0, 0.75f), 20000);
  EXPECT_GT(counts[0], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
}

TEST(SamplingRefTest, TopPActsOnTheDistributionRenormalisedAfterTopK) {
  // top_k = 2 keeps {0.4, 0.3} (mass 0.7). top_p = 0.55 of that is 0.385, which 0.4 alone
  // reaches, so only token 0 stays. Measured against the original mass (0.55) it would keep both.
  const std::vector<float> logits = LogitsFromProbs({0.4, 0.3, 0.2, 0.1});
  const Draw d = SampleOne(logits, Params(1.0f, 2, 0.55f));
  EXPECT_NEAR(d.kept_mass, 0.4, 1e-6);
  const std::vector<int64_t> counts = CountDraws(logits, Params(1.0f, 2, 0.55f), 2000);
  EXPECT_EQ(counts[0], 2000);
}

TEST(SamplingRefTest, TopPKeepsTiesAtTheBoundary) {
  // Running mass 0.4 < 0.5, then 0.6 >= 0.5 at p = 0.2; all three tokens at 0.2 stay.
  const std::vector<float> logits = LogitsFromProbs({0.4, 0.2, 0.2, 0.2});
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 0.5f)).kept_mass, 1.0, 1e-6);
}

TEST(SamplingRefTest, MinPKeepsTokensAboveFractionOfMax) {
  const std::vector<float> logits = LogitsFromProbs({0.5, 0.3, 0.15, 0.05});
  // Threshold 0.5 * 0.5 = 0.25: tokens 0 and 1.
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 1.0f, 0.5f)).kept_mass, 0.8, 1e-6);
  // min_p = 0 is off.
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 1.0f, 0.0f)).kept_mass, 1.0, 1e-6);
  // min_p > 1 is read as 1: only the top token.
  EXPECT_NEAR(SampleOne(logits, Params(1.0f, 0, 1.0f, 2.0f)).kept_mass, 0.5, 1e-6);
}

TEST(SamplingRefTest, NegativeInfinityAndNanAreNeverDrawn) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> logits = {-kInf, -kInf, 3.0f, -kInf, nan};
  for (uint64_t position = 0; position < 1000; ++position) {
    const Draw d = SampleOne(logits, Params(0.7f, 0, 1.0f, 0.0f, 8, position));
    ASSERT_EQ(d.token, 2);
    EXPECT_EQ(d.logprob, 0.0f);
    EXPECT_EQ(d.kept_mass, 1.0f);
  }
  EXPECT_EQ(SampleOne(logits, Params(0.0f)).token, 2);
  // An infinite temperature flattens the finite logits but must not turn -inf into NaN.
  EXPECT_EQ(SampleOne(logits, Params(kInf)).token, 2);
  EXPECT_EQ(SampleOne(logits, Params(kInf)).kept_mass, 1.0f);
}

TEST(SamplingRefTest, DegenerateRowIsReported) {
  const std::vector<float> logits = {-kInf, std::numeric_limits<float>::quiet_NaN(), -kInf};
  for (float temperature : {0.0f, 1.0f}) {
    const Draw d = SampleOne(logits, Params(temperature));
    EXPECT_EQ(d.token, 0);
    EXPECT_EQ(d.logprob, -kInf);
    EXPECT_EQ(d.kept_mass, 0.0f);
  }
}

TEST(SamplingRefTest, PositiveInfinitySharesTheMass) {
  const std::vector<float> logits = {0.0f, kInf, kInf};
  std::vector<float> masses;
  const std::vector<int64_t> counts = CountDraws(logits, Params(1.0f), 4000, &masses);
  EXPECT_EQ(counts[0], 0);
  EXPECT_NEAR(counts[1], 2000, 200);
  EXPECT_NEAR(SampleOne(logits, Params(1.0f)).logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(SampleOne(logits, Params(0.0f)).token, 1);
}

TEST(SamplingRefTest, TinyTemperatureIsFiniteAndNearGreedy) {
  const std::vector<float> logits = {1.0f, 2.0f, 1.5f};
  for (uint64_t position = 0; position < 100; ++position) {
    const Draw d = SampleOne(logits, Params(1e-30f, 0, 1.0f, 0.0f, 1, position));
    EXPECT_EQ(d.token, 1);
    EXPECT_EQ(d.logprob, 0.0f);
    EXPECT_EQ(d.kept_mass, 1.0f);
  }
}

// Probabilities sorted: .25 (1), .20 (4), .15 (3), .12 (6), .10 (7), .06 (8), .05 (0), .04 (9),
// .02 (2), .01 (5).
//   top_k = 7 keeps p >= .05: {1, 4, 3, 6, 7, 8, 0}, mass .93.
//   top_p = .8 of .93 is .744; running mass .25, .45, .60, .72, .82 reaches it at p = .10:
//     {1, 4, 3, 6, 7}, mass .82.
//   min_p = .45 keeps p >= .1125: {1, 4, 3, 6}, mass .72.
const std::vector<double> kTenProbs = {0.05, 0.25, 0.02, 0.15, 0.2, 0.01, 0.12, 0.1, 0.06, 0.04};

TEST(SamplingRefTest, FrequenciesMatchTheTruncatedRenormalisedDistribution) {
  const std::vector<float> logits = LogitsFromProbs(kTenProbs);
  constexpr int64_t kDraws = 200000;
  std::vector<float> masses;
  const std::vector<int64_t> counts =
      CountDraws(logits, Params(1.0f, 7, 0.8f, 0.45f, 2024), kDraws, &masses);
  EXPECT_NEAR(masses[0], 0.72, 1e-6);
  const std::set<int> kept = {1, 4, 3, 6};
  for (int i = 0; i < 10; ++i) {
    const double expected = kept.count(i) ? kTenProbs[i] / 0.72 : 0.0;
    const double empirical = static_cast<double>(counts[i]) / kDraws;
    if (expected == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
    } else {
      // One standard error is at most 0.0011 here.
      EXPECT_NEAR(empirical, expected, 0.005) << "token " << i;
    }
  }
}

TEST(SamplingRefTest, FrequenciesMatchTemperedSoftmax) {
  // V = 37 (not a multiple of 32), T = 1.5, no truncation: compare against softmax(logits / T)
  // computed here in double.
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(37);
  for (float& x : logits) x = normal(rng);
  double sum = 0.0;
  std::vector<double> expected(37);
  for (int i = 0; i < 37; ++i) sum += expected[i] = std::exp(logits[i] / 1.5);
  constexpr int64_t kDraws = 200000;
  const std::vector<int64_t> counts = CountDraws(logits, Params(1.5f, 0, 1.0f, 0.0f, 77), kDraws);
  double max_err = 0.0;
  for (int i = 0; i < 37; ++i) {
    max_err =
        std::max(max_err, std::abs(static_cast<double>(counts[i]) / kDraws - expected[i] / sum));
  }
  EXPECT_LT(max_err, 0.005);
}

TEST(SamplingRefTest, TruncatedTokensAreNeverDrawnInALargeVocabulary) {
  // V = 1000 with distinct logits: top_k = 50 may only draw the 50 largest.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = uniform(rng);
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float cutoff = sorted[49];
  ASSERT_GT(cutoff, sorted[50]);
  const std::vector<int64_t> counts = CountDraws(logits, Params(2.0f, 50, 1.0f, 0.0f, 3), 20000);
  int distinct = 0;
  for (int i = 0; i < 1000; ++i) {
    if (logits[i] < cutoff) {
      EXPECT_EQ(counts[i], 0) << "token " << i;
    }
    if (counts[i] > 0) ++distinct;
  }
  EXPECT_EQ(distinct, 50);
}

TEST(SamplingRefTest, DrawDependsOnlyOnSeedAndPositionNotTheBatch) {
  constexpr int64_t kVocab = 37;
  constexpr int64_t kBatch = 1024;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kBatch * kVocab);
  for (float& x : logits) x = normal(rng);
  std::vector<SamplingRowParams> params(kBatch);
  for (int64_t r = 0; r < kBatch; ++r) {
    params[r] = Params(r % 3 == 0 ? 0.0f : 0.9f, static_cast<int32_t>(r % 7), 0.95f, 0.01f,
                       1000 + r % 13, static_cast<uint64_t>(r * 31));
  }
  std::vector<int32_t> tokens(kBatch);
  std::vector<float> logprobs(kBatch), masses(kBatch);
  SampleRowsRef(logits.data(), kBatch, kVocab, params.data(), tokens.data(), logprobs.data(),
                masses.data());
  // Reversing the batch and sampling each row alone give identical results.
  std::vector<float> reversed(kBatch * kVocab);
  std::vector<SamplingRowParams> reversed_params(kBatch);
  for (int64_t r = 0; r < kBatch; ++r) {
    std::copy(logits.begin() + r * kVocab, logits.begin() + (r + 1) * kVocab,
              reversed.begin() + (kBatch - 1 - r) * kVocab);
    reversed_params[kBatch - 1 - r] = params[r];
  }
  std::vector<int32_t> rtokens(kBatch);
  std::vector<float> rlogprobs(kBatch), rmasses(kBatch);
  SampleRowsRef(reversed.data(), kBatch, kVocab, reversed_params.data(), rtokens.data(),
                rlogprobs.data(), rmasses.data());
  std::set<int32_t> seen;
  for (int64_t r = 0; r < kBatch; ++r) {
    Draw single;
    SampleRowsRef(logits.data() + r * kVocab, 1, kVocab, &params[r], &single.token, &single.logprob,
                  &single.kept_mass);
    EXPECT_EQ(single.token, tokens[r]);
    EXPECT_EQ(single.logprob, logprobs[r]);
    EXPECT_EQ(single.kept_mass, masses[r]);
    EXPECT_EQ(rtokens[kBatch - 1 - r], tokens[r]);
    seen.insert(tokens[r]);
  }
  EXPECT_GT(seen.size(), 20u);
}

TEST(SamplingRefTest, SeedsGiveDifferentStreams) {
  const std::vector<float> logits(64, 0.0f);
  int same = 0;
  for (uint64_t position = 0; position < 200; ++position) {
    same += SampleOne(logits, Params(1.0f, 0, 1.0f, 0.0f, 1, position)).token ==
            SampleOne(logits, Params(1.0f, 0, 1.0f, 0.0f, 2, position)).token;
  }
  // Uniform over 64 tokens: about 3 coincidences expected.
  EXPECT_LT(same, 20);
}

}  // namespace
}  // namespace gyre::kernels
