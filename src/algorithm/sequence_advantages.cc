#include "algorithm/sequence_advantages.h"

#include <cmath>
#include <limits>

namespace gyre::algorithm {
namespace {

constexpr double kEps = 1e-6;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool AnyNaN(const float* r, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    if (std::isnan(r[i])) return true;
  }
  return false;
}

double Mean(const float* r, int32_t n) {
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += r[i];
  return sum / n;
}

// grpo_passk: only the group's best sample (the first holding the maximum) moves, by its margin
// over the best of the others, scaled by the group's unbiased std.
void PassK(const float* r, int32_t n, float* out) {
  for (int32_t i = 0; i < n; ++i) out[i] = 0.0f;
  if (AnyNaN(r, n)) {
    for (int32_t i = 0; i < n; ++i) out[i] = static_cast<float>(kNaN);
    return;
  }
  if (n < 2) return;
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (r[i] > r[best]) best = i;
  }
  double second = -std::numeric_limits<double>::infinity();
  for (int32_t i = 0; i < n; ++i) {
    if (i != best) second = std::max(second, static_cast<double>(r[i]));
  }
  const double mean = Mean(r, n);
  double ss = 0;
  for (int32_t i = 0; i < n; ++i) ss += (r[i] - mean) * (r[i] - mean);
  const double std_dev = std::sqrt(ss / (n - 1));
  out[best] = static_cast<float>((r[best] - second) / (std_dev + kEps));
}

// opo: R_i minus the group's length-weighted mean reward.
void Opo(const float* r, const int32_t* len, int32_t n, float* out) {
  if (n < 2) {
    out[0] = std::isnan(r[0]) ? static_cast<float>(kNaN) : 0.0f;
    return;
  }
  double weighted = 0, total = 0;
  for (int32_t i = 0; i < n; ++i) {
    weighted += static_cast<double>(len[i]) * r[i];
    total += len[i];
  }
  const double baseline = weighted / total;
  for (int32_t i = 0; i < n; ++i) out[i] = static_cast<float>(r[i] - baseline);
}

}  // namespace

Status CheckGrouping(const std::string& name, size_t num_rewards,
                     const std::vector<int32_t>& group_sizes) {
  int64_t total = 0;
  for (int32_t n : group_sizes) {
    if (n <= 0) return InvalidArgument("advantage estimator '" + name + "': empty group");
    total += n;
  }
  if (total != static_cast<int64_t>(num_rewards)) {
    return InvalidArgument("advantage estimator '" + name + "': group sizes add up to " +
                           std::to_string(total) + ", not the " + std::to_string(num_rewards) +
                           " rewards");
  }
  return Status::Ok();
}

StatusOr<std::vector<float>> PassKAdvantages(const std::vector<float>& rewards,
                                             const std::vector<int32_t>& group_sizes,
                                             const std::vector<int32_t>* /*response_lengths*/) {
  GYRE_RETURN_IF_ERROR(CheckGrouping("grpo_passk", rewards.size(), group_sizes));
  std::vector<float> out(rewards.size());
  size_t begin = 0;
  for (int32_t n : group_sizes) {
    PassK(rewards.data() + begin, n, out.data() + begin);
    begin += static_cast<size_t>(n);
  }
  return out;
}

StatusOr<std::vector<float>> GpgAdvantages(const std::vector<float>& rewards,
                                           const std::vector<int32_t>& group_sizes,
                                           const std::vector<int32_t>* /*response_lengths*/) {
  GYRE_RETURN_IF_ERROR(CheckGrouping("gpg", rewards.size(), group_sizes));
  // A_i = alpha (R_i - mean_g), alpha = B / (samples of the groups whose rewards differ).
  std::vector<float> out(rewards.size());
  size_t begin = 0, informative = 0;
  bool nan = false;
  for (int32_t n : group_sizes) {
    const float* r = rewards.data() + begin;
    nan = nan || AnyNaN(r, n);
    bool equal = true;
    for (int32_t i = 1; i < n; ++i) equal = equal && r[i] == r[0];
    if (!equal) informative += static_cast<size_t>(n);
    begin += static_cast<size_t>(n);
  }
  const double alpha = nan ? kNaN
                           : static_cast<double>(rewards.size()) /
                                 static_cast<double>(std::max<size_t>(1, informative));
  begin = 0;
  for (int32_t n : group_sizes) {
    const float* r = rewards.data() + begin;
    const double mean = Mean(r, n);
    for (int32_t i = 0; i < n; ++i) out[begin + i] = static_cast<float>(alpha * (r[i] - mean));
    begin += static_cast<size_t>(n);
  }
  return out;
}

StatusOr<std::vector<float>> OpoAdvantages(const std::vector<float>& rewards,
                                           const std::vector<int32_t>& group_sizes,
                                           const std::vector<int32_t>* response_lengths) {
  GYRE_RETURN_IF_ERROR(CheckGrouping("opo", rewards.size(), group_sizes));
  if (response_lengths == nullptr || response_lengths->size() != rewards.size()) {
    return InvalidArgument("advantage estimator 'opo' needs one response length per reward");
  }
  for (int32_t l : *response_lengths) {
    if (l < 1) return InvalidArgument("advantage estimator 'opo': a response length is < 1");
  }
  std::vector<float> out(rewards.size());
  size_t begin = 0;
  for (int32_t n : group_sizes) {
    Opo(rewards.data() + begin, response_lengths->data() + begin, n, out.data() + begin);
    begin += static_cast<size_t>(n);
  }
  return out;
}

}  // namespace gyre::algorithm
