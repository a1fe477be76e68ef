// `gyre bench e2e`: the same job synchronous (k = 0) and with asynchronous rollout under
// staleness bounds k = 1, 2, 4, run end to end by the real controller over real gRPC. With
// --simulate the workers are simulated (src/sim/sim_workers.h: waits from a cost model, no
// model), served by a `gyre sim-workers` child process, so clusters of tens to thousands of
// workers fit on one machine; without it the job in --config runs for real.

#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "common/command_line.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "config/config.h"
#include "gyre/job.h"
#include "rpc/rpc_util.h"
#include "sim/cost_model.h"

namespace gyre::bench {
namespace {

struct E2eOptions {
  bool simulate = false;
  std::string config;
  std::vector<std::string> overrides;
  std::vector<int64_t> staleness = {0, 1, 2, 4};
  std::vector<std::string> weight_updates = {"lockstep", "between_steps"};
  int64_t steps = 4;
  std::string out, json;
  int64_t rollout_workers = 64, trainer_workers = 8, prompts = 256, group = 8;
  int64_t max_new_tokens = 8192;
  sim::CostModel cost = BenchCost();
  static sim::CostModel BenchCost() {
    sim::CostModel c;
    // A simulated minute in 3 s. Every real overhead (gRPC, the controller's bookkeeping, the
    // simulated workers' scheduling on shared cores) counts 1 / time_scale times in simulated
    // seconds: at 0.01 it hid most of what asynchronous rollout and peer relay gain
    // (docs/algorithms.md, "Measuring: gyre bench e2e").
    c.time_scale = 0.05;
    return c;
  }
};

constexpr char kE2eDetails[] =
    "Runs one job per staleness bound k (0 = synchronous, else rollout.async with\n"
    "algorithm.max_staleness k) with the real controller and reports steps per hour, samples\n"
    "per second, the rollout workers' idle fraction (\"rollout idle\": over the whole step;\n"
    "\"idle in gen\": within the step's generation, the same for asynchronous runs) and the\n"
    "controller's CPU time, each against the k = 0 run of the same invocation\n"
    "(docs/algorithms.md, \"Measuring: gyre bench e2e\").\n"
    "\n"
    "--simulate: simulated workers (a `gyre sim-workers` child process, each worker its own\n"
    "gRPC server and heartbeat) spend the cost model's time instead of computing; times are\n"
    "reported in simulated seconds (wall / --time-scale). The cost model's defaults are for an\n"
    "8xH100-class node and a 7B model. Without --simulate, --config names the job to run for\n"
    "real (its workers are real processes) and the held-out accuracy is reported too.\n";

double CpuSeconds() {
  rusage u = {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The simulated job: the built-in task for prompts (rewards are whatever its verifier makes of
// simulated tokens), external workers, no warm-up, no checkpoints.
StatusOr<JobConfig> SimulatedJob(const E2eOptions& o, int64_t k, const std::string& updates,
                                 int port) {
  JobConfig cfg;
  std::vector<std::string> sets = {
      "job.log_level=warn",
      "data.eval_size=" + std::to_string(std::min<int64_t>(64, o.prompts)),
      "model.max_seq_len=" + std::to_string(o.max_new_tokens + 64),
      "rollout.max_new_tokens=" + std::to_string(o.max_new_tokens),
      "rollout.workers=" + std::to_string(o.rollout_workers),
      "rollout.prompts_per_step=" + std::to_string(o.prompts),
      "rollout.group_size=" + std::to_string(o.group),
      "trainer.workers=" + std::to_string(o.trainer_workers),
      "trainer.warmup_sft_steps=0",
      "trainer.checkpoint_every=0",
      "cluster.mode=external",
      "cluster.controller_port=" + std::to_string(port),
      "cluster.register_timeout_s=300",
      "cluster.rpc_timeout_s=86400",
      "cluster.weight_sync_timeout_s=86400",
      "cluster.weight_transport=grpc",
      "metrics.eval_every=0",
  };
  sets.insert(sets.end(), o.overrides.begin(), o.overrides.end());
  sets.push_back("trainer.steps=" + std::to_string(o.steps));
  sets.push_back("rollout.async=" + std::string(k > 0 ? "true" : "false"));
  sets.push_back("algorithm.max_staleness=" + std::to_string(k));
  if (k > 0) sets.push_back("rollout.weight_updates=" + updates);
  for (const std::string& s : sets) GYRE_RETURN_IF_ERROR(config::ApplyOverride(&cfg, s));
  GYRE_RETURN_IF_ERROR(config::ValidateJobConfig(cfg));
  return cfg;
}

StatusOr<JobConfig> RealJob(const E2eOptions& o, int64_t k, const std::string& updates) {
  std::vector<std::string> sets = o.overrides;
  sets.push_back("trainer.steps=" + std::to_string(o.steps));
  sets.push_back("trainer.checkpoint_every=0");
  sets.push_back("rollout.async=" + std::string(k > 0 ? "true" : "false"));
  sets.push_back("algorithm.max_staleness=" + std::to_string(k));
  if (k > 0) sets.push_back("rollout.weight_updates=" + updates);
  return LoadJobConfig(o.config, sets);
}

// One run's row: the GRPO steps' mean time (simulated seconds with --simulate), throughput, the
// rollout workers' idle fraction, and the controller's CPU time per step.
StatusOr<nlohmann::json> RunOne(const E2eOptions& o, int64_t k, const std::string& updates) {
  const std::string name = "k" + std::to_string(k) + (k > 0 ? "-" + updates : "");
  std::vector<std::string> sim_argv;
  StatusOr<JobConfig> cfg = InvalidArgument("no job");
  if (o.simulate) {
    GYRE_ASSIGN_OR_RETURN(const int port, rpc::PickFreePort("127.0.0.1"));
    cfg = SimulatedJob(o, k, updates, port);
    sim_argv = {SelfExecutable(),
                "sim-workers",
                "--controller",
                "127.0.0.1:" + std::to_string(port),
                "--rollout",
                std::to_string(o.rollout_workers),
                "--trainer",
                std::to_string(o.trainer_workers),
                "--register-timeout-s",
                "300"};
    for (const std::string& a : o.cost.ToArgs()) sim_argv.push_back(a);
  } else {
    cfg = RealJob(o, k, updates);
  }
  GYRE_RETURN_IF_ERROR(cfg.status());
  cfg->job.output_dir = o.out;
  cfg->job.name = name;
  GYRE_RETURN_IF_ERROR(MakeDirs(o.out + "/" + name));
  pid_t sim = -1;
  if (o.simulate) {
    GYRE_ASSIGN_OR_RETURN(sim, SpawnProcess(sim_argv, o.out + "/" + name + ".sim-workers.log"));
  }
  std::fprintf(
      stderr, "bench e2e: running %s (%s)...\n", name.c_str(),
      k == 0 ? "synchronous" : ("asynchronous, k = " + std::to_string(k) + ", " + updates).c_str());
  RunOptions run;
  run.print_progress = false;
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<JobResult> result = RunJob(*cfg, run);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  if (sim > 0) {
    int st = 0;
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = PollExit(sim, &st);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!gone) TerminateProcess(sim, 5);
  }
  if (!result.ok()) return result.status().WithContext("bench e2e, run " + name);
  const double scale = o.simulate ? o.cost.time_scale : 1.0;
  std::ifstream in(result->run_dir + "/" + cfg->metrics.file);
  std::string line;
  double step_s = 0, idle = 0, gen_idle = 0, samples = 0;
  int steps = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("phase", "") != "grpo") continue;
    ++steps;
    step_s += j.value("step_time_s", 0.0);
    idle += j.value("rollout_step_idle_fraction", 0.0);
    gen_idle += j.value("rollout_idle_fraction", 0.0);
    samples += j.value("samples", 0.0);
  }
  if (steps == 0) return Internal("bench e2e, run " + name + ": no GRPO steps in the metrics");
  const double mean_step = step_s / steps / scale;
  nlohmann::json row = {{"mode", k == 0 ? "sync" : "async"},
                        {"k", k},
                        {"weight_updates", k == 0 ? "-" : updates},
                        {"steps", steps},
                        {"step_s", mean_step},
                        {"steps_per_hour", 3600.0 / mean_step},
                        {"samples_per_s", samples / (step_s / scale)},
                        {"rollout_idle_fraction", idle / steps},
                        {"rollout_generate_idle_fraction", gen_idle / steps},
                        {"controller_cpu_s_per_step", cpu / steps},
                        {"controller_cpu_fraction", cpu / steps / mean_step},
                        {"wall_s", wall}};
  if (!o.simulate) {
    row["accuracy_before_rl"] = result->accuracy_before_rl;
    row["accuracy_after_rl"] = result->accuracy_after_rl;
  }
  return row;
}

}  // namespace

int RunBenchE2e(const std::vector<std::string>& args) {
  E2eOptions o;
  auto app = NewCommand(
      "gyre bench e2e",
      "Whole GRPO jobs, synchronous vs asynchronous, with real or simulated workers.", kE2eDetails);
  app->add_flag("--simulate", o.simulate, "simulated workers (a gyre sim-workers child process)");
  app->add_option("--config", o.config, "the job to run for real")->type_name("JOB.yaml");
  app->add_option("--set", o.overrides, "a job config override (repeatable)")
      ->type_name("KEY=VALUE")
      ->default_str("");
  app->add_option("--staleness", o.staleness, "k values, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(0, 1000))
      ->default_str("0,1,2,4");
  AddListOption(app.get(), "--weight-updates", &o.weight_updates,
                {"lockstep", "repack", "between_steps", "between_steps_repack"},
                "rollout.weight_updates of the asynchronous runs, comma-separated");
  app->add_option("--steps", o.steps, "GRPO steps per run")->check(CLI::Range(1, 100000));
  app->add_option("--out", o.out, "run directories (default: a temporary directory, removed after)")
      ->type_name("DIR");
  app->add_option("--json", o.json, "also write the figures as JSON")->type_name("FILE");
  const std::string cluster = "Simulated cluster (--simulate)";
  app->add_option("--rollout-workers", o.rollout_workers, "simulated rollout nodes")
      ->check(CLI::Range(1, 100000))
      ->group(cluster);
  app->add_option("--trainer-workers", o.trainer_workers, "simulated trainer nodes")
      ->check(CLI::Range(1, 64))
      ->group(cluster);
  app->add_option("--prompts-per-step", o.prompts, "groups per GRPO step")
      ->check(CLI::Range(1, 1000000))
      ->group(cluster);
  app->add_option("--group-size", o.group, "samples per group")
      ->check(CLI::Range(1, 4096))
      ->group(cluster);
  app->add_option("--max-new-tokens", o.max_new_tokens, "response length cap")
      ->check(CLI::Range(1, 1000000))
      ->group(cluster);
  AddCostOptions(app.get(), &o.cost, "Cost model (--simulate; per node)");
  if (int rc = ParseCommandLine(*app, args); rc >= 0) return rc;
  if (o.simulate == !o.config.empty()) {
    return CommandLineError(*app, "give either --simulate or --config JOB.yaml");
  }
  InitLogging("bench-e2e", "warn");  // the in-process controller's log: warnings and errors
  const bool temporary = o.out.empty();
  if (temporary) {
    char tmpl[] = "/tmp/gyre-bench-e2e-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "gyre bench e2e: cannot create a temporary directory\n");
      return 1;
    }
    o.out = tmpl;
  }
  o.out = AbsolutePath(o.out);
  BenchReport report("e2e");
  report.SetKeys({"mode", "k", "weight_updates"});
  report.SetMetric("step_s", false);
  report.SetMetric("samples_per_s", true);
  report.SetMetric("speedup", true);
  report.SetContext("mode", o.simulate ? "simulated workers" : "real workers (" + o.config + ")");
  if (o.simulate) {
    report.SetContext("cluster", std::to_string(o.rollout_workers) + " rollout + " +
                                     std::to_string(o.trainer_workers) + " trainer nodes");
    report.SetContext("batch", std::to_string(o.prompts) + " groups x " + std::to_string(o.group) +
                                   " samples per step");
    report.SetContext("lengths", "lognormal(median " + std::to_string(o.cost.length_median) +
                                     ", sigma " + std::to_string(o.cost.length_sigma) +
                                     "), at most " + std::to_string(o.max_new_tokens));
    report.SetContext("time_scale", o.cost.time_scale);
  }
  report.SetContext("steps", o.steps);
  double sync_step = 0;
  for (int64_t k : o.staleness) {
    for (const std::string& updates : o.weight_updates) {
      if (k == 0 && updates != o.weight_updates.front()) continue;  // one synchronous run
      StatusOr<nlohmann::json> row = RunOne(o, k, updates);
      if (!row.ok()) {
        std::fprintf(stderr, "gyre bench e2e: %s (run directories in %s)\n",
                     row.status().ToString().c_str(), o.out.c_str());
        return 1;
      }
      if (k == 0) sync_step = (*row)["step_s"].get<double>();
      if (sync_step > 0) (*row)["speedup"] = sync_step / (*row)["step_s"].get<double>();
      report.AddRow(*row);
    }
  }
  std::vector<BenchColumn> columns = {{"mode", "mode"},
                                      {"k", "k"},
                                      {"weight_updates", "weight updates"},
                                      {"step_s", "step s", 2},
                                      {"steps_per_hour", "steps/h", 1},
                                      {"samples_per_s", "samples/s", 1},
                                      {"rollout_idle_fraction", "rollout idle", 3},
                                      {"rollout_generate_idle_fraction", "idle in gen", 3},
                                      {"controller_cpu_fraction", "ctrl cpu/step", 4},
                                      {"speedup", "speedup", 2}};
  if (!o.simulate) columns.push_back({"accuracy_after_rl", "held-out acc", 3});
  report.PrintTable(columns);
  if (!report.WriteJsonIfAsked(o.json, "e2e")) return 1;
  if (temporary) (void)RemoveTree(o.out);
  return 0;
}

}  // namespace gyre::bench
