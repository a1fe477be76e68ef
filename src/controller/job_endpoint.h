#pragma once
// The job's HTTP endpoint (metrics.endpoint, docs/observability.md): /health answers the job's
// name, its last finished GRPO step and each worker's state; /metrics serves the run's metrics
// (fed by observe::RunMetrics) plus the workers per role and state and the planned steps.
//
// Thread contract: StartJobEndpoint runs on the job thread; the endpoint's handlers run on its
// own thread and read only the cluster's ControllerService (thread-safe), JobState::last_step
// (atomic) and fields fixed before the endpoint starts.

#include "controller/job_state.h"

namespace gyre::controller {

// Starts job->endpoint on metrics.endpoint and attaches it to job->metrics (when open). Needs
// job->cluster started (its service) and job->slurm_job_id set.
Status StartJobEndpoint(JobState* job);

}  // namespace gyre::controller
