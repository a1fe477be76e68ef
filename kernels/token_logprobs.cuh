#pragma once
// Fused token log-probabilities (+ entropy) from logits, forward and backward, without a
// materialised log-softmax. Semantics: kernels/reference/token_logprobs_ref.h. Pointers are
// device pointers; all launches are asynchronous on `stream`.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace gyre::kernels {

// logits [rows, V] in float or bfloat16; targets [rows]; logp, entropy [rows] float32
// (entropy may be null).
template <typename T>
cudaError_t LaunchTokenLogprobsForward(const T* logits, const int64_t* targets, int64_t rows,
                                       int64_t V, float temperature, float* logp, float* entropy,
                                       cudaStream_t stream);

// grad_logits [rows, V] in the logits' type, overwritten; grad_entropy may be null.
template <typename T>
cudaError_t LaunchTokenLogprobsBackward(const T* logits, const int64_t* targets, int64_t rows,
                                        int64_t V, float temperature, const float* grad_logp,
                                        const float* grad_entropy, T* grad_logits,
                                        cudaStream_t stream);

}  // namespace gyre::kernels
