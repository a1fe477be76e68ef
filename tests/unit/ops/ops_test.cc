// src/ops on CPU tensors: each op equals its kernels/reference twin, and bad input is refused.
#include "ops/ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/reference/policy_loss_ref.h"
#include "kernels/reference/sampling_ref.h"

namespace gyre::ops {
namespace {

std::vector<kernels::SamplingRowParams> MixedParams(int64_t B) {
  std::vector<kernels::SamplingRowParams> p(B);
  for (int64_t r = 0; r < B; ++r) {
    p[r] = {r % 4 == 3 ? 0.f : 0.8f,  static_cast<int32_t>(r % 3 == 0 ? 5 : 0),
            r % 2 ? 0.9f : 1.f,       r % 5 == 0 ? 0.05f : 0.f,
            static_cast<uint64_t>(r), 7};
  }
  return p;
}

TEST(OpsSampleRows, MatchesTheReferenceForFloatAndBf16) {
  at::manual_seed(1);
  const int64_t B = 9, V = 300;
  const auto params = MixedParams(B);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor logits = (at::randn({B, V}) * 3).to(dtype);
    auto got = SampleRows(logits, params);
    ASSERT_TRUE(got.ok()) << got.status().message();
    at::Tensor f = logits.to(at::kFloat).contiguous();
    std::vector<int32_t> tokens(B);
    std::vector<float> lp(B), kept(B);
    kernels::SampleRowsRef(f.data_ptr<float>(), B, V, params.data(), tokens.data(), lp.data(),
                           kept.data());
    EXPECT_EQ(got->tokens, tokens);
    EXPECT_EQ(got->logprobs, lp);
    EXPECT_EQ(got->kept_mass, kept);
  }
}

TEST(OpsSampleRows, RefusesBadInput) {
  const auto params = MixedParams(2);
  EXPECT_FALSE(SampleRows(at::Tensor(), params).ok());
  EXPECT_FALSE(SampleRows(at::randn({2, 3, 4}), params).ok());
  auto wrong_count = SampleRows(at::randn({3, 10}), params);
  ASSERT_FALSE(wrong_count.ok());
  EXPECT_NE(wrong_count.status().message().find("2 parameter sets for 3 rows"), std::string::npos);
  EXPECT_FALSE(SampleRows(at::randn({2, 0}), params).ok());
  auto meta = SampleRows(at::empty({2, 10}, at::TensorOptions().device(at::kMeta)), params);
  ASSERT_FALSE(meta.ok());
  EXPECT_NE(meta.status().message().find("unsupported device"), std::string::npos);
}

TEST(OpsTokenLogprobs, MatchesTheReferenceAndDifferentiates) {
  at::manual_seed(2);
  at::Tensor logits = at::randn({2, 3, 50}).set_requires_grad(true);
  at::Tensor targets = at::randint(0, 50, {2, 3}, at::kLong);
  at::Tensor lp = TokenLogprobs(logits, targets, 0.7);
  at::Tensor flat = logits.detach().contiguous().view({6, 50});
  for (int64_t i = 0; i < 6; ++i) {
    const float ref =
        kernels::LogSoftmaxAt(flat[i].data_ptr<float>(), 50, 0.7f,
                              static_cast<int32_t>(targets.view({6})[i].item<int64_t>()));
    // libtorch's vectorised log-softmax vs the plain loop: rounding relative to the value.
    EXPECT_NEAR(lp.view({6})[i].item<float>(), ref, 2e-6 + 1e-5 * std::fabs(ref));
  }
  lp.sum().backward();
  ASSERT_TRUE(logits.grad().defined());
  // Each row's gradient of log p_y sums to zero over the vocabulary.
  EXPECT_LT(logits.grad().sum(-1).abs().max().item<float>(), 1e-5);
}

TEST(OpsPolicyLoss, MatchesTheReferenceAndChecksShapes) {
  at::manual_seed(3);
  const int64_t S = 4, T = 6;
  at::Tensor logp = at::randn({S, T}) * 0.1 - 1;
  at::Tensor old = logp + at::randn({S, T}) * 0.05;
  at::Tensor adv = at::randn({S, T});
  at::Tensor mask = (at::rand({S, T}) > 0.3).to(at::kFloat);
  kernels::PolicyLossParams params;
  auto got = PolicyLoss(logp, old, at::Tensor(), at::Tensor(), adv, mask, params);
  ASSERT_TRUE(got.ok()) << got.status().message();
  kernels::PolicyLossInputs in{S,       T,       logp.data_ptr<float>(), old.data_ptr<float>(),
                               nullptr, nullptr, adv.data_ptr<float>(),  mask.data_ptr<float>()};
  std::vector<float> grad(S * T);
  const kernels::PolicyLossStats ref = kernels::PolicyLossRef(in, params, grad.data());
  EXPECT_EQ(got->stats.loss, ref.loss);
  EXPECT_EQ(got->stats.clip_frac, ref.clip_frac);
  for (int64_t i = 0; i < S * T; ++i)
    EXPECT_EQ(got->grad_logp.view({-1})[i].item<float>(), grad[i]);

  EXPECT_FALSE(
      PolicyLoss(logp, old.view({T, S}), at::Tensor(), at::Tensor(), adv, mask, params).ok());
  params.correction = kernels::Correction::kTis;
  auto no_rollout = PolicyLoss(logp, old, at::Tensor(), at::Tensor(), adv, mask, params);
  ASSERT_FALSE(no_rollout.ok());
  EXPECT_NE(no_rollout.status().message().find("rollout log-probs"), std::string::npos);
}

}  // namespace
}  // namespace gyre::ops
