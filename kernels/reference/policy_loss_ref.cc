#include "kernels/reference/policy_loss_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace gyre::kernels {
namespace {

constexpr double kLogRatioClamp = 20.0;
constexpr double kK3Clamp = 10.0;

// A name table: each enum value and the name the config spells it with.
template <typename E>
struct Named {
  E value;
  const char* name;
};

constexpr Named<LossAgg> kAggNames[] = {
    {LossAgg::kTokenMean, "token-mean"},
    {LossAgg::kSeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAgg::kSeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAgg::kSeqMeanTokenSumNorm, "seq-mean-token-sum-norm"},
};

constexpr Named<KlKind> kKlNames[] = {
    {KlKind::kNone, "none"},
    {KlKind::kK1, "k1"},
    {KlKind::kK2, "k2"},
    {KlKind::kK3, "k3"},
};

constexpr Named<PolicyLossKind> kLossKindNames[] = {
    {PolicyLossKind::kPpo, "ppo"},
    {PolicyLossKind::kGspo, "gspo"},
    {PolicyLossKind::kCispo, "cispo"},
    {PolicyLossKind::kSao, "sao"},
};

constexpr Named<Correction> kCorrectionNames[] = {
    {Correction::kNone, "none"},     {Correction::kTis, "tis"},   {Correction::kSeqTis, "seq-tis"},
    {Correction::kIcePop, "icepop"}, {Correction::kM2po, "m2po"},
};

// Sets *out to `name`'s value in `table`; false (and *out unchanged) for an unknown name.
template <typename E, size_t N>
bool ParseNamed(const Named<E> (&table)[N], const std::string& name, E* out) {
  for (const Named<E>& entry : table) {
    if (name == entry.name) {
      *out = entry.value;
      return true;
    }
  }
  return false;
}

template <typename E, size_t N>
const char* NameOf(const Named<E> (&table)[N], E value) {
  for (const Named<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

// One token's policy term and its derivative with respect to logp.
struct PgTerm {
  double loss;
  double grad;
  bool clipped;       // the PPO-clipped term strictly won
  bool dual_clipped;  // the dual-clip cap strictly won
};

// log_ratio is the token's x (the header): its own logp - logp_old, or kGspo's sequence mean.
PgTerm PolicyTerm(double log_ratio, double adv, const PolicyLossParams& p) {
  const bool ratio_clamped = log_ratio < -kLogRatioClamp || log_ratio > kLogRatioClamp;
  const double ratio = std::exp(std::clamp(log_ratio, -kLogRatioClamp, kLogRatioClamp));
  const double d_ratio = ratio_clamped ? 0.0 : ratio;  // d ratio / d logp

  const double lo = 1.0 - static_cast<double>(p.clip_eps_low);
  const double hi = 1.0 + static_cast<double>(p.clip_eps_high);
  switch (p.kind) {
    case PolicyLossKind::kCispo: {
      const double weight = std::clamp(ratio, lo, hi);
      return {-adv * weight, ratio_clamped ? 0.0 : -adv * weight, ratio < lo || ratio > hi, false};
    }
    case PolicyLossKind::kSao:
      if (ratio < lo || ratio > hi) return {0.0, 0.0, true, false};
      return {-adv * ratio, -adv * d_ratio, false, false};
    case PolicyLossKind::kPpo:
    case PolicyLossKind::kGspo:
      break;
  }
  const double unclipped = -adv * ratio;
  const double clipped = -adv * std::clamp(ratio, lo, hi);
  PgTerm term{unclipped, -adv * d_ratio, false, false};
  if (clipped > unclipped) term = {clipped, 0.0, true, false};

  if (p.kind == PolicyLossKind::kPpo && adv < 0.0 && p.dual_clip_c > 1.0f) {
    const double cap = -adv * static_cast<double>(p.dual_clip_c);
    if (term.loss > cap) term = {cap, 0.0, false, true};
  }
  return term;
}

// KL estimator value and derivative with respect to logp.
void KlTerm(KlKind kind, double logp, double logp_ref, double* value, double* grad) {
  const double d = logp - logp_ref;
  switch (kind) {
    case KlKind::kNone:
      *value = 0.0;
      *grad = 0.0;
      return;
    case KlKind::kK1:
      *value = d;
      *grad = 1.0;
      return;
    case KlKind::kK2:
      *value = 0.5 * d * d;
      *grad = d;
      return;
    case KlKind::kK3: {
      const double e = std::exp(-d);
      const double k3 = e + d - 1.0;
      if (k3 > kK3Clamp || k3 < -kK3Clamp) {
        *value = std::clamp(k3, -kK3Clamp, kK3Clamp);
        *grad = 0.0;
      } else {
        *value = k3;
        *grad = 1.0 - e;
      }
      return;
    }
  }
}

PolicyLossStats NanStats(int64_t count, float* grad_logp) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (grad_logp != nullptr) {
    std::fill(grad_logp, grad_logp + count, std::numeric_limits<float>::quiet_NaN());
  }
  return {nan, nan, nan, nan, nan, nan, nan, nan, nan, nan};
}

// The behaviour weight w of one token (header), from d = logp_old - logp_rollout and, for
// kSeqTis, the sequence's sum of d over its masked tokens.
double BehaviourWeight(const PolicyLossParams& p, double d, double seq_d) {
  switch (p.correction) {
    case Correction::kNone:
      return 1.0;
    case Correction::kTis:
      return std::min(std::exp(d), static_cast<double>(p.tis_cap));
    case Correction::kSeqTis:
      return std::min(std::exp(seq_d), static_cast<double>(p.tis_cap));
    case Correction::kIcePop: {
      const double e = std::exp(d);
      return e >= static_cast<double>(p.icepop_low) && e <= static_cast<double>(p.icepop_high)
                 ? e
                 : 0.0;
    }
    case Correction::kM2po:
      return d * d >= p.m2po_threshold ? 0.0 : 1.0;
  }
  return 1.0;
}

}  // namespace

bool ParseLossAgg(const std::string& name, LossAgg* agg) {
  return ParseNamed(kAggNames, name, agg);
}
const char* LossAggName(LossAgg agg) { return NameOf(kAggNames, agg); }

bool ParsePolicyLossKind(const std::string& name, PolicyLossKind* kind) {
  return ParseNamed(kLossKindNames, name, kind);
}
const char* PolicyLossKindName(PolicyLossKind kind) { return NameOf(kLossKindNames, kind); }

bool ParseKlKind(const std::string& name, KlKind* kl) { return ParseNamed(kKlNames, name, kl); }
const char* KlKindName(KlKind kl) { return NameOf(kKlNames, kl); }

bool ParseCorrection(const std::string& name, Correction* c) {
  return ParseNamed(kCorrectionNames, name, c);
}
const char* CorrectionName(Correction c) { return NameOf(kCorrectionNames, c); }

PolicyLossStats PolicyLossRef(const PolicyLossInputs& in, const PolicyLossParams& p,
                              float* grad_logp) {
  const int64_t S = in.S, T = in.T;
  if ((p.correction != Correction::kNone && in.logp_rollout == nullptr) ||
      (p.kl != KlKind::kNone && in.logp_ref == nullptr)) {
    return NanStats(S * T, grad_logp);
  }

  // Denominators first: each token's gradient depends on its sequence's scale.
  // seq_d[s]: kSeqTis's sum of m * (logp_old - logp_rollout) over the sequence; seq_x[s]: kGspo's
  // sum of m * (logp - logp_old), then its mean.
  std::vector<double> seq_tokens(S, 0.0), seq_d(S, 0.0), seq_x(S, 0.0);
  double local_tokens = 0.0;
  double local_seqs = 0.0;
  const bool seq_weight = p.correction == Correction::kSeqTis;
  const bool seq_ratio = p.kind == PolicyLossKind::kGspo;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = s * T + t;
      const double m = in.mask[i];
      seq_tokens[s] += m;
      if (seq_weight && m != 0.0) {
        seq_d[s] += m * (static_cast<double>(in.logp_old[i]) - in.logp_rollout[i]);
      }
      if (seq_ratio && m != 0.0) {
        seq_x[s] += m * (static_cast<double>(in.logp[i]) - in.logp_old[i]);
      }
    }
    if (seq_ratio && seq_tokens[s] != 0.0) seq_x[s] /= seq_tokens[s];
    local_tokens += seq_tokens[s];
    if (seq_tokens[s] != 0.0) local_seqs += 1.0;
  }
  const double token_denom = p.global_tokens > 0 ? p.global_tokens : local_tokens;
  const double seq_denom = p.global_seqs > 0 ? p.global_seqs : local_seqs;
  const double norm_len =
      p.norm_max_len > 0 ? static_cast<double>(p.norm_max_len) : static_cast<double>(T);

  // scale[s] turns sequence s's masked token sum into its share of the loss.
  std::vector<double> scale(S, 0.0);
  for (int64_t s = 0; s < S; ++s) {
    double denom = 0.0;
    switch (p.agg) {
      case LossAgg::kTokenMean:
        denom = token_denom;
        break;
      case LossAgg::kSeqMeanTokenSum:
        denom = seq_denom;
        break;
      case LossAgg::kSeqMeanTokenMean:
        denom = seq_denom * seq_tokens[s];
        break;
      case LossAgg::kSeqMeanTokenSumNorm:
        denom = seq_denom * norm_len;
        break;
    }
    scale[s] = denom != 0.0 ? 1.0 / denom : 0.0;
  }

  PolicyLossStats stats{};
  const double kl_coef = p.kl_coef;
  double clipped = 0.0, dual_clipped = 0.0, approx_kl = 0.0, tis_sum = 0.0, tis_max = 0.0;
  double corr_masked = 0.0;
  for (int64_t s = 0; s < S; ++s) {
    double seq_loss = 0.0, seq_pg = 0.0, seq_kl = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = s * T + t;
      const double m = in.mask[i];
      if (m == 0.0) {
        if (grad_logp != nullptr) grad_logp[i] = 0.0f;
        continue;
      }
      const double logp = in.logp[i];
      const double logp_old = in.logp_old[i];
      const PgTerm pg = PolicyTerm(seq_ratio ? seq_x[s] : logp - logp_old, in.advantages[i], p);
      const double w =
          p.correction == Correction::kNone
              ? 1.0
              : BehaviourWeight(p, logp_old - static_cast<double>(in.logp_rollout[i]), seq_d[s]);
      double kl = 0.0, kl_grad = 0.0;
      if (p.kl != KlKind::kNone) KlTerm(p.kl, logp, in.logp_ref[i], &kl, &kl_grad);

      seq_pg += m * w * pg.loss;
      seq_kl += m * kl;
      seq_loss += m * (w * pg.loss + kl_coef * kl);
      if (grad_logp != nullptr) {
        grad_logp[i] = static_cast<float>(scale[s] * m * (w * pg.grad + kl_coef * kl_grad));
      }

      const double log_ratio = logp - logp_old;
      approx_kl += m * 0.5 * log_ratio * log_ratio;
      if (pg.clipped) clipped += m;
      if (pg.dual_clipped) dual_clipped += m;
      tis_sum += m * w;
      tis_max = std::max(tis_max, w);
      if (w == 0.0) corr_masked += m;
    }
    stats.loss += scale[s] * seq_loss;
    stats.pg_loss += scale[s] * seq_pg;
    stats.kl += scale[s] * seq_kl;
  }

  stats.tokens = local_tokens;
  if (local_tokens != 0.0) {
    stats.clip_frac = clipped / local_tokens;
    stats.dual_clip_frac = dual_clipped / local_tokens;
    stats.approx_kl = approx_kl / local_tokens;
    stats.tis_mean = tis_sum / local_tokens;
    stats.tis_max = tis_max;
    stats.corr_masked_frac = corr_masked / local_tokens;
  }
  return stats;
}

double M2poThreshold(const double* squared_log_ratios, size_t count, double tau) {
  const double inf = std::numeric_limits<double>::infinity();
  if (count == 0) return inf;
  std::vector<double> x(squared_log_ratios, squared_log_ratios + count);
  std::sort(x.begin(), x.end());  // ascending: x[count - 1] is the largest
  // rest[j] = sum of the j smallest values, accumulated from the smallest (the sum every prefix
  // mean is judged by, in one fixed order).
  std::vector<double> rest(count + 1, 0.0);
  for (size_t j = 0; j < count; ++j) rest[j + 1] = rest[j] + x[j];
  if (rest[count] <= tau * static_cast<double>(count)) return inf;
  // Leave out the k largest, k = 1, 2, ...: the rest are the count - k smallest.
  for (size_t k = 1; k < count; ++k) {
    const size_t kept = count - k;
    if (rest[kept] <= tau * static_cast<double>(kept)) return x[kept];  // the k-th largest
  }
  return x[0];  // every value must go
}

double LogLinearProximalAlpha(int64_t behaviour_version, int64_t proximal_version,
                              int64_t current_version) {
  if (current_version <= behaviour_version) return 1.0;
  const double alpha = static_cast<double>(proximal_version - behaviour_version) /
                       static_cast<double>(current_version - behaviour_version);
  return std::clamp(alpha, 0.0, 1.0);
}

}  // namespace gyre::kernels
