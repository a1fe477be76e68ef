#pragma once
// Learning-rate schedules of GRPO (trainer.lr_schedule, trainer.lr_warmup_steps,
// trainer.lr_min_ratio; docs/algorithms.md, "Learning-rate schedules"). The rate is a pure
// function of the GRPO step, so a resumed job continues the same curve. The schedules' names are
// in the registry (algorithm/registry.h, Family::kLrSchedule).
//
// Thread contract: plain functions of their arguments.

#include <string>
#include <vector>

#include "gyre/config.h"

namespace gyre::algorithm {

// The learning rate of GRPO step `step` (1-based) of trainer.steps, for trainer.lr = lr:
//   step <= W (W = lr_warmup_steps): lr * step / W
//   constant:                        lr
//   cosine:                          lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2,
//                                    p = (step - W) / (steps - W) clamped to [0, 1],
//                                    lr_min = lr * lr_min_ratio
// Every optimizer step of a GRPO step (trainer.mini_batches) uses that step's rate. Steps past
// trainer.steps keep the last step's rate.
double LearningRate(const TrainerSection& trainer, int step);

}  // namespace gyre::algorithm
