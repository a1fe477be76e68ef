#pragma once
// src/ops: where libtorch tensors meet kernels/. Each function checks shapes and dtypes, moves
// data to the layout the kernel expects, and calls the CPU reference for CPU tensors or the CUDA
// kernel for CUDA tensors; a build without the kernels refuses CUDA tensors with an error that
// says how to get them (docs/kernels.md, "src/ops: one call, either device").

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "gyre/status.h"
#include "kernels/reference/policy_loss_ref.h"
#include "kernels/reference/sampling_ref.h"

namespace gyre::ops {

struct SampleOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<float> kept_mass;
};

// logits: float [B, V]; one parameter set per row (docs/design.md, "Sampling").
StatusOr<SampleOutput> SampleRows(const at::Tensor& logits,
                                  const std::vector<kernels::SamplingRowParams>& params);

// Log-probabilities of `targets` [B, T] (int64) under logits [B, T, V] / temperature, float32
// [B, T], differentiable with respect to logits.
at::Tensor TokenLogprobs(const at::Tensor& logits, const at::Tensor& targets, double temperature);

// Per-token statistics of `targets` [N] (int64) under logits = hidden [N, H] @ weight [V, H]^T
// (in their dtype, read as float32) / temperature, computed `chunk_tokens` rows at a time so that
// no [N, V] tensor is ever held: the backward recomputes each chunk's logits. logp and entropy
// (float32 [N]) are differentiable with respect to hidden and weight; argmax_ok (float32 [N], 1
// where the most likely token is the target) is not. Equal to log_softmax and the entropy of
// the full logits up to floating-point summation order. logp_only: only logp is computed (for
// callers that want log-probs alone: old log-probs, the reference policy), and entropy and
// argmax_ok are empty ([0]).
struct TokenStats {
  at::Tensor logp, entropy, argmax_ok;
};
TokenStats ChunkedTokenStats(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets, double temperature, int64_t chunk_tokens,
                             bool logp_only = false);

struct PolicyLossResult {
  kernels::PolicyLossStats stats;
  at::Tensor grad_logp;  // d loss / d logp, float32 [S, T]; feed to logp.backward(grad_logp)
};

// All tensors float32 [S, T]; logp_rollout / logp_ref may be undefined when unused.
StatusOr<PolicyLossResult> PolicyLoss(const at::Tensor& logp, const at::Tensor& logp_old,
                                      const at::Tensor& logp_rollout, const at::Tensor& logp_ref,
                                      const at::Tensor& advantages, const at::Tensor& mask,
                                      const kernels::PolicyLossParams& params);

}  // namespace gyre::ops
