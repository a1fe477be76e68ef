#include "kernels/reference/token_logprobs_ref.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace gyre::kernels {
namespace {

// Straightforward two-pass log-softmax in double: the meaning the one-pass reference must keep.
void Naive(const std::vector<float>& logits, const std::vector<int64_t>& y, int64_t T, int64_t V,
           double tau, std::vector<double>* logp, std::vector<double>* entropy) {
  for (int64_t t = 0; t < T; ++t) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < V; ++j) m = std::max(m, logits[t * V + j] / tau);
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[t * V + j] / tau - m);
    const double lse = m + std::log(s);
    double h = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double lp = logits[t * V + j] / tau - lse;
      if (std::isfinite(lp)) h -= std::exp(lp) * lp;
    }
    logp->push_back(logits[t * V + y[t]] / tau - lse);
    entropy->push_back(h);
  }
}

std::vector<float> RandomLogits(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(TokenLogprobsRefTest, MatchesTwoPassLogSoftmaxIncludingLargeVocabulary) {
  for (auto [T, V, tau] :
       {std::tuple<int64_t, int64_t, double>{7, 1001, 0.7}, {3, 37, 1.0}, {2, 151936, 1.3}}) {
    auto logits = RandomLogits(T * V, static_cast<uint32_t>(V), 3.0f);
    std::vector<int64_t> y(T);
    for (int64_t t = 0; t < T; ++t) y[t] = (t * 7919) % V;
    std::vector<float> logp(T), ent(T);
    TokenLogprobsForwardRef(logits.data(), y.data(), T, V, static_cast<float>(tau), logp.data(),
                            ent.data());
    std::vector<double> want_lp, want_h;
    Naive(logits, y, T, V, tau, &want_lp, &want_h);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_NEAR(logp[t], want_lp[t], 1e-5 + 1e-6 * std::fabs(want_lp[t])) << "V=" << V;
      EXPECT_NEAR(ent[t], want_h[t], 1e-5 + 1e-6 * want_h[t]) << "V=" << V;
    }
  }
}

TEST(TokenLogprobsRefTest, MaskedLogitsCarryNoMassAndTemperatureZeroMeansOne) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> logits = {ninf, 2.0f, ninf, 0.0f};
  std::vector<int64_t> y = {1};
  float lp = 0, h = 0, lp0 = 0;
  TokenLogprobsForwardRef(logits.data(), y.data(), 1, 4, 1.0f, &lp, &h);
  const double p1 = std::exp(2.0) / (std::exp(2.0) + 1.0);
  EXPECT_NEAR(lp, std::log(p1), 1e-6);
  EXPECT_NEAR(h, -(p1 * std::log(p1) + (1 - p1) * std::log(1 - p1)), 1e-6);
  TokenLogprobsForwardRef(logits.data(), y.data(), 1, 4, 0.0f, &lp0, nullptr);
  EXPECT_EQ(lp0, lp);
  std::vector<float> grad(4), g_lp = {1.0f};
  TokenLogprobsBackwardRef(logits.data(), y.data(), 1, 4, 1.0f, g_lp.data(), nullptr, grad.data());
  EXPECT_EQ(grad[0], 0.0f);
  EXPECT_EQ(grad[2], 0.0f);
  EXPECT_NEAR(grad[1], 1 - p1, 1e-6);
}

// d/dlogits of sum_t (a_t logp_t + b_t H_t) against central differences.
TEST(TokenLogprobsRefTest, BackwardMatchesFiniteDifferences) {
  const int64_t T = 3, V = 13;
  const float tau = 0.8f;
  auto logits = RandomLogits(T * V, 5, 1.5f);
  std::vector<int64_t> y = {0, 6, 12};
  std::vector<float> a = {1.0f, -0.5f, 2.0f}, b = {0.3f, 0.0f, -1.2f};
  std::vector<float> grad(T * V);
  TokenLogprobsBackwardRef(logits.data(), y.data(), T, V, tau, a.data(), b.data(), grad.data());
  auto objective = [&](const std::vector<float>& l) {
    std::vector<float> lp(T), h(T);
    TokenLogprobsForwardRef(l.data(), y.data(), T, V, tau, lp.data(), h.data());
    double f = 0;
    for (int64_t t = 0; t < T; ++t) f += a[t] * lp[t] + b[t] * h[t];
    return f;
  };
  const float eps = 1e-2f;
  for (int64_t i = 0; i < T * V; ++i) {
    auto up = logits, down = logits;
    up[i] += eps;
    down[i] -= eps;
    const double numeric = (objective(up) - objective(down)) / (2 * eps);
    EXPECT_NEAR(grad[i], numeric, 2e-3 + 1e-2 * std::fabs(numeric)) << "index " << i;
  }
}

}  // namespace
}  // namespace gyre::kernels
