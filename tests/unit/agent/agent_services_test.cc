// Environment and reward services end to end: real server processes written with the Python SDK
// (python/gyre_env, installed into the build tree by pip), started, supervised and killed by
// the test; Gyre's clients over real sockets.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "agent/env_client.h"
#include "agent/service_reward.h"
#include "agent/service_supervisor.h"
#include "test_paths.h"
#include "testing/dependency.h"

namespace gyre::agent {
namespace {

using Clock = std::chrono::steady_clock;

class AgentServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(GYRE_SDK_PATH).empty()) {
      GYRE_MISSING_DEPENDENCY(::gyre::testing::kFixGrpc)
          << GYRE_PYTHON << " had no grpcio/grpcio-tools when the build was configured";
    }
    char tmpl[] = "/tmp/gyre-agent-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  // A server script run with the SDK on its path.
  ServiceOptions Script(ServiceKind kind, const std::string& script,
                        std::vector<std::string> args = {}) {
    ServiceOptions o;
    o.kind = kind;
    o.what = kind == ServiceKind::kEnv ? "env" : "reward";
    o.command = {"/usr/bin/env", std::string("PYTHONPATH=") + GYRE_SDK_PATH, GYRE_PYTHON,
                 std::string(GYRE_SOURCE_DIR) + "/" + script};
    for (auto& a : args) o.command.push_back(a);
    o.command.insert(o.command.end(), {"--port", "{port}"});
    o.log_path = dir_ + "/" + o.what + ".log";
    o.ready_timeout_s = 30;
    return o;
  }

  std::string dir_;
};

v1::ResetRequest Reset(const std::string& session, const nlohmann::json& task, uint64_t seed) {
  v1::ResetRequest r;
  r.set_session_id(session);
  r.set_task_json(task.dump());
  r.set_seed(seed);
  return r;
}

v1::StepRequest Call(const std::string& session, int index, const std::string& tool,
                     const nlohmann::json& args) {
  v1::StepRequest r;
  r.set_session_id(session);
  r.set_step_index(index);
  r.set_action_text("<tool_call>...</tool_call>");
  v1::EnvToolCall* c = r.add_tool_calls();
  c->set_id("call-" + std::to_string(index));
  c->set_name(tool);
  c->set_arguments_json(args.dump());
  return r;
}

v1::StepRequest Say(const std::string& session, int index, const std::string& text) {
  v1::StepRequest r;
  r.set_session_id(session);
  r.set_step_index(index);
  r.set_action_text(text);
  return r;
}

TEST_F(AgentServicesTest, CalculatorEpisodeWithToolCallsAndAnIdempotentRetry) {
  auto sup = ServiceSupervisor::Start(Script(ServiceKind::kEnv, "examples/envs/calculator_env.py"));
  ASSERT_TRUE(sup.ok()) << sup.status();
  EXPECT_EQ((*sup)->description().name(), "calculator");
  EnvClient env(sup->get(), EnvTimeouts{});

  v1::ResetResponse reset;
  ASSERT_TRUE(
      env.Reset(Reset("e1", {{"prompt", "What is 347 * 29?"}, {"answer", "10063"}}, 7), &reset)
          .ok());
  ASSERT_EQ(reset.observation().messages_size(), 1);
  EXPECT_EQ(reset.observation().messages(0).role(), "user");
  EXPECT_EQ(reset.observation().messages(0).content(), "What is 347 * 29?");
  auto tools = nlohmann::json::parse(reset.tools_json());
  ASSERT_EQ(tools.size(), 1u);
  EXPECT_EQ(tools[0]["function"]["name"], "calculate");

  v1::StepResponse step;
  ASSERT_TRUE(env.Step(Call("e1", 0, "calculate", {{"expression", "347 * 29"}}), &step).ok());
  ASSERT_EQ(step.observation().messages_size(), 1);
  EXPECT_EQ(step.observation().messages(0).role(), "tool");
  EXPECT_EQ(step.observation().messages(0).content(), "10063");
  EXPECT_EQ(step.observation().messages(0).tool_call_id(), "call-0");
  EXPECT_FALSE(step.terminated() || step.truncated());

  // The same step index again (a retry) answers the same without acting twice: the episode's
  // step count below is 2, not 3.
  v1::StepResponse again;
  ASSERT_TRUE(env.Step(Call("e1", 0, "calculate", {{"expression", "1 + 1"}}), &again).ok());
  EXPECT_EQ(again.observation().messages(0).content(), "10063");

  v1::StepResponse skip;
  Status s = env.Step(Say("e1", 5, "x"), &skip);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("next step is 1"), std::string::npos) << s;

  v1::StepResponse last;
  ASSERT_TRUE(env.Step(Say("e1", 1, "So 347 * 29 = 10,063."), &last).ok());
  EXPECT_TRUE(last.terminated());
  EXPECT_EQ(last.reward(), 1.0);
  EXPECT_EQ(nlohmann::json::parse(last.info_json())["steps"], 2);

  // A wrong answer, a malformed call and an unknown tool: observations, not failures.
  ASSERT_TRUE(env.Reset(Reset("e2", {{"prompt", "2+2?"}, {"answer", "4"}}, 1), &reset).ok());
  v1::StepRequest bad = Say("e2", 0, "<tool_call>{oops</tool_call>");
  bad.set_tool_call_error("the tool call is not valid JSON");
  ASSERT_TRUE(env.Step(bad, &step).ok());
  EXPECT_NE(step.observation().messages(0).content().find("not valid JSON"), std::string::npos);
  ASSERT_TRUE(env.Step(Call("e2", 1, "search", {{"q", "x"}}), &step).ok());
  EXPECT_NE(step.observation().messages(0).content().find("unknown tool"), std::string::npos);
  ASSERT_TRUE(
      env.Step(Call("e2", 2, "calculate", {{"expression", "__import__('os')"}}), &step).ok());
  EXPECT_NE(step.observation().messages(0).content().find("error"), std::string::npos);
  ASSERT_TRUE(env.Step(Say("e2", 3, "It is 5."), &step).ok());
  EXPECT_TRUE(step.terminated());
  EXPECT_EQ(step.reward(), 0.0);

  // Steps after the end, and on a session that never existed, are refused.
  EXPECT_EQ(env.Step(Say("e2", 4, "x"), &step).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(env.Step(Say("nobody", 0, "x"), &step).code(), StatusCode::kNotFound);
  env.Close("e1", "");
  EXPECT_EQ(env.Step(Say("e1", 2, "x"), &step).code(), StatusCode::kNotFound);
}

TEST_F(AgentServicesTest, AKilledEnvServerIsRestartedAndItsEpisodesEndWithAStatus) {
  auto sup = ServiceSupervisor::Start(Script(ServiceKind::kEnv, "examples/envs/calculator_env.py"));
  ASSERT_TRUE(sup.ok()) << sup.status();
  EnvClient env(sup->get(), EnvTimeouts{});
  v1::ResetResponse reset;
  ASSERT_TRUE(env.Reset(Reset("k1", {{"prompt", "1+1?"}, {"answer", "2"}}, 3), &reset).ok());
  const pid_t first = (*sup)->pid();
  const std::string first_address = (*sup)->address();
  ASSERT_GT(first, 0);
  ASSERT_EQ(kill(first, SIGKILL), 0);

  // The episode's next step fails with a status (its session died with the server); the
  // service itself comes back on its own.
  v1::StepResponse step;
  Status s = env.Step(Call("k1", 0, "calculate", {{"expression", "1+1"}}), &step);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnavailable) << s;
  ASSERT_TRUE((*sup)->AwaitServing().ok());
  EXPECT_EQ((*sup)->restarts(), 1);
  EXPECT_NE((*sup)->pid(), first);
  EXPECT_NE((*sup)->pid(), 0);
  EXPECT_NE((*sup)->address(), first_address);
  ASSERT_TRUE(env.Reset(Reset("k2", {{"prompt", "1+1?"}, {"answer", "2"}}, 3), &reset).ok());
  ASSERT_TRUE(env.Step(Say("k2", 0, "2"), &step).ok());
  EXPECT_EQ(step.reward(), 1.0);
}

TEST_F(AgentServicesTest, AServerThatDiesTooOftenFailsTheServiceWithItsLog) {
  ServiceOptions o = Script(ServiceKind::kEnv, "examples/envs/calculator_env.py");
  o.max_restarts = 1;
  auto sup = ServiceSupervisor::Start(o);
  ASSERT_TRUE(sup.ok()) << sup.status();
  for (int death = 0; death < 2; ++death) {
    ASSERT_TRUE((*sup)->AwaitServing().ok());
    const pid_t pid = (*sup)->pid();
    ASSERT_GT(pid, 0);
    kill(pid, SIGKILL);
    // Wait for the monitor to notice.
    for (int i = 0; i < 100 && (*sup)->pid() == pid; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  Status s = (*sup)->AwaitServing();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("max_restarts 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("env.log"), std::string::npos) << s;
}

TEST_F(AgentServicesTest, AStepPastItsDeadlineIsDeadlineExceeded) {
  auto sup = ServiceSupervisor::Start(
      Script(ServiceKind::kEnv, "tests/unit/agent/test_servers.py", {"env"}));
  ASSERT_TRUE(sup.ok()) << sup.status();
  EnvTimeouts t;
  t.step_s = 0.5;
  EnvClient env(sup->get(), t);
  v1::ResetResponse reset;
  ASSERT_TRUE(env.Reset(Reset("d1", nlohmann::json::object(), 11), &reset).ok());
  EXPECT_EQ(reset.observation().messages(0).content(), "seed 11");
  v1::StepResponse step;
  const auto t0 = Clock::now();
  Status s = env.Step(Say("d1", 0, "sleep:5"), &step);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(took, 3.0);
  // Another session is served meanwhile.
  ASSERT_TRUE(env.Reset(Reset("d2", nlohmann::json::object(), 12), &reset).ok());
  ASSERT_TRUE(env.Step(Say("d2", 0, "hello"), &step).ok());
  EXPECT_EQ(step.observation().messages(0).content(), "hello");
}

// A server at its concurrency limit refuses calls (RESOURCE_EXHAUSTED) without starting them:
// the client asks again within the call's deadline, so every step is served.
TEST_F(AgentServicesTest, CallsPastTheServersConcurrencyLimitWaitTheirTurn) {
  auto sup = ServiceSupervisor::Start(Script(ServiceKind::kEnv, "tests/unit/agent/test_servers.py",
                                             {"env", "--max-concurrency", "1"}));
  ASSERT_TRUE(sup.ok()) << sup.status();
  EnvClient env(sup->get(), EnvTimeouts{});
  constexpr int kSessions = 10;  // the server takes 4 calls at once (1 worker, 4 queued)
  for (int i = 0; i < kSessions; ++i) {
    v1::ResetResponse reset;
    ASSERT_TRUE(
        env.Reset(Reset("c" + std::to_string(i), nlohmann::json::object(), i), &reset).ok());
  }
  std::vector<std::thread> threads;
  std::vector<Status> got(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      v1::StepResponse step;
      got[i] = env.Step(Say("c" + std::to_string(i), 0, "sleep:0.2"), &step);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kSessions; ++i) EXPECT_TRUE(got[i].ok()) << "session " << i << ": " << got[i];
}

TEST_F(AgentServicesTest, SandboxedPythonRunsCodeWithoutNetworkOrWritableRoot) {
  auto sup =
      ServiceSupervisor::Start(Script(ServiceKind::kEnv, "examples/envs/python_exec_env.py"));
  ASSERT_TRUE(sup.ok()) << sup.status();
  EnvTimeouts t;
  t.step_s = 30;
  EnvClient env(sup->get(), t);
  v1::ResetResponse reset;
  ASSERT_TRUE(env.Reset(Reset("p1", {{"prompt", "6*7?"}, {"answer", "42"}}, 1), &reset).ok());
  v1::StepResponse step;
  ASSERT_TRUE(env.Step(Call("p1", 0, "python", {{"code", "print(6*7)"}}), &step).ok());
  EXPECT_EQ(step.observation().messages(0).content(), "42\n");
  ASSERT_TRUE(env.Step(Call("p1", 1, "python",
                            {{"code",
                              "import socket\nsocket.create_connection(('1.1.1.1', 80), "
                              "timeout=3)"}}),
                       &step)
                  .ok());
  EXPECT_NE(step.observation().messages(0).content().find("Network is unreachable"),
            std::string::npos)
      << step.observation().messages(0).content();
  ASSERT_TRUE(
      env.Step(Call("p1", 2, "python", {{"code", "open('/etc/gyre-test', 'w')"}}), &step).ok());
  EXPECT_NE(step.observation().messages(0).content().find("Read-only file system"),
            std::string::npos)
      << step.observation().messages(0).content();
  // Neither the server's files nor its environment variables (PYTHONPATH here) are visible.
  ASSERT_TRUE(env.Step(Call("p1", 3, "python",
                            {{"code", std::string("import os\nprint(os.path.exists('") +
                                          GYRE_SOURCE_DIR + "'), 'PYTHONPATH' in os.environ)"}}),
                       &step)
                  .ok());
  EXPECT_EQ(step.observation().messages(0).content(), "False False\n");
  const auto t0 = Clock::now();
  ASSERT_TRUE(env.Step(Call("p1", 4, "python", {{"code", "while True: pass"}}), &step).ok());
  EXPECT_NE(step.observation().messages(0).content().find("CPU-time limit"), std::string::npos)
      << step.observation().messages(0).content();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 15.0);
  ASSERT_TRUE(env.Step(Call("p1", 5, "python", {{"code", "x = bytearray(1 << 30)"}}), &step).ok());
  EXPECT_NE(step.observation().messages(0).content().find("MemoryError"), std::string::npos)
      << step.observation().messages(0).content();
  ASSERT_TRUE(env.Step(Say("p1", 6, "The answer is 42."), &step).ok());
  EXPECT_TRUE(step.terminated());
  EXPECT_EQ(step.reward(), 1.0);
}

RewardInput Item(const std::string& id, const std::string& response, const std::string& answer) {
  RewardInput in;
  in.id = id;
  in.prompt = "p";
  in.response = response;
  in.answer = answer;
  in.finished = true;
  return in;
}

TEST_F(AgentServicesTest, MathRewardServerScoresABatchAndMarksBadItems) {
  auto sup =
      ServiceSupervisor::Start(Script(ServiceKind::kReward, "examples/rewards/math_reward.py"));
  ASSERT_TRUE(sup.ok()) << sup.status();
  RewardServiceOptions o;
  o.batch_size = 2;  // three requests, two in flight
  o.concurrency = 2;
  ServiceReward reward(std::move(*sup), o);
  auto out = reward.ScoreBatch({Item("a", "so \\boxed{\\frac{3}{4}}", "0.75"),
                                Item("b", "The total is 1,234.50 dollars", "1234.5"),
                                Item("c", "I think 7", "8"), Item("d", "42", "forty-two"),
                                Item("e", "\\boxed{12} then 13", "12")});
  ASSERT_EQ(out.size(), 5u);
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  EXPECT_EQ(*out[0], 1.0);
  ASSERT_TRUE(out[1].ok()) << out[1].status();
  EXPECT_EQ(*out[1], 1.0);
  ASSERT_TRUE(out[2].ok());
  EXPECT_EQ(*out[2], 0.0);
  ASSERT_FALSE(out[3].ok());  // a reference that is not a number: an error, never a 0
  EXPECT_NE(out[3].status().message().find("not a number"), std::string::npos) << out[3].status();
  ASSERT_TRUE(out[4].ok());
  EXPECT_EQ(*out[4], 1.0);

  // Inputs without ids are distinct items (the server caches by id); inputs sharing an id are
  // one item, scored once.
  out = reward.ScoreBatch({Item("", "1", "1"), Item("", "2", "1"), Item("a", "ignored", "0.75")});
  ASSERT_TRUE(out[0].ok() && out[1].ok() && out[2].ok());
  EXPECT_EQ(*out[0], 1.0);
  EXPECT_EQ(*out[1], 0.0);
  EXPECT_EQ(*out[2], 1.0);  // item "a" was scored above; the server answers from its cache
}

TEST_F(AgentServicesTest, AHangingRewardItemIsCutAtItsDeadlineAndTheOthersAreScored) {
  auto sup = ServiceSupervisor::Start(
      Script(ServiceKind::kReward, "tests/unit/agent/test_servers.py", {"reward"}));
  ASSERT_TRUE(sup.ok()) << sup.status();
  RewardServiceOptions o;
  o.item_timeout_s = 1.0;
  o.timeout_s = 20;
  ServiceReward reward(std::move(*sup), o);
  const auto t0 = Clock::now();
  auto out = reward.ScoreBatch({Item("h1", "abc", ""), Item("h2", "hang", ""),
                                Item("h3", "raise", ""), Item("h4", "abcdef", "")});
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  ASSERT_TRUE(out[0].ok()) << out[0].status();
  EXPECT_EQ(*out[0], 3.0);
  EXPECT_EQ(out[1].status().code(), StatusCode::kDeadlineExceeded) << out[1].status();
  EXPECT_EQ(out[2].status().code(), StatusCode::kInternal) << out[2].status();
  EXPECT_NE(out[2].status().message().find("asked to fail"), std::string::npos);
  ASSERT_TRUE(out[3].ok());
  EXPECT_EQ(*out[3], 6.0);
}

TEST_F(AgentServicesTest, AWholeRequestPastItsDeadlineMarksEveryItem) {
  auto sup = ServiceSupervisor::Start(
      Script(ServiceKind::kReward, "tests/unit/agent/test_servers.py", {"reward"}));
  ASSERT_TRUE(sup.ok()) << sup.status();
  RewardServiceOptions o;
  o.item_timeout_s = 120;  // the server would wait: the request's own deadline cuts it
  o.timeout_s = 1.0;
  ServiceReward reward(std::move(*sup), o);
  auto out = reward.ScoreBatch({Item("w1", "abc", ""), Item("w2", "hang", "")});
  for (const auto& r : out) {
    EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status();
    EXPECT_NE(r.status().message().find("reward.timeout_s"), std::string::npos);
  }
}

TEST_F(AgentServicesTest, StartFailuresSayWhatToFix) {
  ServiceOptions both = Script(ServiceKind::kEnv, "examples/envs/calculator_env.py");
  both.address = "127.0.0.1:1";
  auto s = ServiceSupervisor::Start(both);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("exactly one of address"), std::string::npos);

  ServiceOptions crash = Script(ServiceKind::kEnv, "examples/envs/no_such_env.py");
  s = ServiceSupervisor::Start(crash);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("exited with status"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find(crash.log_path), std::string::npos) << s.status();

  ServiceOptions nobody;
  nobody.address = "127.0.0.1:1";
  nobody.ready_timeout_s = 0.5;
  s = ServiceSupervisor::Start(nobody);
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find("did not answer Describe"), std::string::npos);

  // A reward server where an environment is expected: Describe is UNIMPLEMENTED.
  ServiceOptions wrong = Script(ServiceKind::kEnv, "examples/rewards/math_reward.py");
  s = ServiceSupervisor::Start(wrong);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("Describe"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace gyre::agent
