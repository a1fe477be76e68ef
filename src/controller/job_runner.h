#pragma once
// JobRunner: the controller's job loop. It owns the run directory, the controller's gRPC server,
// the worker processes it spawned (local mode) and the clients to them, and drives the job:
// register -> publish v0 -> supervised warm-up -> held-out eval -> GRPO steps (generate, score,
// advantages, train, publish) -> held-out eval -> save. One thread (the caller's) runs the
// loop; a monitor thread only watches child processes and heartbeats and records deaths.

#include "gyre/job.h"

namespace gyre::controller {

StatusOr<JobResult> RunJobImpl(const JobConfig& config, const RunOptions& options);

}  // namespace gyre::controller
