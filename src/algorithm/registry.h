#pragma once
// Algorithms by name: the one list of the advantage estimators, policy losses, loss aggregations,
// behaviour-policy corrections, KL estimators, learning-rate schedules and sampling policies a job
// can name. The
// config's choice lists, docs/algorithms.md's table and `gyre validate --print` all read it, so
// they cannot drift. An embedding program adds its own advantage estimator with
// RegisterAdvantageEstimator before it runs a job; the controller then computes advantages through
// ComputeAdvantages.
//
// Thread contract: Algorithms(), NamesFor() and ComputeAdvantages() may be called from any
// thread; RegisterAdvantageEstimator() must not run concurrently with them (register at start-up,
// before RunJob).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::algorithm {

// Which job-file key names the algorithm.
enum class Family {
  kAdvantage,
  kPolicyLoss,
  kLossAgg,
  kCorrection,
  kKl,
  kLrSchedule,
  kSamplingPolicy
};

// The key of `family`, e.g. "algorithm.advantage".
const char* FamilyKey(Family family);

struct AlgorithmInfo {
  Family family = Family::kAdvantage;
  std::string name;     // what the job file says
  std::string formula;  // one line, plain text
  std::string paper;    // title and arXiv id (or "Gyre" for Gyre's own)
  std::string verl;     // where Gyre differs from verl's implementation of the same name
  bool user = false;    // registered by the embedding program
};

// Every algorithm, built-ins first in the order the docs list them, then user registrations.
std::vector<AlgorithmInfo> Algorithms();

// The names of one family, in Algorithms() order: the config's choice list.
std::vector<std::string> NamesFor(Family family);

// A user's advantage estimator. rewards holds group_sizes.size() consecutive groups; fill
// *advantages with one value per reward. Return an error to fail the step (never a silent 0).
using AdvantageFn =
    std::function<Status(const std::vector<float>& rewards, const std::vector<int32_t>& group_sizes,
                         std::vector<float>* advantages)>;

// Registers `fn` under info.name (family must be kAdvantage; the name must be new, lower case
// letters, digits and '_', and fn non-null). Errors name what to fix.
Status RegisterAdvantageEstimator(AlgorithmInfo info, AdvantageFn fn);

// Adds a user algorithm's name to `info.family` (not kAdvantage: RegisterAdvantageEstimator has
// the function too) for a family whose implementation lives elsewhere, such as a policy loss
// registered through include_torch/gyre/torch.h. Same name rules and errors as
// RegisterAdvantageEstimator.
Status RegisterAlgorithmName(AlgorithmInfo info);

// Advantages of `rewards` grouped by `group_sizes` with the estimator `name`, built-in or
// registered. *zero_variance (nullable) gets 1 per group whose rewards are all equal.
// `response_lengths` (nullable; one per reward, in tokens) is needed by opo. Fails on an unknown
// name, sizes that do not add up, missing lengths, or a user estimator's error or wrong output
// size.
StatusOr<std::vector<float>> ComputeAdvantages(
    const std::string& name, const std::vector<float>& rewards,
    const std::vector<int32_t>& group_sizes, std::vector<uint8_t>* zero_variance,
    const std::vector<int32_t>* response_lengths = nullptr);

// The Markdown table of every built-in algorithm (name, key, formula, paper, difference from
// verl), as docs/algorithms.md holds it; a test keeps the two identical.
std::string AlgorithmTableMarkdown();

}  // namespace gyre::algorithm
