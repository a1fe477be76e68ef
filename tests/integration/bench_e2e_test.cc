// `gyre bench e2e --simulate` at a tiny size: the real controller, a `gyre sim-workers` child
// process serving simulated workers over real gRPC; the JSON carries the promised fields, the
// figures are consistent, and bad options are usage errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "integration/run_util.h"

namespace gyre {
namespace {

using testing::GyreProcess;

TEST(BenchE2eTest, TinySimulatedRunWritesConsistentJson) {
  const std::string dir = testing::MakeTempDir("bench_e2e");
  const std::string json_path = dir + "/e2e.json";
  GyreProcess p = GyreProcess::Start({"bench",
                                      "e2e",
                                      "--simulate",
                                      "--rollout-workers",
                                      "3",
                                      "--trainer-workers",
                                      "2",
                                      "--steps",
                                      "3",
                                      "--prompts-per-step",
                                      "6",
                                      "--group-size",
                                      "2",
                                      "--max-new-tokens",
                                      "128",
                                      "--length-median",
                                      "40",
                                      "--staleness",
                                      "0,1",
                                      "--weight-updates",
                                      "lockstep,repack,between_steps,between_steps_repack",
                                      "--time-scale",
                                      "0.002",
                                      "--out",
                                      dir + "/runs",
                                      "--json",
                                      json_path},
                                     dir);
  ASSERT_TRUE(p.Wait(180)) << p.Output();
  ASSERT_TRUE(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0) << p.Output();
  EXPECT_NE(p.Output().find("speedup"), std::string::npos) << p.Output();  // the table
  const auto j = nlohmann::json::parse(testing::ReadFile(json_path));
  EXPECT_EQ(j["benchmark"], "e2e");
  EXPECT_EQ(j["context"]["mode"], "simulated workers");
  EXPECT_EQ(j["context"]["cluster"], "3 rollout + 2 trainer nodes");
  const auto& rows = j["results"];
  // One synchronous run, then k = 1 with each way of updating weights.
  ASSERT_EQ(rows.size(), 5u) << j.dump(2);
  EXPECT_EQ(rows[0]["mode"], "sync");
  EXPECT_EQ(rows[0]["k"], 0);
  for (int r = 1; r <= 4; ++r) {
    EXPECT_EQ(rows[r]["mode"], "async");
    EXPECT_EQ(rows[r]["k"], 1);
  }
  EXPECT_EQ(rows[1]["weight_updates"], "lockstep");
  EXPECT_EQ(rows[2]["weight_updates"], "repack");
  EXPECT_EQ(rows[3]["weight_updates"], "between_steps");
  EXPECT_EQ(rows[4]["weight_updates"], "between_steps_repack");
  EXPECT_EQ(rows[0]["speedup"], 1.0);
  for (const auto& r : rows) {
    EXPECT_EQ(r["steps"], 3) << r.dump();
    const double step_s = r["step_s"];
    EXPECT_GT(step_s, 0);
    EXPECT_NEAR(r["steps_per_hour"].get<double>(), 3600.0 / step_s, 1e-6 * 3600.0 / step_s);
    // 12 samples per step.
    EXPECT_NEAR(r["samples_per_s"].get<double>(), 12.0 / step_s, 1e-6 * 12.0 / step_s);
    EXPECT_GE(r["rollout_idle_fraction"].get<double>(), 0.0);
    EXPECT_LE(r["rollout_idle_fraction"].get<double>(), 1.0);
    // Idle over the whole step is at least idle within generation's part of it (equal in
    // asynchronous runs, where generation's window is the step).
    EXPECT_GE(r["rollout_idle_fraction"].get<double>(),
              r["rollout_generate_idle_fraction"].get<double>() - 1e-9)
        << r.dump();
    if (r["mode"] == "async") {
      EXPECT_NEAR(r["rollout_idle_fraction"].get<double>(),
                  r["rollout_generate_idle_fraction"].get<double>(), 1e-9);
    }
    EXPECT_GT(r["controller_cpu_s_per_step"].get<double>(), 0.0);
    EXPECT_NEAR(r["controller_cpu_fraction"].get<double>(),
                r["controller_cpu_s_per_step"].get<double>() / step_s, 1e-9);
    EXPECT_NEAR(r["speedup"].get<double>(), rows[0]["step_s"].get<double>() / step_s, 1e-9);
  }
  // The runs' own records: every step trained 12 samples from the simulated workers.
  const std::string metrics = testing::ReadFile(dir + "/runs/k1-between_steps/metrics.jsonl");
  EXPECT_NE(metrics.find("\"samples\":12"), std::string::npos) << metrics;
  EXPECT_TRUE(PathExists(dir + "/runs/k0/final/simulated.json"));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(BenchE2eTest, BadOptionsAreUsageErrors) {
  const std::string dir = testing::MakeTempDir("bench_e2e_bad");
  // Each refusal is one line that names the option (or what is missing) and points at the help.
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"bench", "e2e"}, "give either --simulate or --config JOB.yaml"},
      {{"bench", "e2e", "--simulate", "--config", "x.yaml"}, "give either"},
      {{"bench", "e2e", "--simulate", "--staleness", "0,x"}, "--staleness: Value x"},
      {{"bench", "e2e", "--simulate", "--time-scale", "0"}, "--time-scale: Value 0 not in range"},
      {{"bench", "e2e", "--simulate", "--weight-updates", "sometimes"},
       "--weight-updates: sometimes not in"},
      {{"bench", "e2e", "--simulate", "--weight-updates", "lockstep,lockstep"},
       "--weight-updates: lockstep is listed twice"},
      {{"bench", "e2e", "--simulate", "--rollout-workers"}, "--rollout-workers"},
      {{"bench", "e2e", "--simulate", "--frobnicate", "1"}, "--frobnicate"},
      {{"sim-workers", "--rollout", "2"}, "--controller is required"},
      {{"sim-workers", "--controller", "127.0.0.1:1", "--max-running", "0"},
       "--max-running: Value 0 not in range"},
      {{"sim-workers", "--controller", "127.0.0.1:1", "--max-running", "1.5"}, "--max-running"},
      {{"sim-workers", "--controller", "127.0.0.1:1", "--length-sigma", "x"}, "--length-sigma"},
      {{"sim-workers", "--controller", "127.0.0.1:1", "--model-gb"}, "--model-gb"},
  };
  for (const auto& [args, names] : bad) {
    const auto [rc, out] = testing::RunGyre(args, dir, 30);
    EXPECT_EQ(rc, 2) << out;
    const std::string command = args[0] == "bench" ? "gyre bench e2e" : "gyre sim-workers";
    EXPECT_EQ(out.rfind(command + ": ", 0), 0u) << out;
    EXPECT_NE(out.find(names), std::string::npos) << out;
    EXPECT_NE(out.find("(see " + command + " --help)\n"), std::string::npos) << out;
  }
  GyreProcess help = GyreProcess::Start({"bench", "e2e", "--help"}, dir);
  ASSERT_TRUE(help.Wait(30));
  EXPECT_EQ(WEXITSTATUS(help.wait_status), 0);
  EXPECT_NE(help.Output().find("--publish-gb-per-s"), std::string::npos) << help.Output();
  GyreProcess sim_help = GyreProcess::Start({"sim-workers", "--help"}, dir);
  ASSERT_TRUE(sim_help.Wait(30));
  EXPECT_EQ(WEXITSTATUS(sim_help.wait_status), 0);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre
