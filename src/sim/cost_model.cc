#include "sim/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "common/hash.h"

namespace gyre::sim {
namespace {

// A uniform in (0, 1) from 53 random bits.
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

struct Option {
  const char* flag;
  double lo, hi;
  double CostModel::*field;  // null for max_running (an integer)
  const char* help;
};

constexpr Option kOptions[] = {
    {"--max-running", 1, 1e6, nullptr, "sequences a rollout worker runs at once"},
    {"--step-base-s", 0, 100, &CostModel::step_base_s, "engine step time at any batch size (s)"},
    {"--step-per-seq-s", 0, 10, &CostModel::step_per_seq_s,
     "engine step time added per running sequence (s)"},
    {"--prefill-tokens-per-s", 1, 1e12, &CostModel::prefill_tokens_per_s,
     "prompt tokens prefilled per second"},
    {"--length-median", 1, 1e7, &CostModel::length_median, "median response length (tokens)"},
    {"--length-sigma", 0, 10, &CostModel::length_sigma, "lognormal sigma of response lengths"},
    {"--train-s-per-token", 0, 100, &CostModel::train_s_per_token,
     "trainer seconds per response token"},
    {"--model-gb", 0, 1e6, &CostModel::model_gb, "weights published per version (GB)"},
    {"--publish-gb-per-s", 1e-6, 1e9, &CostModel::publish_gb_per_s,
     "trainer uplink for weight publishing (GB/s)"},
    {"--time-scale", 1e-6, 1e3, &CostModel::time_scale,
     "factor on every simulated wait (0.01 = 100x faster than real time)"},
};

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
  for (const Option& o : kOptions) {
    out.push_back(o.flag);
    out.push_back(o.field == nullptr ? std::to_string(max_running) : Format(this->*o.field));
  }
  return out;
}

StatusOr<bool> ParseCostOption(const std::vector<std::string>& args, size_t* i, CostModel* model) {
  for (const Option& o : kOptions) {
    if (args[*i] != o.flag) continue;
    if (*i + 1 >= args.size()) return InvalidArgument(std::string(o.flag) + " needs a value");
    const std::string& v = args[*i + 1];
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(d) || d < o.lo || d > o.hi ||
        (o.field == nullptr && d != std::floor(d))) {
      return InvalidArgument(std::string(o.flag) + ": '" + v + "' is not " +
                             (o.field == nullptr ? "an integer" : "a number") + " in [" +
                             Format(o.lo) + ", " + Format(o.hi) + "]");
    }
    if (o.field == nullptr) {
      model->max_running = static_cast<int64_t>(d);
    } else {
      model->*o.field = d;
    }
    ++*i;
    return true;
  }
  return false;
}

std::string CostOptionsHelp(const CostModel& defaults) {
  std::string out;
  for (const Option& o : kOptions) {
    std::string line = std::string("  ") + o.flag + " X";
    line.resize(std::max<size_t>(line.size() + 1, 28), ' ');
    out += line + o.help + " [" +
           (o.field == nullptr ? std::to_string(defaults.max_running) : Format(defaults.*o.field)) +
           "]\n";
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
