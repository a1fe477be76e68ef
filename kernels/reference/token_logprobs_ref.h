#pragma once
// Token log-probabilities from logits without materialising a log-softmax: the plain-loop CPU
// twin of kernels/token_logprobs.cu.
//
// For row t of logits [T, V] at temperature tau (z = logits / tau, tau <= 0 means 1):
//   logp[t]    = z[t, y_t] - logsumexp(z[t, :])
//   entropy[t] = -sum_j p_j log p_j,  p = softmax(z[t, :])
// computed in one pass per row with an online max / sum / weighted sum (m, s, w):
//   s = sum exp(z - m), w = sum exp(z - m) z, so logsumexp = m + log s and
//   entropy = m + log s - w / s.
// The backward pass turns upstream gradients g_logp[t] and g_entropy[t] into
//   d/dlogits[t, j] = (g_logp (1[j = y] - p_j) - g_entropy p_j (log p_j + H)) / tau.

#include <cstdint>

namespace gyre::kernels {

// logits: [T, V] row-major float32. targets: [T] in [0, V). entropy may be null.
void TokenLogprobsForwardRef(const float* logits, const int64_t* targets, int64_t T, int64_t V,
                             float temperature, float* logp, float* entropy);

// grad_entropy may be null (no entropy term). grad_logits: [T, V], overwritten.
void TokenLogprobsBackwardRef(const float* logits, const int64_t* targets, int64_t T, int64_t V,
                              float temperature, const float* grad_logp, const float* grad_entropy,
                              float* grad_logits);

}  // namespace gyre::kernels
