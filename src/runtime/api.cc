// The public API (include/gyre/job.h) on top of the modules.

#include <cstdio>
#include <cstring>
#include <exception>

#include "common/logging.h"
#include "config/config.h"
#include "controller/job_runner.h"
#include "gyre/job.h"
#include "runtime/worker.h"

namespace gyre {

StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  return config::LoadJobConfigFile(path, overrides);
}

std::string JobConfigToYaml(const JobConfig& config) { return config::DumpJobConfig(config); }

StatusOr<JobResult> RunJob(const JobConfig& config, const RunOptions& options) {
  GYRE_RETURN_IF_ERROR(config::ValidateJobConfig(config));
  try {
    return controller::RunJobImpl(config, options);
  } catch (const std::exception& e) {  // the library's edge: an error value, never a throw
    return Internal("job failed with an exception: " + FirstLine(e.what()));
  }
}

bool MaybeRunWorker(int argc, char** argv, int* exit_code) {
  if (argc < 2 || std::strcmp(argv[1], "worker") != 0) return false;
  std::vector<std::string> args(argv + 2, argv + argc);
  InstallTerminateHandler("gyre worker");
  try {
    *exit_code = runtime::RunWorker(args);
  } catch (const std::exception& e) {  // the worker's module edge: one line in its log
    std::fprintf(stderr, "gyre worker: fatal: %s\n", FirstLine(e.what()).c_str());
    *exit_code = 1;
  }
  return true;
}

const char* Version() { return GYRE_VERSION; }

}  // namespace gyre
