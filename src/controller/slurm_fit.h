#pragma once
// Whether a job's Slurm request can ever run on a partition's nodes (`gyre launch slurm` asks
// before it submits): a heterogeneous job's tasks all run at once, each task on one node, so a
// request that does not fit the partition's nodes stays pending forever without a word from
// Slurm. The check places every task on a node (largest first, each on the node with the most
// room left) and says which resource is short, by how much, and which options change the request.

#include <string>
#include <vector>

#include "gyre/status.h"

namespace gyre::controller {

// A node of the partition, as sinfo lists it.
struct SlurmNode {
  std::string name;
  int cpus = 0;
  int gpus = 0;  // from its GRES (gpu:N, gpu:TYPE:N), 0 without
};

// Parses `sinfo -h -N -o "%N %c %G"` (one "NAME CPUS GRES" line per node and partition; a node
// listed twice is counted once). InvalidArgument on a line that is not that.
StatusOr<std::vector<SlurmNode>> ParseSinfoNodes(const std::string& text);

// What `gyre launch slurm` asks for: one controller task, then rollout and trainer worker tasks.
struct SlurmRequest {
  int controller_cpus = 2;
  int rollout_workers = 1, trainer_workers = 1;
  int cpus_per_worker = 2, gpus_per_worker = 0;
  // rollout.tensor_parallel: a rollout task runs that many processes, with as many times the CPUs.
  int rollout_tensor_parallel = 1;
  int rollout_cpus() const { return cpus_per_worker * rollout_tensor_parallel; }
};

// "" when every task of `r` has a place on `nodes` at once; otherwise a message that names the
// short resource, what the job asks and what the partition (`partition`, for the message) has,
// and the options that change it.
std::string WhyItCannotRun(const SlurmRequest& r, const std::vector<SlurmNode>& nodes,
                           const std::string& partition);

}  // namespace gyre::controller
