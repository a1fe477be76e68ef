#pragma once
// Fused token sampling on the GPU: temperature, top-k, top-p, min-p, greedy, Philox draws keyed
// by (seed, position). Semantics: kernels/reference/sampling_ref.h (the CPU twin that defines
// them); the design notes are at the top of sampling.cu. All pointers are device pointers and
// launches are asynchronous on `stream`.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/reference/sampling_ref.h"

namespace gyre::kernels {

// logits [rows, vocab] in float or bfloat16; params, out_* [rows]. vocab < 2^31.
template <typename T>
cudaError_t LaunchSampleRows(const T* logits, int64_t rows, int64_t vocab,
                             const SamplingRowParams* params, int32_t* out_tokens,
                             float* out_logprobs, float* out_kept_mass, cudaStream_t stream);

}  // namespace gyre::kernels
