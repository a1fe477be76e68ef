// Data-parallel trainers end to end: the same job with trainer.workers = 1 and = 2 (real worker
// processes, a Gloo group over loopback) ends with the same model up to floating-point
// summation order, and the two ranks really ran.

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "integration/run_util.h"

namespace gyre::testing {
namespace {

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";

std::vector<std::string> Job(const std::string& dir, int trainers) {
  return {"train", kQuickstart,
          "--set", "job.output_dir=" + dir,
          "--set", "job.name=t",
          "--set", "trainer.warmup_sft_steps=4",
          "--set", "trainer.steps=2",
          "--set", "trainer.mini_batches=2",
          "--set", "trainer.workers=" + std::to_string(trainers),
          "--set", "rollout.prompts_per_step=8",
          "--set", "rollout.workers=1",
          "--set", "data.eval_size=10",
          "--set", kEveryGroupTrains};
}

std::vector<double> Logprobs(const std::string& model_dir, const std::string& dir) {
  auto p =
      GyreProcess::Start({"logprobs", "--model", model_dir, "--ids", "1 5 9 12 3 7 2 40 41"}, dir);
  EXPECT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  std::istringstream in(p.Output());
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '{') {
      return nlohmann::json::parse(line)["logprobs"].get<std::vector<double>>();
    }
  }
  ADD_FAILURE() << "no JSON from gyre logprobs: " << p.Output();
  return {};
}

std::vector<nlohmann::json> GrpoMetrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(ReadFile(path));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["phase"] == "grpo") out.push_back(j);
  }
  return out;
}

TEST(DataParallelTest, TwoTrainerRanksMatchOne) {
  std::vector<std::vector<double>> lps;
  std::vector<std::vector<nlohmann::json>> metrics;
  for (int trainers : {1, 2}) {
    const std::string dir = MakeTempDir("dp" + std::to_string(trainers));
    auto p = GyreProcess::Start(Job(dir, trainers), dir);
    ASSERT_TRUE(p.Wait(240)) << p.Output();
    const std::string out = p.Output();
    ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
    if (trainers == 2) {
      EXPECT_NE(ReadFile(dir + "/t/logs/trainer-1.log").find("joined data-parallel group"),
                std::string::npos);
    }
    lps.push_back(Logprobs(dir + "/t/final", dir));
    metrics.push_back(GrpoMetrics(dir + "/t/metrics.jsonl"));
  }
  ASSERT_EQ(lps[0].size(), 8u);
  ASSERT_EQ(lps[1].size(), lps[0].size());
  // Two ranks sum gradients in another order over 10 optimizer steps: rounding that grows with
  // the steps, relative to the log-prob's size.
  for (size_t i = 0; i < lps[0].size(); ++i) {
    EXPECT_NEAR(lps[1][i], lps[0][i], 2e-4 + 2e-4 * std::fabs(lps[0][i])) << i;
  }
  ASSERT_EQ(metrics[0].size(), 2u);
  ASSERT_EQ(metrics[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    // The same rollouts were drawn (same weights up to rounding, same seeds) ...
    EXPECT_EQ(metrics[1][s]["generated_tokens"], metrics[0][s]["generated_tokens"]);
    EXPECT_EQ(metrics[1][s]["mean_reward"], metrics[0][s]["mean_reward"]);
    // ... and the trainers reported the same step.
    const double loss = metrics[0][s]["loss"].get<double>();
    EXPECT_NEAR(metrics[1][s]["loss"].get<double>(), loss, 1e-5 + 1e-4 * std::fabs(loss));
    EXPECT_EQ(metrics[1][s]["policy_version"], metrics[0][s]["policy_version"]);
  }
}

}  // namespace
}  // namespace gyre::testing
