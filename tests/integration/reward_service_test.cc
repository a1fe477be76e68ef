// reward.type: service end to end: a short quickstart job whose rewards come from the Python
// SDK's math reward server (examples/rewards/math_reward.py), which the job starts, supervises
// and, after the test kills it with SIGKILL between steps, restarts. The same job with the
// built-in math verifier runs first: both jobs are deterministic on one machine, so every step's
// rewards and the held-out accuracies must be identical, with no reward errors.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::testing {
namespace {

std::vector<std::string> ShortJob(const std::string& dir, const std::string& name) {
  return {"train", std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml",
          "--set", "job.output_dir=" + dir,
          "--set", "job.name=" + name,
          "--set", "trainer.steps=4",
          "--set", "trainer.warmup_sft_steps=60",
          "--set", "rollout.prompts_per_step=16",
          "--set", "data.eval_size=64",
          "--set", "metrics.eval_every=0",
          "--set", kEveryGroupTrains};
}

// Each GRPO step's metrics line, in order.
std::vector<nlohmann::json> Steps(const std::string& metrics_path) {
  std::vector<nlohmann::json> steps;
  std::istringstream in(ReadFile(metrics_path));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "grpo") steps.push_back(j);
  }
  return steps;
}

TEST(RewardServiceTest, AJobScoredByARewardServerMatchesTheBuiltInVerifierThroughAKill) {
  if (std::string(GYRE_SDK_PATH).empty()) {
    GYRE_MISSING_DEPENDENCY(kFixGrpc)
        << GYRE_PYTHON << " had no grpcio/grpcio-tools when the build was configured";
  }
  const std::string dir = MakeTempDir("reward_service");
  auto builtin_args = ShortJob(dir, "builtin");
  builtin_args.insert(builtin_args.end(), {"--set", "reward.type=math"});
  auto a = GyreProcess::Start(builtin_args, MakeTempDir("reward_service_a"));
  ASSERT_TRUE(a.Wait(300)) << a.Output();
  ASSERT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();

  const nlohmann::json command = {
      "/usr/bin/env", std::string("PYTHONPATH=") + GYRE_SDK_PATH,
      GYRE_PYTHON,    std::string(GYRE_SOURCE_DIR) + "/examples/rewards/math_reward.py",
      "--port",       "{port}"};
  auto service_args = ShortJob(dir, "service");
  service_args.insert(service_args.end(), {"--set", "reward.type=service", "--set",
                                           "reward.command=" + command.dump()});
  const std::string out_dir = MakeTempDir("reward_service_out");
  auto b = GyreProcess::Start(service_args, out_dir);
  std::string text;
  auto served =
      b.WaitForOutput("reward server score serving on \\S+ \\(pid ([0-9]+)\\)", 120, &text);
  ASSERT_FALSE(served.empty()) << text;
  const pid_t reward_pid = std::stoi(served[1]);
  // Kill it once the first GRPO step has been scored; the next step's request finds it dead.
  ASSERT_FALSE(b.WaitForOutput("step +1/", 240, &text).empty()) << text;
  ASSERT_EQ(::kill(reward_pid, SIGKILL), 0);
  ASSERT_TRUE(b.Wait(300)) << b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << b.Output();
  EXPECT_NE(b.Output().find("restarting it (1 of at most 5)"), std::string::npos) << b.Output();

  auto want = Steps(dir + "/builtin/metrics.jsonl");
  auto got = Steps(dir + "/service/metrics.jsonl");
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]["reward_errors"], 0) << got[i];
    EXPECT_EQ(got[i]["mean_reward"], want[i]["mean_reward"]) << "step " << i + 1;
    EXPECT_EQ(got[i]["accuracy"], want[i]["accuracy"]) << "step " << i + 1;
  }
  auto sa = nlohmann::json::parse(ReadFile(dir + "/builtin/summary.json"));
  auto sb = nlohmann::json::parse(ReadFile(dir + "/service/summary.json"));
  EXPECT_EQ(sb["accuracy_before_rl"], sa["accuracy_before_rl"]);
  EXPECT_EQ(sb["accuracy_after_rl"], sa["accuracy_after_rl"]);
  EXPECT_TRUE(PathExists(dir + "/service/logs/reward.log"));
  EXPECT_FALSE(ProcessAlive(reward_pid));
}

}  // namespace
}  // namespace gyre::testing
