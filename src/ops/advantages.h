#pragma once
// Group advantages over plain vectors (no tensors): what the controller computes after scoring
// a step's samples. Calls the reference in kernels/reference/advantages_ref.h.

#include <cstdint>
#include <vector>

#include "gyre/status.h"
#include "kernels/reference/advantages_ref.h"

namespace gyre::ops {

// rewards are grouped consecutively by `group_sizes` (sizes may differ). Fails on empty groups
// or sizes that do not add up to rewards.size().
StatusOr<std::vector<float>> GroupAdvantages(const std::vector<float>& rewards,
                                             const std::vector<int32_t>& group_sizes,
                                             kernels::AdvantageKind kind,
                                             std::vector<uint8_t>* zero_variance);

}  // namespace gyre::ops
