// GPU kernels against their CPU references (kernels/reference/): advantages, the broadcast to
// tokens and the policy loss. Tolerances are llm.c style, |gpu - ref| <= tol + |ref| * eps, with
// eps a couple of float ulps for float outputs (both sides compute in double and round once) and
// 1e-9 for double sums (only the summation order differs). Every test skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "algorithm/registry.h"
#include "gpu_test_util.h"
#include "kernels/advantages.cuh"
#include "kernels/device_info.h"
#include "kernels/policy_loss.cuh"
#include "kernels/reference/advantages_ref.h"
#include "kernels/reference/policy_loss_ref.h"

namespace gyre::kernels {
namespace {

using gpu_test::Close;
using gpu_test::DeviceArray;
using gpu_test::ExpectAllClose;

const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Float outputs: both sides compute in double and round once, so they differ by at most an ulp or
// two. Advantages are O(1) values whose double statistics carry summation-order noise (a zero-
// variance group under reinforce_pp_baseline gets -batch_mean / std, pure rounding noise around
// 1e-16), hence a small absolute floor. Gradients are elementwise (the same double terms on both
// sides) and can be tiny (scaled by 1 / tokens), so their floor is negligible.
constexpr double kAdvTol = 1e-9;
constexpr double kGradTol = 1e-30;
constexpr double kFloatEps = 2.5e-7;
// Double sums: same terms, different summation order.
constexpr double kSumTol = 1e-9;
constexpr double kSumEps = 1e-9;

// ---------------------------------------------------------------------------------------------
// Advantages

const AdvantageKind kAllKinds[] = {
    AdvantageKind::kGrpo,   AdvantageKind::kGrpoNoStd,           AdvantageKind::kRloo,
    AdvantageKind::kMedian, AdvantageKind::kReinforcePpBaseline, AdvantageKind::kReinforcePp};

struct Groups {
  std::vector<float> rewards;
  std::vector<int32_t> offsets{0};

  void Add(const std::vector<float>& group) {
    rewards.insert(rewards.end(), group.begin(), group.end());
    offsets.push_back(static_cast<int32_t>(rewards.size()));
  }
  int32_t num_groups() const { return static_cast<int32_t>(offsets.size()) - 1; }
  int32_t total() const { return offsets.back(); }
};

// Rewards of one group of size n in one of several patterns: continuous, binary (ties, often all
// equal), constant (zero variance), small integers (many ties), and large with a tiny spread
// (where a float mean would lose the signal).
std::vector<float> GroupRewards(int32_t n, int pattern, std::mt19937* rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::bernoulli_distribution coin(0.5);
  std::uniform_int_distribution<int> small_int(0, 4);
  std::normal_distribution<float> tiny(0.0f, 1e-2f);
  const float constant = uniform(*rng);
  std::vector<float> r(n);
  for (float& v : r) {
    switch (pattern % 5) {
      case 0:
        v = uniform(*rng);
        break;
      case 1:
        v = coin(*rng) ? 1.0f : 0.0f;
        break;
      case 2:
        v = constant;
        break;
      case 3:
        v = static_cast<float>(small_int(*rng));
        break;
      default:
        v = 1000.0f + tiny(*rng);
        break;
    }
  }
  return r;
}

// num_groups groups: the first ones have the sizes that stress the kernel (the largest supported
// in shared memory, one, two, empty, odd and even), the rest random sizes in [1, 48].
Groups MakeGroups(int32_t num_groups, uint32_t seed) {
  const int32_t special[] = {kMedianSharedMaxGroupSize, 1, 2, 0, 3, 1, 2, 5, 0, 8, 257, 64, 7, 2};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> size(1, 48);
  Groups groups;
  for (int32_t g = 0; g < num_groups; ++g) {
    const int32_t n = g < static_cast<int32_t>(std::size(special)) ? special[g] : size(rng);
    groups.Add(GroupRewards(n, g, &rng));
  }
  return groups;
}

struct AdvantagesOut {
  std::vector<float> advantages;
  std::vector<uint8_t> zero_variance;
};

AdvantagesOut RefAdvantages(const Groups& g, AdvantageKind kind, float eps) {
  AdvantagesOut out{std::vector<float>(g.total(), -99.0f), std::vector<uint8_t>(g.num_groups(), 7)};
  GroupAdvantagesRef(g.rewards.data(), g.offsets.data(), g.num_groups(), kind, eps,
                     out.advantages.data(), out.zero_variance.data());
  return out;
}

// Runs LaunchGroupAdvantages on `stream` and downloads its outputs (zero_variance only when
// with_flags). Outputs start as garbage, so anything the kernel forgets to write shows.
void GpuAdvantages(const Groups& g, AdvantageKind kind, float eps, bool with_flags,
                   cudaStream_t stream, AdvantagesOut* out) {
  DeviceArray<float> rewards(g.rewards);
  DeviceArray<int32_t> offsets(g.offsets);
  DeviceArray<float> adv(std::vector<float>(g.total(), -99.0f));
  DeviceArray<uint8_t> flags(std::vector<uint8_t>(g.num_groups(), 7));
  GYRE_CUDA_OK(rewards.status());
  GYRE_CUDA_OK(offsets.status());
  GYRE_CUDA_OK(adv.status());
  GYRE_CUDA_OK(flags.status());
  GYRE_CUDA_OK(LaunchGroupAdvantages(rewards.get(), offsets.get(), g.num_groups(), kind, eps,
                                     adv.get(), with_flags ? flags.get() : nullptr, g.total(),
                                     stream));
  GYRE_CUDA_OK(cudaStreamSynchronize(stream));
  out->advantages = adv.Download();
  out->zero_variance = flags.Download();
}

void ExpectAdvantagesMatch(const Groups& g, AdvantageKind kind, const std::string& what) {
  const float eps = 1e-6f;
  const AdvantagesOut ref = RefAdvantages(g, kind, eps);
  AdvantagesOut gpu;
  ASSERT_NO_FATAL_FAILURE(GpuAdvantages(g, kind, eps, /*with_flags=*/true, nullptr, &gpu));
  const std::string label = what + " " + algorithm::NameOf(kind);
  ExpectAllClose(gpu.advantages, ref.advantages, kAdvTol, kFloatEps, label + " advantages");
  EXPECT_EQ(gpu.zero_variance, ref.zero_variance) << label;
}

class AdvantagesSweepGpuTest : public ::testing::TestWithParam<std::tuple<AdvantageKind, int32_t>> {
};

TEST_P(AdvantagesSweepGpuTest, MatchesReferenceOnUnevenGroups) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [kind, num_groups] = GetParam();
  const Groups g = MakeGroups(num_groups, 1234u + static_cast<uint32_t>(num_groups));
  ExpectAdvantagesMatch(g, kind, "B=" + std::to_string(num_groups));
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, AdvantagesSweepGpuTest,
    ::testing::Combine(::testing::ValuesIn(kAllKinds), ::testing::Values(1, 2, 17, 256, 1024)),
    [](const ::testing::TestParamInfo<AdvantagesSweepGpuTest::ParamType>& info) {
      return std::string(algorithm::NameOf(std::get<0>(info.param))) + "_B" +
             std::to_string(std::get<1>(info.param));
    });

TEST(AdvantagesGpuTest, SmallKnownValues) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  // Median of {3, 1, 2} is 2; of {4, 1, 2, 10} is 3; a group of one has median itself.
  Groups g;
  g.Add({3, 1, 2});
  g.Add({4, 1, 2, 10});
  g.Add({5});
  AdvantagesOut gpu;
  ASSERT_NO_FATAL_FAILURE(GpuAdvantages(g, AdvantageKind::kMedian, 1e-6f, true, nullptr, &gpu));
  EXPECT_EQ(gpu.advantages, (std::vector<float>{1, -1, 0, 1, -2, -1, 7, 0}));
  EXPECT_EQ(gpu.zero_variance, (std::vector<uint8_t>{0, 0, 1}));

  // rloo: n / (n - 1) * (R - mean) of {0, 1, 1, 0} is {-2/3, 2/3, 2/3, -2/3}; grpo of {1, 1} is 0.
  Groups h;
  h.Add({0, 1, 1, 0});
  h.Add({1, 1});
  ASSERT_NO_FATAL_FAILURE(GpuAdvantages(h, AdvantageKind::kRloo, 1e-6f, true, nullptr, &gpu));
  const std::vector<float> rloo = {-2.0f / 3, 2.0f / 3, 2.0f / 3, -2.0f / 3, 0, 0};
  ExpectAllClose(gpu.advantages, rloo, kAdvTol, kFloatEps, "rloo");
  EXPECT_EQ(gpu.zero_variance, (std::vector<uint8_t>{0, 1}));
}

TEST(AdvantagesGpuTest, GroupsLargerThanSharedMemoryMedian) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  // Groups above kMedianSharedMaxGroupSize take the global-memory median path.
  std::mt19937 rng(7);
  Groups g;
  g.Add(GroupRewards(kMedianSharedMaxGroupSize + 1, 0, &rng));
  g.Add(GroupRewards(3, 0, &rng));
  g.Add(GroupRewards(6000, 3, &rng));  // many ties
  g.Add(GroupRewards(5000, 2, &rng));  // constant
  for (AdvantageKind kind : kAllKinds) ExpectAdvantagesMatch(g, kind, "large groups");
}

TEST(AdvantagesGpuTest, NullFlagsDefaultStreamAndDeterminism) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Groups g = MakeGroups(300, 99);
  cudaStream_t stream = nullptr;
  GYRE_CUDA_OK(cudaStreamCreate(&stream));
  for (AdvantageKind kind : kAllKinds) {
    const AdvantagesOut ref = RefAdvantages(g, kind, 1e-6f);
    AdvantagesOut first, second;
    ASSERT_NO_FATAL_FAILURE(GpuAdvantages(g, kind, 1e-6f, false, stream, &first));
    ASSERT_NO_FATAL_FAILURE(GpuAdvantages(g, kind, 1e-6f, false, stream, &second));
    ExpectAllClose(first.advantages, ref.advantages, kAdvTol, kFloatEps, "no flags");
    EXPECT_EQ(first.advantages, second.advantages) << algorithm::NameOf(kind);  // bitwise
    // zero_variance was null: the garbage placed there is untouched.
    EXPECT_EQ(first.zero_variance, std::vector<uint8_t>(g.num_groups(), 7));
  }
  GYRE_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(AdvantagesGpuTest, EpsilonIsHonoured) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Groups g = MakeGroups(40, 5);
  for (float eps : {0.0f, 1e-6f, 0.5f}) {
    for (AdvantageKind kind : {AdvantageKind::kGrpo, AdvantageKind::kReinforcePpBaseline}) {
      const AdvantagesOut ref = RefAdvantages(g, kind, eps);
      AdvantagesOut gpu;
      ASSERT_NO_FATAL_FAILURE(GpuAdvantages(g, kind, eps, true, nullptr, &gpu));
      ExpectAllClose(gpu.advantages, ref.advantages, kAdvTol, kFloatEps,
                     "eps=" + std::to_string(eps));
    }
  }
}

TEST(AdvantagesGpuTest, NanRewardPropagatesInItsGroup) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Groups g;
  g.Add({1, kNan, 0, 1});
  g.Add({0, 1, 0.5f});
  g.Add({kNan});  // a lone NaN is not zero variance
  g.Add({2, 2});
  for (AdvantageKind kind : kAllKinds) {
    const AdvantagesOut ref = RefAdvantages(g, kind, 1e-6f);
    AdvantagesOut gpu;
    ASSERT_NO_FATAL_FAILURE(GpuAdvantages(g, kind, 1e-6f, true, nullptr, &gpu));
    EXPECT_EQ(gpu.zero_variance, (std::vector<uint8_t>{0, 0, 0, 1})) << algorithm::NameOf(kind);
    if (kind == AdvantageKind::kMedian) {
      // The reference's std::sort leaves NaN's place undefined; the kernel's median of a group
      // with a NaN is NaN, so the whole group is NaN and the other groups are untouched.
      for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(gpu.advantages[i])) << i;
      const std::vector<float> rest(gpu.advantages.begin() + 4, gpu.advantages.end());
      const std::vector<float> ref_rest(ref.advantages.begin() + 4, ref.advantages.end());
      ExpectAllClose(rest, ref_rest, kAdvTol, kFloatEps, "median after NaN group");
    } else {
      ExpectAllClose(gpu.advantages, ref.advantages, kAdvTol, kFloatEps,
                     std::string("NaN ") + algorithm::NameOf(kind));
    }
  }
}

TEST(AdvantagesGpuTest, EmptyBatchesAndBadArguments) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  // No groups: nothing to do.
  EXPECT_EQ(LaunchGroupAdvantages(nullptr, nullptr, 0, AdvantageKind::kGrpo, 1e-6f, nullptr,
                                  nullptr, 0, nullptr),
            cudaSuccess);
  // Only empty groups: every flag is 1, no sample is touched.
  Groups empty;
  empty.Add({});
  empty.Add({});
  for (AdvantageKind kind : kAllKinds) {
    AdvantagesOut gpu;
    ASSERT_NO_FATAL_FAILURE(GpuAdvantages(empty, kind, 1e-6f, true, nullptr, &gpu));
    EXPECT_TRUE(gpu.advantages.empty());
    EXPECT_EQ(gpu.zero_variance, (std::vector<uint8_t>{1, 1})) << algorithm::NameOf(kind);
  }
  // A single sample: reinforce_pp_baseline's batch std is 0, so the advantage is 0 / eps = 0.
  Groups one;
  one.Add({0.25f});
  for (AdvantageKind kind : kAllKinds) ExpectAdvantagesMatch(one, kind, "single sample");

  float* dummy = reinterpret_cast<float*>(16);
  const int32_t* offsets = reinterpret_cast<const int32_t*>(16);
  EXPECT_EQ(LaunchGroupAdvantages(dummy, offsets, -1, AdvantageKind::kGrpo, 1e-6f, dummy, nullptr,
                                  0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchGroupAdvantages(dummy, offsets, 1, AdvantageKind::kGrpo, 1e-6f, dummy, nullptr,
                                  -1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchGroupAdvantages(dummy, nullptr, 1, AdvantageKind::kGrpo, 1e-6f, dummy, nullptr, 4,
                                  nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchGroupAdvantages(nullptr, offsets, 1, AdvantageKind::kGrpo, 1e-6f, dummy, nullptr,
                                  4, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchBroadcastToTokens(nullptr, nullptr, -1, 4, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchBroadcastToTokens(nullptr, dummy, 2, 4, dummy, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchBroadcastToTokens(nullptr, nullptr, 0, 4, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// ---------------------------------------------------------------------------------------------
// Broadcast to tokens

class BroadcastGpuTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(BroadcastGpuTest, MatchesReferenceBitForBit) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [S, T] = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(S * 31 + T));
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::uniform_int_distribution<int64_t> length(0, T);
  std::vector<float> values(S), mask(S * T, 0.0f);
  for (int64_t s = 0; s < S; ++s) {
    // Every 5th sequence has a non-finite value; its mask is all zeros so nothing may leak.
    const bool poisoned = s % 5 == 4;
    values[s] = poisoned ? (s % 2 == 0 ? kNan : kInf) : uniform(rng);
    if (poisoned) continue;
    const int64_t len = length(rng);  // a response of len tokens, then padding
    for (int64_t t = 0; t < len; ++t) {
      // Mostly 1, some tool tokens (0) and some fractional weights.
      const int64_t k = (s * T + t) % 11;
      mask[s * T + t] = k == 3 ? 0.0f : (k == 7 ? 0.5f : 1.0f);
    }
  }
  std::vector<float> ref(S * T, -99.0f);
  BroadcastToTokensRef(values.data(), mask.data(), S, T, ref.data());

  DeviceArray<float> d_values(values), d_mask(mask);
  DeviceArray<float> d_out(std::vector<float>(S * T, -99.0f));
  GYRE_CUDA_OK(d_values.status());
  GYRE_CUDA_OK(d_mask.status());
  GYRE_CUDA_OK(d_out.status());
  GYRE_CUDA_OK(LaunchBroadcastToTokens(d_values.get(), d_mask.get(), S, T, d_out.get(), nullptr));
  GYRE_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = d_out.Download();
  ExpectAllClose(got, ref, 0.0, 0.0, "broadcast");
  for (size_t i = 0; i < got.size(); ++i) {
    if (mask[i] == 0.0f) {
      ASSERT_EQ(got[i], 0.0f) << "padding leaked at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BroadcastGpuTest,
                         ::testing::Values(std::make_tuple(int64_t{1}, int64_t{1}),
                                           std::make_tuple(int64_t{3}, int64_t{7}),
                                           std::make_tuple(int64_t{5}, int64_t{0}),
                                           std::make_tuple(int64_t{64}, int64_t{1000}),
                                           std::make_tuple(int64_t{1024}, int64_t{4096})));

// ---------------------------------------------------------------------------------------------
// Policy loss

// Owns host [S, T] inputs and their device copies.
struct LossBatch {
  int64_t S = 0, T = 0;
  std::vector<float> logp, logp_old, logp_rollout, logp_ref, advantages, mask;

  PolicyLossInputs HostInputs() const {
    return {S,
            T,
            logp.data(),
            logp_old.data(),
            logp_rollout.data(),
            logp_ref.data(),
            advantages.data(),
            mask.data()};
  }
};

// Inputs that reach every branch of the loss: log-ratios inside the trust region, across both clip
// edges, above the dual-clip cap (ln 3) and beyond the +-20 clamp; positive, negative and zero
// advantages; TIS weights below and above the cap; KL log-ratios small and large enough for the
// k3 clamp; variable response lengths, tool tokens (mask 0 inside a response) and fully masked
// sequences. Every masked-out token holds NaN or inf, which must never reach any output.
LossBatch MakeLossBatch(int64_t S, int64_t T, uint32_t seed) {
  LossBatch b;
  b.S = S;
  b.T = T;
  const size_t n = static_cast<size_t>(S * T);
  b.logp.resize(n);
  b.logp_old.resize(n);
  b.logp_rollout.resize(n);
  b.logp_ref.resize(n);
  b.advantages.resize(n);
  b.mask.assign(n, 0.0f);

  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto sign = [&] { return unit(rng) < 0.5 ? -1.0 : 1.0; };
  for (int64_t s = 0; s < S; ++s) {
    const bool fully_masked = S > 1 && s % 9 == 5;
    const int64_t len = fully_masked ? 0 : 1 + static_cast<int64_t>(unit(rng) * T) % T;
    // Sequence-level advantage (as GRPO broadcasts), sometimes per-token noise, sometimes zero.
    const double seq_adv = unit(rng) < 0.1 ? 0.0 : 2.0 * normal(rng);
    const bool per_token_adv = s % 4 == 1;
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(s * T + t);
      const bool masked_in = t < len && unit(rng) > 0.08;
      if (!masked_in) {
        const float poison = (i % 3 == 0) ? kInf : kNan;
        b.logp[i] = poison;
        b.logp_old[i] = (i % 2 == 0) ? kNan : -kInf;
        b.logp_rollout[i] = poison;
        b.logp_ref[i] = kNan;
        b.advantages[i] = poison;
        b.mask[i] = 0.0f;
        continue;
      }
      b.mask[i] = 1.0f;
      const double u = unit(rng);
      double log_ratio;
      if (u < 0.35) {
        log_ratio = 0.1 * normal(rng);  // inside the trust region
      } else if (u < 0.6) {
        log_ratio = sign() * (0.2 + 0.4 * unit(rng));  // across a clip edge
      } else if (u < 0.8) {
        log_ratio = sign() * (1.0 + 4.0 * unit(rng));  // far outside; above ln 3 for dual clip
      } else if (u < 0.9) {
        log_ratio = sign() * (20.5 + 10.0 * unit(rng));  // beyond the ratio clamp
      } else {
        log_ratio = sign() * (0.5 + unit(rng));
      }
      const double old = -0.01 - 8.0 * unit(rng);
      b.logp_old[i] = static_cast<float>(old);
      b.logp[i] = static_cast<float>(old + log_ratio);
      // TIS: exp(logp_old - logp_rollout) is above the cap 2 for about a third of the tokens.
      b.logp_rollout[i] =
          static_cast<float>(old - (unit(rng) < 0.3 ? 0.7 + 2.0 * unit(rng) : 0.5 * normal(rng)));
      // KL: d = logp - logp_ref; k3 = exp(-d) + d - 1 exceeds 10 for d < about -2.5 or d > 11.
      const double d = unit(rng) < 0.7 ? 0.5 * normal(rng) : sign() * (2.0 + 12.0 * unit(rng));
      b.logp_ref[i] = static_cast<float>(static_cast<double>(b.logp[i]) - d);
      b.advantages[i] = static_cast<float>(per_token_adv ? 2.0 * normal(rng) : seq_adv);
    }
  }
  return b;
}

struct LossOut {
  PolicyLossStats stats;
  std::vector<float> grad;
};

LossOut RefLoss(const LossBatch& b, const PolicyLossParams& p, bool with_grad = true) {
  LossOut out{{}, std::vector<float>(with_grad ? b.S * b.T : 0, -99.0f)};
  out.stats = PolicyLossRef(b.HostInputs(), p, with_grad ? out.grad.data() : nullptr);
  return out;
}

// Uploads `b`, runs LaunchPolicyLoss on its own stream, and downloads the stats (through
// FinishPolicyLossStats) and the gradient (unless !with_grad). drop_rollout / drop_ref pass
// null pointers for those inputs.
void GpuLoss(const LossBatch& b, const PolicyLossParams& p, bool with_grad, LossOut* out,
             bool drop_rollout = false, bool drop_ref = false) {
  DeviceArray<float> logp(b.logp), logp_old(b.logp_old), logp_rollout(b.logp_rollout),
      logp_ref(b.logp_ref), advantages(b.advantages), mask(b.mask);
  DeviceArray<float> grad(std::vector<float>(b.S * b.T, -99.0f));
  DeviceArray<double> stats(std::vector<double>(kPolicyLossStatSlots, -12345.0));
  for (cudaError_t err :
       {logp.status(), logp_old.status(), logp_rollout.status(), logp_ref.status(),
        advantages.status(), mask.status(), grad.status(), stats.status()}) {
    GYRE_CUDA_OK(err);
  }
  PolicyLossInputs in{b.S,
                      b.T,
                      logp.get(),
                      logp_old.get(),
                      drop_rollout ? nullptr : logp_rollout.get(),
                      drop_ref ? nullptr : logp_ref.get(),
                      advantages.get(),
                      mask.get()};
  cudaStream_t stream = nullptr;
  GYRE_CUDA_OK(cudaStreamCreate(&stream));
  GYRE_CUDA_OK(LaunchPolicyLoss(in, p, with_grad ? grad.get() : nullptr, stats.get(), stream));
  GYRE_CUDA_OK(cudaStreamSynchronize(stream));
  GYRE_CUDA_OK(cudaStreamDestroy(stream));
  const std::vector<double> host_stats = stats.Download();
  out->stats = FinishPolicyLossStats(host_stats.data(), p);
  out->grad = with_grad ? grad.Download() : std::vector<float>();
}

void ExpectStatsMatch(const PolicyLossStats& got, const PolicyLossStats& ref,
                      const std::string& what) {
  const struct {
    const char* name;
    double got, ref;
  } fields[] = {
      {"loss", got.loss, ref.loss},
      {"pg_loss", got.pg_loss, ref.pg_loss},
      {"kl", got.kl, ref.kl},
      {"clip_frac", got.clip_frac, ref.clip_frac},
      {"approx_kl", got.approx_kl, ref.approx_kl},
      {"tis_mean", got.tis_mean, ref.tis_mean},
      {"tis_max", got.tis_max, ref.tis_max},
      {"tokens", got.tokens, ref.tokens},
      {"dual_clip_frac", got.dual_clip_frac, ref.dual_clip_frac},
      {"corr_masked_frac", got.corr_masked_frac, ref.corr_masked_frac},
  };
  for (const auto& f : fields) {
    EXPECT_TRUE(Close(f.got, f.ref, kSumTol, kSumEps))
        << what << " " << f.name << ": gpu " << f.got << " vs ref " << f.ref;
  }
}

std::string ParamsName(const PolicyLossParams& p) {
  return std::string(algorithm::NameOf(p.agg)) + (p.dual_clip_c > 1 ? " dual" : " nodual") + " " +
         algorithm::NameOf(p.correction) + " kl=" + algorithm::NameOf(p.kl);
}

void ExpectLossMatches(const LossBatch& b, const PolicyLossParams& p, const std::string& what) {
  const LossOut ref = RefLoss(b, p);
  LossOut gpu;
  ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, /*with_grad=*/true, &gpu));
  const std::string label = what + " " + ParamsName(p);
  ExpectStatsMatch(gpu.stats, ref.stats, label);
  ExpectAllClose(gpu.grad, ref.grad, kGradTol, kFloatEps, label + " grad");
}

// Every aggregation x dual clip x correction x KL combination on one branch-rich batch.
class PolicyLossSweepGpuTest
    : public ::testing::TestWithParam<std::tuple<LossAgg, bool, Correction, KlKind>> {};

TEST_P(PolicyLossSweepGpuTest, MatchesReferenceValueStatsAndGradient) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [agg, dual, correction, kl] = GetParam();
  PolicyLossParams p;
  p.agg = agg;
  p.dual_clip_c = dual ? 3.0f : 1.0f;
  p.correction = correction;
  p.m2po_threshold = 0.25;
  p.kl = kl;
  p.kl_coef = 0.1f;
  p.norm_max_len = agg == LossAgg::kSeqMeanTokenSumNorm ? 512.0f : 0.0f;
  const LossBatch b = MakeLossBatch(37, 301, 42);
  ExpectLossMatches(b, p, "S=37 T=301");

  // The batch must actually reach the branches this combination is about.
  const LossOut ref = RefLoss(b, p);
  EXPECT_GT(ref.stats.clip_frac, 0.05);
  if (dual) {
    EXPECT_GT(ref.stats.dual_clip_frac, 0.02);
  }
  if (correction == Correction::kTis || correction == Correction::kSeqTis) {
    EXPECT_EQ(ref.stats.tis_max, 2.0);
  }
  if (correction == Correction::kIcePop || correction == Correction::kM2po) {
    EXPECT_GT(ref.stats.corr_masked_frac, 0.05);
    EXPECT_LT(ref.stats.corr_masked_frac, 0.95);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllModes, PolicyLossSweepGpuTest,
    ::testing::Combine(::testing::Values(LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum,
                                         LossAgg::kSeqMeanTokenMean, LossAgg::kSeqMeanTokenSumNorm),
                       ::testing::Bool(),
                       ::testing::Values(Correction::kNone, Correction::kTis, Correction::kSeqTis,
                                         Correction::kIcePop, Correction::kM2po),
                       ::testing::Values(KlKind::kNone, KlKind::kK1, KlKind::kK2, KlKind::kK3)),
    [](const ::testing::TestParamInfo<PolicyLossSweepGpuTest::ParamType>& info) {
      std::string name = std::string(algorithm::NameOf(std::get<0>(info.param))) +
                         (std::get<1>(info.param) ? "_dual_" : "_nodual_") +
                         algorithm::NameOf(std::get<2>(info.param)) + "_" +
                         algorithm::NameOf(std::get<3>(info.param));
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// Every policy-loss kind x aggregation, with and without a correction and KL.
class PolicyLossKindGpuTest
    : public ::testing::TestWithParam<std::tuple<PolicyLossKind, LossAgg, bool>> {};

TEST_P(PolicyLossKindGpuTest, MatchesReferenceValueStatsAndGradient) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [kind, agg, extras] = GetParam();
  PolicyLossParams p;
  p.kind = kind;
  p.agg = agg;
  p.norm_max_len = agg == LossAgg::kSeqMeanTokenSumNorm ? 512.0f : 0.0f;
  if (extras) {
    p.correction = Correction::kSeqTis;
    p.kl = KlKind::kK3;
    p.kl_coef = 0.1f;
  }
  const LossBatch b = MakeLossBatch(29, 257, 7);
  ExpectLossMatches(b, p, std::string("S=29 T=257 ") + algorithm::NameOf(kind));
  EXPECT_GT(RefLoss(b, p).stats.clip_frac, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, PolicyLossKindGpuTest,
    ::testing::Combine(::testing::ValuesIn(algorithm::BuiltinPolicyLossKinds()),
                       ::testing::Values(LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum,
                                         LossAgg::kSeqMeanTokenMean, LossAgg::kSeqMeanTokenSumNorm),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<PolicyLossKindGpuTest::ParamType>& info) {
      std::string name = std::string(algorithm::NameOf(std::get<0>(info.param))) + "_" +
                         algorithm::NameOf(std::get<1>(info.param)) +
                         (std::get<2>(info.param) ? "_seqtis_k3" : "_plain");
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// Shapes from one token to S = 1024 x T = 4096, with two contrasting configurations.
class PolicyLossShapeGpuTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(PolicyLossShapeGpuTest, MatchesReferenceAtEveryShape) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [S, T] = GetParam();
  const LossBatch b = MakeLossBatch(S, T, static_cast<uint32_t>(S * 7 + T));
  const std::string shape = "S=" + std::to_string(S) + " T=" + std::to_string(T);

  PolicyLossParams all_on;
  all_on.correction = Correction::kTis;
  all_on.kl = KlKind::kK3;
  all_on.kl_coef = 0.05f;
  ExpectLossMatches(b, all_on, shape);

  PolicyLossParams seq_mean;
  seq_mean.agg = LossAgg::kSeqMeanTokenMean;
  seq_mean.dual_clip_c = 0.0f;
  seq_mean.kl = KlKind::kK2;
  seq_mean.kl_coef = 0.2f;
  ExpectLossMatches(b, seq_mean, shape);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PolicyLossShapeGpuTest,
                         ::testing::Values(std::make_tuple(int64_t{1}, int64_t{1}),
                                           std::make_tuple(int64_t{1}, int64_t{4096}),
                                           std::make_tuple(int64_t{3}, int64_t{255}),
                                           std::make_tuple(int64_t{1024}, int64_t{1}),
                                           std::make_tuple(int64_t{1024}, int64_t{4096})));

TEST(PolicyLossGpuTest, GlobalDenominatorsAndNormLength) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const LossBatch b = MakeLossBatch(20, 130, 3);
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum, LossAgg::kSeqMeanTokenMean,
                      LossAgg::kSeqMeanTokenSumNorm}) {
    PolicyLossParams p;
    p.agg = agg;
    p.global_tokens = 12345.0;
    p.global_seqs = 77.0;
    p.kl = KlKind::kK1;
    p.kl_coef = 0.3f;
    ExpectLossMatches(b, p, "global denominators");
    p.norm_max_len = 1000.0f;
    ExpectLossMatches(b, p, "global denominators, norm 1000");
    p.clip_eps_low = 0.1f;
    p.clip_eps_high = 0.5f;
    p.dual_clip_c = 5.0f;
    p.correction = Correction::kTis;
    p.tis_cap = 1.5f;
    ExpectLossMatches(b, p, "other clip params");
  }
}

TEST(PolicyLossGpuTest, GradientIsOptional) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const LossBatch b = MakeLossBatch(9, 77, 11);
  PolicyLossParams p;
  p.correction = Correction::kTis;
  p.kl = KlKind::kK3;
  p.kl_coef = 0.1f;
  const LossOut ref = RefLoss(b, p, /*with_grad=*/false);
  LossOut gpu;
  ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, /*with_grad=*/false, &gpu));
  ExpectStatsMatch(gpu.stats, ref.stats, "no grad");
}

TEST(PolicyLossGpuTest, DeterministicAcrossRuns) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const LossBatch b = MakeLossBatch(64, 500, 8);
  PolicyLossParams p;
  p.agg = LossAgg::kSeqMeanTokenSum;
  p.kl = KlKind::kK2;
  p.kl_coef = 0.1f;
  LossOut first, second;
  ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, true, &first));
  ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, true, &second));
  EXPECT_EQ(first.stats.loss, second.stats.loss);
  EXPECT_EQ(first.stats.pg_loss, second.stats.pg_loss);
  EXPECT_EQ(first.stats.kl, second.stats.kl);
  EXPECT_EQ(first.grad, second.grad);
}

TEST(PolicyLossGpuTest, EmptyMaskAndEmptyBatchGiveZeroNotNan) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  LossBatch b = MakeLossBatch(4, 50, 2);
  std::fill(b.mask.begin(), b.mask.end(), 0.0f);
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum, LossAgg::kSeqMeanTokenMean,
                      LossAgg::kSeqMeanTokenSumNorm}) {
    PolicyLossParams p;
    p.agg = agg;
    p.correction = Correction::kTis;
    p.kl = KlKind::kK3;
    p.kl_coef = 1.0f;
    LossOut gpu;
    ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, true, &gpu));
    ExpectStatsMatch(gpu.stats, RefLoss(b, p).stats, "empty mask");
    EXPECT_EQ(gpu.stats.loss, 0.0);
    EXPECT_EQ(gpu.stats.tokens, 0.0);
    EXPECT_EQ(gpu.stats.tis_max, 0.0);
    for (float g : gpu.grad) ASSERT_EQ(g, 0.0f);
  }

  LossBatch none;  // S = 0
  LossOut gpu;
  ASSERT_NO_FATAL_FAILURE(GpuLoss(none, PolicyLossParams{}, true, &gpu));
  ExpectStatsMatch(gpu.stats, RefLoss(none, PolicyLossParams{}).stats, "S=0");
  EXPECT_EQ(gpu.stats.loss, 0.0);

  LossBatch no_tokens;  // S = 3, T = 0
  no_tokens.S = 3;
  ASSERT_NO_FATAL_FAILURE(GpuLoss(no_tokens, PolicyLossParams{}, true, &gpu));
  ExpectStatsMatch(gpu.stats, RefLoss(no_tokens, PolicyLossParams{}).stats, "T=0");
}

TEST(PolicyLossGpuTest, MissingInputsAreLoud) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const LossBatch b = MakeLossBatch(3, 20, 4);
  PolicyLossParams tis;
  tis.correction = Correction::kTis;
  PolicyLossParams kl;
  kl.kl = KlKind::kK2;
  for (const auto& [p, drop_rollout, drop_ref] :
       {std::make_tuple(tis, true, false), std::make_tuple(kl, false, true)}) {
    LossOut gpu;
    ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, true, &gpu, drop_rollout, drop_ref));
    EXPECT_TRUE(std::isnan(gpu.stats.loss));
    EXPECT_TRUE(std::isnan(gpu.stats.clip_frac));
    EXPECT_TRUE(std::isnan(gpu.stats.tis_max));
    EXPECT_TRUE(std::isnan(gpu.stats.tokens));
    for (float g : gpu.grad) ASSERT_TRUE(std::isnan(g));
  }
}

TEST(PolicyLossGpuTest, BadArgumentsAreRejected) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  double* stats = reinterpret_cast<double*>(16);
  PolicyLossInputs in{2, 3, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  EXPECT_EQ(LaunchPolicyLoss(in, PolicyLossParams{}, nullptr, stats, nullptr),
            cudaErrorInvalidValue);
  in.S = -1;
  in.T = 0;
  EXPECT_EQ(LaunchPolicyLoss(in, PolicyLossParams{}, nullptr, stats, nullptr),
            cudaErrorInvalidValue);
  in.S = 0;
  EXPECT_EQ(LaunchPolicyLoss(in, PolicyLossParams{}, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// d loss / d logp against central finite differences of the GPU loss itself, on smooth inputs
// (log-ratios well inside the trust region, TIS weights below the cap, k3 unclamped), for every
// aggregation mode.
TEST(PolicyLossGpuTest, GradientMatchesFiniteDifferences) {
  if (gyre::kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t S = 4, T = 40;
  LossBatch b = MakeLossBatch(S, T, 21);
  std::mt19937 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (size_t i = 0; i < b.mask.size(); ++i) {
    if (b.mask[i] == 0.0f) continue;
    const double old = b.logp_old[i];
    b.logp[i] = static_cast<float>(old + 0.05 * normal(rng));
    b.logp_rollout[i] = static_cast<float>(old + 0.1 * normal(rng));
    b.logp_ref[i] = static_cast<float>(b.logp[i] - 0.3 * normal(rng));
  }
  for (LossAgg agg : {LossAgg::kTokenMean, LossAgg::kSeqMeanTokenSum, LossAgg::kSeqMeanTokenMean,
                      LossAgg::kSeqMeanTokenSumNorm}) {
    PolicyLossParams p;
    p.agg = agg;
    p.correction = Correction::kTis;
    p.kl = KlKind::kK3;
    p.kl_coef = 0.5f;
    LossOut base;
    ASSERT_NO_FATAL_FAILURE(GpuLoss(b, p, true, &base));
    int checked = 0;
    for (size_t i = 0; i < b.mask.size() && checked < 12; i += 3) {
      if (b.mask[i] == 0.0f) continue;
      ++checked;
      LossBatch plus = b, minus = b;
      plus.logp[i] = static_cast<float>(b.logp[i] + 1e-2);
      minus.logp[i] = static_cast<float>(b.logp[i] - 1e-2);
      // The KL reference stays fixed: only logp moves.
      LossOut lp, lm;
      ASSERT_NO_FATAL_FAILURE(GpuLoss(plus, p, false, &lp));
      ASSERT_NO_FATAL_FAILURE(GpuLoss(minus, p, false, &lm));
      const double h = static_cast<double>(plus.logp[i]) - static_cast<double>(minus.logp[i]);
      const double fd = (lp.stats.loss - lm.stats.loss) / h;
      EXPECT_NEAR(base.grad[i], fd, 1e-6 + 1e-3 * std::fabs(fd))
          << algorithm::NameOf(agg) << " token " << i;
    }
    EXPECT_GE(checked, 8);
  }
}

}  // namespace
}  // namespace gyre::kernels
