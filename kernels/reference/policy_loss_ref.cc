#include "kernels/reference/policy_loss_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/policy_loss_terms.h"

namespace gyre::kernels {
namespace {

PolicyLossStats NanStats(int64_t count, float* grad_logp) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (grad_logp != nullptr) {
    std::fill(grad_logp, grad_logp + count, std::numeric_limits<float>::quiet_NaN());
  }
  return {nan, nan, nan, nan, nan, nan, nan, nan, nan, nan};
}

}  // namespace

PolicyLossStats PolicyLossRef(const PolicyLossInputs& in, const PolicyLossParams& p,
                              float* grad_logp) {
  const int64_t S = in.S, T = in.T;
  if ((p.correction != Correction::kNone && in.logp_rollout == nullptr) ||
      (p.kl != KlKind::kNone && in.logp_ref == nullptr)) {
    return NanStats(S * T, grad_logp);
  }

  // Denominators first: each token's gradient depends on its sequence's scale.
  // seq_d[s]: kSeqTis's sum of m * (logp_old - logp_rollout) over the sequence; seq_x[s]: the
  // sequence kinds' X (terms::SequenceLogRatio), a masked sum, then its mean.
  std::vector<double> seq_tokens(S, 0.0), seq_d(S, 0.0), seq_x(S, 0.0);
  double local_tokens = 0.0;
  double local_seqs = 0.0;
  const bool seq_weight = p.correction == Correction::kSeqTis;
  const bool seq_ratio = terms::UsesSequenceRatio(p.kind);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = s * T + t;
      const double m = in.mask[i];
      seq_tokens[s] += m;
      if (seq_weight && m != 0.0) {
        seq_d[s] += m * (static_cast<double>(in.logp_old[i]) - in.logp_rollout[i]);
      }
      if (seq_ratio && m != 0.0) {
        seq_x[s] += m * terms::SequenceLogRatio(static_cast<double>(in.logp[i]) - in.logp_old[i],
                                                in.advantages[i], p);
      }
    }
    if (seq_ratio && seq_tokens[s] != 0.0) seq_x[s] /= seq_tokens[s];
    local_tokens += seq_tokens[s];
    if (seq_tokens[s] != 0.0) local_seqs += 1.0;
  }
  // scale[s] turns sequence s's masked token sum into its share of the loss.
  std::vector<double> scale(S, 0.0);
  for (int64_t s = 0; s < S; ++s) {
    scale[s] =
        terms::AggregationScale(p, local_tokens, local_seqs, seq_tokens[s], static_cast<double>(T));
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
      const terms::PgTerm pg = terms::PolicyTerm(logp - logp_old, seq_x[s], in.advantages[i], p);
      const double w = p.correction == Correction::kNone
                           ? 1.0
                           : terms::BehaviourWeight(
                                 p, logp_old - static_cast<double>(in.logp_rollout[i]), seq_d[s]);
      double kl = 0.0, kl_grad = 0.0;
      if (p.kl != KlKind::kNone) terms::KlTerm(p.kl, logp, in.logp_ref[i], &kl, &kl_grad);

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
