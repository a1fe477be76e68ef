#include "sim/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "common/hash.h"

namespace gyre::sim {
namespace {

// A uniform in (0, 1) from 53 random bits.
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

std::string Format(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

int64_t CostModel::Length(uint64_t seed, int64_t max_new_tokens) const {
  const uint64_t a = SplitMix64(seed ^ 0x5151f00dULL), b = SplitMix64(a);
  const double z = std::sqrt(-2.0 * std::log(Unit(a))) * std::cos(2.0 * M_PI * Unit(b));
  const double len = std::round(std::exp(std::log(length_median) + length_sigma * z));
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(len, 1e12)), 1,
                             std::max<int64_t>(1, max_new_tokens));
}

double CostModel::StepSeconds(int64_t running) const {
  return (step_base_s + step_per_seq_s * static_cast<double>(running)) * time_scale;
}

std::vector<std::string> CostModel::ToArgs() const {
  std::vector<std::string> out;
  for (const CostOption& o : kCostOptions) {
    out.push_back(o.flag);
    out.push_back(o.field == nullptr ? std::to_string(max_running) : Format(this->*o.field));
  }
  return out;
}

bool SleepUntilUnless(std::chrono::steady_clock::time_point start, double seconds,
                      const std::function<bool()>& stop) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point end =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(std::max(0.0, std::min(seconds, 1e9))));
  while (true) {
    if (stop && stop()) return false;
    const Clock::time_point now = Clock::now();
    if (now >= end) return true;
    const Clock::duration left = end - now;
    std::this_thread::sleep_for(std::min<Clock::duration>(left, std::chrono::milliseconds(10)));
  }
}

bool SleepUnless(double seconds, const std::function<bool()>& stop) {
  return SleepUntilUnless(std::chrono::steady_clock::now(), seconds, stop);
}

}  // namespace gyre::sim
