#include "algorithm/registry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "algorithm/lr_schedule.h"
#include "algorithm/sampling_policy.h"
#include "algorithm/sequence_advantages.h"
#include "kernels/reference/advantages_ref.h"
#include "kernels/reference/policy_loss_ref.h"
#include "test_paths.h"

namespace gyre::algorithm {
namespace {

// Every registered built-in needs a check here against values worked out by hand: a new name
// without one fails EveryBuiltinHasAHandComputedCheck.
using Check = std::function<void()>;

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 + 1e-6 * std::abs(want[i])) << what << " sample " << i;
  }
}

// Groups {1, 0, 0, 1} and {3, 1, 2}.
const std::vector<float> kRewards = {1, 0, 0, 1, 3, 1, 2};
const std::vector<int32_t> kSizes = {4, 3};

std::vector<float> Advantages(const std::string& name) {
  auto adv = ComputeAdvantages(name, kRewards, kSizes, nullptr);
  EXPECT_TRUE(adv.ok()) << adv.status().ToString();
  return adv.ok() ? *adv : std::vector<float>();
}

// One token per sequence, three sequences: log ratios log(1.5), log(0.5), log(1.1), advantages
// +1, +1, -1 (the cases where the policy terms differ).
struct LossBatch {
  std::vector<float> logp, logp_old, logp_rollout, adv, mask;
  int64_t S = 3, T = 1;
};

LossBatch ThreeTokens() {
  LossBatch b;
  b.logp_old = {-1.0f, -1.0f, -1.0f};
  b.logp = {static_cast<float>(-1.0 + std::log(1.5)), static_cast<float>(-1.0 + std::log(0.5)),
            static_cast<float>(-1.0 + std::log(1.1))};
  b.logp_rollout = b.logp_old;
  b.adv = {1.0f, 1.0f, -1.0f};
  b.mask = {1.0f, 1.0f, 1.0f};
  return b;
}

kernels::PolicyLossStats Loss(const LossBatch& b, const kernels::PolicyLossParams& p,
                              std::vector<float>* grad) {
  kernels::PolicyLossInputs in;
  in.S = b.S;
  in.T = b.T;
  in.logp = b.logp.data();
  in.logp_old = b.logp_old.data();
  in.logp_rollout = b.logp_rollout.data();
  in.advantages = b.adv.data();
  in.mask = b.mask.data();
  grad->assign(b.S * b.T, 0.0f);
  return kernels::PolicyLossRef(in, p, grad->data());
}

kernels::PolicyLossParams LossNamed(const std::string& name) {
  kernels::PolicyLossParams p;
  auto kind = PolicyLossKindFor(name);
  EXPECT_TRUE(kind.ok()) << name;
  if (kind.ok()) p.kind = *kind;
  return p;
}

std::map<std::string, Check> HandChecks() {
  std::map<std::string, Check> c;
  // Advantages. Group 1: mean 0.5, unbiased std sqrt(1/3). Group 2: mean 2, std 1, median 2.
  c["algorithm.advantage/grpo"] = [] {
    const double a = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-6), b = 1.0 / (1.0 + 1e-6);
    ExpectNear(Advantages("grpo"), {a, -a, -a, a, b, -b, 0}, "grpo");
  };
  c["algorithm.advantage/grpo_no_std"] = [] {
    ExpectNear(Advantages("grpo_no_std"), {0.5, -0.5, -0.5, 0.5, 1, -1, 0}, "grpo_no_std");
  };
  c["algorithm.advantage/rloo"] = [] {
    // n / (n - 1) (R - mean): 4/3 * 0.5 and 3/2 * 1.
    const double a = 2.0 / 3.0;
    ExpectNear(Advantages("rloo"), {a, -a, -a, a, 1.5, -1.5, 0}, "rloo");
  };
  c["algorithm.advantage/reinforce_pp"] = [] {
    // Batch mean 8/7; squared deviations sum to 336/49 = 48/7; unbiased std sqrt(48/42).
    const double mean = 8.0 / 7.0, sd = std::sqrt(48.0 / 42.0) + 1e-6;
    std::vector<double> want;
    for (float r : kRewards) want.push_back((r - mean) / sd);
    ExpectNear(Advantages("reinforce_pp"), want, "reinforce_pp");
  };
  c["algorithm.advantage/reinforce_pp_baseline"] = [] {
    // Centred {.5, -.5, -.5, .5, 1, -1, 0}: mean 0, squares sum 3, unbiased std sqrt(3/6).
    const double sd = std::sqrt(0.5) + 1e-6;
    ExpectNear(Advantages("reinforce_pp_baseline"),
               {0.5 / sd, -0.5 / sd, -0.5 / sd, 0.5 / sd, 1 / sd, -1 / sd, 0},
               "reinforce_pp_baseline");
  };
  c["algorithm.advantage/median"] = [] {
    // Group 1 (even): median (0 + 1) / 2 = 0.5. Group 2: median 2.
    ExpectNear(Advantages("median"), {0.5, -0.5, -0.5, 0.5, 1, -1, 0}, "median");
  };
  // grpo_passk. Group 1: best = sample 0 (first of the 1s), second best 1: margin 0. Group 2:
  // best = sample 4 (R = 3), second best 2: margin 1, std 1.
  c["algorithm.advantage/grpo_passk"] = [] {
    ExpectNear(Advantages("grpo_passk"), {0, 0, 0, 0, 1.0 / (1.0 + 1e-6), 0, 0}, "grpo_passk");
    // A clear winner: {0, 1, 0}: mean 1/3, unbiased std sqrt(1/3).
    auto w = ComputeAdvantages("grpo_passk", {0, 1, 0}, {3}, nullptr);
    ASSERT_TRUE(w.ok());
    ExpectNear(*w, {0, 1.0 / (std::sqrt(1.0 / 3.0) + 1e-6), 0}, "grpo_passk winner");
    auto one = ComputeAdvantages("grpo_passk", {5}, {1}, nullptr);
    ASSERT_TRUE(one.ok());
    ExpectNear(*one, {0}, "grpo_passk group of one");
  };
  // gpg: both groups have a signal, alpha = 7 / 7; {1, 1} added (no signal): alpha = 9 / 7.
  c["algorithm.advantage/gpg"] = [] {
    ExpectNear(Advantages("gpg"), {0.5, -0.5, -0.5, 0.5, 1, -1, 0}, "gpg");
    auto a = ComputeAdvantages("gpg", {1, 0, 1, 1}, {2, 2}, nullptr);
    ASSERT_TRUE(a.ok());
    ExpectNear(*a, {1.0, -1.0, 0, 0}, "gpg alpha = 4 / 2");
  };
  // opo with lengths {1, 3, 2, 2 | 1, 1, 2}: group 1 baseline (1 + 2) / 8 = 0.375, group 2
  // (3 + 1 + 4) / 4 = 2.
  c["algorithm.advantage/opo"] = [] {
    const std::vector<int32_t> lengths = {1, 3, 2, 2, 1, 1, 2};
    auto a = ComputeAdvantages("opo", kRewards, kSizes, nullptr, &lengths);
    ASSERT_TRUE(a.ok()) << a.status();
    ExpectNear(*a, {0.625, -0.375, -0.375, 0.625, 1, -1, 0}, "opo");
    auto no_lengths = ComputeAdvantages("opo", kRewards, kSizes, nullptr);
    EXPECT_EQ(no_lengths.status().code(), StatusCode::kInvalidArgument);
    const std::vector<int32_t> zero = {1, 0, 2, 2, 1, 1, 2};
    EXPECT_FALSE(ComputeAdvantages("opo", kRewards, kSizes, nullptr, &zero).ok());
  };
  // Policy losses on ThreeTokens (token mean over 3 tokens; r = 1.5, 0.5, 1.1; A = 1, 1, -1).
  c["algorithm.policy_loss/ppo"] = [] {
    // max(-1.5, -1.28) = -1.28 (clipped); max(-0.5, -0.8) = -0.5; max(1.1, 1.1) = 1.1.
    std::vector<float> g;
    const auto s = Loss(ThreeTokens(), LossNamed("ppo"), &g);
    EXPECT_NEAR(s.loss, (-1.28 - 0.5 + 1.1) / 3, 1e-6);
    ExpectNear(g, {0, -0.5 / 3, 1.1 / 3}, "ppo grad");
  };
  c["algorithm.policy_loss/gspo"] = [] {
    // One token per sequence: the sequence ratio is the token's; no dual clip.
    LossBatch b = ThreeTokens();
    b.logp[2] = static_cast<float>(-1.0 + std::log(4.0));  // A = -1, r = 4: PPO caps at 3
    std::vector<float> g;
    const auto s = Loss(b, LossNamed("gspo"), &g);
    EXPECT_NEAR(s.loss, (-1.28 - 0.5 + 4.0) / 3, 1e-6);
    ExpectNear(g, {0, -0.5 / 3, 4.0 / 3}, "gspo grad");
  };
  c["algorithm.policy_loss/cispo"] = [] {
    // -A clip(r): -1.28, -0.8, 1.1; every token keeps the gradient -A clip(r) / 3.
    std::vector<float> g;
    const auto s = Loss(ThreeTokens(), LossNamed("cispo"), &g);
    EXPECT_NEAR(s.loss, (-1.28 - 0.8 + 1.1) / 3, 1e-6);
    ExpectNear(g, {-1.28 / 3, -0.8 / 3, 1.1 / 3}, "cispo grad");
  };
  c["algorithm.policy_loss/sao"] = [] {
    // r = 1.5 and 0.5 leave [0.8, 1.28]: masked. r = 1.1 stays: -A r = 1.1.
    std::vector<float> g;
    const auto s = Loss(ThreeTokens(), LossNamed("sao"), &g);
    EXPECT_NEAR(s.loss, 1.1 / 3, 1e-6);
    ExpectNear(g, {0, 0, 1.1 / 3}, "sao grad");
    EXPECT_NEAR(s.clip_frac, 2.0 / 3, 1e-12);
  };
  c["algorithm.policy_loss/gmpo"] = [] {
    // One sequence of the three tokens with A = 1: x = log 1.5 is capped at log 1.28, so X =
    // log(1.28 * 0.5 * 1.1) / 3 and every token's term is -exp(X); token-mean gives -exp(X). The
    // clipped token gets no gradient, the others -exp(X) / 3.
    LossBatch b = ThreeTokens();
    b.S = 1;
    b.T = 3;
    b.adv = {1.0f, 1.0f, 1.0f};
    std::vector<float> g;
    const auto s = Loss(b, LossNamed("gmpo"), &g);
    const double gm = std::cbrt(1.28 * 0.5 * 1.1);
    EXPECT_NEAR(s.loss, -gm, 1e-6);
    ExpectNear(g, {0, -gm / 3, -gm / 3}, "gmpo grad");
    EXPECT_NEAR(s.clip_frac, 1.0 / 3, 1e-12);
  };
  // Aggregations: two sequences of lengths 1 and 3, r = 1 everywhere, A = -1 on the first and
  // -2 on the second: token terms 1 and 2, 2, 2.
  auto agg = [](const std::string& name, double want) {
    LossBatch b;
    b.S = 2;
    b.T = 3;
    b.logp = b.logp_old = b.logp_rollout = std::vector<float>(6, -1.0f);
    b.adv = {-1, 0, 0, -2, -2, -2};
    b.mask = {1, 0, 0, 1, 1, 1};
    kernels::PolicyLossParams p;
    auto parsed = LossAggFor(name);
    ASSERT_TRUE(parsed.ok()) << name;
    p.agg = *parsed;
    p.norm_max_len = 4;
    std::vector<float> g;
    EXPECT_NEAR(Loss(b, p, &g).loss, want, 1e-9) << name;
  };
  c["algorithm.loss_agg/token-mean"] = [agg] { agg("token-mean", 7.0 / 4); };
  c["algorithm.loss_agg/seq-mean-token-mean"] = [agg] { agg("seq-mean-token-mean", 1.5); };
  c["algorithm.loss_agg/seq-mean-token-sum"] = [agg] { agg("seq-mean-token-sum", 3.5); };
  c["algorithm.loss_agg/seq-mean-token-sum-norm"] = [agg] {
    agg("seq-mean-token-sum-norm", 7.0 / (2 * 4));
  };
  // Corrections on one token: A = -1, r = 1 (L = 1), d = logp_old - logp_rollout = log 3.
  auto corr = [](const std::string& name, double want) {
    LossBatch b;
    b.S = 1;
    b.logp = b.logp_old = {-1.0f};
    b.logp_rollout = {static_cast<float>(-1.0 - std::log(3.0))};
    b.adv = {-1.0f};
    b.mask = {1.0f};
    kernels::PolicyLossParams p;
    auto parsed = CorrectionFor(name);
    ASSERT_TRUE(parsed.ok()) << name;
    p.correction = *parsed;
    p.m2po_threshold = 1.0;  // log(3)^2 = 1.207 >= 1: masked
    std::vector<float> g;
    EXPECT_NEAR(Loss(b, p, &g).loss, want, 1e-6) << name;
  };
  c["algorithm.correction/none"] = [corr] { corr("none", 1.0); };
  c["algorithm.correction/tis"] = [corr] { corr("tis", 2.0); };  // min(3, tis_cap 2)
  c["algorithm.correction/seq-tis"] = [corr] { corr("seq-tis", 2.0); };
  c["algorithm.correction/icepop"] = [corr] { corr("icepop", 0.0); };  // 3 > icepop_high 2
  c["algorithm.correction/m2po"] = [corr] { corr("m2po", 0.0); };
  // KL on one token with r = 1 and A = 0 (no policy term), d = logp - logp_ref = 0.5, kl_coef 1:
  // the loss is the estimator and its gradient the estimator's derivative.
  auto kl = [](const std::string& name, double value, double grad) {
    LossBatch b;
    b.S = 1;
    b.logp = b.logp_old = b.logp_rollout = {-1.0f};
    b.adv = {0.0f};
    b.mask = {1.0f};
    const std::vector<float> ref = {-1.5f};
    kernels::PolicyLossParams p;
    auto parsed = KlKindFor(name);
    ASSERT_TRUE(parsed.ok()) << name;
    p.kl = *parsed;
    p.kl_coef = 1.0f;
    kernels::PolicyLossInputs in;
    in.S = 1;
    in.T = 1;
    in.logp = b.logp.data();
    in.logp_old = b.logp_old.data();
    in.logp_ref = ref.data();
    in.advantages = b.adv.data();
    in.mask = b.mask.data();
    std::vector<float> g(1);
    const auto s = kernels::PolicyLossRef(in, p, g.data());
    EXPECT_NEAR(s.loss, value, 1e-6) << name;
    EXPECT_NEAR(g[0], grad, 1e-6) << name;
  };
  c["algorithm.kl/none"] = [kl] { kl("none", 0.0, 0.0); };
  c["algorithm.kl/k1"] = [kl] { kl("k1", 0.5, 1.0); };
  c["algorithm.kl/k2"] = [kl] { kl("k2", 0.125, 0.5); };
  // exp(-0.5) + 0.5 - 1 = 0.10653066; d/d logp = 1 - exp(-0.5) = 0.39346934.
  c["algorithm.kl/k3"] = [kl] { kl("k3", 0.10653065971263342, 0.3934693402873666); };
  // Sampling policies (sampling_policy_test.cc has the full cases): G = 8, 4 pilot samples.
  auto budget = [](const std::string& policy) {
    JobConfig c;
    c.rollout.group_size = 8;
    c.rollout.budget.policy = policy;
    c.rollout.budget.pilot_samples = 4;
    c.rollout.budget.greso_streak = 1;
    c.rollout.budget.greso_initial = 1.0;
    return MakeSamplingPolicy(c, 1.0);
  };
  c["rollout.budget.policy/uniform"] = [budget] { EXPECT_EQ(budget("uniform")->FirstRound(), 8); };
  c["rollout.budget.policy/pilot"] = [budget] {
    // Pilot accuracies 0.5 (in [0.1, 0.9]) and 1: the rest of the group for the first only.
    EXPECT_EQ(budget("pilot")->TopUps({{"a", {1, 0, 1, 0}}, {"b", {1, 1, 1, 1}}}),
              (std::vector<int>{4, 0}));
  };
  c["rollout.budget.policy/variance"] = [budget] {
    // Budget 2 * 4 = 8, all to the only group with variance, 2 at a time (cap 16).
    EXPECT_EQ(budget("variance")->TopUps({{"a", {1, 0, 1, 0}}, {"b", {1, 1, 1, 1}}}),
              (std::vector<int>{8, 0}));
  };
  c["rollout.budget.policy/greso"] = [budget] {
    auto p = budget("greso");
    p->Observe({{"easy", {1, 1}}});
    EXPECT_TRUE(p->Skip("easy", 1, 0));  // streak 1 >= 1, probability 1
    EXPECT_FALSE(p->Skip("new", 1, 1));
  };
  // Schedules: lr 1e-3, 10 steps, 2 warm-up steps, floor 0.1.
  auto trainer = [](const std::string& schedule) {
    TrainerSection t;
    t.lr = 1e-3;
    t.steps = 10;
    t.lr_schedule = schedule;
    t.lr_warmup_steps = 2;
    t.lr_min_ratio = 0.1;
    return t;
  };
  c["trainer.lr_schedule/constant"] = [trainer] {
    EXPECT_DOUBLE_EQ(LearningRate(trainer("constant"), 1), 5e-4);
    EXPECT_DOUBLE_EQ(LearningRate(trainer("constant"), 7), 1e-3);
  };
  c["trainer.lr_schedule/cosine"] = [trainer] {
    // Step 6: p = (6 - 2) / 8 = 0.5, so lr_min + (lr - lr_min) / 2 = 1e-4 + 4.5e-4.
    EXPECT_NEAR(LearningRate(trainer("cosine"), 6), 5.5e-4, 1e-15);
    EXPECT_NEAR(LearningRate(trainer("cosine"), 10), 1e-4, 1e-15);
  };
  return c;
}

TEST(RegistryTest, EveryBuiltinHasAHandComputedCheck) {
  const std::map<std::string, Check> checks = HandChecks();
  std::set<std::string> seen;
  for (const AlgorithmInfo& a : Algorithms()) {
    if (a.user) continue;
    const std::string key = std::string(FamilyKey(a.family)) + "/" + a.name;
    EXPECT_TRUE(seen.insert(key).second) << "registered twice: " << key;
    auto it = checks.find(key);
    if (it == checks.end()) {
      ADD_FAILURE() << "no hand-computed check for " << key;
      continue;
    }
    SCOPED_TRACE(key);
    it->second();
    EXPECT_FALSE(a.formula.empty()) << key;
    EXPECT_FALSE(a.paper.empty()) << key;
    EXPECT_FALSE(a.verl.empty()) << key;
  }
  for (const auto& [key, check] : checks) {
    EXPECT_TRUE(seen.count(key)) << "a check for an unregistered name: " << key;
  }
}

// The registry is the dispatch table: every built-in name carries its implementation, and each
// kernel value has exactly one name.
TEST(RegistryTest, EveryBuiltinCarriesItsImplementation) {
  for (const AlgorithmInfo& a : Algorithms()) {
    if (a.user) continue;
    auto found = Find(a.family, a.name);
    ASSERT_TRUE(found.ok()) << a.name;
    switch (a.family) {
      case Family::kAdvantage:
        // The group kernel's kind names it back, or a batch function computes it.
        if (a.batch_advantage == nullptr) {
          EXPECT_EQ(NameOf(a.advantage_kind), a.name);
        }
        break;
      case Family::kPolicyLoss:
        EXPECT_EQ(NameOf(*PolicyLossKindFor(a.name)), a.name);
        break;
      case Family::kLossAgg:
        EXPECT_EQ(NameOf(*LossAggFor(a.name)), a.name);
        break;
      case Family::kCorrection:
        EXPECT_EQ(NameOf(*CorrectionFor(a.name)), a.name);
        break;
      case Family::kKl:
        EXPECT_EQ(NameOf(*KlKindFor(a.name)), a.name);
        break;
      case Family::kLrSchedule:
      case Family::kSamplingPolicy:
        break;
    }
  }
  auto unknown = Find(Family::kPolicyLoss, "gpmo");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("algorithm.policy_loss 'gpmo'"), std::string::npos)
      << unknown.status().message();
  EXPECT_NE(unknown.status().message().find("gmpo"), std::string::npos);
  EXPECT_FALSE(PolicyLossKindFor("gpmo").ok());
  EXPECT_EQ(NamesFor(Family::kLrSchedule), (std::vector<std::string>{"constant", "cosine"}));
}

TEST(RegistryTest, TheDocsTableIsTheRegistrys) {
  const std::string path = std::string(GYRE_SOURCE_DIR) + "/docs/algorithms.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string doc = buf.str();
  const std::string begin_marker = "<!-- BEGIN registry table";
  const std::string end_marker = "<!-- END registry table -->";
  const size_t b = doc.find(begin_marker);
  ASSERT_NE(b, std::string::npos) << path << " has no '" << begin_marker << "' marker";
  const size_t body = doc.find('\n', b) + 1;
  const size_t e = doc.find(end_marker, body);
  ASSERT_NE(e, std::string::npos) << path << " has no '" << end_marker << "' marker";
  const std::string want = AlgorithmTableMarkdown();
  if (doc.substr(body, e - body) != want && std::getenv("GYRE_UPDATE_DOCS") != nullptr) {
    std::ofstream out(path);
    out << doc.substr(0, body) << want << doc.substr(e);
    GTEST_SKIP() << "rewrote the table in " << path;
  }
  EXPECT_EQ(doc.substr(body, e - body), want)
      << "docs/algorithms.md's table differs from the registry; rerun this test with "
         "GYRE_UPDATE_DOCS=1 to rewrite it";
}

TEST(RegistryTest, AUserEstimatorIsCalledAndListed) {
  AlgorithmInfo info;
  info.family = Family::kAdvantage;
  info.name = "test_sign";
  info.formula = "sign of R - mean";
  int calls = 0;
  ASSERT_TRUE(RegisterAdvantageEstimator(info, [&calls](const std::vector<float>& rewards,
                                                        const std::vector<int32_t>& sizes,
                                                        std::vector<float>* adv) {
                ++calls;
                size_t begin = 0;
                for (int32_t n : sizes) {
                  double sum = 0;
                  for (int32_t i = 0; i < n; ++i) sum += rewards[begin + i];
                  const double mean = sum / n;
                  for (int32_t i = 0; i < n; ++i) {
                    const double d = rewards[begin + i] - mean;
                    adv->push_back(d > 0 ? 1.0f : (d < 0 ? -1.0f : 0.0f));
                  }
                  begin += n;
                }
                return Status::Ok();
              }).ok());
  const std::vector<std::string> names = NamesFor(Family::kAdvantage);
  EXPECT_EQ(names.back(), "test_sign");
  std::vector<uint8_t> zero;
  auto adv = ComputeAdvantages("test_sign", {3, 1, 2, 5, 5}, {3, 2}, &zero);
  ASSERT_TRUE(adv.ok()) << adv.status().ToString();
  EXPECT_EQ(*adv, (std::vector<float>{1, -1, 0, 0, 0}));
  EXPECT_EQ(zero, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(calls, 1);
  // Not in the docs table: that lists the built-ins.
  EXPECT_EQ(AlgorithmTableMarkdown().find("test_sign"), std::string::npos);

  // A second registration of the name, a built-in's name, bad names and no function fail.
  EXPECT_EQ(
      RegisterAdvantageEstimator(info, [](auto&, auto&, auto*) { return Status::Ok(); }).code(),
      StatusCode::kAlreadyExists);
  info.name = "grpo";
  Status builtin =
      RegisterAdvantageEstimator(info, [](auto&, auto&, auto*) { return Status::Ok(); });
  EXPECT_EQ(builtin.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(builtin.message().find("built-in"), std::string::npos) << builtin.message();
  for (const std::string bad : {"", "Upper", "with space", "dash-ed"}) {
    info.name = bad;
    EXPECT_EQ(
        RegisterAdvantageEstimator(info, [](auto&, auto&, auto*) { return Status::Ok(); }).code(),
        StatusCode::kInvalidArgument)
        << bad;
  }
  info.name = "no_function";
  EXPECT_EQ(RegisterAdvantageEstimator(info, nullptr).code(), StatusCode::kInvalidArgument);
  info.name = "wrong_family";
  info.family = Family::kPolicyLoss;
  EXPECT_EQ(
      RegisterAdvantageEstimator(info, [](auto&, auto&, auto*) { return Status::Ok(); }).code(),
      StatusCode::kInvalidArgument);
}

TEST(RegistryTest, AUserEstimatorsErrorsFailTheStepWithItsName) {
  AlgorithmInfo info;
  info.family = Family::kAdvantage;
  info.name = "test_short";
  ASSERT_TRUE(
      RegisterAdvantageEstimator(info, [](const std::vector<float>&, const std::vector<int32_t>&,
                                          std::vector<float>* adv) {
        adv->push_back(1.0f);  // one value, whatever the batch
        return Status::Ok();
      }).ok());
  auto short_out = ComputeAdvantages("test_short", {1, 0}, {2}, nullptr);
  ASSERT_FALSE(short_out.ok());
  EXPECT_NE(short_out.status().message().find("'test_short' returned 1 advantages for 2 rewards"),
            std::string::npos)
      << short_out.status().message();

  info.name = "test_fails";
  ASSERT_TRUE(RegisterAdvantageEstimator(info, [](auto&, auto&, auto*) {
                return InvalidArgument("rewards out of range");
              }).ok());
  auto failed = ComputeAdvantages("test_fails", {1, 0}, {2}, nullptr);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("test_fails"), std::string::npos);
  EXPECT_NE(failed.status().message().find("rewards out of range"), std::string::npos);

  // Grouping is checked before a user function sees it; unknown names list the known ones.
  EXPECT_FALSE(ComputeAdvantages("test_fails", {1, 0}, {3}, nullptr).ok());
  EXPECT_FALSE(ComputeAdvantages("test_fails", {1, 0}, {2, 0}, nullptr).ok());
  auto unknown = ComputeAdvantages("nope", {1}, {1}, nullptr);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("grpo, grpo_no_std"), std::string::npos)
      << unknown.status().message();
}

}  // namespace
}  // namespace gyre::algorithm
