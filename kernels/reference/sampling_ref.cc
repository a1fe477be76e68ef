#include "kernels/reference/sampling_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/philox.h"

namespace gyre::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float CleanLogit(float x) {
  if (std::isnan(x)) return kNegInf;
  if (x > FLT_MAX) return FLT_MAX;
  return x;
}

// Index of the largest cleaned logit, ties -> lowest id; -1 when every logit is -inf or NaN.
int64_t ArgMax(const float* logits, int64_t vocab, float* max_logit) {
  int64_t best = -1;
  float best_value = kNegInf;
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = CleanLogit(logits[i]);
    if (v > best_value) {
      best_value = v;
      best = i;
    }
  }
  *max_logit = best_value;
  return best;
}

// Scaled, max-shifted logit d_i = (logit_i - max) / T; 0 for the max token, <= 0 elsewhere.
// -inf stays -inf even for T = inf, where the division alone would give NaN.
float ShiftedLogit(float logit, float max_logit, float temperature) {
  const float clean = CleanLogit(logit);
  if (clean == kNegInf) return kNegInf;
  return (clean - max_logit) / temperature;
}

// S = sum_i expf(d_i) in double, ascending id order. Requires a finite max_logit.
double ExpSum(const float* logits, int64_t vocab, float max_logit, float temperature) {
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    sum += static_cast<double>(std::exp(ShiftedLogit(logits[i], max_logit, temperature)));
  }
  return sum;
}

float LogProbFrom(float shifted_logit, double exp_sum) {
  return static_cast<float>(static_cast<double>(shifted_logit) - std::log(exp_sum));
}

struct RowResult {
  int32_t token;
  float logprob;
  float kept_mass;
};

RowResult SampleRow(const float* logits, int64_t vocab, const SamplingRowParams& params,
                    std::vector<float>* probs, std::vector<float>* scratch,
                    std::vector<uint8_t>* keep) {
  float max_logit;
  const int64_t argmax = ArgMax(logits, vocab, &max_logit);
  if (argmax < 0) return {0, kNegInf, 0.0f};

  if (!(params.temperature > 0.0f)) {
    const double exp_sum = ExpSum(logits, vocab, max_logit, 1.0f);
    return {static_cast<int32_t>(argmax),
            LogProbFrom(ShiftedLogit(logits[argmax], max_logit, 1.0f), exp_sum), 1.0f};
  }

  const float temperature = params.temperature;
  std::vector<float>& p = *probs;
  std::vector<uint8_t>& kept = *keep;
  p.resize(vocab);
  kept.resize(vocab);
  // One exponential per logit: p holds expf(d_i) first (summed in double, ascending id order,
  // exactly as ExpSum), then the probabilities. The decode loop's largest CPU cost after the
  // forward on a large vocabulary, so the exponentials are not computed twice.
  double exp_sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    p[i] = std::exp(ShiftedLogit(logits[i], max_logit, temperature));
    exp_sum += static_cast<double>(p[i]);
  }
  float p_max = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) {
    p[i] = static_cast<float>(static_cast<double>(p[i]) / exp_sum);
    kept[i] = p[i] > 0.0f;
    p_max = std::max(p_max, p[i]);
  }

  // top-k: the k-th largest probability is the threshold; everything tied with it stays.
  if (params.top_k > 0 && params.top_k < vocab) {
    scratch->assign(p.begin(), p.end());
    auto kth = scratch->begin() + (params.top_k - 1);
    std::nth_element(scratch->begin(), kth, scratch->end(), std::greater<float>());
    const float threshold = *kth;
    for (int64_t i = 0; i < vocab; ++i) kept[i] = kept[i] && p[i] >= threshold;
  }

  // top-p on the renormalised top-k survivors. Only probabilities are sorted, not (prob, id)
  // pairs: the boundary probability alone decides membership because ties are kept.
  if (params.top_p < 1.0f) {
    double survivor_mass = 0.0;
    scratch->clear();
    for (int64_t i = 0; i < vocab; ++i) {
      if (!kept[i]) continue;
      survivor_mass += p[i];
      scratch->push_back(p[i]);
    }
    std::sort(scratch->begin(), scratch->end(), std::greater<float>());
    const double target = static_cast<double>(params.top_p) * survivor_mass;
    // If rounding keeps the running mass below the target, every survivor stays.
    float boundary = scratch->back();
    double running = 0.0;
    for (float v : *scratch) {
      running += v;
      if (running >= target) {
        boundary = v;
        break;
      }
    }
    for (int64_t i = 0; i < vocab; ++i) kept[i] = kept[i] && p[i] >= boundary;
  }

  if (params.min_p > 0.0f) {
    const float threshold = std::min(params.min_p, 1.0f) * p_max;
    for (int64_t i = 0; i < vocab; ++i) kept[i] = kept[i] && p[i] >= threshold;
  }

  double kept_mass = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (kept[i]) kept_mass += p[i];
  }

  const double target =
      static_cast<double>(PhiloxUniform(params.seed, params.position)) * kept_mass;
  int64_t token = -1;
  int64_t last_kept = -1;
  double running = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!kept[i]) continue;
    last_kept = i;
    running += p[i];
    if (running > target) {
      token = i;
      break;
    }
  }
  if (token < 0) token = last_kept;

  return {static_cast<int32_t>(token),
          LogProbFrom(ShiftedLogit(logits[token], max_logit, temperature), exp_sum),
          static_cast<float>(kept_mass)};
}

}  // namespace

void SampleRowsRef(const float* logits, int64_t rows, int64_t vocab,
                   const SamplingRowParams* params, int32_t* out_tokens, float* out_logprobs,
                   float* out_kept_mass) {
  std::vector<float> probs, scratch;
  std::vector<uint8_t> keep;
  for (int64_t r = 0; r < rows; ++r) {
    const RowResult result =
        SampleRow(logits + r * vocab, vocab, params[r], &probs, &scratch, &keep);
    out_tokens[r] = result.token;
    out_logprobs[r] = result.logprob;
    out_kept_mass[r] = result.kept_mass;
  }
}

float LogSoftmaxAt(const float* logits, int64_t vocab, float temperature, int32_t token) {
  if (token < 0 || token >= vocab) return std::numeric_limits<float>::quiet_NaN();
  float max_logit;
  if (ArgMax(logits, vocab, &max_logit) < 0) return kNegInf;
  const float t = temperature > 0.0f ? temperature : 1.0f;
  return LogProbFrom(ShiftedLogit(logits[token], max_logit, t),
                     ExpSum(logits, vocab, max_logit, t));
}

}  // namespace gyre::kernels
