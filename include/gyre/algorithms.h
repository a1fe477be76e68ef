#pragma once
// Gyre's RL algorithms on plain arrays, for a program that trains with its own loop
// (docs/embedding.md): group advantages by estimator name, the policy loss with its gradient
// d loss / d logp, and the KL estimators. The definitions are docs/algorithms.md's, computed by
// the CPU references Gyre's own trainer is tested against (kernels/reference/). No torch, gRPC
// or protobuf types.
//
//   std::vector<float> adv = *gyre::GroupAdvantages("grpo", rewards, {8, 8, 8});
//   gyre::PolicyLossOptions opts;        // ppo, token-mean, clip 0.2 / 0.28, dual clip 3
//   std::vector<float> grad(S * T);
//   auto value = gyre::PolicyLoss(arrays, opts, grad.data());
//   // then backpropagate grad through your log-probs: logp.backward(grad)
//
// Thread contract: every function may be called from any thread; they share no state, except
// that the estimator names include those registered with RegisterAdvantageEstimator
// (src/algorithm/registry.h), which must happen before.

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre {

// The names a job file (and these functions) accept for `key`: "algorithm.advantage",
// "algorithm.policy_loss", "algorithm.loss_agg", "algorithm.correction", "algorithm.kl",
// "trainer.lr_schedule" or "rollout.budget.policy". Empty for an unknown key.
std::vector<std::string> AlgorithmNames(const std::string& key);

// One advantage per reward. `rewards` holds group_sizes.size() consecutive groups (sizes may
// differ). `response_lengths` (tokens, one per reward) is needed by opo only. InvalidArgument for
// an unknown estimator, an empty group, sizes that do not add up, or missing lengths.
StatusOr<std::vector<float>> GroupAdvantages(const std::string& estimator,
                                             const std::vector<float>& rewards,
                                             const std::vector<int32_t>& group_sizes,
                                             const std::vector<int32_t>& response_lengths = {});

struct PolicyLossOptions {
  std::string loss = "ppo";                // algorithm.policy_loss
  std::string aggregation = "token-mean";  // algorithm.loss_agg
  float clip_eps_low = 0.2f;
  float clip_eps_high = 0.28f;
  float dual_clip_c = 3.0f;         // ppo only; <= 1 = off
  std::string correction = "none";  // algorithm.correction; needs logp_rollout
  float tis_cap = 2.0f;
  float icepop_low = 0.5f, icepop_high = 2.0f;
  double m2po_threshold = 1e300;  // m2po: tokens with d^2 >= this are masked
  std::string kl = "none";        // algorithm.kl; needs logp_ref
  float kl_coef = 0.0f;
  // seq-mean-token-sum-norm's constant length; <= 0 = tokens_per_sequence.
  float norm_length = 0.0f;
  // Denominators of a batch split over several calls (micro-batches or ranks): the whole
  // batch's masked token count and sequences with a masked token. <= 0 = this call's.
  double global_tokens = 0;
  double global_sequences = 0;
};

// Row-major [sequences, tokens_per_sequence] arrays. Tokens with mask 0 are skipped (they may
// hold anything, NaN included). logp_rollout and logp_ref may be null unless the options need
// them.
struct PolicyLossArrays {
  int64_t sequences = 0;
  int64_t tokens_per_sequence = 0;
  const float* logp = nullptr;          // the policy being trained
  const float* logp_old = nullptr;      // the proximal policy the ratio is taken against
  const float* logp_rollout = nullptr;  // the behaviour policy (corrections)
  const float* logp_ref = nullptr;      // the reference policy (KL)
  const float* advantages = nullptr;    // per token
  const float* mask = nullptr;          // 1 = a token the model generated
};

struct PolicyLossValue {
  double loss = 0;           // the aggregated loss, KL term included
  double policy_loss = 0;    // without the KL term
  double kl = 0;             // the aggregated KL estimate (before kl_coef)
  double clip_fraction = 0;  // share of masked tokens the clip changed
  double approx_kl = 0;      // mean of (logp - logp_old)^2 / 2
  double behaviour_weight_mean = 1;
  double tokens = 0;  // masked tokens in this call
};

// The loss and, when grad_logp is not null, d loss / d logp into it (tokens_per_sequence *
// sequences floats; 0 on masked-out tokens). InvalidArgument for an unknown name, a negative
// size, or a null array the options need.
StatusOr<PolicyLossValue> PolicyLoss(const PolicyLossArrays& arrays,
                                     const PolicyLossOptions& options, float* grad_logp);

// One token's KL estimate between the policy and the reference, d = logp - logp_ref (both rounded
// to float, as the arrays are): k1 = d,
// k2 = d^2 / 2, k3 = exp(-d) + d - 1 clamped to [-10, 10]; *grad (nullable) gets d k / d logp.
StatusOr<double> KlEstimate(const std::string& estimator, double logp, double logp_ref,
                            double* grad);

}  // namespace gyre
