// The public API (include/gyre/job.h) on top of the modules.

#include <cstring>

#include "cli/worker.h"
#include "config/config.h"
#include "controller/job_runner.h"
#include "gyre/job.h"

namespace gyre {

StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  return config::LoadJobConfigFile(path, overrides);
}

std::string JobConfigToYaml(const JobConfig& config) { return config::DumpJobConfig(config); }

StatusOr<JobResult> RunJob(const JobConfig& config, const RunOptions& options) {
  GYRE_RETURN_IF_ERROR(config::ValidateJobConfig(config));
  return controller::RunJobImpl(config, options);
}

bool MaybeRunWorker(int argc, char** argv, int* exit_code) {
  if (argc < 2 || std::strcmp(argv[1], "worker") != 0) return false;
  std::vector<std::string> args(argv + 2, argv + argc);
  *exit_code = cli::RunWorker(args);
  return true;
}

const char* Version() { return GYRE_VERSION; }

}  // namespace gyre
