#include "algorithm/sampling_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace gyre::algorithm {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

bool AllEqual(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [&](double x) { return x == v.front(); });
}

class Uniform final : public SamplingPolicy {
 public:
  explicit Uniform(int group_size) : n_(group_size) {}
  int FirstRound() const override { return n_; }

 private:
  const int n_;
};

// Pilot-then-commit: pilot_samples per prompt; a prompt whose pilot accuracy (share of rewards
// at or above the correct threshold) lies in [low, high] gets the rest of the group.
class Pilot final : public SamplingPolicy {
 public:
  Pilot(const JobConfig& cfg, double threshold)
      : b_(cfg.rollout.budget), n_(cfg.rollout.group_size), threshold_(threshold) {}
  int FirstRound() const override { return b_.pilot_samples; }
  std::vector<int> TopUps(const std::vector<GroupRewards>& groups) const override {
    std::vector<int> out;
    for (const GroupRewards& g : groups) {
      double correct = 0;
      for (double r : g.rewards) correct += r >= threshold_ ? 1.0 : 0.0;
      const double acc = g.rewards.empty() ? 0.0 : correct / g.rewards.size();
      const bool commit = !g.rewards.empty() && acc >= b_.pilot_low && acc <= b_.pilot_high;
      out.push_back(commit ? n_ - b_.pilot_samples : 0);
    }
    return out;
  }

 private:
  const BudgetSection b_;
  const int n_;
  const double threshold_;
};

// Variance-guided top-ups: the round's remaining budget goes topup_chunk samples at a time to
// the groups of highest reward variance (ties: earlier group first), round robin over the groups
// with variance > 0 in that order, each capped at topup_max_group samples. Budget no group with
// variance can take is not spent.
class Variance final : public SamplingPolicy {
 public:
  explicit Variance(const JobConfig& cfg)
      : b_(cfg.rollout.budget),
        n_(cfg.rollout.group_size),
        cap_(cfg.rollout.budget.topup_max_group > 0 ? cfg.rollout.budget.topup_max_group
                                                    : 2 * cfg.rollout.group_size) {}
  int FirstRound() const override { return b_.pilot_samples; }
  std::vector<int> TopUps(const std::vector<GroupRewards>& groups) const override {
    std::vector<int> out(groups.size(), 0);
    int64_t budget = static_cast<int64_t>(groups.size()) * (n_ - b_.pilot_samples);
    std::vector<size_t> order;
    std::vector<double> var(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      var[g] = RewardVariance(groups[g].rewards);
      if (var[g] > 0) order.push_back(g);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return var[a] > var[b]; });
    bool granted = true;
    while (budget > 0 && granted) {
      granted = false;
      for (size_t g : order) {
        if (budget <= 0) break;
        const int64_t have = static_cast<int64_t>(groups[g].rewards.size()) + out[g];
        const int64_t give = std::min<int64_t>({b_.topup_chunk, budget, cap_ - have});
        if (give <= 0) continue;
        out[g] += static_cast<int>(give);
        budget -= give;
        granted = true;
      }
    }
    return out;
  }

 private:
  const BudgetSection b_;
  const int n_;
  const int64_t cap_;
};

// GRESO-style skipping: per prompt, the number of its most recent groups in a row whose rewards
// were all equal. A prompt with at least greso_streak of them is skipped with probability p; after
// each step p moves by greso_step up when the step's share of zero-variance groups exceeded
// greso_target, down otherwise (within [0, 1]).
class Greso final : public SamplingPolicy {
 public:
  explicit Greso(const JobConfig& cfg)
      : b_(cfg.rollout.budget),
        n_(cfg.rollout.group_size),
        seed_(cfg.job.seed),
        p_(cfg.rollout.budget.greso_initial) {}

  bool Skip(const std::string& prompt, int step, uint64_t draw) override {
    auto it = streak_.find(prompt);
    if (it == streak_.end() || it->second < b_.greso_streak) return false;
    // A uniform draw in [0, 1) from the job seed, the step, the draw and the prompt.
    const uint64_t h = SplitMix(seed_ ^ SplitMix(static_cast<uint64_t>(step) * 0x100000001b3ULL ^
                                                 SplitMix(draw) ^ Fnv1a(prompt)));
    const double u = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
    const bool skip = u < p_;
    skipped_ += skip ? 1 : 0;
    return skip;
  }
  int FirstRound() const override { return n_; }
  void Observe(const std::vector<GroupRewards>& groups) override {
    for (const GroupRewards& g : groups) {
      if (g.rewards.empty()) continue;
      int& s = streak_[g.prompt];
      s = AllEqual(g.rewards) ? s + 1 : 0;
      zero_ += AllEqual(g.rewards) ? 1 : 0;
      ++groups_;
    }
  }
  void AddMetrics(nlohmann::json* j) const override {
    (*j)["skipped_prompts"] = skipped_;
    (*j)["skip_probability"] = p_;
    (*j)["history_prompts"] = static_cast<int64_t>(streak_.size());
  }
  void EndStep() override {
    // The step's share of zero-variance groups sets the next step's probability.
    const double share = groups_ > 0 ? static_cast<double>(zero_) / groups_ : 0.0;
    p_ = std::clamp(p_ + (share > b_.greso_target ? b_.greso_step : -b_.greso_step), 0.0, 1.0);
    skipped_ = zero_ = groups_ = 0;
  }
  nlohmann::json SaveState() const override {
    nlohmann::json streaks = nlohmann::json::object();
    for (const auto& [prompt, s] : streak_) streaks[prompt] = s;
    return {{"policy", "greso"}, {"skip_probability", p_}, {"streaks", streaks}};
  }
  Status RestoreState(const nlohmann::json& state) override {
    auto bad = [](const std::string& why) {
      return InvalidArgument("sampling policy state: " + why);
    };
    if (!state.is_object() || !state.contains("policy") || state["policy"] != "greso") {
      return bad("not a greso state (the checkpoint was written with another policy)");
    }
    if (!state.contains("skip_probability") || !state["skip_probability"].is_number() ||
        !(state["skip_probability"].get<double>() >= 0 &&
          state["skip_probability"].get<double>() <= 1)) {
      return bad("skip_probability must be a number in [0, 1]");
    }
    if (!state.contains("streaks") || !state["streaks"].is_object()) {
      return bad("streaks must be an object of prompt: count");
    }
    std::map<std::string, int> streaks;
    for (const auto& [prompt, s] : state["streaks"].items()) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > 1000000000) {
        return bad("streak of '" + prompt + "' must be a non-negative integer");
      }
      streaks[prompt] = s.get<int>();
    }
    p_ = state["skip_probability"].get<double>();
    streak_ = std::move(streaks);
    skipped_ = zero_ = groups_ = 0;
    return Status::Ok();
  }

 private:
  const BudgetSection b_;
  const int n_;
  const uint64_t seed_;
  double p_;
  std::map<std::string, int> streak_;
  int64_t skipped_ = 0, zero_ = 0, groups_ = 0;  // this step's
};

}  // namespace

double RewardVariance(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return sq / static_cast<double>(v.size() - 1);
}

std::unique_ptr<SamplingPolicy> MakeSamplingPolicy(const JobConfig& cfg, double correct_threshold) {
  const std::string& p = cfg.rollout.budget.policy;
  if (p == "pilot") return std::make_unique<Pilot>(cfg, correct_threshold);
  if (p == "variance") return std::make_unique<Variance>(cfg);
  if (p == "greso") return std::make_unique<Greso>(cfg);
  return std::make_unique<Uniform>(cfg.rollout.group_size);
}

}  // namespace gyre::algorithm
