#pragma once
// The cost model of simulated workers (`gyre sim-workers`, `gyre bench e2e --simulate`): what a
// rollout or trainer worker would spend on a request, so that the real controller can be run
// against many workers without models (docs/algorithms.md, "Measuring: gyre bench e2e").
//
// A simulated worker stands for one node; the defaults describe an 8xH100-class node serving or
// training a 7B-parameter model in bf16 (the numbers are assumptions, documented with the bench):
//   rollout  continuous batching of up to max_running sequences; an engine step generates one
//            token for every running sequence and takes step_base_s + step_per_seq_s * running
//            (0.015 s + 40 us per sequence: about 10k tokens/s at a full batch of 256, 67 at
//            one); admitting a group costs its prompt tokens / prefill_tokens_per_s once (the
//            group's samples share the prompt's KV).
//   lengths  each sample's response length is lognormal: exp(log(length_median) +
//            length_sigma * z), z standard normal drawn from the sample's seed, rounded and
//            clamped to [1, max_new_tokens], so a sample has the same length wherever it runs.
//   trainer  a train step takes train_s_per_token * (the response tokens of its shard).
//   publish  a weight publish from the trainer takes model_gb * receivers / publish_gb_per_s
//            (the trainer's uplink carries every copy).
// Every wait is multiplied by time_scale (1 = real time; 0.01 runs 100x faster), so reported
// simulated times are wall times / time_scale.
//
// Thread-safe: immutable after construction.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gyre::sim {

struct CostModel {
  int64_t max_running = 256;
  double step_base_s = 0.015;
  double step_per_seq_s = 40e-6;
  double prefill_tokens_per_s = 50000;
  double length_median = 600;
  double length_sigma = 1.0;
  double train_s_per_token = 3.3e-5;  // a node of 8 GPUs at ~30k tokens/s fwd + bwd
  double model_gb = 15;
  double publish_gb_per_s = 25;
  double time_scale = 1.0;

  // The response length of the sample with sampling seed `seed`, at most max_new_tokens.
  int64_t Length(uint64_t seed, int64_t max_new_tokens) const;
  // Seconds (already scaled) of one engine step with `running` sequences.
  double StepSeconds(int64_t running) const;
  // Every option of kCostOptions (below) as "--key value" pairs, for passing the model to
  // `gyre sim-workers`.
  std::vector<std::string> ToArgs() const;
};

// The cost model's command-line options, as `gyre sim-workers` and `gyre bench e2e --simulate`
// declare them and ToArgs writes them: the flag, the valid range of its value, the field it sets
// (null for max_running, the one integer) and a one-line help.
struct CostOption {
  const char* flag;
  double lo, hi;
  double CostModel::*field;
  const char* help;
};

inline constexpr CostOption kCostOptions[] = {
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

// Sleeps `seconds`; returns false early (after at most ~10 ms) when `stop()` turns true.
bool SleepUnless(double seconds, const std::function<bool()>& stop);
// Sleeps until `seconds` after `start` (steady clock); the same early return. Waiting for
// absolute times keeps a long run of short simulated steps from adding up each sleep's overshoot.
bool SleepUntilUnless(std::chrono::steady_clock::time_point start, double seconds,
                      const std::function<bool()>& stop);

}  // namespace gyre::sim
