#pragma once
// RewardFn: how a library user scores responses. The controller calls Score once per sample,
// from its own thread (never concurrently for one RewardFn), with the decoded prompt and
// response and the dataset's reference answer. Returning an error marks the sample's reward as
// failed: it is reported and left out of training, never silently counted as 0.

#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre {

struct RewardInput {
  std::string prompt;     // the prompt text as the dataset gave it
  std::string response;   // decoded response, without the stop token
  std::string answer;     // the dataset's reference answer ("" when it has none)
  bool finished = false;  // the response ended with a stop token (not cut at max_new_tokens)
  // Unique within the job for one sample ("g<group id>/s<sample id>"): a reward service's
  // idempotent item id (inputs with the same id are the same item). Empty when the caller has
  // none.
  std::string id;
};

class RewardFn {
 public:
  virtual ~RewardFn() = default;
  virtual StatusOr<double> Score(const RewardInput& input) = 0;
  // Scores several inputs; element i answers inputs[i]. The default calls Score for each; a
  // reward that works on batches (a reward service, agent/service_reward.h) overrides it.
  virtual std::vector<StatusOr<double>> ScoreBatch(const std::vector<RewardInput>& inputs) {
    std::vector<StatusOr<double>> out;
    out.reserve(inputs.size());
    for (const RewardInput& in : inputs) out.push_back(Score(in));
    return out;
  }
  // Rewards at or above this count as "correct" in accuracy figures.
  virtual double correct_threshold() const { return 1.0; }
};

}  // namespace gyre
