// Environment jobs end to end: configs/calculator-tools.yaml, whose episodes run against the
// Python calculator environment (examples/envs/calculator_env.py, written with the SDK) that the
// job starts and supervises. The environment is killed with SIGKILL while a step's episodes wait
// for it (every step sleeps): those episodes end with the failure as their status and are left
// out of training (reward.on_failure: drop_sample), the server is restarted, and the job goes on
// to finish with every later episode scored.

#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::testing {
namespace {

std::vector<nlohmann::json> Lines(const std::string& metrics_path, const std::string& phase) {
  std::vector<nlohmann::json> out;
  std::istringstream in(ReadFile(metrics_path));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == phase) out.push_back(j);
  }
  return out;
}

TEST(EnvJobTest, AToolUseJobRunsEpisodesAndGoesOnThroughTheEnvironmentsKill) {
  if (std::string(GYRE_SDK_PATH).empty()) {
    GYRE_MISSING_DEPENDENCY(kFixGrpc)
        << GYRE_PYTHON << " had no grpcio/grpcio-tools when the build was configured";
  }
  const std::string dir = MakeTempDir("env_job");
  const std::string data = dir + "/data";
  const std::string make = std::string(GYRE_PYTHON) + " " + GYRE_SOURCE_DIR +
                           "/examples/envs/make_calculator_data.py --out " + data +
                           " --train 400 --eval 16 > /dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const nlohmann::json command = {
      "/usr/bin/env", std::string("PYTHONPATH=") + GYRE_SDK_PATH,
      GYRE_PYTHON,    std::string(GYRE_SOURCE_DIR) + "/examples/envs/calculator_env.py",
      "--port",       "{port}",
      "--step-delay", "0.3"};
  const std::vector<std::string> args = {
      "train",
      std::string(GYRE_SOURCE_DIR) + "/configs/calculator-tools.yaml",
      "--set",
      "job.output_dir=" + dir,
      "--set",
      "job.name=calc",
      "--set",
      "data.train_path=" + data + "/train.jsonl",
      "--set",
      "data.eval_path=" + data + "/eval.jsonl",
      "--set",
      "env.chat_template=" + std::string(GYRE_SOURCE_DIR) + "/configs/templates/tiny_tools.jinja",
      "--set",
      "env.command=" + command.dump(),
      "--set",
      "trainer.steps=4",
      "--set",
      "trainer.warmup_sft_steps=40",
      "--set",
      "rollout.prompts_per_step=4",
      "--set",
      "rollout.group_size=4",
      "--set",
      "metrics.eval_every=0",
      "--set",
      kEveryGroupTrains};
  auto job = GyreProcess::Start(args, MakeTempDir("env_job_out"));
  std::string text;
  auto served = job.WaitForOutput(
      "environment server calculator serving on \\S+ \\(pid ([0-9]+)\\)", 120, &text);
  ASSERT_FALSE(served.empty()) << text;
  const pid_t env_pid = std::stoi(served[1]);
  // Step 2's episodes start right after step 1's line; each step of theirs sleeps 0.3 s, so
  // 0.2 s later they wait on the server.
  ASSERT_FALSE(job.WaitForOutput("step +1/", 300, &text).empty()) << text;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(env_pid, SIGKILL), 0);
  ASSERT_TRUE(job.Wait(300)) << job.Output();
  ASSERT_EQ(WEXITSTATUS(job.wait_status), 0) << job.Output();
  EXPECT_NE(job.Output().find("restarting it (1 of at most 5)"), std::string::npos) << job.Output();

  const auto steps = Lines(dir + "/calc/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps[0]["reward_errors"], 0) << steps[0];
  EXPECT_GT(steps[1]["reward_errors"].get<int>(), 0) << "the kill failed no episode: " << steps[1];
  EXPECT_EQ(steps[3]["reward_errors"], 0) << "the restarted server serves again: " << steps[3];
  for (const auto& s : steps) EXPECT_GT(s["env_turns_mean"].get<double>(), 0.0) << s;
  EXPECT_FALSE(Lines(dir + "/calc/metrics.jsonl", "warmup").empty());
  const auto evals = Lines(dir + "/calc/metrics.jsonl", "eval");
  ASSERT_EQ(evals.size(), 2u);
  for (const auto& e : evals) {
    EXPECT_EQ(e["problems"], 16) << e;
    EXPECT_EQ(e["reward_errors"], 0) << e;
  }
  EXPECT_TRUE(PathExists(dir + "/calc/logs/env.log"));
  EXPECT_FALSE(ProcessAlive(env_pid));
}

}  // namespace
}  // namespace gyre::testing
