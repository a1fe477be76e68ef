// The per-token math of the policy-gradient loss, written once for its two implementations: the
// CPU reference (kernels/reference/policy_loss_ref.cc) and the CUDA kernels (policy_loss.cu) both
// call these functions, and so does the trainer for the aggregation scale of the terms it adds
// itself (entropy, a registered loss). Everything is in double. Plain C++ that nvcc compiles for
// the device too: no library calls but exp and log (Exp, Log).
//
// Adding a built-in policy loss: a PolicyLossKind value (policy_loss_ref.h), its case in
// SequenceLogRatio (if it uses a sequence-level ratio) and PolicyTerm below, its registry entry
// (src/algorithm/registry.cc: name, formula, paper, kind) and its hand-computed test
// (tests/unit/kernels/policy_loss_ref_test.cc). Nothing else dispatches on the kind.
#pragma once

#include <cmath>

#include "kernels/reference/policy_loss_ref.h"

#if defined(__CUDACC__)
#define GYRE_HOST_DEVICE __host__ __device__
#else
#define GYRE_HOST_DEVICE
#endif

namespace gyre::kernels::terms {

constexpr double kLogRatioClamp = 20.0;
constexpr double kK3Clamp = 10.0;

// std::clamp's behaviour (a NaN passes through).
GYRE_HOST_DEVICE inline double Clamp(double v, double lo, double hi) {
  return v < lo ? lo : (hi < v ? hi : v);
}

// exp and log: <cmath>'s on the host, CUDA's on the device.
GYRE_HOST_DEVICE inline double Exp(double v) {
#if defined(__CUDA_ARCH__)
  return ::exp(v);
#else
  return std::exp(v);
#endif
}
GYRE_HOST_DEVICE inline double Log(double v) {
#if defined(__CUDA_ARCH__)
  return ::log(v);
#else
  return std::log(v);
#endif
}

// std::max's behaviour: `a` unless a < b.
GYRE_HOST_DEVICE inline double Max(double a, double b) { return a < b ? b : a; }

// std::min's behaviour: `a` unless b < a.
GYRE_HOST_DEVICE inline double Min(double a, double b) { return b < a ? b : a; }

// Whether `kind`'s term reads its sequence's log ratio X (SequenceLogRatio), which the loss then
// computes in a first pass over each sequence.
GYRE_HOST_DEVICE inline bool UsesSequenceRatio(PolicyLossKind kind) {
  return kind == PolicyLossKind::kGspo || kind == PolicyLossKind::kGmpo;
}

// GMPO's token log ratio x clipped in log space on the side that favours the update, as PPO's
// clip in the geometric mean: A >= 0 caps x at log(hi), A < 0 floors it at log(lo).
// *clipped (nullable) is set when the clip changed x.
GYRE_HOST_DEVICE inline double GmpoClippedLogRatio(double x, double adv, const PolicyLossParams& p,
                                                   bool* clipped) {
  const double log_lo = Log(1.0 - static_cast<double>(p.clip_eps_low));
  const double log_hi = Log(1.0 + static_cast<double>(p.clip_eps_high));
  const double y = adv >= 0.0 ? Min(x, log_hi) : Max(x, log_lo);
  if (clipped != nullptr) *clipped = y != x;
  return y;
}

// One masked token's share of its sequence's log ratio X, before the division by the sequence's
// mask sum: X = sum_t m_t SequenceLogRatio(x_t, A_t) / sum_t m_t. x = logp - logp_old.
//   kGspo: x (X is the mean log ratio, the log of the geometric-mean ratio)
//   kGmpo: x clipped as GmpoClippedLogRatio
GYRE_HOST_DEVICE inline double SequenceLogRatio(double x, double adv, const PolicyLossParams& p) {
  if (p.kind == PolicyLossKind::kGmpo) return GmpoClippedLogRatio(x, adv, p, nullptr);
  return x;
}

// One token's policy term and its derivative with respect to logp.
struct PgTerm {
  double loss;
  double grad;
  bool clipped;       // the clip changed the term (policy_loss_ref.h, clip_frac)
  bool dual_clipped;  // the dual-clip cap strictly won
};

// The policy term L of one masked token (policy_loss_ref.h), from its own log ratio x = logp -
// logp_old, its sequence's X (UsesSequenceRatio kinds; ignored otherwise) and its advantage.
GYRE_HOST_DEVICE inline PgTerm PolicyTerm(double x, double seq_x, double adv,
                                          const PolicyLossParams& p) {
  const double lo = 1.0 - static_cast<double>(p.clip_eps_low);
  const double hi = 1.0 + static_cast<double>(p.clip_eps_high);
  if (p.kind == PolicyLossKind::kGmpo) {
    // L = -A exp(X): the token's share of -A times the geometric mean of the clipped ratios; the
    // token's own gradient is 0 where its x was clipped (or X clamped).
    bool token_clipped = false;
    GmpoClippedLogRatio(x, adv, p, &token_clipped);
    const bool ratio_clamped = seq_x < -kLogRatioClamp || seq_x > kLogRatioClamp;
    const double ratio = Exp(Clamp(seq_x, -kLogRatioClamp, kLogRatioClamp));
    const bool frozen = token_clipped || ratio_clamped;
    return {-adv * ratio, frozen ? 0.0 : -adv * ratio, token_clipped, false};
  }
  const double log_ratio = p.kind == PolicyLossKind::kGspo ? seq_x : x;
  const bool ratio_clamped = log_ratio < -kLogRatioClamp || log_ratio > kLogRatioClamp;
  const double ratio = Exp(Clamp(log_ratio, -kLogRatioClamp, kLogRatioClamp));
  const double d_ratio = ratio_clamped ? 0.0 : ratio;  // d ratio / d logp
  switch (p.kind) {
    case PolicyLossKind::kCispo: {
      const double weight = Clamp(ratio, lo, hi);
      return {-adv * weight, ratio_clamped ? 0.0 : -adv * weight, ratio < lo || ratio > hi, false};
    }
    case PolicyLossKind::kSao:
      if (ratio < lo || ratio > hi) return {0.0, 0.0, true, false};
      return {-adv * ratio, -adv * d_ratio, false, false};
    case PolicyLossKind::kPpo:
    case PolicyLossKind::kGspo:
    case PolicyLossKind::kGmpo:
      break;
  }
  const double unclipped = -adv * ratio;
  const double clipped = -adv * Clamp(ratio, lo, hi);
  PgTerm term{unclipped, -adv * d_ratio, false, false};
  if (clipped > unclipped) term = {clipped, 0.0, true, false};

  if (p.kind == PolicyLossKind::kPpo && adv < 0.0 && p.dual_clip_c > 1.0f) {
    const double cap = -adv * static_cast<double>(p.dual_clip_c);
    if (term.loss > cap) term = {cap, 0.0, false, true};
  }
  return term;
}

// The KL estimator of one token and its derivative with respect to logp.
GYRE_HOST_DEVICE inline void KlTerm(KlKind kind, double logp, double logp_ref, double* value,
                                    double* grad) {
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
      const double e = Exp(-d);
      const double k3 = e + d - 1.0;
      if (k3 > kK3Clamp || k3 < -kK3Clamp) {
        *value = Clamp(k3, -kK3Clamp, kK3Clamp);
        *grad = 0.0;
      } else {
        *value = k3;
        *grad = 1.0 - e;
      }
      return;
    }
  }
}

// The behaviour weight w of one token, from d = logp_old - logp_rollout and, for kSeqTis, its
// sequence's sum of d over the masked tokens.
GYRE_HOST_DEVICE inline double BehaviourWeight(const PolicyLossParams& p, double d, double seq_d) {
  switch (p.correction) {
    case Correction::kNone:
      return 1.0;
    case Correction::kTis:
      return Min(Exp(d), static_cast<double>(p.tis_cap));
    case Correction::kSeqTis:
      return Min(Exp(seq_d), static_cast<double>(p.tis_cap));
    case Correction::kIcePop: {
      const double e = Exp(d);
      return e >= static_cast<double>(p.icepop_low) && e <= static_cast<double>(p.icepop_high)
                 ? e
                 : 0.0;
    }
    case Correction::kM2po:
      return d * d >= p.m2po_threshold ? 0.0 : 1.0;
  }
  return 1.0;
}

// The factor that turns a sequence's masked token sum into its share of the loss under p.agg
// (policy_loss_ref.h, "Aggregation"), given the batch's token and sequence denominators (the
// global ones when p carries them, else the local counts), the sequence's mask sum and the padded
// width T. 0 for a zero denominator.
GYRE_HOST_DEVICE inline double AggregationScale(const PolicyLossParams& p, double local_tokens,
                                                double local_seqs, double seq_tokens, double T) {
  const double token_denom = p.global_tokens > 0 ? p.global_tokens : local_tokens;
  const double seq_denom = p.global_seqs > 0 ? p.global_seqs : local_seqs;
  const double norm_len = p.norm_max_len > 0 ? static_cast<double>(p.norm_max_len) : T;
  double denom = 0.0;
  switch (p.agg) {
    case LossAgg::kTokenMean:
      denom = token_denom;
      break;
    case LossAgg::kSeqMeanTokenSum:
      denom = seq_denom;
      break;
    case LossAgg::kSeqMeanTokenMean:
      denom = seq_denom * seq_tokens;
      break;
    case LossAgg::kSeqMeanTokenSumNorm:
      denom = seq_denom * norm_len;
      break;
  }
  return denom != 0.0 ? 1.0 / denom : 0.0;
}

}  // namespace gyre::kernels::terms
