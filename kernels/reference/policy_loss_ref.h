// CPU reference for Gyre's clipped policy-gradient loss and its gradient (docs/design.md,
// "Policy loss"). Per-token math and every accumulation are in double; inputs are float.
//
// Exact semantics, per token (s, t) with mask weight m = mask[s, t] (0 or 1 expected; a token
// with m == 0 is skipped entirely, so padding may hold NaN or inf), lo = 1 - clip_eps_low and
// hi = 1 + clip_eps_high:
//   log ratio x = logp - logp_old; the sequence kinds (kGspo, kGmpo) also read their sequence's X,
//             the mask-weighted mean over its tokens of SequenceLogRatio(x, A)
//             (kernels/policy_loss_terms.h)
//   ratio     r = exp(clamp(x, -20, 20)) (kGspo, kGmpo: of X)
//   policy term L by PolicyLossParams::kind (kernels/policy_loss_terms.h, PolicyTerm, defines
//   each; docs/algorithms.md names them):
//     kPpo         L = max(-A r, -A clip(r, lo, hi)); dual clip (A < 0 and dual_clip_c > 1):
//                  L = min(L, -A dual_clip_c)
//     kGspo        kPpo's clip on X's ratio, no dual clip; its gradient reaches each token as if
//                  X were that token's own log ratio (GSPO-token with the sequence advantage)
//     kCispo       L = -A clip(r, lo, hi), with the gradient of -A sg(clip(r, lo, hi) / r) r: the
//                  clipped ratio is a detached weight on the log-prob's gradient, never zeroed
//     kSao         L = -A r where lo <= r <= hi, else L = 0 with no gradient (double-sided token
//                  masking, whatever the sign of A)
//     kGmpo        L = -A exp(X), X the mean of the token log ratios clipped in log space (A >= 0:
//                  x capped at log hi; A < 0: floored at log lo): -A times the geometric mean of
//                  the clipped ratios. A token whose x was clipped gets no gradient; with
//                  seq-mean-token-mean this is the exact gradient of GMPO's sequence objective.
//   behaviour weight w (detached; docs/algorithms.md, "Off-policy corrections"), from
//             d = logp_old - logp_rollout (logp_old is the proximal policy):
//             kNone    w = 1
//             kTis     w = min(exp(d), tis_cap)
//             kSeqTis  w = min(exp(sum_t' m' d'), tis_cap): one weight for the whole sequence, the
//                      sum over its masked tokens
//             kIcePop  w = exp(d) if icepop_low <= exp(d) <= icepop_high, else 0 (masked)
//             kM2po    w = 0 if d^2 >= m2po_threshold (masked), else 1; see M2poThreshold
//             A token with w = 0 contributes no policy term, but stays in every denominator.
//   KL        (kl != kNone) e = logp - logp_ref: k1 = e, k2 = e^2 / 2,
//             k3 = clamp(exp(-e) + e - 1, -10, 10); the KL term is not weighted by w (it is kept
//             on tokens the correction masks)
//   per token l = w * L + kl_coef * k
// Aggregation, with D_tok = global_tokens if > 0 else sum of mask, and D_seq = global_seqs if > 0
// else the number of sequences with at least one non-zero mask entry:
//   kTokenMean:           sum_{s,t} m l / D_tok
//   kSeqMeanTokenSum:     sum_s (sum_t m l) / D_seq
//   kSeqMeanTokenMean:    sum_s (sum_t m l / sum_t m) / D_seq (sequences with no tokens add 0)
//   kSeqMeanTokenSumNorm: sum_s (sum_t m l) / (D_seq * norm_max_len); norm_max_len <= 0 means T
// A zero denominator gives loss 0 and gradient 0 (nothing to learn from), not NaN.
//
// Gradient: the exact derivative of the returned loss with respect to logp (kCispo: of its
// detached-weight form above; kGspo, kGmpo: token t gets m w L'(X) times its sequence's scale,
// which is the exact derivative whenever w is constant over the sequence, as without a correction
// or with kSeqTis, and the mask is 0/1). A branch that holds the loss constant contributes 0: the
// ratio clamp (|x| > 20), the PPO clip when the clipped term is strictly larger, the dual clip when
// it is strictly smaller, kSao's mask, and the k3 clamp. At ties between branches the unclipped
// gradient is used. clip_frac counts tokens where the clip changed the term: kPpo/kGspo the clipped
// term strictly won, kCispo r lies strictly outside [lo, hi], kSao the token was masked, kGmpo
// the token's x was clipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace gyre::kernels {

// The names a job file uses for these values live in the algorithm registry
// (src/algorithm/registry.cc), which maps each name to its value here.
enum class LossAgg { kTokenMean, kSeqMeanTokenSum, kSeqMeanTokenMean, kSeqMeanTokenSumNorm };

enum class KlKind { kNone, kK1, kK2, kK3 };

// The policy term L (header).
enum class PolicyLossKind { kPpo, kGspo, kCispo, kSao, kGmpo };

// Behaviour-policy correction (the weight w above).
enum class Correction { kNone, kTis, kSeqTis, kIcePop, kM2po };

struct PolicyLossParams {
  PolicyLossKind kind = PolicyLossKind::kPpo;
  float clip_eps_low = 0.2f;
  float clip_eps_high = 0.28f;
  float dual_clip_c = 3.0f;  // <= 1 disables the dual clip; kPpo only
  // Anything but kNone requires PolicyLossInputs::logp_rollout.
  Correction correction = Correction::kNone;
  float tis_cap = 2.0f;                         // kTis and kSeqTis
  float icepop_low = 0.5f, icepop_high = 2.0f;  // kIcePop's kept band of exp(d)
  // kM2po: tokens whose d^2 is at least this leave the policy term (M2poThreshold computes it over
  // the step's whole batch; +inf masks nothing).
  double m2po_threshold = std::numeric_limits<double>::infinity();
  KlKind kl = KlKind::kNone;  // anything but kNone requires PolicyLossInputs::logp_ref
  float kl_coef = 0.0f;
  LossAgg agg = LossAgg::kTokenMean;
  float norm_max_len = 0;  // kSeqMeanTokenSumNorm's fixed length; <= 0 means T
  // token-mean denominator across micro-batches and data-parallel ranks; 0 = local mask sum.
  double global_tokens = 0;
  // seq-mean denominators across micro-batches and ranks; 0 = local count of sequences with at
  // least one mask token.
  double global_seqs = 0;
};

// All arrays are row-major [S, T] and must stay alive for the call.
struct PolicyLossInputs {
  int64_t S, T;
  const float* logp;
  const float* logp_old;
  const float* logp_rollout;  // nullable when correction is kNone
  const float* logp_ref;      // nullable unless kl != kNone
  const float* advantages;
  const float* mask;
};

// loss = pg_loss + kl_coef * kl, where pg_loss aggregates w * L and kl aggregates k with the same
// mode and denominators. The remaining fields are diagnostics averaged over this call's masked
// tokens only (mask-weighted; 0 when there are none), never over global denominators.
struct PolicyLossStats {
  double loss;
  double pg_loss;
  double kl;
  double clip_frac;          // fraction of masked tokens the clip changed (header)
  double approx_kl;          // mean of 0.5 * (logp - logp_old)^2
  double tis_mean, tis_max;  // of w (1 without a correction; 0 counts on masked tokens)
  double tokens;             // sum of mask in this call
  double dual_clip_frac;     // fraction of masked tokens where the dual clip strictly won
  double corr_masked_frac;   // fraction of masked tokens whose w is 0 (kIcePop, kM2po)
};

// Computes the loss and, when grad_logp is non-null, d loss / d logp into it ([S, T]; 0 on
// masked-out tokens). If a correction is set without logp_rollout, or a KL kind without logp_ref,
// every stat and every gradient entry is NaN, so the misuse cannot go unnoticed.
PolicyLossStats PolicyLossRef(const PolicyLossInputs& in, const PolicyLossParams& p,
                              float* grad_logp);

// M2PO's second-moment mask (docs/algorithms.md): given the squared log ratios d^2 of every masked
// token of the step's batch, the threshold that leaves the smallest number k of the largest values
// out so that the mean of the rest is at most tau. Ties with the k-th largest value are masked too
// (so the order of equal values does not matter). Returns +inf (mask nothing) when the mean of all
// values is already at most tau or there are none. Accumulation in double, in a fixed order.
double M2poThreshold(const double* squared_log_ratios, size_t count, double tau);

// The log-linear proximal policy (algorithm.proximal: loglinear): the trainer's log-prob at the
// proximal version p (the version before the step) approximated between the token's behaviour
// version b and the current version c >= p as
//   logp_prox = logp_behaviour + alpha * (logp_current - logp_behaviour),
//   alpha = (p - b) / (c - b), and 1 when c <= b.
// This returns alpha, clamped to [0, 1].
double LogLinearProximalAlpha(int64_t behaviour_version, int64_t proximal_version,
                              int64_t current_version);

}  // namespace gyre::kernels
