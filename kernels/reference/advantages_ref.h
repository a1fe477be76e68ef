// CPU reference for group-relative advantage estimators (docs/design.md, "Advantages").
//
// A group is the n samples drawn for one prompt; groups in a batch may differ in size. All
// statistics are computed in double from the float rewards, then rounded once to float.
// A NaN reward propagates into its group's advantages (and, for the reinforce_pp kinds, into the
// whole batch) rather than being silently replaced: a failed reward must never look like a 0.
// Thread-safe: no state between calls.
#pragma once

#include <cstdint>
#include <string>

namespace gyre::kernels {

// Exact meanings, for a group with rewards R_1..R_n, mean m (and eps, default 1e-6):
//   kGrpo:                (R_i - m) / (std + eps), std unbiased (divides by n - 1); 0 when n == 1
//                         or all rewards are equal.
//   kGrpoNoStd:           R_i - m (Dr. GRPO).
//   kRloo:                n / (n - 1) * (R_i - m), i.e. R_i minus the mean of the other n - 1;
//                         0 when n == 1.
//   kMedian:              R_i - median (even n: mean of the two middle values) (MC-GRPO).
//   kReinforcePpBaseline: x_i = R_i - m, then whitened over every sample of the batch:
//                         (x_i - mean(x)) / (std(x) + eps), std unbiased; std is taken as 0 when
//                         the batch has fewer than two samples.
//   kReinforcePp:         x_i = R_i (no group baseline), whitened over the batch as above
//                         (REINFORCE++ with one terminal reward and gamma = 1).
// The per-sample formulas: kernels/advantage_terms.h (SampleValue), shared with the CUDA kernel.
enum class AdvantageKind { kGrpo, kGrpoNoStd, kRloo, kMedian, kReinforcePpBaseline, kReinforcePp };

// The names a job file uses live in the algorithm registry (src/algorithm/registry.cc).

// Computes one advantage per sample.
// rewards, advantages: [group_offsets[num_groups]] samples; group g is the half-open range
// [group_offsets[g], group_offsets[g + 1]) and offsets must be non-decreasing from 0.
// zero_variance (nullable): [num_groups]; set to 1 when every reward in the group is equal
// (including groups of one and empty groups), else 0.
void GroupAdvantagesRef(const float* rewards, const int32_t* group_offsets, int32_t num_groups,
                        AdvantageKind kind, float eps, float* advantages, uint8_t* zero_variance);

// out[s, t] = seq_values[s] * mask[s, t] for a row-major [S, T] mask: the sequence advantage on
// every response token. Where mask[s, t] == 0 the output is exactly 0, even for a non-finite
// seq_values[s], so padding never carries NaN.
void BroadcastToTokensRef(const float* seq_values, const float* mask, int64_t S, int64_t T,
                          float* out);

}  // namespace gyre::kernels
