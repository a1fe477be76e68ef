// CUDA launchers for group-relative advantages and their broadcast to token positions. The
// semantics are exactly those of kernels/reference/advantages_ref.h (the CPU twin): statistics in
// double from float rewards, each output rounded once to float.
//
// All pointers are device pointers; work is enqueued on `stream` and nothing is synchronised.
// The launchers are thread-safe (no state between calls) and return the first CUDA error met, or
// cudaErrorInvalidValue for bad arguments (in which case nothing is enqueued).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/reference/advantages_ref.h"

namespace gyre::kernels {

// Groups of up to this many samples find their median in shared memory; larger groups use the same
// algorithm reading global memory (correct, but quadratic in the group size, so slow).
constexpr int32_t kMedianSharedMaxGroupSize = 4096;

// One advantage per sample, as GroupAdvantagesRef.
// rewards, advantages: [total] floats. group_offsets: [num_groups + 1], non-decreasing from 0, with
// group_offsets[num_groups] == total (the caller passes `total` so that the launcher needs no
// device read). zero_variance (nullable): [num_groups] bytes, 1 when every reward of the group is
// equal (groups of one and empty groups included; a lone NaN is not zero variance), else 0.
// kMedian: a group holding a NaN reward gets a NaN median, so every advantage of that group is NaN
// (the reference's std::sort gives no defined order for NaN).
// kReinforcePpBaseline allocates `total` doubles of stream-ordered scratch (cudaMallocAsync) and
// frees it on the same stream.
// Returns cudaErrorInvalidValue if num_groups < 0, total < 0, or a needed pointer is null.
cudaError_t LaunchGroupAdvantages(const float* rewards, const int32_t* group_offsets,
                                  int32_t num_groups, AdvantageKind kind, float eps,
                                  float* advantages, uint8_t* zero_variance, int32_t total,
                                  cudaStream_t stream);

// out[s, t] = seq_values[s] * mask[s, t] over a row-major [S, T] mask, and exactly 0 where
// mask[s, t] == 0 (even for a non-finite seq_values[s]), as BroadcastToTokensRef.
// Returns cudaErrorInvalidValue if S or T is negative or a pointer is null while S * T > 0.
cudaError_t LaunchBroadcastToTokens(const float* seq_values, const float* mask, int64_t S,
                                    int64_t T, float* out, cudaStream_t stream);

}  // namespace gyre::kernels
