#include "algorithm/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace gyre::algorithm {

double LearningRate(const TrainerSection& t, int step) {
  const int warmup = std::max(0, t.lr_warmup_steps);
  if (step <= warmup) {
    return t.lr * static_cast<double>(std::max(step, 0)) / static_cast<double>(warmup);
  }
  if (t.lr_schedule != "cosine") return t.lr;
  const double span = std::max(1, t.steps - warmup);
  const double p = std::clamp(static_cast<double>(step - warmup) / span, 0.0, 1.0);
  const double lr_min = t.lr * t.lr_min_ratio;
  return lr_min + (t.lr - lr_min) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace gyre::algorithm
