#pragma once
// The worker process: `gyre worker --role rollout|trainer --controller HOST:PORT [--index I]`.
// What the controller spawns locally, and what a cluster launcher (srun, a Kubernetes Job)
// starts on each node. The worker starts its own gRPC server, registers with the controller,
// receives the job configuration from it, builds its model, and serves until told to stop or
// until it loses the controller.

#include <string>
#include <vector>

namespace gyre::runtime {

// argv without the program name and the "worker" word. Returns the process exit code.
int RunWorker(const std::vector<std::string>& args);

// Keeps freed memory in the process for reuse (mallopt: no trimming, mmap only for chunks of 32
// MiB and more) instead of glibc's default of giving large blocks back and faulting them in,
// zeroed, on the next step. Worker processes call it at start; so do the benchmarks that time
// repeated steps of a worker's engine (gyre bench rollout). GYRE_MALLOC_DEFAULTS=1 opts out.
void TuneAllocatorForRepeatedSteps();

}  // namespace gyre::runtime
