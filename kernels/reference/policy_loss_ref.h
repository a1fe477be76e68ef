// CPU reference for Gyre's clipped policy-gradient loss and its gradient (DESIGN.md, "Policy
// loss"). Per-token math and every accumulation are in double; inputs are float.
//
// Exact semantics, per token (s, t) with mask weight m = mask[s, t] (0 or 1 expected; a token
// with m == 0 is skipped entirely, so padding may hold NaN or inf):
//   ratio     r = exp(clamp(logp - logp_old, -20, 20))
//   PPO clip  L = max(-A r, -A clip(r, 1 - clip_eps_low, 1 + clip_eps_high))
//   dual clip (A < 0 and dual_clip_c > 1): L = min(L, -A dual_clip_c)
//   TIS       (use_tis) w = min(exp(logp_old - logp_rollout), tis_cap), a constant (detached);
//             otherwise w = 1
//   KL        (kl != kNone) d = logp - logp_ref: k1 = d, k2 = d^2 / 2,
//             k3 = clamp(exp(-d) + d - 1, -10, 10); the KL term is not TIS-weighted
//   per token l = w * L + kl_coef * k
// Aggregation, with D_tok = global_tokens if > 0 else sum of mask, and D_seq = global_seqs if > 0
// else the number of sequences with at least one non-zero mask entry:
//   kTokenMean:           sum_{s,t} m l / D_tok
//   kSeqMeanTokenSum:     sum_s (sum_t m l) / D_seq
//   kSeqMeanTokenMean:    sum_s (sum_t m l / sum_t m) / D_seq (sequences with no tokens add 0)
//   kSeqMeanTokenSumNorm: sum_s (sum_t m l) / (D_seq * norm_max_len); norm_max_len <= 0 means T
// A zero denominator gives loss 0 and gradient 0 (nothing to learn from), not NaN.
//
// Gradient: the exact derivative of the returned loss with respect to logp. A branch that holds
// the loss constant contributes 0: the ratio clamp (|logp - logp_old| > 20), the PPO clip when the
// clipped term is strictly larger, the dual clip when it is strictly smaller, and the k3 clamp.
// At ties between branches the unclipped gradient is used.
#pragma once

#include <cstdint>
#include <string>

namespace gyre::kernels {

enum class LossAgg { kTokenMean, kSeqMeanTokenSum, kSeqMeanTokenMean, kSeqMeanTokenSumNorm };

// Parses "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm".
// Returns false and leaves *agg unchanged for anything else.
bool ParseLossAgg(const std::string& name, LossAgg* agg);
const char* LossAggName(LossAgg agg);

enum class KlKind { kNone, kK1, kK2, kK3 };

// Parses "none", "k1", "k2", "k3". Returns false and leaves *kl unchanged for anything else.
bool ParseKlKind(const std::string& name, KlKind* kl);
const char* KlKindName(KlKind kl);

struct PolicyLossParams {
  float clip_eps_low = 0.2f;
  float clip_eps_high = 0.28f;
  float dual_clip_c = 3.0f;  // <= 1 disables the dual clip
  bool use_tis = false;      // requires PolicyLossInputs::logp_rollout
  float tis_cap = 2.0f;
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
  const float* logp_rollout;  // nullable unless use_tis
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
  double clip_frac;          // fraction of masked tokens where the PPO-clipped term strictly won
  double approx_kl;          // mean of 0.5 * (logp - logp_old)^2
  double tis_mean, tis_max;  // of w (1 when TIS is off)
  double tokens;             // sum of mask in this call
  double dual_clip_frac;     // fraction of masked tokens where the dual clip strictly won
};

// Computes the loss and, when grad_logp is non-null, d loss / d logp into it ([S, T]; 0 on
// masked-out tokens). If use_tis is set without logp_rollout, or a KL kind without logp_ref,
// every stat and every gradient entry is NaN, so the misuse cannot go unnoticed.
PolicyLossStats PolicyLossRef(const PolicyLossInputs& in, const PolicyLossParams& p,
                              float* grad_logp);

}  // namespace gyre::kernels
