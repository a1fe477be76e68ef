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

// The built-ins. Formulas use docs/algorithms.md's symbols; a cell must not contain '|'.
const std::vector<AlgorithmInfo>& Builtins() {
  static const std::vector<AlgorithmInfo>* builtins = new std::vector<AlgorithmInfo>{
      // Advantages: R_i the group's rewards, n its size, mean/std/median over the group.
      {Family::kAdvantage, "grpo", "(R_i - mean) / (std + 1e-6), std unbiased; 0 for n = 1",
       "DeepSeekMath (Shao et al. 2024, arXiv:2402.03300)",
       "verl gives a group of one mean 0 and std 1 (advantage R_i / (1 + eps)); Gyre gives 0"},
      {Family::kAdvantage, "grpo_no_std", "R_i - mean",
       "Dr. GRPO: Understanding R1-Zero-Like Training (Liu et al. 2025, arXiv:2503.20783)",
       "verl's grpo with norm_adv_by_std_in_grpo: false; a group of one gets R_i there, 0 here"},
      {Family::kAdvantage, "rloo",
       "n / (n - 1) (R_i - mean): R_i minus the others' mean; 0 for n = 1",
       "Back to Basics: REINFORCE style optimization (Ahmadian et al. 2024, arXiv:2402.14740)",
       "a group of one gets R_i in verl, 0 here (Gyre's config requires n >= 2)"},
      {Family::kAdvantage, "reinforce_pp",
       "R_i whitened over every sample of the batch: (R_i - mean_B) / (std_B + 1e-6)",
       "REINFORCE++ (Hu 2025, arXiv:2501.03262)",
       "verl whitens per-token discounted returns over every response token of the batch (long "
       "responses weigh more) with rsqrt(var + 1e-8); Gyre whitens one value per sample, gamma = "
       "1"},
      {Family::kAdvantage, "reinforce_pp_baseline",
       "x_i = R_i - mean, then x whitened over every sample of the batch",
       "REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262)",
       "verl whitens over response tokens, not samples, and gives a group of one mean 0"},
      {Family::kAdvantage, "median",
       "R_i - median; with an odd n the first sample equal to the median (the pivot) is left "
       "out of the step",
       "MC-GRPO (Kim 2026, arXiv:2601.22582): n = G + 1 samples, G trained",
       "verl has no median estimator"},
      {Family::kAdvantage, "grpo_passk",
       "the group's best sample (first with the maximum R) gets (R_max - R_second) / (std + "
       "1e-6), std unbiased; every other sample 0",
       "Pass@k policy gradient (arXiv:2503.19595, as cited by verl)",
       "same as verl with norm_adv_by_std_in_grpo: true; a group of one gets 0"},
      {Family::kAdvantage, "gpg",
       "alpha (R_i - mean), alpha = B / (samples of the batch's groups whose rewards differ)",
       "GPG: Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546), F_norm = 1",
       "verl's alpha counts the samples with a non-zero reward; Gyre counts the samples of "
       "groups with a learning signal (B - M in the paper)"},
      {Family::kAdvantage, "opo",
       "R_i - sum(l_j R_j) / sum(l_j): the group's length-weighted mean as baseline, l = "
       "response tokens",
       "On-Policy RL with Optimal Reward Baseline (Hao et al. 2025, arXiv:2505.23585)",
       "a group of one gets R_i in verl (baseline 0), 0 here"},
      // Policy losses: r = exp(clamp(x, -20, 20)), x = logp - logp_old, lo/hi the clip bounds.
      {Family::kPolicyLoss, "ppo",
       "max(-A r, -A clip(r, lo, hi)); A < 0: min(that, -A dual_clip_c)",
       "PPO (Schulman et al. 2017, arXiv:1707.06347); dual clip (Ye et al. 2020, "
       "arXiv:1912.09729); clip-higher (DAPO, arXiv:2503.14476)",
       "same as verl's vanilla loss (clip_ratio_c = dual_clip_c)"},
      {Family::kPolicyLoss, "gspo",
       "the ppo clip on x = the sequence's mean of logp - logp_old, gradient to each token "
       "(GSPO-token); no dual clip",
       "GSPO (Zheng et al. 2025, arXiv:2507.18071)",
       "verl clamps x at 10 (Gyre: +-20) and always aggregates seq-mean-token-mean; Gyre uses "
       "algorithm.loss_agg (set seq-mean-token-mean for the paper's objective)"},
      {Family::kPolicyLoss, "cispo",
       "-A clip(r, lo, hi) with gradient -A sg(clip(r, lo, hi)) d logp: every token keeps its "
       "gradient",
       "CISPO, MiniMax-M1 (MiniMax 2025, arXiv:2506.13585)",
       "verl's loss value is -sg(clip(r)) A logp (same gradient, different value); the paper "
       "sets no lower bound (a large clip_eps_low here)"},
      {Family::kPolicyLoss, "sao",
       "-A r where lo <= r <= hi, else 0 with no gradient (double-sided token masking)",
       "Gyre's definition: no paper defines this name; the mask is the PPO clip band applied "
       "to both signs of A",
       "verl has no loss of this name"},
      // Loss aggregations: l the weighted token term, m the loss mask.
      {Family::kLossAgg, "token-mean", "sum of m l over the batch / D_tok", "-",
       "same; Gyre's D_tok is the global batch's (all micro-batches and ranks)"},
      {Family::kLossAgg, "seq-mean-token-mean", "mean over sequences of (sum_t m l) / (sum_t m)",
       "-", "same"},
      {Family::kLossAgg, "seq-mean-token-sum", "sum over sequences of (sum_t m l) / D_seq", "-",
       "same"},
      {Family::kLossAgg, "seq-mean-token-sum-norm",
       "sum over sequences of (sum_t m l) / (D_seq * algorithm.loss_norm_len)",
       "Dr. GRPO (arXiv:2503.20783): a constant length denominator",
       "verl divides the token sum by loss_scale_factor alone (default the micro-batch's padded "
       "width), not by the number of sequences"},
      // Behaviour-policy corrections: d = logp_old - logp_rollout.
      {Family::kCorrection, "none", "w = 1", "-", "-"},
      {Family::kCorrection, "tis", "w = min(exp(d), tis_cap)",
       "truncated importance sampling (Yao et al. 2025, 'Your efficient RL framework secretly "
       "brings you off-policy RL training')",
       "verl's rollout_is: token"},
      {Family::kCorrection, "seq-tis", "w = min(exp(sum over the sequence of d), tis_cap)",
       "sequence-level TIS", "verl's rollout_is: sequence"},
      {Family::kCorrection, "icepop", "w = exp(d) inside [icepop_low, icepop_high], else 0",
       "IcePop, Ring-1T ('Every Step Evolves', Ling Team 2025)",
       "verl has no option of this name (its rollout_rs token_k1 rejects without the weight)"},
      {Family::kCorrection, "m2po",
       "w = 0 for the fewest largest d^2 whose removal brings the batch's mean d^2 to m2po_tau",
       "M2PO ('Prosperity before Collapse', Zheng et al. 2025)", "verl has no M2PO"},
      // KL to the frozen reference policy, per token, d = logp - logp_ref.
      {Family::kKl, "none", "no KL term", "-", "-"},
      {Family::kKl, "k1", "d", "Schulman 2020, 'Approximating KL divergence' (k1)",
       "same as verl's kl / k1"},
      {Family::kKl, "k2", "d^2 / 2", "Schulman 2020 (k2)", "same as verl's mse / k2"},
      {Family::kKl, "k3", "exp(-d) + d - 1, clamped to [-10, 10] (no gradient where clamped)",
       "Schulman 2020 (k3)",
       "verl's low_var_kl / k3 also clamps -d to [-20, 20] before the exponential"},
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

struct UserEstimator {
  AlgorithmInfo info;
  AdvantageFn fn;
};

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::vector<UserEstimator>& UserEstimators() {
  static auto* users = new std::vector<UserEstimator>;
  return *users;
}

std::vector<AlgorithmInfo>& UserNames() {
  static auto* names = new std::vector<AlgorithmInfo>;
  return *names;
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
  for (const UserEstimator& u : UserEstimators()) out.push_back(u.info);
  for (const AlgorithmInfo& u : UserNames()) out.push_back(u);
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
  std::lock_guard<std::mutex> lock(RegistryMutex());
  UserEstimators().push_back({std::move(info), std::move(fn)});
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
  UserNames().push_back(std::move(info));
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
  kernels::AdvantageKind kind;
  if (kernels::ParseAdvantageKind(name, &kind)) {
    return ops::GroupAdvantages(rewards, group_sizes, kind, zero_variance);
  }
  if (IsSequenceEstimator(name)) {
    GYRE_ASSIGN_OR_RETURN(auto adv,
                          SequenceAdvantages(name, rewards, group_sizes, response_lengths));
    if (zero_variance != nullptr) ZeroVariance(rewards, group_sizes, zero_variance);
    return adv;
  }
  AdvantageFn fn;
  {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    for (const UserEstimator& u : UserEstimators()) {
      if (u.info.name == name) fn = u.fn;
    }
  }
  if (!fn) {
    return InvalidArgument("unknown advantage estimator '" + name + "' (registered: " + [] {
      std::string all;
      for (const std::string& n : NamesFor(Family::kAdvantage)) {
        all += (all.empty() ? "" : ", ") + n;
      }
      return all;
    }() + ")");
  }
  // The built-in path checks the grouping; a user function gets the same guarantee.
  GYRE_RETURN_IF_ERROR(CheckGrouping(name, rewards.size(), group_sizes));
  std::vector<float> adv;
  Status s = fn(rewards, group_sizes, &adv);
  if (!s.ok()) return s.WithContext("advantage estimator '" + name + "'");
  if (adv.size() != rewards.size()) {
    return Internal("advantage estimator '" + name + "' returned " + std::to_string(adv.size()) +
                    " advantages for " + std::to_string(rewards.size()) + " rewards");
  }
  if (zero_variance != nullptr) ZeroVariance(rewards, group_sizes, zero_variance);
  return adv;
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
