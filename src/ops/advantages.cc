#include "ops/advantages.h"

#include <string>

namespace gyre::ops {

StatusOr<std::vector<float>> GroupAdvantages(const std::vector<float>& rewards,
                                             const std::vector<int32_t>& group_sizes,
                                             kernels::AdvantageKind kind,
                                             std::vector<uint8_t>* zero_variance) {
  std::vector<int32_t> offsets(group_sizes.size() + 1, 0);
  for (size_t g = 0; g < group_sizes.size(); ++g) {
    if (group_sizes[g] <= 0) return InvalidArgument("group " + std::to_string(g) + " is empty");
    offsets[g + 1] = offsets[g] + group_sizes[g];
  }
  if (static_cast<size_t>(offsets.back()) != rewards.size()) {
    return InvalidArgument("group sizes add up to " + std::to_string(offsets.back()) + ", got " +
                           std::to_string(rewards.size()) + " rewards");
  }
  std::vector<float> adv(rewards.size());
  std::vector<uint8_t> zv(group_sizes.size());
  kernels::GroupAdvantagesRef(rewards.data(), offsets.data(),
                              static_cast<int32_t>(group_sizes.size()), kind, 1e-6f, adv.data(),
                              zv.data());
  if (zero_variance) *zero_variance = std::move(zv);
  return adv;
}

}  // namespace gyre::ops
