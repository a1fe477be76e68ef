#include "algorithm/registry.h"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "algorithm/lr_schedule.h"
#include "algorithm/sequence_advantages.h"
#include "ops/advantages.h"

namespace gyre::algorithm {
namespace {

// A built-in entry with its implementation attached (see AlgorithmInfo).
AlgorithmInfo Group(AlgorithmInfo info, kernels::AdvantageKind kind) {
  info.advantage_kind = kind;
  return info;
}
AlgorithmInfo Batch(AlgorithmInfo info, BatchAdvantageFn fn) {
  info.batch_advantage = fn;
  return info;
}
AlgorithmInfo Loss(AlgorithmInfo info, kernels::PolicyLossKind kind) {
  info.policy_loss = kind;
  return info;
}
AlgorithmInfo Agg(AlgorithmInfo info, kernels::LossAgg agg) {
  info.loss_agg = agg;
  return info;
}
AlgorithmInfo Corr(AlgorithmInfo info, kernels::Correction correction) {
  info.correction = correction;
  return info;
}
AlgorithmInfo Kl(AlgorithmInfo info, kernels::KlKind kl) {
  info.kl = kl;
  return info;
}

// The built-ins. Formulas use docs/algorithms.md's symbols; a cell must not contain '|'.
const std::vector<AlgorithmInfo>& Builtins() {
  static const std::vector<AlgorithmInfo>* builtins = new std::vector<AlgorithmInfo>{
      // Advantages: R_i the group's rewards, n its size, mean/std/median over the group.
      Group(
          {Family::kAdvantage, "grpo", "(R_i - mean) / (std + 1e-6), std unbiased; 0 for n = 1",
           "DeepSeekMath (Shao et al. 2024, arXiv:2402.03300)",
           "verl gives a group of one mean 0 and std 1 (advantage R_i / (1 + eps)); Gyre gives 0"},
          kernels::AdvantageKind::kGrpo),
      Group({Family::kAdvantage, "grpo_no_std", "R_i - mean",
             "Dr. GRPO: Understanding R1-Zero-Like Training (Liu et al. 2025, arXiv:2503.20783)",
             "verl's grpo with norm_adv_by_std_in_grpo: false; a group of one gets R_i there, 0 "
             "here"},
            kernels::AdvantageKind::kGrpoNoStd),
      Group(
          {Family::kAdvantage, "rloo",
           "n / (n - 1) (R_i - mean): R_i minus the others' mean; 0 for n = 1",
           "Back to Basics: REINFORCE style optimization (Ahmadian et al. 2024, arXiv:2402.14740)",
           "a group of one gets R_i in verl, 0 here (Gyre's config requires n >= 2)"},
          kernels::AdvantageKind::kRloo),
      Group(
          {Family::kAdvantage, "reinforce_pp",
           "R_i whitened over every sample of the batch: (R_i - mean_B) / (std_B + 1e-6)",
           "REINFORCE++ (Hu 2025, arXiv:2501.03262)",
           "verl whitens per-token discounted returns over every response token of the batch (long "
           "responses weigh more) with rsqrt(var + 1e-8); Gyre whitens one value per sample, gamma "
           "= "
           "1"},
          kernels::AdvantageKind::kReinforcePp),
      Group({Family::kAdvantage, "reinforce_pp_baseline",
             "x_i = R_i - mean, then x whitened over every sample of the batch",
             "REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262)",
             "verl whitens over response tokens, not samples, and gives a group of one mean 0"},
            kernels::AdvantageKind::kReinforcePpBaseline),
      Group({Family::kAdvantage, "median",
             "R_i - median; with an odd n the first sample equal to the median (the pivot) is left "
             "out of the step",
             "MC-GRPO (Kim 2026, arXiv:2601.22582): n = G + 1 samples, G trained",
             "verl has no median estimator"},
            kernels::AdvantageKind::kMedian),
      Batch({Family::kAdvantage, "grpo_passk",
             "the group's best sample (first with the maximum R) gets (R_max - R_second) / (std + "
             "1e-6), std unbiased; every other sample 0",
             "Pass@k policy gradient (arXiv:2503.19595, as cited by verl)",
             "same as verl with norm_adv_by_std_in_grpo: true; a group of one gets 0"},
            PassKAdvantages),
      Batch({Family::kAdvantage, "gpg",
             "alpha (R_i - mean), alpha = B / (samples of the batch's groups whose rewards differ)",
             "GPG: Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546), F_norm = 1",
             "verl's alpha counts the samples with a non-zero reward; Gyre counts the samples of "
             "groups with a learning signal (B - M in the paper)"},
            GpgAdvantages),
      Batch({Family::kAdvantage, "opo",
             "R_i - sum(l_j R_j) / sum(l_j): the group's length-weighted mean as baseline, l = "
             "response tokens",
             "On-Policy RL with Optimal Reward Baseline (Hao et al. 2025, arXiv:2505.23585)",
             "a group of one gets R_i in verl (baseline 0), 0 here"},
            OpoAdvantages),
      // Policy losses: r = exp(clamp(x, -20, 20)), x = logp - logp_old, lo/hi the clip bounds.
      Loss({Family::kPolicyLoss, "ppo",
            "max(-A r, -A clip(r, lo, hi)); A < 0: min(that, -A dual_clip_c)",
            "PPO (Schulman et al. 2017, arXiv:1707.06347); dual clip (Ye et al. 2020, "
            "arXiv:1912.09729); clip-higher (DAPO, arXiv:2503.14476)",
            "same as verl's vanilla loss (clip_ratio_c = dual_clip_c)"},
           kernels::PolicyLossKind::kPpo),
      Loss({Family::kPolicyLoss, "gspo",
            "the ppo clip on x = the sequence's mean of logp - logp_old, gradient to each token "
            "(GSPO-token); no dual clip",
            "GSPO (Zheng et al. 2025, arXiv:2507.18071)",
            "verl clamps x at 10 (Gyre: +-20) and always aggregates seq-mean-token-mean; Gyre uses "
            "algorithm.loss_agg (set seq-mean-token-mean for the paper's objective)"},
           kernels::PolicyLossKind::kGspo),
      Loss({Family::kPolicyLoss, "cispo",
            "-A clip(r, lo, hi) with gradient -A sg(clip(r, lo, hi)) d logp: every token keeps its "
            "gradient",
            "CISPO, MiniMax-M1 (MiniMax 2025, arXiv:2506.13585)",
            "verl's loss value is -sg(clip(r)) A logp (same gradient, different value); the paper "
            "sets no lower bound (a large clip_eps_low here)"},
           kernels::PolicyLossKind::kCispo),
      Loss({Family::kPolicyLoss, "sao",
            "-A r where lo <= r <= hi, else 0 with no gradient (double-sided token masking)",
            "Gyre's definition: no paper defines this name; the mask is the PPO clip band applied "
            "to both signs of A",
            "verl has no loss of this name"},
           kernels::PolicyLossKind::kSao),
      Loss({Family::kPolicyLoss, "gmpo",
            "-A exp(X), X = the sequence's mean of x clipped in log space (A >= 0: x <= log hi; "
            "A < 0: x >= log lo); a clipped token gets no gradient",
            "GMPO: Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673)",
            "not in the verl versions compared; against the paper's code: the clip bounds are "
            "log(1 - clip_eps_low) and log(1 + clip_eps_high) (its +-0.4 is clip_eps_low 0.33, "
            "clip_eps_high 0.49), and algorithm.loss_agg aggregates (seq-mean-token-mean for the "
            "paper's objective)"},
           kernels::PolicyLossKind::kGmpo),
      // Loss aggregations: l the weighted token term, m the loss mask.
      Agg({Family::kLossAgg, "token-mean", "sum of m l over the batch / D_tok", "-",
           "same; Gyre's D_tok is the global batch's (all micro-batches and ranks)"},
          kernels::LossAgg::kTokenMean),
      Agg({Family::kLossAgg, "seq-mean-token-mean",
           "mean over sequences of (sum_t m l) / (sum_t m)", "-", "same"},
          kernels::LossAgg::kSeqMeanTokenMean),
      Agg({Family::kLossAgg, "seq-mean-token-sum", "sum over sequences of (sum_t m l) / D_seq", "-",
           "same"},
          kernels::LossAgg::kSeqMeanTokenSum),
      Agg({Family::kLossAgg, "seq-mean-token-sum-norm",
           "sum over sequences of (sum_t m l) / (D_seq * algorithm.loss_norm_len)",
           "Dr. GRPO (arXiv:2503.20783): a constant length denominator",
           "verl divides the token sum by loss_scale_factor alone (default the micro-batch's "
           "padded "
           "width), not by the number of sequences"},
          kernels::LossAgg::kSeqMeanTokenSumNorm),
      // Behaviour-policy corrections: d = logp_old - logp_rollout.
      Corr({Family::kCorrection, "none", "w = 1", "-", "-"}, kernels::Correction::kNone),
      Corr({Family::kCorrection, "tis", "w = min(exp(d), tis_cap)",
            "truncated importance sampling (Yao et al. 2025, 'Your efficient RL framework secretly "
            "brings you off-policy RL training')",
            "verl's rollout_is: token"},
           kernels::Correction::kTis),
      Corr({Family::kCorrection, "seq-tis", "w = min(exp(sum over the sequence of d), tis_cap)",
            "sequence-level TIS", "verl's rollout_is: sequence"},
           kernels::Correction::kSeqTis),
      Corr({Family::kCorrection, "icepop", "w = exp(d) inside [icepop_low, icepop_high], else 0",
            "IcePop, Ring-1T ('Every Step Evolves', Ling Team 2025)",
            "verl has no option of this name (its rollout_rs token_k1 rejects without the weight)"},
           kernels::Correction::kIcePop),
      Corr(
          {Family::kCorrection, "m2po",
           "w = 0 for the fewest largest d^2 whose removal brings the batch's mean d^2 to m2po_tau",
           "M2PO ('Prosperity before Collapse', Zheng et al. 2025)", "verl has no M2PO"},
          kernels::Correction::kM2po),
      // KL to the frozen reference policy, per token, d = logp - logp_ref.
      Kl({Family::kKl, "none", "no KL term", "-", "-"}, kernels::KlKind::kNone),
      Kl({Family::kKl, "k1", "d", "Schulman 2020, 'Approximating KL divergence' (k1)",
          "same as verl's kl / k1"},
         kernels::KlKind::kK1),
      Kl({Family::kKl, "k2", "d^2 / 2", "Schulman 2020 (k2)", "same as verl's mse / k2"},
         kernels::KlKind::kK2),
      Kl({Family::kKl, "k3", "exp(-d) + d - 1, clamped to [-10, 10] (no gradient where clamped)",
          "Schulman 2020 (k3)",
          "verl's low_var_kl / k3 also clamps -d to [-20, 20] before the exponential"},
         kernels::KlKind::kK3),
      // Learning-rate schedules (src/algorithm/lr_schedule.h).
      {Family::kLrSchedule, "constant", "lr after a linear warm-up of lr_warmup_steps", "-",
       "Gyre counts GRPO steps from 1: the first warm-up step trains at lr / W, not 0"},
      {Family::kLrSchedule, "cosine",
       "lr_min + (lr - lr_min) (1 + cos(pi p)) / 2 after the warm-up, lr_min = lr * lr_min_ratio",
       "SGDR (Loshchilov and Hutter 2016, arXiv:1608.03983)",
       "as constant; the decay ends at trainer.steps"},
      // Sampling policies (rollout.budget; src/algorithm/sampling_policy.h), G = group_size.
      {Family::kSamplingPolicy, "uniform", "G samples for every prompt", "-",
       "verl's fixed rollout.n per prompt"},
      {Family::kSamplingPolicy, "pilot",
       "pilot_samples per prompt; G - pilot_samples more where the pilot accuracy is in "
       "[pilot_low, pilot_high]",
       "pilot-then-commit allocation; Gyre's rule (band, one commit round)",
       "verl has no per-prompt allocation"},
      {Family::kSamplingPolicy, "variance",
       "pilot_samples per prompt; the round's remaining budget in topup_chunk grants to the "
       "groups of highest reward variance",
       "VIGOR-style variance-guided top-ups; Gyre's rule (one top-up round, round robin)",
       "verl has no per-prompt allocation"},
      {Family::kSamplingPolicy, "greso",
       "skip a prompt whose last greso_streak groups had equal rewards with probability p; p "
       "steers the zero-variance share to greso_target",
       "GRESO, 'Act Only When It Pays' (Zheng et al. 2025); Gyre's additive update of p",
       "verl has no selective rollout"},
  };
  return *builtins;
}

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

// Registered entries of every family, in registration order (an advantage estimator's carries
// its user_advantage).
std::vector<AlgorithmInfo>& UserEntries() {
  static auto* entries = new std::vector<AlgorithmInfo>;
  return *entries;
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string Cell(const std::string& text) { return text.empty() ? "-" : text; }

}  // namespace

const char* FamilyKey(Family family) {
  switch (family) {
    case Family::kAdvantage:
      return "algorithm.advantage";
    case Family::kPolicyLoss:
      return "algorithm.policy_loss";
    case Family::kLossAgg:
      return "algorithm.loss_agg";
    case Family::kCorrection:
      return "algorithm.correction";
    case Family::kKl:
      return "algorithm.kl";
    case Family::kLrSchedule:
      return "trainer.lr_schedule";
    case Family::kSamplingPolicy:
      return "rollout.budget.policy";
  }
  return "unknown";
}

std::vector<AlgorithmInfo> Algorithms() {
  std::vector<AlgorithmInfo> out = Builtins();
  std::lock_guard<std::mutex> lock(RegistryMutex());
  // Advantage estimators first, as the docs list them, then the other families' names.
  for (const AlgorithmInfo& u : UserEntries()) {
    if (u.family == Family::kAdvantage) out.push_back(u);
  }
  for (const AlgorithmInfo& u : UserEntries()) {
    if (u.family != Family::kAdvantage) out.push_back(u);
  }
  return out;
}

std::vector<std::string> NamesFor(Family family) {
  std::vector<std::string> names;
  for (const AlgorithmInfo& a : Algorithms()) {
    if (a.family == family) names.push_back(a.name);
  }
  return names;
}

// The name rules shared by every registration; `who` prefixes the errors.
Status CheckNewName(const AlgorithmInfo& info, const std::string& who) {
  if (!ValidName(info.name)) {
    return InvalidArgument(who + ": name '" + info.name +
                           "' must be 1-64 characters of a-z, 0-9 and '_'");
  }
  for (const AlgorithmInfo& a : Algorithms()) {
    if (a.family == info.family && a.name == info.name) {
      return Status(StatusCode::kAlreadyExists, who + ": " + FamilyKey(info.family) + " '" +
                                                    info.name + "' is already registered" +
                                                    (a.user ? "" : " (a built-in)"));
    }
  }
  return Status::Ok();
}

Status RegisterAdvantageEstimator(AlgorithmInfo info, AdvantageFn fn) {
  if (info.family != Family::kAdvantage) {
    return InvalidArgument("RegisterAdvantageEstimator: info.family must be Family::kAdvantage");
  }
  GYRE_RETURN_IF_ERROR(CheckNewName(info, "RegisterAdvantageEstimator"));
  if (!fn) {
    return InvalidArgument("RegisterAdvantageEstimator: '" + info.name + "' has no function");
  }
  info.user = true;
  info.user_advantage = std::move(fn);
  info.batch_advantage = nullptr;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  UserEntries().push_back(std::move(info));
  return Status::Ok();
}

Status RegisterAlgorithmName(AlgorithmInfo info) {
  if (info.family == Family::kAdvantage) {
    return InvalidArgument(
        "RegisterAlgorithmName: an advantage estimator needs its function "
        "(RegisterAdvantageEstimator)");
  }
  GYRE_RETURN_IF_ERROR(CheckNewName(info, "RegisterAlgorithmName"));
  info.user = true;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  UserEntries().push_back(std::move(info));
  return Status::Ok();
}

namespace {

// 1 per group whose rewards are all equal.
void ZeroVariance(const std::vector<float>& rewards, const std::vector<int32_t>& group_sizes,
                  std::vector<uint8_t>* zero_variance) {
  zero_variance->assign(group_sizes.size(), 0);
  size_t begin = 0;
  for (size_t g = 0; g < group_sizes.size(); ++g) {
    bool equal = true;
    for (int32_t i = 1; i < group_sizes[g]; ++i)
      equal = equal && rewards[begin + i] == rewards[begin];
    (*zero_variance)[g] = equal ? 1 : 0;
    begin += group_sizes[g];
  }
}

}  // namespace

StatusOr<std::vector<float>> ComputeAdvantages(const std::string& name,
                                               const std::vector<float>& rewards,
                                               const std::vector<int32_t>& group_sizes,
                                               std::vector<uint8_t>* zero_variance,
                                               const std::vector<int32_t>* response_lengths) {
  StatusOr<AlgorithmInfo> found = Find(Family::kAdvantage, name);
  if (!found.ok()) return InvalidArgument(found.status().message());
  const AlgorithmInfo& entry = *found;
  if (!entry.user && entry.batch_advantage == nullptr) {  // the group kernel
    return ops::GroupAdvantages(rewards, group_sizes, entry.advantage_kind, zero_variance);
  }
  // The built-in path checks the grouping; a user function gets the same guarantee.
  GYRE_RETURN_IF_ERROR(CheckGrouping(name, rewards.size(), group_sizes));
  std::vector<float> adv;
  if (entry.user) {
    Status s = entry.user_advantage(rewards, group_sizes, &adv);
    if (!s.ok()) return s.WithContext("advantage estimator '" + name + "'");
    if (adv.size() != rewards.size()) {
      return Internal("advantage estimator '" + name + "' returned " + std::to_string(adv.size()) +
                      " advantages for " + std::to_string(rewards.size()) + " rewards");
    }
  } else {
    GYRE_ASSIGN_OR_RETURN(adv, entry.batch_advantage(rewards, group_sizes, response_lengths));
  }
  if (zero_variance != nullptr) ZeroVariance(rewards, group_sizes, zero_variance);
  return adv;
}

namespace {

std::string JoinNames(Family family) {
  std::string all;
  for (const std::string& n : NamesFor(family)) all += (all.empty() ? "" : ", ") + n;
  return all;
}

// The built-in entry of `family` whose implementation `matches`, for NameOf.
template <typename Pred>
const char* BuiltinName(Family family, Pred matches) {
  for (const AlgorithmInfo& a : Builtins()) {
    if (a.family == family && matches(a)) return a.name.c_str();
  }
  return "unknown";
}

}  // namespace

StatusOr<AlgorithmInfo> Find(Family family, const std::string& name) {
  for (const AlgorithmInfo& a : Builtins()) {
    if (a.family == family && a.name == name) return a;
  }
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    for (const AlgorithmInfo& a : UserEntries()) {
      if (a.family == family && a.name == name) return a;
    }
  }
  return Status(StatusCode::kNotFound, std::string("unknown ") + FamilyKey(family) + " '" + name +
                                           "' (registered: " + JoinNames(family) + ")");
}

namespace {

// The kernel value of a built-in entry; InvalidArgument for an unknown name or one registered by
// the program (which has no kernel value).
template <typename T>
StatusOr<T> KernelValue(Family family, const std::string& name, T AlgorithmInfo::*field) {
  StatusOr<AlgorithmInfo> found = Find(family, name);
  if (!found.ok()) return InvalidArgument(found.status().message());
  if (found->user) {
    return InvalidArgument(std::string(FamilyKey(family)) + " '" + name +
                           "' is registered by the program and has no built-in kernel");
  }
  return (*found).*field;
}

}  // namespace

StatusOr<kernels::PolicyLossKind> PolicyLossKindFor(const std::string& name) {
  return KernelValue(Family::kPolicyLoss, name, &AlgorithmInfo::policy_loss);
}
StatusOr<kernels::LossAgg> LossAggFor(const std::string& name) {
  return KernelValue(Family::kLossAgg, name, &AlgorithmInfo::loss_agg);
}
StatusOr<kernels::Correction> CorrectionFor(const std::string& name) {
  return KernelValue(Family::kCorrection, name, &AlgorithmInfo::correction);
}
StatusOr<kernels::KlKind> KlKindFor(const std::string& name) {
  return KernelValue(Family::kKl, name, &AlgorithmInfo::kl);
}

std::vector<kernels::PolicyLossKind> BuiltinPolicyLossKinds() {
  std::vector<kernels::PolicyLossKind> kinds;
  for (const AlgorithmInfo& a : Builtins()) {
    if (a.family == Family::kPolicyLoss) kinds.push_back(a.policy_loss);
  }
  return kinds;
}

bool IsUserPolicyLoss(const std::string& name) {
  StatusOr<AlgorithmInfo> found = Find(Family::kPolicyLoss, name);
  return found.ok() && found->user;
}

const char* NameOf(kernels::AdvantageKind kind) {
  return BuiltinName(Family::kAdvantage, [kind](const AlgorithmInfo& a) {
    return a.batch_advantage == nullptr && a.advantage_kind == kind;
  });
}
const char* NameOf(kernels::PolicyLossKind kind) {
  return BuiltinName(Family::kPolicyLoss,
                     [kind](const AlgorithmInfo& a) { return a.policy_loss == kind; });
}
const char* NameOf(kernels::LossAgg agg) {
  return BuiltinName(Family::kLossAgg, [agg](const AlgorithmInfo& a) { return a.loss_agg == agg; });
}
const char* NameOf(kernels::Correction correction) {
  return BuiltinName(Family::kCorrection,
                     [correction](const AlgorithmInfo& a) { return a.correction == correction; });
}
const char* NameOf(kernels::KlKind kl) {
  return BuiltinName(Family::kKl, [kl](const AlgorithmInfo& a) { return a.kl == kl; });
}

std::string AlgorithmTableMarkdown() {
  std::string out =
      "| key | name | definition | paper | difference from verl |\n|---|---|---|---|---|\n";
  for (const AlgorithmInfo& a : Builtins()) {
    out += std::string("| `") + FamilyKey(a.family) + "` | `" + a.name + "` | " + Cell(a.formula) +
           " | " + Cell(a.paper) + " | " + Cell(a.verl) + " |\n";
  }
  return out;
}

}  // namespace gyre::algorithm
