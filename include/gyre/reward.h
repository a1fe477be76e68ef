#pragma once
// RewardFn: how a library user scores responses. The controller calls Score once per sample,
// from its own thread (never concurrently for one RewardFn), with the decoded prompt and
// response and the dataset's reference answer. Returning an error marks the sample's reward as
// failed: it is reported and left out of training, never silently counted as 0.

#include <string>

#include "gyre/status.h"

namespace gyre {

struct RewardInput {
  std::string prompt;     // the prompt text as the dataset gave it
  std::string response;   // decoded response, without the stop token
  std::string answer;     // the dataset's reference answer ("" when it has none)
  bool finished = false;  // the response ended with a stop token (not cut at max_new_tokens)
};

class RewardFn {
 public:
  virtual ~RewardFn() = default;
  virtual StatusOr<double> Score(const RewardInput& input) = 0;
  // Rewards at or above this count as "correct" in accuracy figures.
  virtual double correct_threshold() const { return 1.0; }
};

}  // namespace gyre
