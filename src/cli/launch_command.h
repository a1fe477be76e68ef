#pragma once
// `gyre launch slurm JOB.yaml`: writes and submits an sbatch script that runs the job as a Slurm
// heterogeneous job (docs/cluster.md#slurm).

#include <string>
#include <vector>

namespace gyre::cli {

// gyre launch slurm JOB.yaml [--set KEY=VALUE ...] [--dry-run] [--sbatch OPTION ...]
int RunLaunch(const std::vector<std::string>& args);

}  // namespace gyre::cli
