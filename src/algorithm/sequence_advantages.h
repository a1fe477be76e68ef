#pragma once
// Sequence-level advantage estimators without a value model (GAE-free) that need more than the
// group statistics of the group-advantage kernel (kernels/reference/advantages_ref.h): the best
// sample's margin (grpo_passk), a batch-level rescaling (gpg), a length-weighted baseline (opo).
// They run on the CPU, where a job computes every advantage (in the controller, once per step on
// one float per sample). Definitions: docs/algorithms.md. Statistics in double, rounded once to
// float; a NaN reward makes its group's advantages NaN (gpg: the whole batch's), never 0.
//
// Thread-safe: no state between calls.

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::algorithm {

// The grouping every estimator needs (used for the user's too): groups of at least one that add
// up to the rewards. InvalidArgument naming estimator `name` otherwise.
Status CheckGrouping(const std::string& name, size_t num_rewards,
                     const std::vector<int32_t>& group_sizes);

// One advantage per reward, for rewards grouped by group_sizes (each >= 1, adding up to
// rewards.size()); InvalidArgument otherwise. The algorithm registry (registry.cc) dispatches to
// them by name. `response_lengths` (one per reward, each >= 1) is needed by opo (InvalidArgument
// when missing or bad) and ignored by the others.
StatusOr<std::vector<float>> PassKAdvantages(const std::vector<float>& rewards,
                                             const std::vector<int32_t>& group_sizes,
                                             const std::vector<int32_t>* response_lengths);
StatusOr<std::vector<float>> GpgAdvantages(const std::vector<float>& rewards,
                                           const std::vector<int32_t>& group_sizes,
                                           const std::vector<int32_t>* response_lengths);
StatusOr<std::vector<float>> OpoAdvantages(const std::vector<float>& rewards,
                                           const std::vector<int32_t>& group_sizes,
                                           const std::vector<int32_t>* response_lengths);

}  // namespace gyre::algorithm
