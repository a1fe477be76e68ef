#pragma once
// The job's side of checkpoints (docs/checkpoints.md; the on-disk format is
// controller/checkpoint.h): saving one after a GRPO step (the trainer's state, the controller's
// counters and problem stream, the batch source's carried groups, the ledger's position, the
// metrics so far), and continuing a job from one (RunOptions::resume).
//
// Thread contract: the job thread only.

#include <string>

#include "common/clock.h"
#include "controller/batch_source.h"
#include "controller/checkpoint.h"
#include "controller/job_state.h"

namespace gyre::controller {

// A new run's ledger: any earlier one at the run's ledger path is removed first.
Status OpenNewLedger(JobState* job);

// Continues the job from checkpoint `dir`, whose controller part is `state` (read and checked by
// OpenResumePoint, whose ledger is already job->ledger): restores the trainer group, the
// controller's counters and problem stream, the ledger, the carried groups (into `source`), the
// metrics file and the results so far, and publishes the restored version. Call after the
// cluster has started and before `source` begins.
Status ResumeJob(JobState* job, const std::string& dir, const ControllerState& state,
                 BatchSource* source);

// Writes the checkpoint after GRPO step `step` (0 = after the warm-up) and prunes old ones
// (trainer.checkpoint_keep_last). `job_start` is when this process's job began (for the
// job's wall time). Generation of `source` is paused while its state is taken.
Status SaveCheckpoint(JobState* job, BatchSource* source, int step,
                      SteadyClock::time_point job_start);

}  // namespace gyre::controller
