// src/ops on CPU tensors: each op equals its kernels/reference twin, and bad input is refused.
#include "ops/ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
    for (int64_t r = 0; r < B; ++r) {
      // Rows without truncation take the vectorised path (exponentials and sums in another
      // order: float rounding); truncated and greedy rows are the reference itself.
      const bool plain = params[r].temperature > 0 && params[r].top_k == 0 &&
                         params[r].top_p >= 1 && params[r].min_p == 0;
      const float tol = plain ? 2e-6f * (1 + std::abs(lp[r])) : 0.0f;
      EXPECT_NEAR(got->logprobs[r], lp[r], tol) << "row " << r;
      EXPECT_NEAR(got->kept_mass[r], kept[r], plain ? 1e-6f : 0.0f) << "row " << r;
    }
  }
}

// The vectorised path for rows without truncation (a large vocabulary, 64 rows, several
// temperatures and seeds, one row with -inf logits and one with a NaN, which the reference
// draws): the same tokens as kernels::SampleRowsRef, log-probs within float rounding, kept mass
// 1. Draws land all over the distribution (peaked and flat rows), so a wrong running sum or
// target moves tokens.
TEST(OpsSampleRows, FullDistributionRowsMatchTheReferenceOnALargeVocabulary) {
  at::manual_seed(3);
  const int64_t B = 64, V = 49152;
  int64_t drawn = 0, not_argmax = 0;
  for (float scale : {0.5f, 4.0f}) {
    for (float temperature : {0.7f, 1.0f, 1.3f}) {
      at::Tensor logits = at::randn({B, V}) * scale;
      logits[5][17] = -std::numeric_limits<float>::infinity();
      logits[9][3] = std::numeric_limits<float>::quiet_NaN();
      std::vector<kernels::SamplingRowParams> params(B);
      for (int64_t r = 0; r < B; ++r) {
        params[r] = {temperature,
                     0,
                     1.0f,
                     0.0f,
                     static_cast<uint64_t>(1000 * scale + r),
                     static_cast<uint64_t>(r * 31)};
      }
      auto got = SampleRows(logits, params);
      ASSERT_TRUE(got.ok()) << got.status().message();
      std::vector<int32_t> tokens(B);
      std::vector<float> lp(B), kept(B);
      kernels::SampleRowsRef(logits.data_ptr<float>(), B, V, params.data(), tokens.data(),
                             lp.data(), kept.data());
      const at::Tensor argmax = logits.nan_to_num(-1e30).argmax(1);
      for (int64_t r = 0; r < B; ++r) {
        ASSERT_EQ(got->tokens[r], tokens[r]) << "row " << r;
        EXPECT_NEAR(got->logprobs[r], lp[r], 2e-6f * (1 + std::abs(lp[r]))) << "row " << r;
        EXPECT_NEAR(got->kept_mass[r], kept[r], 1e-6f) << "row " << r;
        ++drawn;
        not_argmax += tokens[r] != argmax[r].item<int64_t>();
      }
    }
  }
  EXPECT_GT(not_argmax, drawn / 2);  // real draws, not the mode
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

// Chunked token statistics from the LM head's input equal those of the full logits: log-probs,
// entropies and argmax hits, and the gradients of a loss using both log-probs and entropies with
// respect to the hidden states and the head weight, for chunks of 1 token, a few tokens (the
// last one short), all tokens and more. The reference is plain autograd through linear,
// log_softmax and the entropy.
TEST(OpsChunkedTokenStats, EqualFullLogitsAndTheirGradients) {
  at::manual_seed(4);
  const int64_t N = 11, H = 16, V = 40;
  const at::Tensor hidden0 = at::randn({N, H});
  const at::Tensor weight0 = at::randn({V, H}) * 0.5;
  at::Tensor targets = at::randint(0, V, {N}, at::kLong);
  targets[3] = at::linear(hidden0[3], weight0).argmax().item<int64_t>();  // one argmax hit
  const at::Tensor g_lp = at::randn({N}), g_ent = at::randn({N});
  for (double temperature : {1.0, 0.7}) {
    at::Tensor h = hidden0.clone().set_requires_grad(true);
    at::Tensor w = weight0.clone().set_requires_grad(true);
    const at::Tensor z = at::linear(h, w) / temperature;
    const at::Tensor lsm = at::log_softmax(z, -1);
    const at::Tensor lp = lsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    const at::Tensor ent = -(lsm.exp() * lsm).sum(-1);
    const at::Tensor ok = (z.argmax(-1) == targets).to(at::kFloat);
    ((lp * g_lp).sum() + (ent * g_ent).sum()).backward();
    const at::Tensor want_gh = h.grad().clone(), want_gw = w.grad().clone();
    EXPECT_EQ(ok[3].item<float>(), 1.0f);
    for (int64_t chunk : {int64_t{1}, int64_t{4}, N, int64_t{64}}) {
      SCOPED_TRACE("temperature " + std::to_string(temperature) + " chunk " +
                   std::to_string(chunk));
      at::Tensor h2 = hidden0.clone().set_requires_grad(true);
      at::Tensor w2 = weight0.clone().set_requires_grad(true);
      const TokenStats st = ChunkedTokenStats(h2, w2, targets, temperature, chunk);
      EXPECT_TRUE(at::allclose(st.logp, lp.detach(), 1e-5, 1e-5));
      EXPECT_TRUE(at::allclose(st.entropy, ent.detach(), 1e-5, 1e-5));
      EXPECT_TRUE(at::equal(st.argmax_ok, ok));
      ((st.logp * g_lp).sum() + (st.entropy * g_ent).sum()).backward();
      EXPECT_TRUE(at::allclose(h2.grad(), want_gh, 1e-4, 1e-5))
          << (h2.grad() - want_gh).abs().max().item<float>();
      EXPECT_TRUE(at::allclose(w2.grad(), want_gw, 1e-4, 1e-5))
          << (w2.grad() - want_gw).abs().max().item<float>();
    }
  }
  // Only log-probs in the loss: the entropy's gradient is absent, not zero-filled wrongly.
  at::Tensor h3 = hidden0.clone().set_requires_grad(true);
  at::Tensor w3 = weight0.clone().set_requires_grad(true);
  ChunkedTokenStats(h3, w3, targets, 1.0, 3).logp.sum().backward();
  at::Tensor h4 = hidden0.clone().set_requires_grad(true);
  at::Tensor w4 = weight0.clone().set_requires_grad(true);
  at::log_softmax(at::linear(h4, w4), -1).gather(-1, targets.unsqueeze(-1)).sum().backward();
  EXPECT_TRUE(at::allclose(h3.grad(), h4.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(w3.grad(), w4.grad(), 1e-4, 1e-5));
  // logp_only: the same log-probs and gradient, no entropies or argmax computed.
  at::Tensor h5 = hidden0.clone().set_requires_grad(true);
  at::Tensor w5 = weight0.clone().set_requires_grad(true);
  const TokenStats only = ChunkedTokenStats(h5, w5, targets, 1.0, 3, /*logp_only=*/true);
  EXPECT_EQ(only.entropy.numel(), 0);
  EXPECT_EQ(only.argmax_ok.numel(), 0);
  EXPECT_TRUE(at::equal(only.logp, ChunkedTokenStats(h3, w3, targets, 1.0, 3).logp));
  only.logp.sum().backward();
  EXPECT_TRUE(at::equal(h5.grad(), h3.grad()));
  EXPECT_TRUE(at::equal(w5.grad(), w3.grad()));
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
