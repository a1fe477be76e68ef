#pragma once
// The worker process: `gyre worker --role rollout|trainer --controller HOST:PORT [--index I]`.
// What the controller spawns locally, and what a cluster launcher (srun, a Kubernetes Job)
// starts on each node. The worker starts its own gRPC server, registers with the controller,
// receives the job configuration from it, builds its model, and serves until told to stop or
// until it loses the controller.

#include <string>
#include <vector>

namespace gyre::cli {

// argv without the program name and the "worker" word. Returns the process exit code.
int RunWorker(const std::vector<std::string>& args);

}  // namespace gyre::cli
