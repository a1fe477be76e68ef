// CUDA launcher for Gyre's clipped policy-gradient loss and its gradient with respect to the new
// log-probs. The semantics are exactly those of kernels/reference/policy_loss_ref.h (the CPU twin):
// per-token math and every accumulation in double, float inputs, each gradient entry rounded once
// to float.
//
// The loss is returned as reduced sums in a small device buffer (so nothing synchronises); after
// copying it to the host, FinishPolicyLossStats turns it into the PolicyLossStats that
// PolicyLossRef returns. The launcher is thread-safe (no state between calls).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/reference/policy_loss_ref.h"

namespace gyre::kernels {

// Slots of the stats buffer LaunchPolicyLoss writes (doubles). The loss slots are already
// aggregated (scaled by the mode's denominators); the diagnostic slots are mask-weighted sums over
// this call's tokens, divided by kStatTokens in FinishPolicyLossStats.
enum PolicyLossStatSlot : int {
  kStatLoss = 0,     // loss = pg_loss + kl_coef * kl
  kStatPgLoss,       // aggregated w * L
  kStatKl,           // aggregated KL estimator
  kStatClipped,      // sum of m where the PPO-clipped term strictly won
  kStatDualClipped,  // sum of m where the dual clip strictly won
  kStatApproxKl,     // sum of m * 0.5 * (logp - logp_old)^2
  kStatTisSum,       // sum of m * w
  kStatTisMax,       // max of w over masked tokens, and 0
  kStatTokens,       // sum of the mask
  kStatCorrMasked,   // sum of m where the behaviour weight is 0 (the correction masked it)
  kPolicyLossStatSlots
};

// Enqueues the loss on `stream`. `in` holds device pointers (row-major [S, T], as PolicyLossRef);
// grad_logp (device, nullable) receives d loss / d logp ([S, T]; 0 on masked-out tokens);
// stats_device (device, kPolicyLossStatSlots doubles) is overwritten, it need not be zeroed.
// Allocates 12 * S doubles of stream-ordered scratch (cudaMallocAsync) and frees it on the stream.
// As the reference: a correction without logp_rollout, or a KL kind without logp_ref, fills every
// stat slot and every gradient entry with NaN (and returns cudaSuccess). Returns
// cudaErrorInvalidValue, enqueuing nothing, if S or T is negative, stats_device is null, or S * T >
// 0 and logp, logp_old, advantages or mask is null.
cudaError_t LaunchPolicyLoss(const PolicyLossInputs& in, const PolicyLossParams& p,
                             float* grad_logp, double* stats_device, cudaStream_t stream);

// Turns the kPolicyLossStatSlots doubles LaunchPolicyLoss wrote (copied to the host) into the
// stats PolicyLossRef returns for the same inputs and params: diagnostics are divided by the token
// count, and are 0 when there are no tokens. `p` is the params of the launch; the slots carry
// everything needed today, so it is not read.
PolicyLossStats FinishPolicyLossStats(const double* stats_host, const PolicyLossParams& p);

}  // namespace gyre::kernels
