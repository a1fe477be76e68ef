#include "trainer/policy_trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "algorithm/registry.h"
#include "gyre/torch.h"
#include "testing/tensor_compare.h"
#include "testing/tiny_model.h"

namespace gyre::trainer {
namespace {

model::ModelSpec Spec() { return testing::TinySpec(24, 32, 1, 4, 2, 48); }

std::vector<TrainSample> Batch() {
  std::vector<TrainSample> b;
  for (int i = 0; i < 6; ++i) {
    TrainSample s;
    s.prompt = {1, static_cast<int32_t>(3 + i), 5};
    s.response.assign(2 + i % 3, static_cast<int32_t>(7 + i));
    s.rollout_logprobs.assign(s.response.size(), -1.0f);
    s.advantage = (i % 2 == 0 ? 1.0f : -0.5f) * (1 + i);
    b.push_back(s);
  }
  b[2].loss_mask = {1, 0, 1, 1};  // one inserted (masked-out) token in a 4-token response
  return b;
}

TrainOptions Options(int64_t micro) {
  TrainOptions o;
  o.micro_batch_size = micro;
  o.grad_clip = 0;  // compare raw updates
  return o;
}

at::Tensor Flat(const PolicyTrainer& t) {
  std::vector<at::Tensor> parts;
  for (const auto& [n, p] : t.model().NamedParameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts);
}

// Micro-batching uses batch-wide denominators, so the update equals one big batch's.
TEST(PolicyTrainerTest, MicroBatchingGivesTheSameUpdateAsOneBatch) {
  for (auto objective : {Objective::kPolicyGradient, Objective::kSft}) {
    PolicyTrainer whole(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer micro(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    auto a = whole.Step(Batch(), objective, 1e-2, Options(64));
    auto b = micro.Step(Batch(), objective, 1e-2, Options(1));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_NEAR((*a)["loss"], (*b)["loss"], 1e-6 + 1e-5 * std::abs((*a)["loss"]));
    EXPECT_NEAR((*a)["grad_norm"], (*b)["grad_norm"], 1e-4 * (*a)["grad_norm"]);
    // Micro-batches accumulate gradients in another order: rounding scaled to the weights.
    EXPECT_TRUE(testing::AllClose(Flat(whole), Flat(micro), {1e-5, 1e-6, 1e-5}));
    EXPECT_EQ(whole.version(), 1);
  }
}

// Sample i of the layout tests: `prompt`, a response of `length` tokens, behaviour log-probs,
// and an advantage that varies with i.
TrainSample LayoutSample(std::vector<int32_t> prompt, int64_t length, int i) {
  TrainSample s;
  s.prompt = std::move(prompt);
  s.response.resize(static_cast<size_t>(length));
  for (size_t t = 0; t < s.response.size(); ++t) {
    s.response[t] = static_cast<int32_t>((7 * i + 3 * t) % 24);
  }
  s.rollout_logprobs.assign(s.response.size(), -2.0f);
  s.advantage = (i % 2 == 0 ? 1.0f : -0.5f) * (1 + i % 4);
  return s;
}

// A step configuration of the layout tests.
struct LayoutCase {
  Objective objective;
  int64_t micro, minis;
  double entropy;
  TrainOptions Options() const {
    TrainOptions o = trainer::Options(micro);
    o.mini_batches = minis;
    o.entropy_coef = entropy;
    return o;
  }
};

// Two layouts of the same step: the same loss and telemetry, and the same update, up to float32
// reordering.
void ExpectSameStep(const std::map<std::string, double>& a, const std::map<std::string, double>& b,
                    const PolicyTrainer& ta, const PolicyTrainer& tb) {
  for (const char* key : {"loss", "grad_norm", "entropy", "tokens", "token_accuracy"}) {
    ASSERT_TRUE(a.count(key) && b.count(key)) << key;
    EXPECT_NEAR(a.at(key), b.at(key), 1e-6 + 1e-5 * std::abs(b.at(key))) << key;
  }
  EXPECT_TRUE(testing::AllClose(Flat(ta), Flat(tb), {1e-5, 1e-6, 1e-5}));
}

// Sequence packing (the default, log-probs in chunks of tokens or from materialised logits, with
// or without activation checkpointing) and one right-padded row per sample give the same step:
// loss, telemetry and update agree within float32 reordering, for both objectives, one or several
// micro-batches, an entropy bonus, and mini-batches (whose old log-probs are recomputed). Responses
// of 1 to 13 tokens, so that the longest rows hold several short samples.
TEST(PolicyTrainerTest, PackedRowsGiveTheSameStepAsPaddedRows) {
  std::vector<TrainSample> batch;
  for (int i = 0; i < 9; ++i) {
    batch.push_back(
        LayoutSample({1, static_cast<int32_t>(3 + i % 4), 5, static_cast<int32_t>(2 + i % 3)},
                     1 + (i * 5) % 13, i));
  }
  batch[4].loss_mask.assign(batch[4].response.size(), 1.0f);
  batch[4].loss_mask[1] = 0.0f;
  for (const LayoutCase c :
       {LayoutCase{Objective::kPolicyGradient, 64, 1, 0.0}, LayoutCase{Objective::kSft, 3, 1, 0.0},
        LayoutCase{Objective::kPolicyGradient, 4, 1, 0.01},
        LayoutCase{Objective::kPolicyGradient, 2, 3, 0.0}}) {
    SCOPED_TRACE("micro " + std::to_string(c.micro) + " minis " + std::to_string(c.minis));
    // Packed with log-probs in chunks of 4 tokens (several per micro-batch), packed with
    // materialised logits, packed with activation checkpointing, and padded.
    PolicyTrainer packed(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer unchunked(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer checkpointed(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer padded(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    EXPECT_TRUE(packed.sequence_packing());
    EXPECT_FALSE(packed.activation_checkpointing());
    packed.SetLogprobChunkTokens(4);
    unchunked.SetLogprobChunkTokens(0);
    checkpointed.SetActivationCheckpointing(true);
    EXPECT_TRUE(checkpointed.activation_checkpointing());
    padded.SetSequencePacking(false);
    const TrainOptions o = c.Options();
    auto b = padded.Step(batch, c.objective, 1e-2, o);
    ASSERT_TRUE(b.ok()) << b.status();
    for (PolicyTrainer* t : {&packed, &unchunked, &checkpointed}) {
      auto a = t->Step(batch, c.objective, 1e-2, o);
      ASSERT_TRUE(a.ok()) << a.status();
      ExpectSameStep(*a, *b, *t, padded);
    }
  }
}

// Shared prompts (trainer.prompt_sharing): samples with the same prompt, in groups of 1 to 4
// spread over the batch (so micro-batches cut through groups), with responses of 1 token (no
// input of their own) to 9, give the same step laid out as one prompt copy per group as padded
// or packed without sharing: loss, telemetry and update within float32 reordering, for both
// objectives, chunked and unchunked log-probs, activation checkpointing, and mini-batches.
TEST(PolicyTrainerTest, SharedPromptsGiveTheSameStepAsUnsharedRows) {
  std::vector<TrainSample> batch;
  for (int i = 0; i < 14; ++i) {
    const int group = i % 5 == 4 ? 4 : i % 4;  // groups 0-3, and samples 4 and 9 (group 4)
    std::vector<int32_t> prompt = {1, static_cast<int32_t>(3 + group), 5,
                                   static_cast<int32_t>(2 + group % 3)};
    if (group == 2) prompt.push_back(11);
    batch.push_back(LayoutSample(prompt, 1 + (i * 5) % 9, i));
  }
  batch[5].loss_mask.assign(batch[5].response.size(), 1.0f);
  batch[5].loss_mask[1] = 0.0f;
  for (const LayoutCase c :
       {LayoutCase{Objective::kPolicyGradient, 64, 1, 0.0}, LayoutCase{Objective::kSft, 8, 1, 0.0},
        LayoutCase{Objective::kPolicyGradient, 6, 1, 0.01},
        LayoutCase{Objective::kPolicyGradient, 7, 2, 0.0}}) {
    SCOPED_TRACE("micro " + std::to_string(c.micro) + " minis " + std::to_string(c.minis));
    PolicyTrainer padded(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer unshared(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer shared(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer unchunked(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    PolicyTrainer checkpointed(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    EXPECT_EQ(shared.prompt_sharing(), PromptSharing::kAuto);
    padded.SetSequencePacking(false);
    unshared.SetPromptSharing(PromptSharing::kOff);
    for (PolicyTrainer* t : {&shared, &unchunked, &checkpointed}) {
      t->SetPromptSharing(PromptSharing::kOn);
    }
    shared.SetLogprobChunkTokens(3);
    unchunked.SetLogprobChunkTokens(0);
    checkpointed.SetActivationCheckpointing(true);
    const TrainOptions o = c.Options();
    auto b = padded.Step(batch, c.objective, 1e-2, o);
    ASSERT_TRUE(b.ok()) << b.status();
    std::map<PolicyTrainer*, double> computed;  // positions computed that are not padding
    for (PolicyTrainer* t : {&unshared, &shared, &unchunked, &checkpointed}) {
      auto a = t->Step(batch, c.objective, 1e-2, o);
      ASSERT_TRUE(a.ok()) << a.status();
      ExpectSameStep(*a, *b, *t, padded);
      computed[t] = (*a)["computed_tokens"] - (*a)["pad_tokens"];
    }
    // The model ran on fewer positions when sharing: each group's prompt once, per micro-batch.
    double unique = 0;
    const size_t step = static_cast<size_t>(c.micro);  // also the mini-batch size (7 of 14)
    for (size_t start = 0; start < batch.size(); start += step) {
      std::set<std::vector<int32_t>> seen;
      for (size_t i = start; i < std::min(batch.size(), start + step); ++i) {
        if (seen.insert(batch[i].prompt).second)
          unique += static_cast<double>(batch[i].prompt.size());
        unique += static_cast<double>(batch[i].response.size()) - 1;
      }
    }
    EXPECT_EQ(computed[&shared], unique);
    EXPECT_EQ(computed[&unshared], (*b)["computed_tokens"] - (*b)["pad_tokens"]);
    EXPECT_LT(computed[&shared], computed[&unshared]);
  }
}

// trainer.prompt_sharing: auto decides group by group. A group of short answers to a long
// prompt is shared (one 14-token unit instead of four 11-token rows), while sharing a group of
// long answers to a short prompt would make one 78-token unit whose attention costs more than
// the two prompt tokens it saves, so those keep their own rows. Positions computed, padding
// aside: 92 all shared, 128 none, 98 for auto; each the same update as padded.
TEST(PolicyTrainerTest, AutoPromptSharingDecidesGroupByGroup) {
  std::vector<TrainSample> batch;
  for (int i = 0; i < 8; ++i) {
    TrainSample s;
    const bool short_answers = i % 2 == 0;  // the two groups interleaved
    s.prompt = short_answers ? std::vector<int32_t>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19}
                             : std::vector<int32_t>{2, 4};
    s.response.resize(short_answers ? 2 : 20);
    for (size_t t = 0; t < s.response.size(); ++t) {
      s.response[t] = static_cast<int32_t>((5 * i + 3 * t) % 24);
    }
    s.rollout_logprobs.assign(s.response.size(), -2.0f);
    s.advantage = i % 4 < 2 ? 1.0f : -1.0f;
    batch.push_back(s);
  }
  PolicyTrainer padded(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
  padded.SetSequencePacking(false);
  auto b = padded.Step(batch, Objective::kPolicyGradient, 1e-2, Options(64));
  ASSERT_TRUE(b.ok()) << b.status();
  for (auto [mode, useful] :
       {std::pair{PromptSharing::kOn, 92.0}, std::pair{PromptSharing::kOff, 128.0},
        std::pair{PromptSharing::kAuto, 98.0}}) {
    PolicyTrainer t(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
    t.SetPromptSharing(mode);
    auto a = t.Step(batch, Objective::kPolicyGradient, 1e-2, Options(64));
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)["computed_tokens"] - (*a)["pad_tokens"], useful) << static_cast<int>(mode);
    EXPECT_NEAR((*a)["loss"], (*b)["loss"], 1e-6 + 1e-5 * std::abs((*b)["loss"]));
    EXPECT_TRUE(testing::AllClose(Flat(t), Flat(padded), {1e-5, 1e-6, 1e-5}));
  }
}

// Mixed precision (model.dtype: bfloat16): the weights and AdamW moments stay float32 while the
// forward and backward run in bfloat16. The first update moves the weights as float32 training's
// does up to bfloat16 rounding of the gradient (measured: the same direction for 99.7% of the
// weights), the loss agrees within 2% (and is not float32's: the forward did run in bfloat16),
// and SFT still learns the batch (loss down by half in 30 more steps).
TEST(PolicyTrainerTest, MixedPrecisionKeepsFloat32WeightsAndFollowsFloat32Training) {
  PolicyTrainer full(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
  PolicyTrainer mixed(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
  mixed.SetComputeDtype(at::kBFloat16);
  const at::Tensor start = Flat(full);
  auto a = full.Step(Batch(), Objective::kSft, 1e-2, Options(2));
  auto b = mixed.Step(Batch(), Objective::kSft, 1e-2, Options(2));
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  EXPECT_EQ(mixed.model().dtype(), at::kFloat);
  for (const auto& st : mixed.OptimizerState()) {
    EXPECT_EQ(st.exp_avg.scalar_type(), at::kFloat);
    EXPECT_EQ(st.exp_avg_sq.scalar_type(), at::kFloat);
  }
  EXPECT_NEAR((*b)["loss"], (*a)["loss"], 2e-2 * std::abs((*a)["loss"]));
  EXPECT_NE((*b)["loss"], (*a)["loss"]);
  // AdamW's first update is about lr * sign(gradient) per weight, so bfloat16 rounding shows as
  // weights whose tiny gradient changed sign: count the agreeing ones.
  const at::Tensor dm = Flat(mixed) - start, df = Flat(full) - start;
  const double agree = ((dm * df) > 0).to(at::kDouble).mean().item<double>();
  std::fprintf(stderr, "update signs agree on %.4f of the weights\n", agree);
  EXPECT_GT(agree, 0.95);
  double first = (*b)["loss"], last = first;
  for (int i = 0; i < 30; ++i) {
    auto r = mixed.Step(Batch(), Objective::kSft, 1e-2, Options(2));
    ASSERT_TRUE(r.ok()) << r.status();
    last = (*r)["loss"];
  }
  EXPECT_LT(last, 0.5 * first);
}

// Policy gradient at ratio 1: the loss is -mean(A) over unmasked tokens, and a positive
// advantage raises its response's log-prob.
TEST(PolicyTrainerTest, PositiveAdvantageRaisesLogprob) {
  PolicyTrainer t(model::Transformer::Create(Spec(), 4, 0.1), 1e-2, 0, 0.9, 0.999);
  TrainSample good;
  good.prompt = {1, 2};
  good.response = {9, 9, 9};
  good.advantage = 1.0f;
  TrainSample bad = good;
  bad.response = {4, 4, 4};
  bad.advantage = -1.0f;
  auto logp = [&](const std::vector<int32_t>& resp) {
    std::vector<int64_t> seq = {1, 2};
    seq.insert(seq.end(), resp.begin(), resp.end());
    at::NoGradGuard ng;
    at::Tensor lsm = at::log_softmax(t.model().Forward(at::tensor(seq).unsqueeze(0))[0], -1);
    double s = 0;
    for (size_t i = 0; i < resp.size(); ++i) s += lsm[1 + i][resp[i]].item<double>();
    return s;
  };
  const double g0 = logp(good.response), b0 = logp(bad.response);
  auto m = t.Step({good, bad}, Objective::kPolicyGradient, 1e-2, Options(64));
  ASSERT_TRUE(m.ok());
  EXPECT_NEAR((*m)["loss"], 0.0, 1e-6);  // -(3*1 + 3*(-1)) / 6
  EXPECT_EQ((*m)["clip_frac"], 0.0);
  EXPECT_GT(logp(good.response), g0);
  EXPECT_LT(logp(bad.response), b0);
}

// PPO-style mini-batches: M optimizer steps (M versions), later steps judged against the
// sampling policy, so with a large step the ratio leaves [1 - eps, 1 + eps] and clips.
TEST(PolicyTrainerTest, MiniBatchesStepSeveralTimesAgainstTheSamplingPolicy) {
  std::vector<TrainSample> batch;
  for (int i = 0; i < 4; ++i) {
    for (const auto& s : Batch()) batch.push_back(s);
  }
  PolicyTrainer one(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
  PolicyTrainer four(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
  TrainOptions opts = Options(64);
  auto a = one.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
  opts.mini_batches = 4;
  auto b = four.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(one.version(), 1);
  EXPECT_EQ(four.version(), 4);
  EXPECT_EQ((*a)["clip_frac"], 0.0);
  EXPECT_GT((*b)["clip_frac"], 0.0);
  EXPECT_EQ((*b)["mini_batches"], 4.0);
  EXPECT_EQ((*a)["tokens"], (*b)["tokens"]);
}

// trainer.warmup_optimizer_state: reset. After SFT steps, a policy-gradient step that resets the
// AdamW state equals the same step on a fresh trainer holding the same weights; without the reset
// the warm-up's moments change the update. A failed step with the reset restores the moments.
TEST(PolicyTrainerTest, ResetOptimizerStateStartsFromAFreshAdamW) {
  for (int64_t minis : {1, 3}) {
    PolicyTrainer warmed(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0.01, 0.9, 0.999);
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(warmed.Step(Batch(), Objective::kSft, 1e-2, Options(64)).ok());
    std::vector<at::Tensor> weights;
    for (const auto& [n, p] : warmed.model().NamedParameters())
      weights.push_back(p.detach().clone());
    const auto moments = warmed.OptimizerState();
    ASSERT_GT(moments[0].step, 0);
    PolicyTrainer fresh(model::Transformer::Create(Spec(), 99, 0.1), 1e-2, 0.01, 0.9, 0.999);
    ASSERT_TRUE(fresh
                    .RestoreState(weights, std::vector<PolicyTrainer::ParamState>(weights.size()),
                                  warmed.version())
                    .ok());
    PolicyTrainer kept(model::Transformer::Create(Spec(), 99, 0.1), 1e-2, 0.01, 0.9, 0.999);
    ASSERT_TRUE(kept.RestoreState(weights, moments, warmed.version()).ok());

    TrainOptions o = Options(64);
    o.mini_batches = minis;
    // A failing step with the reset (a non-finite gradient norm) changes nothing, moments included.
    std::vector<TrainSample> bad = Batch();
    bad.back().advantage = 1e30f;
    TrainOptions reset = o;
    reset.reset_optimizer_state = true;
    ASSERT_FALSE(warmed.Step(bad, Objective::kPolicyGradient, 1e-2, reset).ok());
    const auto after_failure = warmed.OptimizerState();
    for (size_t i = 0; i < moments.size(); ++i) {
      ASSERT_EQ(after_failure[i].step, moments[i].step) << "minis " << minis;
      EXPECT_TRUE(at::equal(after_failure[i].exp_avg, moments[i].exp_avg)) << "minis " << minis;
      EXPECT_TRUE(at::equal(after_failure[i].exp_avg_sq, moments[i].exp_avg_sq));
    }
    EXPECT_TRUE(at::equal(Flat(warmed), Flat(kept)));

    ASSERT_TRUE(warmed.Step(Batch(), Objective::kPolicyGradient, 1e-2, reset).ok());
    ASSERT_TRUE(fresh.Step(Batch(), Objective::kPolicyGradient, 1e-2, o).ok());
    ASSERT_TRUE(kept.Step(Batch(), Objective::kPolicyGradient, 1e-2, o).ok());
    EXPECT_TRUE(at::equal(Flat(warmed), Flat(fresh))) << "minis " << minis;
    EXPECT_EQ(warmed.OptimizerState()[0].step, minis);
    EXPECT_FALSE(at::equal(Flat(warmed), Flat(kept))) << "the warm-up's moments had no effect";
  }
}

TEST(PolicyTrainerTest, MalformedBatchesAreRejectedWithoutAStep) {
  PolicyTrainer t(model::Transformer::Create(Spec(), 5, 0.1), 1e-2, 0, 0.9, 0.999);
  const at::Tensor before = Flat(t);
  auto b = Batch();
  b[1].loss_mask = {1};
  auto r = t.Step(b, Objective::kPolicyGradient, 1e-2, Options(4));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sample 1: loss_mask has 1 entries"), std::string::npos)
      << r.status();
  b = Batch();
  b[0].response.push_back(99);
  EXPECT_NE(t.Step(b, Objective::kSft, 1e-2, Options(4)).status().message().find("out of range"),
            std::string::npos);
  EXPECT_FALSE(t.Step({}, Objective::kSft, 1e-2, Options(4)).ok());
  // Found by fuzz_trainer_rpc (docs/reliability.md): an SFT step with a logprobs list shorter
  // than the response read past its end (ASan heap-buffer-overflow in BuildMicroBatch).
  b = Batch();
  b[2].rollout_logprobs = {-1.0f};
  for (Objective o : {Objective::kSft, Objective::kPolicyGradient}) {
    auto short_lp = t.Step(b, o, 1e-2, Options(4));
    EXPECT_EQ(short_lp.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(short_lp.status().message().find("sample 2: logprobs has 1 entries"),
              std::string::npos)
        << short_lp.status();
  }
  EXPECT_TRUE(at::equal(before, Flat(t)));
  EXPECT_EQ(t.version(), 0);
}

}  // namespace
}  // namespace gyre::trainer

namespace gyre::trainer {
namespace {

// Telemetry: the rollout engine's log-probs against the trainer's (before the update) for the
// same tokens, checked against values computed by hand. Every unmasked token has
// logp_old = -1; half of them were sampled with logp_rollout = -1.5, so d = 0.5 there.
TEST(PolicyTrainerTest, RolloutTrainerMismatchIsMeasuredOnTheSameTokens) {
  std::vector<TrainSample> batch = Batch();
  bool flip = false;
  for (auto& s : batch) {
    s.old_logprobs.assign(s.response.size(), -1.0f);
    for (size_t t = 0; t < s.response.size(); ++t) {
      flip = !flip;
      s.rollout_logprobs[t] = flip ? -1.5f : -1.0f;
    }
  }
  batch[5].rollout_logprobs.clear();  // a sample without rollout log-probs is left out
  // Count what the trainer sees: samples 0..4.
  double tokens = 0, shifted = 0;
  for (size_t i = 0; i < 5; ++i) {
    for (size_t t = 0; t < batch[i].response.size(); ++t) {
      const bool masked_in = batch[i].loss_mask.empty() || batch[i].loss_mask[t] > 0;
      if (!masked_in) continue;
      tokens += 1;
      shifted += batch[i].rollout_logprobs[t] < -1.25f;
    }
  }
  ASSERT_GT(shifted, 0);
  ASSERT_LT(shifted, tokens);
  PolicyTrainer trainer(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
  auto m = trainer.Step(batch, Objective::kPolicyGradient, 1e-2, Options(64));
  ASSERT_TRUE(m.ok()) << m.status();
  const double w = std::exp(0.5);
  const double frac = shifted / tokens;
  EXPECT_NEAR((*m)["mismatch_abs_logprob"], 0.5 * frac, 1e-6);
  EXPECT_NEAR((*m)["mismatch_ratio_outside"], frac, 1e-9);
  EXPECT_NEAR((*m)["mismatch_kl_k3"], (w - 1.0 - 0.5) * frac, 1e-6);
  const double sum_w = shifted * w + (tokens - shifted),
               sum_w2 = shifted * w * w + (tokens - shifted);
  EXPECT_NEAR((*m)["mismatch_ess"], sum_w * sum_w / (sum_w2 * tokens), 1e-6);

  // The same policy on both sides: no mismatch, every weight 1.
  std::vector<TrainSample> same = Batch();
  for (auto& s : same) {
    s.old_logprobs.assign(s.response.size(), -1.0f);
    s.rollout_logprobs.assign(s.response.size(), -1.0f);
  }
  m = trainer.Step(same, Objective::kPolicyGradient, 1e-2, Options(2));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)["mismatch_abs_logprob"], 0.0);
  EXPECT_EQ((*m)["mismatch_ratio_outside"], 0.0);
  EXPECT_EQ((*m)["mismatch_kl_k3"], 0.0);
  EXPECT_NEAR((*m)["mismatch_ess"], 1.0, 1e-12);
}

// The trainer's own log-probs of each response (temperature 1, no gradient), as a rollout engine
// holding the same weights would report them.
void SetRolloutToOwnPolicy(const PolicyTrainer& t, std::vector<TrainSample>* batch) {
  at::NoGradGuard ng;
  for (auto& s : *batch) {
    std::vector<int64_t> seq(s.prompt.begin(), s.prompt.end());
    seq.insert(seq.end(), s.response.begin(), s.response.end() - 1);
    at::Tensor lsm = at::log_softmax(t.model().Forward(at::tensor(seq).unsqueeze(0))[0], -1);
    const size_t P = s.prompt.size();
    for (size_t i = 0; i < s.response.size(); ++i) {
      s.rollout_logprobs[i] = lsm[static_cast<int64_t>(P - 1 + i)][s.response[i]].item<float>();
    }
    s.versions.assign(s.response.size(), t.version());
  }
}

// When the rollout log-probs are the trainer's own policy at the step's start (on-policy), the
// three proximal policies are the same policy: recomputed, log-linear (alpha = 0 on the second
// mini-batch, so the rollout's log-probs) and behaviour. The updates agree.
TEST(PolicyTrainerTest, ProximalPoliciesAgreeWhenTheRolloutIsOnPolicy) {
  std::vector<TrainSample> batch;
  for (int i = 0; i < 2; ++i) {
    for (const auto& s : Batch()) batch.push_back(s);
  }
  std::vector<at::Tensor> after;
  for (Proximal proximal : {Proximal::kRecompute, Proximal::kLogLinear, Proximal::kBehaviour}) {
    PolicyTrainer t(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
    std::vector<TrainSample> b = batch;
    SetRolloutToOwnPolicy(t, &b);
    TrainOptions opts = Options(4);
    opts.mini_batches = 2;
    opts.proximal = proximal;
    auto m = t.Step(b, Objective::kPolicyGradient, 5e-2, opts);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(t.version(), 2);
    after.push_back(Flat(t));
  }
  EXPECT_TRUE(testing::AllClose(after[1], after[0], {1e-5, 1e-6, 1e-5}));
  EXPECT_TRUE(testing::AllClose(after[2], after[0], {1e-5, 1e-6, 1e-5}));
}

// Off-policy rollout log-probs: with the behaviour policy as proximal the very first update is
// already clipped; recomputed, the first mini-batch's ratio is 1.
TEST(PolicyTrainerTest, BehaviourProximalClipsAStaleBatchFromTheFirstUpdate) {
  PolicyTrainer a(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
  PolicyTrainer b(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
  std::vector<TrainSample> batch = Batch();
  SetRolloutToOwnPolicy(a, &batch);
  for (auto& s : batch) {
    for (size_t t = 0; t < s.response.size(); t += 2) s.rollout_logprobs[t] -= 0.7f;
  }
  TrainOptions opts = Options(64);
  auto recomputed = a.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
  opts.proximal = Proximal::kBehaviour;
  auto behaviour = b.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_TRUE(recomputed.ok() && behaviour.ok());
  EXPECT_EQ((*recomputed)["clip_frac"], 0.0);
  EXPECT_GT((*behaviour)["clip_frac"], 0.2);
  EXPECT_GT((*behaviour)["approx_kl"], 0.05);
}

// IcePop and M2PO through the trainer: half the tokens have d = logp_old - logp_rollout = 1
// (weight e > icepop_high 2, d^2 = 1), the rest 0. Both corrections mask exactly the first half
// (for M2PO: with them gone the mean d^2 is 0 <= tau); the step still trains on the rest.
TEST(PolicyTrainerTest, IcePopAndM2poMaskTheTokensTheRolloutDisagreesOn) {
  for (kernels::Correction c : {kernels::Correction::kIcePop, kernels::Correction::kM2po}) {
    PolicyTrainer t(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
    std::vector<TrainSample> batch = Batch();
    SetRolloutToOwnPolicy(t, &batch);
    double tokens = 0, shifted = 0;
    for (auto& s : batch) {
      for (size_t i = 0; i < s.response.size(); ++i) {
        if (!s.loss_mask.empty() && s.loss_mask[i] == 0) continue;
        tokens += 1;
        if (i % 2 == 0) {
          s.rollout_logprobs[i] -= 1.0f;
          shifted += 1;
        }
      }
    }
    TrainOptions opts = Options(3);
    opts.loss.correction = c;
    auto m = t.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_NEAR((*m)["correction_masked_frac"], shifted / tokens, 1e-9) << algorithm::NameOf(c);
    // The kept tokens have weight 1 (exp(0) for IcePop, 1 for M2PO).
    EXPECT_NEAR((*m)["behaviour_weight_mean"], 1.0 - shifted / tokens, 1e-5);
    EXPECT_EQ(t.version(), 1);
  }
}

// The entropy bonus alone (every advantage 0, so the policy term has no gradient): the loss is
// -c times the aggregated entropy, the step raises the policy's entropy, and micro-batching
// gives the same update (the bonus uses the batch-wide aggregation weights).
TEST(PolicyTrainerTest, EntropyBonusRaisesEntropyWithBatchWideWeights) {
  for (kernels::LossAgg agg : {kernels::LossAgg::kTokenMean, kernels::LossAgg::kSeqMeanTokenMean}) {
    std::vector<TrainSample> batch = Batch();
    for (auto& s : batch) s.advantage = 0.0f;
    PolicyTrainer whole(model::Transformer::Create(Spec(), 8, 0.5), 5e-2, 0, 0.9, 0.999);
    PolicyTrainer micro(model::Transformer::Create(Spec(), 8, 0.5), 5e-2, 0, 0.9, 0.999);
    TrainOptions opts = Options(64);
    opts.entropy_coef = 0.5;
    opts.loss.agg = agg;
    // A small step: AdamW moves every weight by about lr, which must not overshoot.
    auto a = whole.Step(batch, Objective::kPolicyGradient, 1e-3, opts);
    opts.micro_batch_size = 2;
    auto b = micro.Step(batch, Objective::kPolicyGradient, 1e-3, opts);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_GT((*a)["grad_norm"], 0.0);
    EXPECT_TRUE(testing::AllClose(Flat(whole), Flat(micro), {1e-5, 1e-6, 1e-5}));
    EXPECT_NEAR((*a)["loss"], (*b)["loss"], 1e-6);
    if (agg == kernels::LossAgg::kTokenMean) {
      // Token mean: the bonus is exactly -c * the entropy metric (also a token mean).
      EXPECT_NEAR((*a)["loss"], -0.5 * (*a)["entropy"], 1e-6);
    }
    // A second step's metrics measure the entropy after the first: higher.
    auto after = whole.Step(batch, Objective::kPolicyGradient, 1e-9, opts);
    ASSERT_TRUE(after.ok());
    EXPECT_GT((*after)["entropy"], (*a)["entropy"]) << algorithm::NameOf(agg);
  }
}

// The policy-loss kinds reach the update: on the same stale batch (PPO mini-batches move the
// ratio away from 1) each kind gives different weights, and SAO and CISPO report their clips.
TEST(PolicyTrainerTest, PolicyLossKindsGiveTheirOwnUpdates) {
  std::vector<TrainSample> batch;
  for (int i = 0; i < 4; ++i) {
    for (const auto& s : Batch()) batch.push_back(s);
  }
  std::vector<at::Tensor> weights;
  for (kernels::PolicyLossKind kind : algorithm::BuiltinPolicyLossKinds()) {
    PolicyTrainer t(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
    TrainOptions opts = Options(64);
    opts.mini_batches = 4;
    opts.loss.kind = kind;
    auto m = t.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_GT((*m)["clip_frac"], 0.0) << algorithm::NameOf(kind);
    weights.push_back(Flat(t));
  }
  for (size_t i = 0; i < weights.size(); ++i) {
    for (size_t j = i + 1; j < weights.size(); ++j) {
      EXPECT_FALSE(at::equal(weights[i], weights[j])) << i << " vs " << j;
    }
  }
}

// The KL term pulls the policy back to the reference: with every advantage 0 only the KL has a
// gradient; after supervised steps moved the policy away from the reference (frozen at the first
// policy-gradient step), KL-only steps bring kl_ref down.
TEST(PolicyTrainerTest, KlTermPullsThePolicyBackToTheReference) {
  std::vector<TrainSample> batch = Batch();
  for (auto& s : batch) s.advantage = 0.0f;
  PolicyTrainer t(model::Transformer::Create(Spec(), 8, 0.2), 1e-2, 0, 0.9, 0.999);
  TrainOptions opts = Options(64);
  opts.loss.kl = kernels::KlKind::kK2;
  opts.loss.kl_coef = 1.0f;
  auto first = t.Step(batch, Objective::kPolicyGradient, 1e-2, opts);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)["kl_ref"], 0.0);
  EXPECT_EQ((*first)["grad_norm"], 0.0);  // at the reference, with A = 0: nothing to learn
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(t.Step(batch, Objective::kSft, 2e-2, opts).ok());
  // A fresh AdamW state, so the supervised steps' momentum does not carry on.
  TrainOptions reset = opts;
  reset.reset_optimizer_state = true;
  auto away = t.Step(batch, Objective::kPolicyGradient, 2e-3, reset);
  ASSERT_TRUE(away.ok());
  EXPECT_GT((*away)["kl_ref"], 0.0);
  EXPECT_GT((*away)["grad_norm"], 0.0);
  double kl = (*away)["kl_ref"];
  for (int i = 0; i < 5; ++i) {
    auto m = t.Step(batch, Objective::kPolicyGradient, 2e-3, opts);
    ASSERT_TRUE(m.ok());
    kl = (*m)["kl_ref"];
  }
  EXPECT_LT(kl, 0.8 * (*away)["kl_ref"]);
  // The loss is the KL term alone: kl_coef * kl_ref.
  auto last = t.Step(batch, Objective::kPolicyGradient, 1e-12, opts);
  ASSERT_TRUE(last.ok());
  EXPECT_NEAR((*last)["loss"], (*last)["kl_ref"], 1e-6);
}

// KL in the reward: the first call freezes the reference (every KL 0); after supervised steps
// each sample's KL is the sum over its masked response tokens of k3(logp - logp_ref), which a
// full forward of the policy and of the reference reproduce token by token.
TEST(PolicyTrainerTest, SequenceKlSumsTheEstimatorOverEachSamplesMaskedTokens) {
  PolicyTrainer t(model::Transformer::Create(Spec(), 8, 0.2), 1e-2, 0, 0.9, 0.999);
  const std::vector<TrainSample> batch = Batch();
  auto first = t.SequenceKl(batch, kernels::KlKind::kK3, 1.0, 4);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, std::vector<double>(batch.size(), 0.0));
  ASSERT_NE(t.reference(), nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.Step(batch, Objective::kSft, 2e-2, Options(64)).ok());
  const int64_t version = t.version();
  auto kl = t.SequenceKl(batch, kernels::KlKind::kK3, 1.0, 4);
  ASSERT_TRUE(kl.ok()) << kl.status();
  EXPECT_EQ(t.version(), version);  // no step

  auto token_logp = [](const model::Transformer& m, const TrainSample& s) {
    std::vector<int64_t> seq(s.prompt.begin(), s.prompt.end());
    seq.insert(seq.end(), s.response.begin(), s.response.end());
    at::NoGradGuard ng;
    at::Tensor lsm = at::log_softmax(m.Forward(at::tensor(seq).unsqueeze(0))[0], -1);
    std::vector<double> out;
    for (size_t i = 0; i < s.response.size(); ++i) {
      out.push_back(lsm[s.prompt.size() - 1 + i][s.response[i]].item<double>());
    }
    return out;
  };
  ASSERT_EQ(kl->size(), batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto lp = token_logp(t.model(), batch[i]);
    const auto ref = token_logp(*t.reference(), batch[i]);
    double want = 0;
    for (size_t k = 0; k < lp.size(); ++k) {
      if (!batch[i].loss_mask.empty() && batch[i].loss_mask[k] == 0) continue;
      const double d = lp[k] - ref[k];
      want += std::exp(-d) + d - 1.0;
    }
    EXPECT_GT(want, 0.0);
    EXPECT_NEAR((*kl)[i], want, 1e-4 * want + 1e-6) << "sample " << i;
  }
  // Bad samples are refused as Step refuses them.
  std::vector<TrainSample> bad = batch;
  bad[0].response.clear();
  EXPECT_FALSE(t.SequenceKl(bad, kernels::KlKind::kK1, 1.0, 4).ok());
  EXPECT_FALSE(t.SequenceKl(batch, kernels::KlKind::kNone, 1.0, 4).ok());
}

// A policy loss written with torch ops and registered by name (include_torch/gyre/torch.h) trains
// through autograd: PPO's clipped term written that way gives the built-in kernel's update.
TEST(PolicyTrainerTest, ARegisteredTorchLossMatchesTheBuiltInOneThroughAutograd) {
  const Status registered = gyre::RegisterPolicyLoss(
      "test_ppo_torch", "max(-A r, -A clip(r))", [](const gyre::TokenLossInputs& in) {
        const at::Tensor ratio = at::exp(in.logp - in.logp_old);
        const at::Tensor clipped = at::clamp(ratio, 1.0 - in.clip_eps_low, 1.0 + in.clip_eps_high);
        return at::maximum(-in.advantages * ratio, -in.advantages * clipped);
      });
  ASSERT_TRUE(registered.ok()) << registered;
  std::vector<TrainSample> batch;
  for (int i = 0; i < 4; ++i) {
    for (const auto& s : Batch()) batch.push_back(s);
  }
  for (kernels::LossAgg agg : {kernels::LossAgg::kTokenMean, kernels::LossAgg::kSeqMeanTokenSum}) {
    PolicyTrainer builtin(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
    PolicyTrainer user(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
    TrainOptions opts = Options(7);
    opts.mini_batches = 4;  // later mini-batches move the ratio into both clips
    opts.loss.dual_clip_c = 0.0f;
    opts.loss.agg = agg;
    auto a = builtin.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
    opts.user_loss = "test_ppo_torch";
    auto b = user.Step(batch, Objective::kPolicyGradient, 5e-2, opts);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_GT((*a)["clip_frac"], 0.0);
    EXPECT_NEAR((*a)["loss"], (*b)["loss"], 1e-5 + 1e-4 * std::abs((*a)["loss"]));
    EXPECT_TRUE(testing::AllClose(Flat(builtin), Flat(user), {1e-4, 1e-6, 1e-5}))
        << algorithm::NameOf(agg);
  }
  // Names: no second registration, no built-in's name, and a loss must return one value per
  // token; an unregistered name fails the step. Each failure leaves the weights alone.
  EXPECT_EQ(
      gyre::RegisterPolicyLoss("test_ppo_torch", "", [](auto&) { return at::Tensor(); }).code(),
      StatusCode::kAlreadyExists);
  EXPECT_EQ(gyre::RegisterPolicyLoss("ppo", "", [](auto&) { return at::Tensor(); }).code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(gyre::RegisterPolicyLoss("No Good", "", [](auto&) { return at::Tensor(); }).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(gyre::RegisterPolicyLoss("test_scalar", "", [](const gyre::TokenLossInputs& in) {
                return in.logp.sum();
              }).ok());
  PolicyTrainer t(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
  const at::Tensor before = Flat(t).clone();
  TrainOptions opts = Options(64);
  opts.user_loss = "test_scalar";
  auto scalar = t.Step(Batch(), Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_FALSE(scalar.ok());
  EXPECT_NE(scalar.status().message().find("expected one loss per token"), std::string::npos)
      << scalar.status();
  opts.user_loss = "test_never_registered";
  auto missing = t.Step(Batch(), Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("RegisterPolicyLoss before gyre::MaybeRunWorker"),
            std::string::npos)
      << missing.status();
  EXPECT_TRUE(at::equal(before, Flat(t)));
  EXPECT_EQ(t.version(), 0);
}

// include_torch/gyre/torch.h's PolicyLoss: a scalar with the kernel's value and, through autograd,
// the kernel's gradient; the same numbers as the plain-array API.
TEST(TorchApiTest, PolicyLossTensorHasTheKernelsValueAndGradient) {
  const std::vector<float> lp = {-1.2f, -0.4f, -2.0f, -0.9f, -1.5f, -0.3f};
  const std::vector<float> old = {-1.0f, -0.9f, -1.9f, -1.0f, -1.0f, -0.3f};
  const std::vector<float> adv = {1.0f, 1.0f, 1.0f, -2.0f, -2.0f, -2.0f};
  const std::vector<float> mask = {1, 1, 1, 1, 1, 0};
  auto t = [](const std::vector<float>& v) { return at::tensor(v).view({2, 3}); };
  for (const char* loss : {"ppo", "gspo", "cispo", "sao"}) {
    gyre::PolicyLossOptions o;
    o.loss = loss;
    o.aggregation = "seq-mean-token-mean";
    at::Tensor logp = t(lp).requires_grad_(true);
    auto r = gyre::PolicyLoss(logp, t(old), t(adv), t(mask), o);
    ASSERT_TRUE(r.ok()) << r.status();
    r->loss.backward();
    gyre::PolicyLossArrays a;
    a.sequences = 2;
    a.tokens_per_sequence = 3;
    a.logp = lp.data();
    a.logp_old = old.data();
    a.advantages = adv.data();
    a.mask = mask.data();
    std::vector<float> grad(6);
    auto want = gyre::PolicyLoss(a, o, grad.data());
    ASSERT_TRUE(want.ok());
    EXPECT_NEAR(r->loss.item<double>(), want->loss, 1e-6) << loss;
    EXPECT_EQ(r->value.clip_fraction, want->clip_fraction) << loss;
    for (int i = 0; i < 6; ++i) {
      EXPECT_NEAR(logp.grad().view(-1)[i].item<float>(), grad[i], 1e-7) << loss << " " << i;
    }
  }
  gyre::PolicyLossOptions o;
  o.kl = "k3";
  auto no_ref = gyre::PolicyLoss(t(lp), t(old), t(adv), t(mask), o);
  EXPECT_FALSE(no_ref.ok());
  o.kl = "k9";
  auto bad = gyre::PolicyLoss(t(lp), t(old), t(adv), t(mask), o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'k9' is not one of none, k1, k2, k3"), std::string::npos);
}

TEST(PolicyTrainerTest, OffPolicyOptionsRefuseBatchesThatLackWhatTheyNeed) {
  PolicyTrainer t(model::Transformer::Create(Spec(), 6, 0.1), 5e-2, 0, 0.9, 0.999);
  const at::Tensor before = Flat(t);
  std::vector<TrainSample> no_versions = Batch();
  TrainOptions opts = Options(64);
  opts.proximal = Proximal::kLogLinear;
  auto m = t.Step(no_versions, Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("token versions"), std::string::npos) << m.status();

  std::vector<TrainSample> no_rollout = Batch();
  no_rollout[3].rollout_logprobs.clear();
  opts = Options(64);
  opts.loss.correction = kernels::Correction::kSeqTis;
  m = t.Step(no_rollout, Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("sample 3: has no rollout log-probs"), std::string::npos)
      << m.status();

  opts.loss.correction = kernels::Correction::kM2po;
  opts.proximal = Proximal::kBehaviour;
  m = t.Step(Batch(), Objective::kPolicyGradient, 5e-2, opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("m2po"), std::string::npos) << m.status();
  EXPECT_EQ(t.version(), 0);
  EXPECT_TRUE(at::equal(Flat(t), before));
}

}  // namespace
}  // namespace gyre::trainer
