#pragma once
// Tasks and datasets: where prompts and reference answers come from, and the built-in verifier.
//
// The built-in tasks: multi-digit addition, "37+5=" -> "42"; copy, "c4821=" -> "4821", whose
// answer lengths are lognormal (median data.min_digits, sigma 0.75, at most data.max_digits): a
// long-tail response-length task for asynchronous rollout; and word_problems, arithmetic in
// words for instruction-tuned models ("Mia has 23 apples. She buys 14 more. How many apples does
// she have now?" -> "37"; sums, differences and products, operands of data.min_digits to
// data.max_digits digits, a one-digit multiplier), meant for reward.type: math. Problems are drawn
// from a seed, so a job is reproducible; the held-out set is drawn from its own seed and removed
// from the training stream. A JSONL dataset ({"prompt": ..., "answer": ...} per line) uses the same
// verifier (exact match of the trimmed response with the answer).

#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gyre/config.h"
#include "gyre/reward.h"
#include "gyre/status.h"

namespace gyre::agent {
class ServiceSupervisor;
}  // namespace gyre::agent

namespace gyre::controller {

struct Problem {
  std::string prompt;  // text, or the JSON array of {role, content} when is_messages
  std::string answer;
  bool is_messages = false;  // the dataset gave the prompt as a list of chat messages
  std::string where;         // "file:line" of a dataset record; empty for generated problems
  std::string record;        // the dataset record as JSON; empty for generated problems
};

// The task an environment episode of `problem` gets (ResetRequest.task_json): the dataset record
// as it was written, or {"prompt", "answer"} for a generated problem.
std::string TaskJson(const Problem& problem);

// Reads a JSONL file of {"prompt": str or [{"role", "content"}, ...], "answer": str}.
// Errors name the file and line.
StatusOr<std::vector<Problem>> LoadJsonl(const std::string& path);

// An endless, reproducible stream of training problems.
class ProblemSource {
 public:
  // Builds the training stream and the held-out set for `config.data`.
  static StatusOr<ProblemSource> Create(const DataSection& data, uint64_t seed);

  Problem Next();
  const std::vector<Problem>& eval_set() const { return eval_; }
  // For generated problems: the longest prompt each template can produce (every operand at its
  // largest), so that a job checks they fit before it starts. Empty for a dataset.
  std::vector<Problem> LongestPrompts() const;
  // The dataset's training records (empty when problems are generated).
  const std::vector<Problem>& train_set() const { return train_; }

  // The stream's position (dataset cursor and generator state) as text, for checkpoints, and
  // back: after RestoreState(SaveState()) a source created from the same data and seed yields
  // the same problems as the one saved. RestoreState changes nothing on text it cannot read.
  std::string SaveState() const;
  Status RestoreState(const std::string& state);

 private:
  Problem Draw(std::mt19937_64* rng) const;
  DataSection data_;
  std::mt19937_64 rng_;
  std::vector<Problem> train_;  // from a JSONL file; empty = generated
  size_t cursor_ = 0;
  std::vector<Problem> eval_;
  std::set<std::string> eval_prompts_;
};

// The verifier: 1 if the response (trimmed) equals the answer and the model stopped, else 0.
class ExactMatchReward final : public RewardFn {
 public:
  StatusOr<double> Score(const RewardInput& input) override;
};

// The math verifier (reward.type: math): 1 if the model stopped and its final answer equals the
// reference answer as a number, else 0. The final answer is the content of the last \boxed{...}
// when the response has one, else the last number in it ("-12", "1,234", "3.50"); numbers compare
// by value (thousands separators and trailing zeros after a decimal point do not matter). A
// reference answer that is not a number is an error, never a 0.
class MathReward final : public RewardFn {
 public:
  StatusOr<double> Score(const RewardInput& input) override;
};

// The number `text` states, normalised ("1,234.50" -> "1234.5", "-0" -> "0"), or "" when it is not
// one number.
std::string NormaliseNumber(const std::string& text);
// The final answer of a response as MathReward reads it (normalised), or "" when it has none.
std::string FinalNumber(const std::string& response);

// The job's reward: the built-in verifier, or `custom` (RunOptions::reward) when reward.type is
// custom. Setting one without the other is an error that says which to change. For reward.type
// service it returns null: the caller starts the service (StartRewardService) once the run
// directory for its log exists.
StatusOr<std::shared_ptr<RewardFn>> ChooseReward(const RewardSection& reward,
                                                 std::shared_ptr<RewardFn> custom);
// env.address or env.command: starts (or connects to) the environment server; a started server
// logs to `log_path`.
StatusOr<std::unique_ptr<agent::ServiceSupervisor>> StartEnvService(const EnvSection& env,
                                                                    const std::string& log_path);
// reward.type: service: starts (or connects to) the reward server and returns the RewardFn that
// scores through it (agent/service_reward.h). A started server logs to `log_path`.
StatusOr<std::shared_ptr<RewardFn>> StartRewardService(const RewardSection& reward,
                                                       const std::string& log_path);

}  // namespace gyre::controller
