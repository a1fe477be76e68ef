#pragma once
// Running a Gyre job from C++: load a config, optionally plug in a reward function, run.
//
//   auto cfg = gyre::LoadJobConfig("job.yaml", {"trainer.steps=10"});
//   gyre::RunOptions opts;
//   opts.reward = std::make_shared<MyReward>();   // with reward.type: custom
//   auto result = gyre::RunJob(*cfg, opts);
//
// RunJob starts the controller in this process and its rollout and trainer workers as child
// processes. Workers are started as `<worker_binary> worker --role ... --controller ...`; when
// worker_binary is empty the running executable is used, so a program that embeds Gyre calls
// gyre::MaybeRunWorker(argc, argv) first thing in main().

#include <memory>
#include <string>
#include <vector>

#include "gyre/cancel.h"
#include "gyre/config.h"
#include "gyre/reward.h"
#include "gyre/status.h"

namespace gyre {

// Parses and validates a job file; `overrides` are "a.b=c" strings (the CLI's --set).
StatusOr<JobConfig> LoadJobConfig(const std::string& path,
                                  const std::vector<std::string>& overrides = {});

// The effective configuration as YAML (every field).
std::string JobConfigToYaml(const JobConfig& config);

struct RunOptions {
  // Required when reward.type is custom, and an error otherwise (it would silently replace the
  // built-in verifier).
  std::shared_ptr<RewardFn> reward;
  std::string worker_binary;   // overrides cluster.worker_binary
  bool print_progress = true;  // one line per step on stdout
  // Continue from the newest complete checkpoint in the job's run directory
  // (job.output_dir/job.name/checkpoints, written with trainer.checkpoint_every > 0) instead of
  // starting over; fails if there is none or if it does not match the config. The resumed job
  // ends exactly as an uninterrupted one would (docs/checkpoints.md).
  bool resume = false;
  // Cancels the job from any thread: RunJob stops at its next waiting point (between and within
  // steps, while generating or training), stops every worker it started and returns
  // Aborted("cancelled: <reason>"). Null = no token.
  std::shared_ptr<CancellationToken> cancel;
  // RunJob installs SIGINT and SIGTERM handlers for its duration (a signal then stops the job
  // as a cancel does, "interrupted by SIGINT") and restores the previous ones when it returns.
  // A program with its own signal handling sets this to false and cancels through `cancel`.
  bool install_signal_handlers = true;
};

struct JobResult {
  std::string run_dir;
  int grpo_steps = 0;
  double accuracy_before_rl = 0;  // held-out, greedy, after the warm-up
  double accuracy_after_rl = 0;
  double final_mean_reward = 0;
  double wall_seconds = 0;
  int64_t policy_version = 0;
};

// Runs the job to completion. Returns an error (with the reason, e.g. which worker died and
// how) if it cannot finish; stops every worker it started in all cases.
StatusOr<JobResult> RunJob(const JobConfig& config, const RunOptions& options = {});

// If argv is a worker invocation (argv[1] == "worker"), runs the worker and returns its exit
// code in *exit_code and true. Otherwise returns false.
bool MaybeRunWorker(int argc, char** argv, int* exit_code);

// Version string of the library ("0.1.0").
const char* Version();

}  // namespace gyre
