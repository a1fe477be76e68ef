#include "kernels/reference/advantages_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/advantage_terms.h"

namespace gyre::kernels {
namespace {

bool AllEqual(const float* values, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    if (!(values[i] == values[0])) return false;
  }
  // A lone NaN is not "zero variance": its advantage is NaN, not 0.
  return n == 0 || !std::isnan(values[0]);
}

double Mean(const float* values, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += values[i];
  return sum / static_cast<double>(n);
}

double UnbiasedStd(const float* values, int64_t n, double mean) {
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = values[i] - mean;
    sq += d * d;
  }
  return std::sqrt(sq / static_cast<double>(n - 1));
}

double Median(const float* values, int64_t n, std::vector<double>* scratch) {
  scratch->assign(values, values + n);
  std::sort(scratch->begin(), scratch->end());
  const std::vector<double>& v = *scratch;
  if (n % 2 == 1) return v[n / 2];
  return 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void GroupAdvantagesRef(const float* rewards, const int32_t* group_offsets, int32_t num_groups,
                        AdvantageKind kind, float eps, float* advantages, uint8_t* zero_variance) {
  std::vector<double> scratch;
  // The reinforce_pp kinds need the (centred) values of the whole batch before they can whiten;
  // they are kept in double so the second pass does not re-round them.
  std::vector<double> centred;
  const int32_t total = num_groups > 0 ? group_offsets[num_groups] : 0;
  const bool whiten = terms::WhitenedOverBatch(kind);
  if (whiten) centred.resize(total);

  for (int32_t g = 0; g < num_groups; ++g) {
    const int32_t begin = group_offsets[g];
    const int64_t n = group_offsets[g + 1] - begin;
    const float* r = rewards + begin;
    float* adv = advantages + begin;
    const bool all_equal = AllEqual(r, n);
    if (zero_variance != nullptr) zero_variance[g] = all_equal ? 1 : 0;
    if (n == 0) continue;
    terms::GroupStats stats;
    stats.n = n;
    stats.mean = Mean(r, n);
    stats.all_equal = all_equal;
    if (terms::NeedsStd(kind) && n > 1 && !all_equal) stats.std = UnbiasedStd(r, n, stats.mean);
    if (terms::NeedsMedian(kind)) stats.median = Median(r, n, &scratch);
    for (int64_t i = 0; i < n; ++i) {
      const double v = terms::SampleValue(kind, r[i], stats, static_cast<double>(eps));
      if (whiten) {
        centred[begin + i] = v;
      } else {
        adv[i] = static_cast<float>(v);
      }
    }
  }

  if (!whiten || total == 0) return;
  double sum = 0.0;
  for (int32_t i = 0; i < total; ++i) sum += centred[i];
  const double batch_mean = sum / total;
  double sq = 0.0;
  for (int32_t i = 0; i < total; ++i) {
    const double d = centred[i] - batch_mean;
    sq += d * d;
  }
  const double batch_std = total > 1 ? std::sqrt(sq / (total - 1)) : 0.0;
  const double denom = batch_std + static_cast<double>(eps);
  for (int32_t i = 0; i < total; ++i) {
    advantages[i] = static_cast<float>((centred[i] - batch_mean) / denom);
  }
}

void BroadcastToTokensRef(const float* seq_values, const float* mask, int64_t S, int64_t T,
                          float* out) {
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      const float m = mask[s * T + t];
      out[s * T + t] = m == 0.0f ? 0.0f : seq_values[s] * m;
    }
  }
}

}  // namespace gyre::kernels
