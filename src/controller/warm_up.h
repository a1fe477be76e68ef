#pragma once
// The supervised warm-up before RL (trainer.warmup_sft_steps): SFT steps on demonstrations of
// the training problems, trainer.warmup_sft_batch per step at trainer.warmup_sft_lr, each
// written to metrics.jsonl ("phase": "warmup"); it stops early once the mean token accuracy of
// the last 20 steps reaches trainer.warmup_stop_token_accuracy. The warmed-up version is then
// published.
//
// Thread contract: the job thread only.

#include "controller/job_state.h"

namespace gyre::controller {

// Runs the warm-up (nothing when trainer.warmup_sft_steps is 0). Error = the job must end.
Status WarmUp(JobState* job);

}  // namespace gyre::controller
