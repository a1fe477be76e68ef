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
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "config/config.h"
#include "gyre/job.h"
#include "rpc/rpc_util.h"
#include "sim/cost_model.h"

namespace gyre::bench {
namespace {

struct Options {
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
    c.time_scale = 0.01;  // a simulated minute in 0.6 s
    return c;
  }
};

std::string Usage() {
  return "usage: gyre bench e2e --simulate [options] [--json FILE]\n"
         "       gyre bench e2e --config JOB.yaml [--set KEY=VALUE ...] [options] [--json FILE]\n"
         "\n"
         "Runs one job per staleness bound k (0 = synchronous, else rollout.async with\n"
         "algorithm.max_staleness k) with the real controller and reports steps per hour,\n"
         "samples per second, the rollout workers' idle fraction (\"rollout idle\": over\n"
         "the whole step; \"idle in gen\": within the step's generation, the same for\n"
         "asynchronous runs) and the controller's CPU time, each against the k = 0 run of the\n"
         "same invocation\n"
         "(docs/algorithms.md, \"Measuring: gyre bench e2e\").\n"
         "\n"
         "--simulate: simulated workers (a `gyre sim-workers` child process, each worker its own\n"
         "gRPC server and heartbeat) spend the cost model's time instead of computing; times are\n"
         "reported in simulated seconds (wall / --time-scale). Without --simulate, --config names\n"
         "the job to run for real (its workers are real processes) and the held-out accuracy is\n"
         "reported too.\n"
         "\n"
         "options:\n"
         "  --staleness LIST          comma-separated k values [0,1,2,4]\n"
         "  --weight-updates LIST     rollout.weight_updates of the asynchronous runs: lockstep,\n"
         "                            repack, between_steps, between_steps_repack\n"
         "                            [lockstep,between_steps]\n"
         "  --steps N                 GRPO steps per run [4]\n"
         "  --out DIR                 run directories [a temporary directory, removed after]\n"
         "  --json FILE               also write the figures as JSON\n"
         "  --set KEY=VALUE           a job config override (repeatable)\n"
         "simulated cluster (--simulate):\n"
         "  --rollout-workers N       simulated rollout nodes [64]\n"
         "  --trainer-workers M       simulated trainer nodes [8]\n"
         "  --prompts-per-step B      groups per GRPO step [256]\n"
         "  --group-size G            samples per group [8]\n"
         "  --max-new-tokens T        response length cap [8192]\n"
         "cost model (--simulate; per node, defaults for an 8xH100-class node and a 7B model):\n" +
         sim::CostOptionsHelp(Options::BenchCost());
}

// "a,b,c" -> {"a", "b", "c"}.
std::vector<std::string> SplitList(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

double CpuSeconds() {
  rusage u = {};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The simulated job: the built-in task for prompts (rewards are whatever its verifier makes of
// simulated tokens), external workers, no warm-up, no checkpoints.
StatusOr<JobConfig> SimulatedJob(const Options& o, int64_t k, const std::string& updates,
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

StatusOr<JobConfig> RealJob(const Options& o, int64_t k, const std::string& updates) {
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
StatusOr<nlohmann::json> RunOne(const Options& o, int64_t k, const std::string& updates) {
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
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--simulate") {
      o.simulate = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(Usage().c_str(), stdout);
      return 0;
    }
    StatusOr<bool> cost = sim::ParseCostOption(args, &i, &o.cost);
    if (!cost.ok()) {
      std::fprintf(stderr, "gyre bench e2e: %s\n", cost.status().message().c_str());
      return 2;
    }
    if (*cost) continue;
    if (int rc = BenchOptionValue("e2e", Usage().c_str(), args, &i); rc >= 0) return rc;
    const std::string& v = args[i];
    bool ok = true;
    if (a == "--config") {
      o.config = v;
    } else if (a == "--set") {
      o.overrides.push_back(v);
    } else if (a == "--out") {
      o.out = v;
    } else if (a == "--json") {
      o.json = v;
    } else if (a == "--steps") {
      ok = ParseInt(v, 1, 100000, &o.steps);
    } else if (a == "--rollout-workers") {
      ok = ParseInt(v, 1, 100000, &o.rollout_workers);
    } else if (a == "--trainer-workers") {
      ok = ParseInt(v, 1, 64, &o.trainer_workers);
    } else if (a == "--prompts-per-step") {
      ok = ParseInt(v, 1, 1000000, &o.prompts);
    } else if (a == "--group-size") {
      ok = ParseInt(v, 1, 4096, &o.group);
    } else if (a == "--max-new-tokens") {
      ok = ParseInt(v, 1, 1000000, &o.max_new_tokens);
    } else if (a == "--weight-updates") {
      o.weight_updates = SplitList(v);
      for (const std::string& item : o.weight_updates) {
        ok = ok && (item == "lockstep" || item == "repack" || item == "between_steps" ||
                    item == "between_steps_repack");
      }
      ok = ok && !o.weight_updates.empty();
    } else if (a == "--staleness") {
      o.staleness.clear();
      for (const std::string& item : SplitList(v)) {
        int64_t k = 0;
        ok = ok && ParseInt(item, 0, 1000, &k);
        o.staleness.push_back(k);
      }
      ok = ok && !o.staleness.empty();
    } else {
      std::fprintf(stderr, "gyre bench e2e: unknown option '%s'\n\n%s", a.c_str(), Usage().c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "gyre bench e2e: bad value '%s' for %s\n", v.c_str(), a.c_str());
      return 2;
    }
  }
  if (o.simulate == !o.config.empty()) {
    std::fprintf(stderr, "gyre bench e2e: give either --simulate or --config JOB.yaml\n\n%s",
                 Usage().c_str());
    return 2;
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
  if (!o.json.empty()) {
    Status s = report.WriteJson(o.json);
    if (!s.ok()) {
      std::fprintf(stderr, "gyre bench e2e: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (temporary) (void)RemoveTree(o.out);
  return 0;
}

}  // namespace gyre::bench
