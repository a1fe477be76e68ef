#include "controller/step_report.h"

#include <algorithm>
#include <cstdio>

namespace gyre::controller {

namespace {

double TokensPerSecond(const StepRecord& r) {
  return r.window_s > 0 ? static_cast<double>(r.gen->generated_tokens) / r.window_s : 0.0;
}

// Reward and accuracy over every scored sample of the step (filtered groups included).
double MeanReward(const StepScores& sc) { return sc.reward_sum / std::max(1, sc.scored); }
double Accuracy(const StepScores& sc) {
  return static_cast<double>(sc.correct) / std::max(1, sc.scored);
}

// The mean over workers of 1 - busy / window; 0 without workers or window.
double MeanIdle(const std::map<std::string, double>& busy_s, double window_s) {
  if (busy_s.empty() || window_s <= 0) return 0.0;
  double sum = 0;
  for (const auto& [id, sec] : busy_s) sum += std::max(0.0, 1.0 - sec / window_s);
  return sum / static_cast<double>(busy_s.size());
}

}  // namespace

nlohmann::json StepMetrics(const StepRecord& r) {
  const StepScores& sc = *r.scores;
  const GenerateStats& gen = *r.gen;
  nlohmann::json j = {{"phase", "grpo"},
                      {"step", r.step},
                      {"policy_version", r.version},
                      {"mean_reward", MeanReward(sc)},
                      {"accuracy", Accuracy(sc)},
                      {"samples", sc.kept.size()},
                      {"generated_tokens", gen.generated_tokens},
                      {"tokens_per_s", TokensPerSecond(r)},
                      {"step_time_s", r.step_s},
                      {"generate_s", r.generate_s},
                      {"train_s", r.train_s},
                      {"publish_s", r.publish_s},
                      {"lr", 0.0},  // the trainer's metrics below give the applied rate
                      {"zero_variance_groups", r.zero_variance_groups},
                      {"reward_errors", sc.reward_errors},
                      {"stale_dropped", sc.stale}};
  j["reward_zeroed"] = sc.reward_zeroed;
  j["reward_group_drops"] = sc.reward_group_drops;
  j["prefill_tokens"] = gen.prefill_tokens;
  j["prefix_shared_tokens"] = gen.prefix_shared_tokens;
  if (r.relay_rounds >= 0) j["publish_relay_rounds"] = r.relay_rounds;
  if (r.relay_fanout > 0) j["publish_relay_fanout"] = r.relay_fanout;
  if (r.partial_carried >= 0) {
    j["partial_resumed_samples"] = gen.resumed_samples;
    j["partial_carried_groups"] = r.partial_carried;
  }
  // Telemetry: the trained samples' staleness, and how busy each rollout worker was while the
  // step generated.
  nlohmann::json staleness = nlohmann::json::object();
  for (const auto& [st, count] : sc.staleness) staleness[std::to_string(st)] = count;
  j["staleness"] = staleness;
  // Idle within generation's window (stragglers), and within the whole step (a synchronous
  // step's workers also wait while the trainer trains and publishes).
  nlohmann::json busy = nlohmann::json::object();
  for (const auto& [id, sec] : gen.busy_s) busy[id] = sec;
  j["rollout_busy_s"] = busy;
  j["rollout_idle_fraction"] = MeanIdle(gen.busy_s, r.window_s);
  j["rollout_step_idle_fraction"] = MeanIdle(gen.busy_s, r.step_s);
  if (r.filter_zero_variance) {
    j["filtered_groups"] = sc.filtered_groups;
    j["generation_rounds"] = r.rounds;
  }
  if (sc.episodes > 0) {
    j["env_turns_mean"] = static_cast<double>(sc.env_turns) / sc.episodes;
    j["env_terminated_fraction"] = static_cast<double>(sc.env_terminated) / sc.episodes;
    j["env_failures"] = sc.env_failures;
  }
  if (r.overlong_shaping) j["overlong_penalized"] = sc.overlong;
  if (r.median_pivots) j["median_pivots"] = static_cast<int64_t>(sc.pivot_ids.size());
  if (r.has_kl_reward) j["kl_reward"] = r.kl_reward;
  for (const auto& [k, v] : r.extra.items()) j[k] = v;
  for (const auto& [k, v] : r.train) j[k] = v;
  return j;
}

std::string StepProgressLine(const StepRecord& r) {
  const StepScores& sc = *r.scores;
  std::string extra;
  if (r.filter_zero_variance) {
    extra = ", " + std::to_string(sc.filtered_groups) + " filtered";
    if (sc.kept.empty()) extra += ", no update";
  }
  const auto loss = r.train.find("loss");
  char line[256];
  std::snprintf(line, sizeof(line),
                "step %4d/%d  reward %.3f  acc %.3f  %7.0f tok/s  %.2f s  (v%lld, loss %+.4f%s)",
                r.step, r.steps, MeanReward(sc), Accuracy(sc), TokensPerSecond(r), r.step_s,
                static_cast<long long>(r.version), loss != r.train.end() ? loss->second : 0.0,
                extra.c_str());
  return line;
}

std::string StepSummary(const StepRecord& r) {
  char line[160];
  std::snprintf(line, sizeof(line), "step %d/%d  reward %.3f  acc %.3f  %.0f tok/s", r.step,
                r.steps, MeanReward(*r.scores), Accuracy(*r.scores), TokensPerSecond(r));
  return line;
}

}  // namespace gyre::controller
