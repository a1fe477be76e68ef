#pragma once
// JobRunner: the controller's job loop (gyre::RunJob). It owns the run directory and the job's
// state (controller/job_state.h), starts the cluster (controller/cluster.h), and drives the job:
// register -> publish v0 -> supervised warm-up -> held-out eval -> GRPO steps (a batch from the
// job's BatchSource, then the StepFinisher: advantages, train, publish) -> held-out eval ->
// save. One thread (the caller's) runs the loop; the cluster's pool watches the workers from a
// monitor thread that only records deaths.

#include <functional>

#include "controller/controller_service.h"
#include "gyre/job.h"
#include "rpc/clients.h"

namespace gyre::controller {

// What a job takes from outside besides its config and options. RunJob uses the defaults; a
// test runs a job over fake workers (tests/fakes/) in cluster.mode external by passing their
// clients and registering them in `on_workers_expected`.
struct JobDeps {
  rpc::ClientFactory clients = rpc::GrpcClientFactory();
  // How long a failed call waits for the monitor to see its worker die (fakes fail at once).
  double death_grace_s = 2.0;
  // Called once the cluster expects its workers, with the service they register with.
  std::function<Status(ControllerService*)> on_workers_expected;
};

// Runs the job to completion (gyre::RunJob after validating `config`).
StatusOr<JobResult> RunJobImpl(const JobConfig& config, const RunOptions& options,
                               JobDeps deps = JobDeps());

}  // namespace gyre::controller
