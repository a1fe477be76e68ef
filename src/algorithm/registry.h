#pragma once
// Algorithms by name: the one list of the advantage estimators, policy losses, loss aggregations,
// behaviour-policy corrections, KL estimators, learning-rate schedules and sampling policies a job
// can name, and the dispatch table behind them: each built-in entry carries its implementation
// (an advantage estimator's function; the kernel value a policy loss, aggregation, correction or
// KL estimator selects in kernels/policy_loss_terms.h, which the CPU reference and the CUDA
// kernels share). The config's choice lists, docs/algorithms.md's table, `gyre validate --print`,
// the trainers' loss settings and the controller's advantages all read it, so they cannot drift.
// A new built-in is one entry here, its kernel and its test. An embedding program adds its own
// advantage estimator with RegisterAdvantageEstimator before it runs a job; the controller then
// computes advantages through ComputeAdvantages.
//
// Thread contract: Algorithms(), NamesFor() and ComputeAdvantages() may be called from any
// thread; RegisterAdvantageEstimator() must not run concurrently with them (register at start-up,
// before RunJob).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gyre/status.h"
#include "kernels/reference/advantages_ref.h"
#include "kernels/reference/policy_loss_ref.h"

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

// A user's advantage estimator. rewards holds group_sizes.size() consecutive groups; fill
// *advantages with one value per reward. Return an error to fail the step (never a silent 0).
using AdvantageFn =
    std::function<Status(const std::vector<float>& rewards, const std::vector<int32_t>& group_sizes,
                         std::vector<float>* advantages)>;

// How a built-in advantage estimator computes: either the group kernel (kernels/reference/
// advantages_ref.h, CUDA twin advantages.cu) with its kind, or a CPU function over the whole batch
// (sequence_advantages.h) that may read the response lengths.
using BatchAdvantageFn = StatusOr<std::vector<float>> (*)(const std::vector<float>& rewards,
                                                          const std::vector<int32_t>& group_sizes,
                                                          const std::vector<int32_t>* lengths);

struct AlgorithmInfo {
  Family family = Family::kAdvantage;
  std::string name;     // what the job file says
  std::string formula;  // one line, plain text
  std::string paper;    // title and arXiv id (or "Gyre" for Gyre's own)
  std::string verl;     // where Gyre differs from verl's implementation of the same name
  bool user = false;    // registered by the embedding program

  // The implementation, by family (built-ins; a user estimator's is `user_advantage`):
  // kAdvantage: the group kernel's kind, or batch_advantage when that is set.
  kernels::AdvantageKind advantage_kind = kernels::AdvantageKind::kGrpo;
  BatchAdvantageFn batch_advantage = nullptr;
  AdvantageFn user_advantage = nullptr;
  kernels::PolicyLossKind policy_loss = kernels::PolicyLossKind::kPpo;  // kPolicyLoss
  kernels::LossAgg loss_agg = kernels::LossAgg::kTokenMean;             // kLossAgg
  kernels::Correction correction = kernels::Correction::kNone;          // kCorrection
  kernels::KlKind kl = kernels::KlKind::kNone;                          // kKl
};

// Every algorithm, built-ins first in the order the docs list them, then user registrations.
std::vector<AlgorithmInfo> Algorithms();

// The names of one family, in Algorithms() order: the config's choice list.
std::vector<std::string> NamesFor(Family family);

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

// The entry of `family` named `name` (built-in or registered); NotFound naming the family's key
// and its names otherwise.
StatusOr<AlgorithmInfo> Find(Family family, const std::string& name);

// The kernel values of the names a job file gives (Find, then the entry's value); InvalidArgument
// naming the key and the accepted names for an unknown one. A policy loss registered through
// include_torch/gyre/torch.h is not a kernel term: PolicyLossKindFor fails for it, and
// IsUserPolicyLoss tells it apart.
StatusOr<kernels::PolicyLossKind> PolicyLossKindFor(const std::string& name);
StatusOr<kernels::LossAgg> LossAggFor(const std::string& name);
StatusOr<kernels::Correction> CorrectionFor(const std::string& name);
StatusOr<kernels::KlKind> KlKindFor(const std::string& name);
bool IsUserPolicyLoss(const std::string& name);

// The kernel value of every built-in policy loss, in registry order: what tests and benchmarks
// sweep, so that a new entry is covered by them without a list to extend.
std::vector<kernels::PolicyLossKind> BuiltinPolicyLossKinds();

// The name of a kernel value, as job files and messages spell it ("unknown" for a value no entry
// carries).
const char* NameOf(kernels::AdvantageKind kind);
const char* NameOf(kernels::PolicyLossKind kind);
const char* NameOf(kernels::LossAgg agg);
const char* NameOf(kernels::Correction correction);
const char* NameOf(kernels::KlKind kl);

// The Markdown table of every built-in algorithm (name, key, formula, paper, difference from
// verl), as docs/algorithms.md holds it; a test keeps the two identical.
std::string AlgorithmTableMarkdown();

}  // namespace gyre::algorithm
