// include/gyre/algorithms.h over the registry and the CPU references.
#include <cmath>

#include "algorithm/loss_options.h"
#include "algorithm/registry.h"
#include "gyre/algorithms.h"
#include "kernels/reference/policy_loss_ref.h"

namespace gyre {

std::vector<std::string> AlgorithmNames(const std::string& key) {
  for (algorithm::Family f :
       {algorithm::Family::kAdvantage, algorithm::Family::kPolicyLoss, algorithm::Family::kLossAgg,
        algorithm::Family::kCorrection, algorithm::Family::kKl, algorithm::Family::kLrSchedule,
        algorithm::Family::kSamplingPolicy}) {
    if (key == algorithm::FamilyKey(f)) return algorithm::NamesFor(f);
  }
  return {};
}

StatusOr<std::vector<float>> GroupAdvantages(const std::string& estimator,
                                             const std::vector<float>& rewards,
                                             const std::vector<int32_t>& group_sizes,
                                             const std::vector<int32_t>& response_lengths) {
  return algorithm::ComputeAdvantages(estimator, rewards, group_sizes, nullptr,
                                      response_lengths.empty() ? nullptr : &response_lengths);
}

namespace {

// "what: 'x' is not one of a, b, c".
Status UnknownName(const char* what, const std::string& name, const std::string& key) {
  std::string all;
  for (const std::string& n : AlgorithmNames(key)) all += (all.empty() ? "" : ", ") + n;
  return InvalidArgument(std::string(what) + ": '" + name + "' is not one of " + all);
}

}  // namespace

StatusOr<PolicyLossValue> PolicyLoss(const PolicyLossArrays& a, const PolicyLossOptions& o,
                                     float* grad_logp) {
  GYRE_ASSIGN_OR_RETURN(kernels::PolicyLossParams p, algorithm::ToKernelParams(o));
  if (a.sequences < 0 || a.tokens_per_sequence < 0) {
    return InvalidArgument("PolicyLoss: negative sequences or tokens_per_sequence");
  }
  const bool any = a.sequences * a.tokens_per_sequence > 0;
  if (any && (a.logp == nullptr || a.logp_old == nullptr || a.advantages == nullptr ||
              a.mask == nullptr)) {
    return InvalidArgument("PolicyLoss: logp, logp_old, advantages and mask are required");
  }
  if (any && p.correction != kernels::Correction::kNone && a.logp_rollout == nullptr) {
    return InvalidArgument("PolicyLoss: correction '" + o.correction + "' needs logp_rollout");
  }
  if (any && p.kl != kernels::KlKind::kNone && a.logp_ref == nullptr) {
    return InvalidArgument("PolicyLoss: kl '" + o.kl + "' needs logp_ref");
  }
  kernels::PolicyLossInputs in;
  in.S = a.sequences;
  in.T = a.tokens_per_sequence;
  in.logp = a.logp;
  in.logp_old = a.logp_old;
  in.logp_rollout = a.logp_rollout;
  in.logp_ref = a.logp_ref;
  in.advantages = a.advantages;
  in.mask = a.mask;
  const kernels::PolicyLossStats s = kernels::PolicyLossRef(in, p, grad_logp);
  PolicyLossValue v;
  v.loss = s.loss;
  v.policy_loss = s.pg_loss;
  v.kl = s.kl;
  v.clip_fraction = s.clip_frac;
  v.approx_kl = s.approx_kl;
  v.behaviour_weight_mean = s.tis_mean;
  v.tokens = s.tokens;
  return v;
}

namespace algorithm {

StatusOr<kernels::PolicyLossParams> ToKernelParams(const PolicyLossOptions& o) {
  kernels::PolicyLossParams p;
  // The registry's built-in entries carry the kernel values (a loss the program registered is
  // not one: the torch wrapper handles those).
  StatusOr<kernels::PolicyLossKind> kind = PolicyLossKindFor(o.loss);
  if (!kind.ok()) return UnknownName("PolicyLoss: loss", o.loss, "algorithm.policy_loss");
  StatusOr<kernels::LossAgg> agg = LossAggFor(o.aggregation);
  if (!agg.ok()) {
    return UnknownName("PolicyLoss: aggregation", o.aggregation, "algorithm.loss_agg");
  }
  StatusOr<kernels::Correction> correction = CorrectionFor(o.correction);
  if (!correction.ok()) {
    return UnknownName("PolicyLoss: correction", o.correction, "algorithm.correction");
  }
  StatusOr<kernels::KlKind> kl = KlKindFor(o.kl);
  if (!kl.ok()) return UnknownName("PolicyLoss: kl", o.kl, "algorithm.kl");
  p.kind = *kind;
  p.agg = *agg;
  p.correction = *correction;
  p.kl = *kl;
  p.clip_eps_low = o.clip_eps_low;
  p.clip_eps_high = o.clip_eps_high;
  p.dual_clip_c = o.dual_clip_c;
  p.tis_cap = o.tis_cap;
  p.icepop_low = o.icepop_low;
  p.icepop_high = o.icepop_high;
  p.m2po_threshold = o.m2po_threshold;
  p.kl_coef = o.kl_coef;
  p.norm_max_len = o.norm_length;
  p.global_tokens = o.global_tokens;
  p.global_seqs = o.global_sequences;
  return p;
}

}  // namespace algorithm

StatusOr<double> KlEstimate(const std::string& estimator, double logp, double logp_ref,
                            double* grad) {
  // One token with no policy term (advantage 0 at ratio 1) and kl_coef 1: the reference's loss
  // is the estimate and its gradient the estimate's derivative.
  PolicyLossOptions o;
  o.kl = estimator;
  o.kl_coef = 1.0f;
  const float lp = static_cast<float>(logp), ref = static_cast<float>(logp_ref), zero = 0.0f,
              one = 1.0f;
  PolicyLossArrays a;
  a.sequences = 1;
  a.tokens_per_sequence = 1;
  a.logp = &lp;
  a.logp_old = &lp;
  a.logp_ref = &ref;
  a.advantages = &zero;
  a.mask = &one;
  float g = 0;
  GYRE_ASSIGN_OR_RETURN(PolicyLossValue v, PolicyLoss(a, o, &g));
  if (grad != nullptr) *grad = g;
  return v.kl;
}

}  // namespace gyre
