#include "controller/slurm_fit.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

namespace gyre::controller {

namespace {

// The GPUs in a GRES list such as "gpu:4", "gpu:a100:2(S:0-1),shard:8" or "(null)".
int GpusOf(const std::string& gres) {
  int total = 0;
  std::stringstream items(gres);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.rfind("gpu", 0) != 0) continue;
    const size_t paren = item.find('(');
    if (paren != std::string::npos) item = item.substr(0, paren);
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) continue;
    total += std::atoi(item.c_str() + colon + 1);
  }
  return total;
}

struct Task {
  int cpus, gpus;
};

// Places every task (largest first) on the node with the most CPUs left that has room.
bool Fits(std::vector<Task> tasks, std::vector<SlurmNode> nodes) {
  std::sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) {
    return a.gpus != b.gpus ? a.gpus > b.gpus : a.cpus > b.cpus;
  });
  for (const Task& t : tasks) {
    SlurmNode* best = nullptr;
    for (SlurmNode& n : nodes) {
      if (n.cpus >= t.cpus && n.gpus >= t.gpus && (best == nullptr || n.cpus > best->cpus)) {
        best = &n;
      }
    }
    if (best == nullptr) return false;
    best->cpus -= t.cpus;
    best->gpus -= t.gpus;
  }
  return true;
}

}  // namespace

StatusOr<std::vector<SlurmNode>> ParseSinfoNodes(const std::string& text) {
  std::vector<SlurmNode> nodes;
  std::set<std::string> seen;
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::stringstream fields(line);
    SlurmNode n;
    std::string cpus, gres;
    if (!(fields >> n.name >> cpus >> gres)) {
      return InvalidArgument("sinfo printed '" + line + "', not NAME CPUS GRES");
    }
    char* end = nullptr;
    const long c = std::strtol(cpus.c_str(), &end, 10);
    if (*end != '\0' || c < 0) {
      return InvalidArgument("sinfo printed '" + line + "': '" + cpus + "' is not a CPU count");
    }
    n.cpus = static_cast<int>(c);
    n.gpus = GpusOf(gres);
    if (seen.insert(n.name).second) nodes.push_back(n);
  }
  return nodes;
}

std::string WhyItCannotRun(const SlurmRequest& r, const std::vector<SlurmNode>& nodes,
                           const std::string& partition) {
  const std::string where =
      partition.empty() ? "the default partition" : "partition '" + partition + "'";
  const int workers = r.rollout_workers + r.trainer_workers;
  std::vector<Task> tasks = {{r.controller_cpus, 0}};
  for (int i = 0; i < workers; ++i) {
    tasks.push_back(
        {i < r.rollout_workers ? r.rollout_cpus() : r.cpus_per_worker, r.gpus_per_worker});
  }
  if (Fits(tasks, nodes)) return "";
  int max_cpus = 0, max_gpus = 0, all_cpus = 0, all_gpus = 0;
  for (const SlurmNode& n : nodes) {
    max_cpus = std::max(max_cpus, n.cpus);
    max_gpus = std::max(max_gpus, n.gpus);
    all_cpus += n.cpus;
    all_gpus += n.gpus;
  }
  const std::string has = where + " has " + std::to_string(nodes.size()) + " node(s) with " +
                          std::to_string(all_cpus) + " CPUs (at most " + std::to_string(max_cpus) +
                          " on one) and " + std::to_string(all_gpus) + " GPUs (at most " +
                          std::to_string(max_gpus) + " on one)";
  const std::string ask =
      "the job runs " + std::to_string(workers + 1) + " tasks at once: the controller with " +
      std::to_string(r.controller_cpus) + " CPUs (--controller-cpus) and " +
      std::to_string(r.rollout_workers) + " rollout + " + std::to_string(r.trainer_workers) +
      " trainer workers (rollout.workers, " + "trainer.workers) with " +
      std::to_string(r.cpus_per_worker) + " CPUs (--cpus-per-worker)" +
      (r.gpus_per_worker > 0
           ? " and " + std::to_string(r.gpus_per_worker) + " GPUs (--gpus-per-worker)"
           : std::string()) +
      " each" +
      (r.rollout_tensor_parallel > 1
           ? ", a rollout worker " + std::to_string(r.rollout_tensor_parallel) +
                 " processes with " + std::to_string(r.rollout_cpus()) +
                 " CPUs (rollout.tensor_parallel)"
           : std::string());
  std::string fix;
  if (r.gpus_per_worker > max_gpus) {
    fix = "no node has " + std::to_string(r.gpus_per_worker) +
          " GPUs for one worker: lower --gpus-per-worker";
  } else if (r.gpus_per_worker * workers > all_gpus) {
    fix = "GPUs are short (" + std::to_string(r.gpus_per_worker * workers) + " asked, " +
          std::to_string(all_gpus) + " in all): run fewer workers (--set rollout.workers=N, " +
          "--set trainer.workers=N) or lower --gpus-per-worker";
  } else if (r.rollout_cpus() > max_cpus && r.cpus_per_worker <= max_cpus &&
             r.controller_cpus <= max_cpus) {
    fix = "no node has " + std::to_string(r.rollout_cpus()) + " CPUs for one rollout worker of " +
          std::to_string(r.rollout_tensor_parallel) +
          " tensor-parallel processes: lower --cpus-per-worker to at most " +
          std::to_string(max_cpus / r.rollout_tensor_parallel) +
          " or rollout.tensor_parallel (--set rollout.tensor_parallel=N)";
  } else if (r.cpus_per_worker > max_cpus || r.controller_cpus > max_cpus) {
    fix = "no node has " + std::to_string(std::max(r.cpus_per_worker, r.controller_cpus)) +
          " CPUs for one task: lower --cpus-per-worker or --controller-cpus to at most " +
          std::to_string(max_cpus);
  } else {
    const int asked = r.controller_cpus + r.rollout_workers * r.rollout_cpus() +
                      r.trainer_workers * r.cpus_per_worker;
    fix = "CPUs are short (" + std::to_string(asked) + " asked at once, " +
          std::to_string(all_cpus) + " in all";
    fix += asked > all_cpus ? ")" : ", but not in pieces that hold every task)";
    fix += ": lower --cpus-per-worker and --controller-cpus (1 each asks " +
           std::to_string(workers + 1) + "), or run fewer workers (--set rollout.workers=N, " +
           "--set trainer.workers=N)";
    if (workers + 1 > all_cpus) {
      fix +=
          "; with fewer CPUs than tasks, let the tasks share CPUs where the cluster allows "
          "it (--sbatch=--overcommit)";
    }
  }
  return "this job can never start on " + where + ": " + ask + "; " + has + ". " + fix + ".";
}

}  // namespace gyre::controller
