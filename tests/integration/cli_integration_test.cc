// End-to-end tests of the `gyre` binary: real controller and worker processes on loopback.

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "integration/run_util.h"
#include "rpc/rpc_util.h"
#include "test_paths.h"

namespace gyre::testing {
namespace {

int rpc_port() {
  // A free loopback port for a controller that workers must be able to find.
  auto p = rpc::PickFreePort("127.0.0.1");
  return p.ok() ? *p : 0;
}

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";

// A small, fast job: a few warm-up steps, then GRPO steps with 2 rollout workers.
std::vector<std::string> SmallJob(const std::string& dir, int steps) {
  return {"train", kQuickstart,
          "--set", "job.output_dir=" + dir,
          "--set", "job.name=t",
          "--set", "trainer.warmup_sft_steps=5",
          "--set", "trainer.steps=" + std::to_string(steps),
          "--set", "rollout.prompts_per_step=8",
          "--set", "data.eval_size=20",
          "--set", kEveryGroupTrains};
}

// `gyre ledger` of the run in dir/t: `trained` samples trained, every other one dropped.
void ExpectTrainedOnceOrDropped(const std::string& dir, int64_t trained) {
  ASSERT_TRUE(MakeDirs(dir + "/ledger").ok());
  auto l = GyreProcess::Start({"ledger", dir + "/t", "--json"}, dir + "/ledger");
  ASSERT_TRUE(l.Wait(30));
  const auto counts = nlohmann::json::parse(l.Output());
  EXPECT_EQ(counts["by_state"]["trained"], trained) << counts.dump();
  EXPECT_EQ(counts["samples"].get<int64_t>(), counts["by_state"]["trained"].get<int64_t>() +
                                                  counts["by_state"]["dropped"].get<int64_t>())
      << counts.dump();
}

// Runs `gyre train args...` in `dir`, expects it to succeed within 240 s, and returns the GRPO
// metrics lines of the run (job.name t); *output gets what it printed.
std::vector<nlohmann::json> TrainAndReadSteps(const std::vector<std::string>& args,
                                              const std::string& dir, std::string* output) {
  auto p = GyreProcess::Start(args, dir);
  const bool ended = p.Wait(240);
  *output = p.Output();
  EXPECT_TRUE(ended) << *output;
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << *output;
  if (!ended || WEXITSTATUS(p.wait_status) != 0) return {};
  return MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
}

TEST(CliTest, VersionHelpAndUsageErrors) {
  const std::string dir = MakeTempDir("cli");
  auto p = GyreProcess::Start({"--version"}, dir);
  ASSERT_TRUE(p.Wait(30));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0);
  EXPECT_NE(p.Output().find("gyre 0."), std::string::npos);

  p = GyreProcess::Start({"help"}, dir);
  ASSERT_TRUE(p.Wait(30));
  EXPECT_NE(p.Output().find("gyre train JOB.yaml"), std::string::npos);

  (void)RemoveTree(dir + "/gyre.out");
  p = GyreProcess::Start({"frobnicate"}, dir);
  ASSERT_TRUE(p.Wait(30));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 2);
  EXPECT_EQ(p.Output(), "gyre: unknown command 'frobnicate' (see gyre help)\n");
}

// Every command's --help starts with its usage line and lists each of its options (with its
// default where it has one); an unknown option is a usage error, one line that names it.
TEST(CliTest, EveryCommandListsItsOptionsAndRefusesAnUnknownOne) {
  struct Command {
    std::string name;
    std::vector<std::string> options;  // as --help lists them: "--name", or "--name TYPE=DEFAULT"
  };
  const std::vector<Command> commands = {
      {"train", {"--set KEY=VALUE", "--quiet", "--resume"}},
      {"validate", {"--set KEY=VALUE", "--quiet", "--print"}},
      {"worker",
       {"--role", "--controller", "--index N", "--bind-host TEXT=127.0.0.1", "--advertise-host",
        "--port", "--register-timeout SECONDS=60", "--tls-cert PEM", "--tls-key PEM",
        "--tls-ca PEM", "--tls-server-name", "--token-file FILE"}},
      {"generate",
       {"--model DIR", "--prompt TEXT", "--max-new-tokens N=64", "--temperature T=0", "--top-k K=0",
        "--top-p P=1", "--min-p P=0", "--seed S=0", "--chat FORMAT", "--benchmark"}},
      {"tokenize", {"--tokenizer PATH", "--text", "--jsonl", "--no-special"}},
      {"init-model",
       {"--arch", "--out DIR", "--preset", "--seed", "--force", "--init-std S=0.02",
        "--random-norms-and-biases", "--rope-scaling"}},
      {"convert gguf", {"--out DIR", "--force"}},
      {"logprobs", {"--model DIR", "--ids", "--full", "--dtype DTYPE=float32", "--device"}},
      {"ledger", {"--sample ID", "--prompts", "--state STATE", "--top N=20", "--json"}},
      {"report", {"--out FILE=RUN_DIR/report.html", "--png FILE", "--width PX=1240"}},
      {"launch slurm",
       {"--set KEY=VALUE", "--dry-run", "--partition P", "--time T", "--account A",
        "--gpus-per-worker N", "--cpus-per-worker N=2", "--controller-cpus N=2", "--sbatch OPTION",
        "--gyre PATH"}},
  };
  const std::string dir = MakeTempDir("cli_help");
  for (const Command& c : commands) {
    std::vector<std::string> args;
    std::istringstream words(c.name);
    for (std::string w; words >> w;) args.push_back(w);
    args.push_back("--help");
    auto [rc, help] = RunGyre(args, dir, 30);
    EXPECT_EQ(rc, 0) << c.name << ":\n" << help;
    EXPECT_EQ(help.rfind("Usage: gyre " + c.name + " ", 0), 0u) << help;
    for (const std::string& option : c.options) {
      // An option's line: two spaces, the option, then more of its type, padding or the end of
      // the line.
      bool listed = false;
      for (size_t at = help.find("\n  " + option); at != std::string::npos && !listed;
           at = help.find("\n  " + option, at + 1)) {
        const char next = help[at + 3 + option.size()];
        listed = next == ' ' || next == '\n' || next == ':' || next == '=';
      }
      EXPECT_TRUE(listed) << "gyre " << c.name << " --help does not list " << option << ":\n"
                          << help;
    }
    args.back() = "--no-such-option";
    auto [bad_rc, error] = RunGyre(args, dir, 30);
    EXPECT_EQ(bad_rc, 2) << c.name << ": " << error;
    EXPECT_EQ(error, "gyre " + c.name +
                         ": The following argument was not expected: --no-such-option (see gyre " +
                         c.name + " --help)\n");
  }
}

TEST(CliTest, LedgerUsageErrorsAndAMissingLedgerAreClear) {
  const std::string dir = MakeTempDir("ledger");
  auto run = [&](const std::vector<std::string>& args, int want_rc) {
    (void)RemoveTree(dir + "/gyre.out");
    auto p = GyreProcess::Start(args, dir);
    EXPECT_TRUE(p.Wait(30));
    EXPECT_EQ(WEXITSTATUS(p.wait_status), want_rc) << p.Output();
    return p.Output();
  };
  EXPECT_NE(run({"ledger", "--help"}, 0).find("--prompts"), std::string::npos);
  EXPECT_EQ(run({"ledger"}, 2), "gyre ledger: RUN_DIR is required (see gyre ledger --help)\n");
  EXPECT_NE(run({"ledger", dir, "--state", "lost"}, 2).find("--state: lost not in {queued,"),
            std::string::npos);
  EXPECT_NE(run({"ledger", dir, "--sample", "x1"}, 2).find("--sample: 'x1' is not a number"),
            std::string::npos);
  EXPECT_NE(
      run({"ledger", dir, "--prompts", "--sample", "1"}, 2).find("--sample excludes --prompts"),
      std::string::npos);
  EXPECT_NE(run({"ledger", dir, "--top", "-1"}, 2).find("--top: -1 is not >= 0"),
            std::string::npos);
  EXPECT_EQ(run({"ledger", dir}, 1), "gyre ledger: " + dir +
                                         "/ledger.db: no sample ledger here (a run directory "
                                         "holds ledger.db once its job has started)\n");
  // A file that is not a ledger is refused by name, and left as it was.
  std::ofstream(dir + "/ledger.db") << "not a database";
  EXPECT_NE(run({"ledger", dir}, 1).find(dir + "/ledger.db"), std::string::npos);
  EXPECT_EQ(ReadFile(dir + "/ledger.db"), "not a database");
}

// Every example job in configs/ is valid as shipped.
TEST(CliTest, EveryExampleConfigValidates) {
  const std::string dir = MakeTempDir("configs");
  auto names = ListDirectory(std::string(GYRE_SOURCE_DIR) + "/configs");
  ASSERT_TRUE(names.ok());
  int checked = 0;
  for (const auto& name : *names) {
    if (name.size() < 5 || name.substr(name.size() - 5) != ".yaml") continue;
    (void)RemoveTree(dir + "/gyre.out");
    auto p =
        GyreProcess::Start({"validate", std::string(GYRE_SOURCE_DIR) + "/configs/" + name}, dir);
    ASSERT_TRUE(p.Wait(30));
    EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << name << ": " << p.Output();
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(CliTest, ValidateReportsFileLineAndColumnWithSuggestion) {
  const std::string dir = MakeTempDir("validate");
  const std::string job = dir + "/job.yaml";
  std::ofstream(job) << "job:\n  name: x\nrollout:\n  group_size: 4\n  tmperature: 0.5\n";
  auto p = GyreProcess::Start({"validate", job}, dir);
  ASSERT_TRUE(p.Wait(30));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  const std::string out = p.Output();
  EXPECT_NE(out.find(job + ":5:3: unknown key 'rollout.tmperature'"), std::string::npos) << out;
  EXPECT_NE(out.find("did you mean 'rollout.sampling.temperature'"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line on stderr: " << out;

  (void)RemoveTree(dir + "/gyre.out");
  p = GyreProcess::Start({"validate", kQuickstart, "--set", "rollout.group_size=0"}, dir);
  ASSERT_TRUE(p.Wait(30));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  EXPECT_NE(p.Output().find("rollout.group_size"), std::string::npos) << p.Output();
}

// Two GRPO steps with two rollout workers and one trainer as separate processes.
TEST(TrainTest, TwoGrpoStepsWithRealWorkers) {
  const std::string dir = MakeTempDir("train");
  auto p = GyreProcess::Start(SmallJob(dir, 2), dir);
  ASSERT_TRUE(p.Wait(180)) << p.Output();
  const std::string out = p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  const auto pids = WorkerPids(out);
  EXPECT_EQ(pids.size(), 3u) << out;
  EXPECT_TRUE(AllGone(pids, 10)) << "workers outlived the job";
  EXPECT_NE(out.find("step    1/2"), std::string::npos) << out;
  EXPECT_NE(out.find("step    2/2"), std::string::npos) << out;
  EXPECT_NE(out.find("eval before_rl"), std::string::npos);
  EXPECT_NE(out.find("eval after_rl"), std::string::npos);

  const std::string run = dir + "/t";
  auto steps = MetricsRecords(run + "/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 2u);
  // 5 warm-up steps = versions 1..5; each GRPO step is one more optimizer step.
  EXPECT_EQ(steps[0]["policy_version"], 6);
  EXPECT_EQ(steps[1]["policy_version"], 7);
  EXPECT_EQ(steps[0]["samples"], 8 * 8);
  EXPECT_GT(steps[0]["generated_tokens"].get<int>(), 0);
  EXPECT_EQ(steps[0]["stale_dropped"], 0);
  EXPECT_EQ(MetricsRecords(run + "/metrics.jsonl", "eval").size(), 2u);
  EXPECT_TRUE(PathExists(run + "/final/model.safetensors"));
  EXPECT_TRUE(PathExists(run + "/final/config.json"));
  EXPECT_TRUE(PathExists(run + "/config.yaml"));
  auto summary = nlohmann::json::parse(ReadFile(run + "/summary.json"));
  EXPECT_EQ(summary["grpo_steps"], 2);
  EXPECT_EQ(summary["policy_version"], 7);
}

// trainer.lr_schedule: the trainer's AdamW steps use the schedule's rate for each GRPO step (the
// metrics' lr is what the optimizer applied): one warm-up step, then cosine down to half the rate.
TEST(TrainTest, CosineLearningRateScheduleReachesTheOptimizer) {
  const std::string dir = MakeTempDir("train_lr");
  auto args = SmallJob(dir, 4);
  for (const char* kv :
       {"trainer.lr_schedule=cosine", "trainer.lr_warmup_steps=2", "trainer.lr_min_ratio=0.5",
        "trainer.lr=0.001", "trainer.warmup_sft_lr=0.002"}) {
    args.insert(args.end(), {"--set", kv});
  }
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(180)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 4u);
  // Warm-up: 1e-3 * 1/2, 1e-3; cosine over steps 3..4 (p = 1/2, 1): 7.5e-4, 5e-4. The rate
  // travels to the trainer as a float (TrainRequest), hence the relative tolerance.
  const double want[] = {5e-4, 1e-3, 7.5e-4, 5e-4};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(steps[i]["lr"].get<double>(), want[i], 1e-6 * want[i]) << steps[i].dump();
  }
  // The supervised warm-up keeps its own rate.
  for (const auto& w : MetricsRecords(dir + "/t/metrics.jsonl", "warmup")) {
    EXPECT_NEAR(w["lr"].get<double>(), 2e-3, 2e-9) << w.dump();
  }
}

// Evaluations between steps do not change training: their group ids come from a space of their
// own, so the same job with metrics.eval_every 1 (two extra evaluations) samples the same
// rollouts and takes the same steps as with 0.
TEST(TrainTest, EvaluationDoesNotChangeTheTrainingRun) {
  std::vector<std::vector<nlohmann::json>> runs;
  for (const char* every : {"0", "1"}) {
    const std::string dir = MakeTempDir("evalsep");
    auto args = SmallJob(dir, 3);
    args.insert(args.end(), {"--set", std::string("metrics.eval_every=") + every});
    auto p = GyreProcess::Start(args, dir);
    ASSERT_TRUE(p.Wait(180)) << p.Output();
    ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
    runs.push_back(MetricsRecords(dir + "/t/metrics.jsonl", "grpo"));
    EXPECT_EQ(MetricsRecords(dir + "/t/metrics.jsonl", "eval").size(), every[0] == '0' ? 2u : 4u);
  }
  ASSERT_EQ(runs[0].size(), 3u);
  ASSERT_EQ(runs[1].size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    for (const char* k : {"generated_tokens", "mean_reward", "loss", "grad_norm"}) {
      EXPECT_EQ(runs[0][s][k], runs[1][s][k]) << k << " at step " << s + 1;
    }
  }
}

// kill -9 of a rollout worker mid-job: the controller names it, re-queues its work on the other
// worker and finishes. With cluster.max_worker_restarts: 0 it is not restarted.
TEST(TrainTest, RolloutWorkerDeathIsReportedAndTheJobContinues) {
  const std::string dir = MakeTempDir("death");
  auto args = SmallJob(dir, 60);
  args.insert(args.end(), {"--set", "cluster.max_worker_restarts=0"});
  auto p = GyreProcess::Start(args, dir);
  std::string out;
  auto m = p.WaitForOutput("started rollout-1 \\(pid ([0-9]+)\\)", 60, &out);
  ASSERT_FALSE(m.empty()) << out;
  const pid_t victim = std::stoi(m[1]);
  ASSERT_FALSE(p.WaitForOutput("step    3/60", 120, &out).empty()) << out;
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(
      out.find("worker rollout-1 died: pid " + std::to_string(victim) + " killed by signal 9"),
      std::string::npos)
      << out;
  // The message quotes the end of the worker's log, so the reason is on the controller's line.
  EXPECT_NE(out.find("killed by signal 9 (Killed); its log ends: "), std::string::npos) << out;
  EXPECT_NE(out.find("continuing with 1 rollout worker(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("step   60/60"), std::string::npos) << out;
  EXPECT_EQ(out.find("will be restarted"), std::string::npos) << out;
  EXPECT_EQ(out.find("restarted (pid"), std::string::npos) << out;
  EXPECT_EQ(WorkerPids(out).size(), 3u) << out;
  EXPECT_FALSE(PathExists(dir + "/t/logs/rollout-1.log.1"));
  auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 60u);
  for (const auto& s : steps) EXPECT_EQ(s["samples"], 64) << s.dump();  // nothing lost
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir + "/t/summary.json"))["worker_restarts"], 0);
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  // The ledger agrees: every sample trained once, none left behind by the dead worker.
  ASSERT_TRUE(MakeDirs(dir + "/ledger").ok());
  auto l = GyreProcess::Start({"ledger", dir + "/t", "--json"}, dir + "/ledger");
  ASSERT_TRUE(l.Wait(30));
  ASSERT_EQ(WEXITSTATUS(l.wait_status), 0) << l.Output();
  const auto counts = nlohmann::json::parse(l.Output());
  EXPECT_EQ(counts["samples"], 60 * 64) << counts.dump();
  EXPECT_EQ(counts["by_state"]["trained"], 60 * 64) << counts.dump();
}

// rollout.async: generation runs ahead of training by at most max_staleness versions; every
// trained sample is within the bound, every step gets its full batch, and the ledger ends with
// each sample trained once or dropped (made ahead for a step that never ran).
TEST(TrainTest, AsyncRolloutRunsAheadWithinTheStalenessBound) {
  const std::string dir = MakeTempDir("async");
  auto args = SmallJob(dir, 6);
  args.insert(args.end(), {"--set", "rollout.async=true", "--set", "algorithm.max_staleness=2"});
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 6u);
  int64_t ahead = 0;
  for (const auto& s : steps) {
    EXPECT_EQ(s["samples"], 64) << s.dump();
    int64_t counted = 0;
    for (const auto& [st, count] : s["staleness"].items()) {
      EXPECT_LE(std::stoi(st), 2) << s.dump();
      if (std::stoi(st) > 0) ahead += count.get<int64_t>();
      counted += count.get<int64_t>();
    }
    EXPECT_EQ(counted, 64) << s.dump();
    EXPECT_EQ(s["stale_dropped"], 0) << s.dump();
    EXPECT_LE(s["admitted_groups"].get<int64_t>(), (2 + s["step"].get<int64_t>()) * 8);
  }
  EXPECT_GT(ahead, 0) << "no sample was generated ahead of its step";
  ExpectTrainedOnceOrDropped(dir, 6 * 64);
  EXPECT_TRUE(AllGone(WorkerPids(p.Output()), 10));
}

// The algorithms by name reach a real job: each combination trains three steps through the
// controller and trainer processes, and what it reports is what the names promise.
TEST(TrainTest, NamedAlgorithmsTrainEndToEnd) {
  struct Case {
    std::vector<std::string> sets;
    bool median;
  };
  const std::vector<Case> cases = {
      // MC-GRPO with G = 8 (9 samples per prompt), CISPO, Dr. GRPO's constant-length
      // normaliser, an entropy bonus and DAPO's overlong shaping over the last 2 of 5 tokens.
      {{"algorithm.advantage=median", "rollout.group_size=9", "algorithm.policy_loss=cispo",
        "algorithm.loss_agg=seq-mean-token-sum-norm", "algorithm.entropy_coef=0.01",
        "algorithm.overlong_buffer=2"},
       true},
      // GSPO over two mini-batches with a KL penalty to the reference policy.
      {{"algorithm.advantage=reinforce_pp", "algorithm.policy_loss=gspo",
        "algorithm.loss_agg=seq-mean-token-mean", "trainer.mini_batches=2", "algorithm.kl=k2",
        "algorithm.kl_coef=0.1"},
       false},
      // SAO with the KL to the reference policy in the reward.
      {{"algorithm.advantage=reinforce_pp_baseline", "algorithm.policy_loss=sao",
        "trainer.mini_batches=2", "algorithm.kl=k1", "algorithm.kl_in=reward",
        "algorithm.kl_coef=0.5"},
       false},
      // OPO's length-weighted baseline: the response lengths reach the estimator.
      {{"algorithm.advantage=opo"}, false},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string dir = MakeTempDir("named_algorithms_" + std::to_string(c));
    auto args = SmallJob(dir, 3);
    // A longer warm-up than SmallJob's, so that some answers are right and rewards vary.
    args.insert(args.end(), {"--set", "trainer.warmup_sft_steps=80"});
    for (const std::string& s : cases[c].sets) args.insert(args.end(), {"--set", s});
    std::string out;
    const auto steps = TrainAndReadSteps(args, dir, &out);
    ASSERT_EQ(steps.size(), 3u) << out;
    int64_t trained = 0, pivots = 0;
    double grad_norm = 0;
    for (const auto& s : steps) {
      EXPECT_TRUE(std::isfinite(s["loss"].get<double>())) << s.dump();
      grad_norm += s["grad_norm"].get<double>();
      trained += s["samples"].get<int64_t>();
      if (cases[c].median) {
        // Every group of 9 loses its pivot: 8 prompts train 8 samples each.
        EXPECT_EQ(s["median_pivots"], 8) << s.dump();
        EXPECT_EQ(s["samples"], 64) << s.dump();
        EXPECT_TRUE(s.contains("overlong_penalized")) << s.dump();
        pivots += s["median_pivots"].get<int64_t>();
      } else {
        EXPECT_FALSE(s.contains("median_pivots")) << s.dump();
      }
      if (c == 1) {
        EXPECT_GE(s["kl_ref"].get<double>(), 0.0) << s.dump();
      } else {
        EXPECT_FALSE(s.contains("kl_ref")) << s.dump();
      }
      EXPECT_EQ(s.contains("kl_reward"), c == 2) << s.dump();
      if (c == 2) {
        // The reference is the policy of step 1; later steps have moved away from it.
        if (s["step"] == 1) {
          EXPECT_EQ(s["kl_reward"].get<double>(), 0.0) << s.dump();
        } else {
          EXPECT_NE(s["kl_reward"].get<double>(), 0.0) << s.dump();
        }
      }
    }
    EXPECT_GT(grad_norm, 0.0) << "no step had a gradient: " << out;
    // The ledger: trained samples once, pivots filtered with their reason, nothing else.
    ASSERT_TRUE(MakeDirs(dir + "/ledger").ok());
    auto l = GyreProcess::Start({"ledger", dir + "/t", "--json"}, dir + "/ledger");
    ASSERT_TRUE(l.Wait(30));
    const auto counts = nlohmann::json::parse(l.Output());
    EXPECT_EQ(counts["by_state"]["trained"], trained) << counts.dump();
    if (cases[c].median) {
      EXPECT_EQ(counts["by_state"]["filtered"], pivots) << counts.dump();
    }
    EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  }
}

// rollout.budget on real workers: each policy's groups reach the trainer with the sizes it
// chose, every generated sample is trained, filtered or dropped once in the ledger, GRESO's
// history reaches the checkpoint, and trainer.max_generated_tokens ends GRPO early.
TEST(TrainTest, SamplingPoliciesShapeTheGroupsTheyGenerate) {
  struct Case {
    std::string policy;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases = {
      {"pilot", {"rollout.budget.pilot_low=0.1", "rollout.budget.pilot_high=0.9"}},
      {"variance", {"rollout.budget.topup_chunk=2"}},
      // Greedy sampling makes every group all-correct or all-wrong, so each prompt's history
      // fills at its first draw whatever the model learned; one-digit sums (100 prompts, 32
      // drawn) repeat, and a repeat is skipped.
      {"greso",
       {"rollout.budget.greso_streak=1", "rollout.budget.greso_initial=1.0", "data.max_digits=1",
        "trainer.checkpoint_every=2", "rollout.sampling.temperature=0"}},
  };
  for (const Case& c : cases) {
    const std::string dir = MakeTempDir("budget_" + c.policy);
    auto args = SmallJob(dir, 4);
    args.insert(args.end(), {"--set", "trainer.warmup_sft_steps=80", "--set",
                             "rollout.budget.policy=" + c.policy});
    for (const std::string& s : c.sets) args.insert(args.end(), {"--set", s});
    std::string out;
    const auto steps = TrainAndReadSteps(args, dir, &out);
    ASSERT_EQ(steps.size(), 4u) << out;
    int64_t generated = 0, trained = 0;
    for (const auto& s : steps) {
      const int64_t made = s["samples_generated"].get<int64_t>();
      generated += made;
      trained += s["samples"].get<int64_t>();
      EXPECT_LE(s["useful_groups"].get<int64_t>(), 8) << s.dump();
      if (c.policy == "pilot") {
        // 4 pilot samples per prompt, 4 more for the prompts in the band: 32 to 64.
        EXPECT_GE(made, 32) << s.dump();
        EXPECT_LE(made, 64) << s.dump();
        EXPECT_EQ((made - 32) % 4, 0) << s.dump();
      } else if (c.policy == "variance") {
        EXPECT_GE(made, 32) << s.dump();
        EXPECT_LE(made, 64) << s.dump();
      } else {
        EXPECT_EQ(made, 64) << s.dump();  // greso skips prompts, not samples
        EXPECT_TRUE(s.contains("skip_probability")) << s.dump();
      }
    }
    if (c.policy == "greso") {
      // Prompts repeat, their history fills and some are skipped.
      int64_t skipped = 0;
      for (const auto& s : steps) skipped += s["skipped_prompts"].get<int64_t>();
      EXPECT_GT(skipped, 0) << out;
      const auto state =
          nlohmann::json::parse(ReadFile(dir + "/t/checkpoints/step-000004/controller.json"));
      EXPECT_EQ(state["sampling_policy"]["policy"], "greso") << state.dump();
      EXPECT_GT(state["sampling_policy"]["streaks"].size(), 0u) << state.dump();
    }
    ASSERT_TRUE(MakeDirs(dir + "/ledger").ok());
    auto l = GyreProcess::Start({"ledger", dir + "/t", "--json"}, dir + "/ledger");
    ASSERT_TRUE(l.Wait(30));
    const auto counts = nlohmann::json::parse(l.Output());
    EXPECT_EQ(counts["samples"], generated) << counts.dump();
    EXPECT_EQ(counts["by_state"]["trained"], trained) << counts.dump();
    EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  }

  // trainer.max_generated_tokens: GRPO ends after the step that reaches the budget.
  const std::string dir = MakeTempDir("budget_tokens");
  auto args = SmallJob(dir, 50);
  args.insert(args.end(), {"--set", "trainer.max_generated_tokens=600"});
  std::string out;
  const auto steps = TrainAndReadSteps(args, dir, &out);
  ASSERT_GE(steps.size(), 1u) << out;
  ASSERT_LT(steps.size(), 50u) << out;
  int64_t tokens = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i + 1 < steps.size()) EXPECT_LT(tokens + steps[i]["generated_tokens"].get<int64_t>(), 600);
    tokens += steps[i]["generated_tokens"].get<int64_t>();
  }
  EXPECT_GE(tokens, 600);
  const auto summary = nlohmann::json::parse(ReadFile(dir + "/t/summary.json"));
  EXPECT_EQ(summary["grpo_steps"], static_cast<int64_t>(steps.size()));
}

// trainer.publish_every: 2: the workers get new weights after every second step only (and before
// an evaluation), the bound still holds, and every sample is trained once or dropped.
TEST(TrainTest, AsyncPublishEveryOtherStepKeepsTheBound) {
  const std::string dir = MakeTempDir("async_publish_every");
  auto args = SmallJob(dir, 6);
  args.insert(args.end(), {"--set", "rollout.async=true", "--set", "algorithm.max_staleness=2",
                           "--set", "trainer.publish_every=2", "--set", "metrics.eval_every=3"});
  std::string out;
  const auto steps = TrainAndReadSteps(args, dir, &out);
  ASSERT_EQ(steps.size(), 6u);
  // The warm-up ends at v5 and each step adds one version. The workers hold v5 through step 2;
  // step 2 publishes v7; step 3's evaluation needs v8, so it is published then; step 4 publishes
  // v9, which the workers hold through step 6.
  const int64_t held[] = {5, 5, 7, 8, 9, 9};
  int64_t trained = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    EXPECT_EQ(s["published_version"], held[i]) << s.dump();
    EXPECT_EQ(s["policy_version"], 6 + static_cast<int64_t>(i)) << s.dump();
    for (const auto& [st, count] : s["staleness"].items()) EXPECT_LE(std::stoi(st), 2) << s.dump();
    EXPECT_EQ(s["stale_dropped"], 0) << s.dump();
    EXPECT_GE(s["samples"].get<int64_t>(), 64) << s.dump();
    trained += s["samples"].get<int64_t>();
  }
  ExpectTrainedOnceOrDropped(dir, trained);
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
}

// rollout.weight_updates: between_steps: the trainer publishes while generation runs, each worker
// taking the version between engine steps; the bound holds and every step trains a full batch.
// With peer relay (fan-out 1) the trainer sends one copy and the first worker relays it to the
// second in one round.
TEST(TrainTest, AsyncWeightUpdatesBetweenEngineStepsKeepTheBound) {
  const std::string dir = MakeTempDir("async_between");
  auto args = SmallJob(dir, 8);
  args.insert(args.end(),
              {"--set", "rollout.async=true", "--set", "algorithm.max_staleness=2", "--set",
               "rollout.weight_updates=between_steps", "--set", "rollout.max_new_tokens=12",
               "--set", "model.max_seq_len=40", "--set", "cluster.weight_relay_fanout=1"});
  std::string out;
  const auto steps = TrainAndReadSteps(args, dir, &out);
  ASSERT_EQ(steps.size(), 8u);
  for (const auto& s : steps) {
    EXPECT_EQ(s["samples"], 64) << s.dump();
    EXPECT_EQ(s["publish_relay_rounds"], 1) << s.dump();
    for (const auto& [age, count] : s["staleness"].items()) EXPECT_LE(std::stoi(age), 2);
  }
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
}

// rollout.work_stealing on real workers: a worker that runs out of work takes over samples still
// generating on the other (Rollout.Preempt, then GenerateStream with resumed samples). Every
// admitted group goes out in one call (async_chunk_groups=64) to a worker that runs 4 sequences
// at a time, so the other worker is idle while that call still has queued samples for many
// engine steps, and it steals; every step still trains its full batch within the bound and the
// ledger counts each sample once. (With the quickstart's 5-token answers in one full batch a
// call took a few tens of milliseconds, and a loaded CI host once saw every call end before a
// steal reached it.) The policy starts untrained, so answers run to max_new_tokens.
TEST(TrainTest, AsyncJobWithWorkStealingTrainsEverySampleOnce) {
  const std::string dir = MakeTempDir("async_steal");
  auto args = SmallJob(dir, 6);
  args.insert(args.end(),
              {"--set", "rollout.async=true", "--set", "algorithm.max_staleness=1", "--set",
               "rollout.work_stealing=true", "--set", "rollout.async_chunk_groups=64", "--set",
               "rollout.weight_updates=between_steps", "--set", "rollout.max_running=4", "--set",
               "rollout.max_new_tokens=12", "--set", "model.max_seq_len=40", "--set",
               "trainer.warmup_sft_steps=0"});
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 6u);
  int64_t stolen = 0;
  for (const auto& s : steps) {
    EXPECT_EQ(s["samples"], 64) << s.dump();
    for (const auto& [age, count] : s["staleness"].items()) EXPECT_LE(std::stoi(age), 1);
    stolen += s["stolen_samples"].get<int64_t>();
  }
  EXPECT_GT(stolen, 0) << "no sample was taken over";
  ExpectTrainedOnceOrDropped(dir, 6 * 64);
  EXPECT_TRUE(AllGone(WorkerPids(p.Output()), 10));
}

// Runs a 6-step asynchronous job with `sets` under staleness bound `k`: every step trains at
// least its batch of 64 (more when more must be trained to keep the bound) within the bound,
// some publish took samples out of their calls (repacked_samples), and the ledger counts each
// sample once.
void ExpectRepackingJobTrainsEverySampleOnce(const std::string& name, int k,
                                             const std::vector<std::string>& sets) {
  const std::string dir = MakeTempDir(name);
  auto args = SmallJob(dir, 6);
  args.insert(args.end(), {"--set", "rollout.async=true", "--set",
                           "algorithm.max_staleness=" + std::to_string(k)});
  for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 6u);
  int64_t repacked = 0, trained = 0;
  for (const auto& s : steps) {
    EXPECT_GE(s["samples"], 64) << s.dump();
    trained += s["samples"].get<int64_t>();
    for (const auto& [age, count] : s["staleness"].items()) EXPECT_LE(std::stoi(age), k);
    repacked += s["repacked_samples"].get<int64_t>();
  }
  EXPECT_GT(repacked, 0) << "no publish took a sample out";
  ExpectTrainedOnceOrDropped(dir, trained);
  EXPECT_TRUE(AllGone(WorkerPids(p.Output()), 10));
}

// rollout.weight_updates: repack and rollout.split_groups on real workers. Groups of 8 go out in
// pieces of 2, one per call, to workers that run 1 sequence at a time, so publishes find
// samples generating; it takes them out with their tokens (Rollout.Preempt) and they continue on
// the new version. Generation must be the slower side, or it reaches the staleness bound and
// waits there with nothing in flight at a publish (a loaded CI host once saw that at all 5
// publishes): the policy starts untrained, so responses run to max_new_tokens, generated one
// sequence at a time, several times longer than a train step.
TEST(TrainTest, AsyncJobRepackingAtEachPublishTrainsEverySampleOnce) {
  ExpectRepackingJobTrainsEverySampleOnce(
      "async_repack", 2,
      {"rollout.weight_updates=repack", "rollout.split_groups=2", "rollout.max_running=1",
       "rollout.async_chunk_groups=1", "rollout.max_new_tokens=12", "model.max_seq_len=40",
       "trainer.warmup_sft_steps=0"});
}

// rollout.weight_updates: between_steps_repack on real workers. All 40 admitted groups (k = 4)
// go out in one call to a worker that runs 1 sequence at a time, while a step takes 8 groups, so
// the call outlives a step; at the next publish its samples are taken out with their tokens and
// continue on tail workers, in calls of at most 4 samples.
TEST(TrainTest, AsyncJobTailRepackingWithoutLockstepTrainsEverySampleOnce) {
  ExpectRepackingJobTrainsEverySampleOnce(
      "async_tails", 4,
      {"rollout.weight_updates=between_steps_repack", "rollout.tail_batch=4",
       "rollout.max_running=1", "rollout.async_chunk_groups=40"});
}

// kill -9 of a rollout worker during an asynchronous job: its groups go to the others, it is
// restarted and caught up, and every step still trains a full batch.
TEST(TrainTest, AsyncJobSurvivesAKilledRolloutWorker) {
  const std::string dir = MakeTempDir("async_kill");
  auto args = SmallJob(dir, 30);
  args.insert(args.end(), {"--set", "rollout.async=true", "--set", "algorithm.max_staleness=1"});
  auto p = GyreProcess::Start(args, dir);
  std::string out;
  auto m = p.WaitForOutput("started rollout-1 \\(pid ([0-9]+)\\)", 60, &out);
  ASSERT_FALSE(m.empty()) << out;
  const pid_t victim = std::stoi(m[1]);
  ASSERT_FALSE(p.WaitForOutput("step    3/30", 120, &out).empty()) << out;
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(
      out.find("worker rollout-1 died: pid " + std::to_string(victim) + " killed by signal 9"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("rollout-1 restarted (pid"), std::string::npos) << out;
  const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 30u);
  for (const auto& s : steps) EXPECT_EQ(s["samples"], 64) << s.dump();
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
}

// kill -9 of trainer-0 once step `after_step` has been printed: the job fails within 15 s with one
// line naming the worker, pid and signal, and leaves no worker behind.
void ExpectKilledTrainerFailsTheJob(const std::string& dir, const std::vector<std::string>& args,
                                    int after_step, int steps) {
  auto p = GyreProcess::Start(args, dir);
  std::string out;
  auto m = p.WaitForOutput("started trainer-0 \\(pid ([0-9]+)\\)", 60, &out);
  ASSERT_FALSE(m.empty()) << out;
  const pid_t victim = std::stoi(m[1]);
  char progress[64];
  std::snprintf(progress, sizeof(progress), "step %4d/%d", after_step, steps);
  ASSERT_FALSE(p.WaitForOutput(progress, 120, &out).empty()) << out;
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(p.Wait(60)) << p.Output();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15.0);
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1) << out;
  EXPECT_NE(out.find("gyre: job failed: worker trainer-0 died: pid " + std::to_string(victim) +
                     " killed by signal 9"),
            std::string::npos)
      << out;
  EXPECT_TRUE(AllGone(WorkerPids(out), 10)) << "orphaned workers";
}

// kill -9 of the trainer during an asynchronous job: trainer deaths end the job (there is no
// trainer state to continue from but a checkpoint), while the rollout workers generate ahead.
TEST(TrainTest, AsyncJobEndsNamingAKilledTrainer) {
  const std::string dir = MakeTempDir("async_trainer_kill");
  auto args = SmallJob(dir, 200);
  args.insert(args.end(), {"--set", "rollout.async=true", "--set", "algorithm.max_staleness=2"});
  ExpectKilledTrainerFailsTheJob(dir, args, 3, 200);
}

// Dynamic sampling: groups whose rewards are all equal leave the batch, new groups replace
// them, and the ledger records each filtered sample with the reason.
TEST(TrainTest, DynamicSamplingReplacesZeroVarianceGroups) {
  const std::string dir = MakeTempDir("dapo");
  auto args = SmallJob(dir, 4);
  args.insert(args.end(),
              {"--set", "trainer.warmup_sft_steps=150", "--set",
               "algorithm.filter_zero_variance=true", "--set", "algorithm.max_filter_rounds=2"});
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 4u);
  int64_t filtered = 0, trained = 0;
  for (const auto& s : steps) {
    const int64_t samples = s["samples"], rounds = s["generation_rounds"];
    filtered += s["filtered_groups"].get<int64_t>();
    trained += samples;
    EXPECT_GE(rounds, 1) << s.dump();
    EXPECT_LE(rounds, 3) << s.dump();
    EXPECT_LE(samples, 64) << s.dump();
    // A round is added only while the batch is short of prompts_per_step usable groups.
    if (samples < 64) EXPECT_EQ(rounds, 3) << s.dump();
    if (rounds > 1) EXPECT_GT(s["filtered_groups"], 0) << s.dump();
    if (samples > 0) EXPECT_EQ(s["zero_variance_groups"], 0) << s.dump();
    EXPECT_EQ(s["reward_errors"], 0);
  }
  EXPECT_GT(filtered, 0) << "a barely warmed-up model answers most groups all wrong";
  ASSERT_TRUE(MakeDirs(dir + "/ledger").ok());
  auto l = GyreProcess::Start({"ledger", dir + "/t", "--json"}, dir + "/ledger");
  ASSERT_TRUE(l.Wait(30));
  const auto counts = nlohmann::json::parse(l.Output());
  EXPECT_EQ(counts["by_state"]["filtered"], filtered * 8) << counts.dump();
  EXPECT_EQ(counts["by_state"]["trained"], trained) << counts.dump();
  EXPECT_EQ(counts["samples"], filtered * 8 + trained) << counts.dump();
  (void)RemoveTree(dir + "/ledger/gyre.out");
  auto f = GyreProcess::Start({"ledger", dir + "/t", "--state", "filtered", "--top", "1", "--json"},
                              dir + "/ledger");
  ASSERT_TRUE(f.Wait(30));
  const auto rows = nlohmann::json::parse(f.Output())["rows"];
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["last"]["reason"].get<std::string>().rfind("zero reward variance: all 8", 0),
            0u)
      << rows.dump();
  EXPECT_TRUE(AllGone(WorkerPids(p.Output()), 10));
}

// After `victim` (rollout-1) was killed: the controller restarted it, published the current
// version to it alone, and only then gave it work; the job finished with every sample.
void ExpectRestartedAndCaughtUp(const std::string& dir, const std::string& out, pid_t victim,
                                int steps_total) {
  EXPECT_NE(
      out.find("worker rollout-1 died: pid " + std::to_string(victim) + " killed by signal 9"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("it will be restarted (restart 1 of 3)"), std::string::npos) << out;
  std::smatch m;
  const std::regex re("rollout-1 restarted \\(pid ([0-9]+)\\), caught up to policy v([0-9]+)");
  ASSERT_TRUE(std::regex_search(out, m, re)) << out;
  const pid_t new_pid = std::stoi(m[1]);
  const std::string version = m[2];
  EXPECT_NE(new_pid, victim);
  const auto pids = WorkerPids(out);  // the restart is announced as "started rollout-1 (pid N)"
  EXPECT_EQ(pids.size(), 4u) << out;
  EXPECT_NE(std::find(pids.begin(), pids.end(), new_pid), pids.end()) << out;
  // The first process's log is kept; the new one received version V before any generation.
  EXPECT_NE(ReadFile(dir + "/t/logs/rollout-1.log.1").find("serving on"), std::string::npos);
  const std::string log = ReadFile(dir + "/t/logs/rollout-1.log");
  const size_t received = log.find("received policy version " + version + " ");
  const size_t generated = log.find("first generate request, holding policy version " + version);
  ASSERT_NE(received, std::string::npos) << log;
  ASSERT_NE(generated, std::string::npos) << "the restarted worker got no work: " << log;
  EXPECT_LT(received, generated) << log;
  EXPECT_EQ(log.find("received policy version", received + 1), std::string::npos)
      << "one catch-up publish, then regular ones at DEBUG: " << log;
  // Nothing lost, and the later steps had both workers again (the new one generated).
  auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), static_cast<size_t>(steps_total));
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i]["samples"], 64) << steps[i].dump();
    EXPECT_EQ(steps[i]["policy_version"], static_cast<int>(6 + i));
  }
  EXPECT_LT(std::stoi(version), 6 + steps_total) << "caught up before the last step";
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir + "/t/summary.json"))["worker_restarts"], 1);
  EXPECT_TRUE(AllGone(pids, 10));
}

// Restarts (cluster.max_worker_restarts, default 3) over gRPC weight streams.
TEST(TrainTest, KilledRolloutWorkerIsRestartedAndCaughtUp) {
  const std::string dir = MakeTempDir("restart");
  auto p = GyreProcess::Start(SmallJob(dir, 30), dir);
  std::string out;
  auto m = p.WaitForOutput("started rollout-1 \\(pid ([0-9]+)\\)", 60, &out);
  ASSERT_FALSE(m.empty()) << out;
  const pid_t victim = std::stoi(m[1]);
  ASSERT_FALSE(p.WaitForOutput("step    3/30", 120, &out).empty()) << out;
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("step   30/30"), std::string::npos) << out;
  ExpectRestartedAndCaughtUp(dir, out, victim, 30);
}

// trainer.torch_threads: 0 gives each worker its share of the cores this process may run on: the
// 2 rollout workers split them while generating, the one trainer has them all while training (the
// phases alternate); asynchronously all three split them. A number sets it; the default is 1.
TEST(TrainTest, TorchThreadsComeFromTheCoresAvailable) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(mask), &mask), 0);
  const int cores = CPU_COUNT(&mask);
  auto threads = [](int n) {
    return "(" + std::to_string(n) + " intra-op thread" + (n == 1 ? "" : "s") + ")";
  };
  struct Case {
    std::vector<std::string> sets;
    int trainer, rollout;
  };
  const std::vector<Case> cases = {
      {{"trainer.torch_threads=0"}, std::min(cores, 32), std::clamp(cores / 2, 1, 32)},
      {{"trainer.torch_threads=0", "rollout.async=true"},
       std::clamp(cores / 3, 1, 32),
       std::clamp(cores / 3, 1, 32)},
      {{"trainer.torch_threads=3"}, 3, 3},
      {{}, 1, 1}};
  for (const Case& c : cases) {
    const std::string dir = MakeTempDir("threads");
    auto args = SmallJob(dir, 1);
    for (const std::string& s : c.sets) args.insert(args.end(), {"--set", s});
    std::string out;
    ASSERT_EQ(TrainAndReadSteps(args, dir, &out).size(), 1u) << out;
    EXPECT_NE(ReadFile(dir + "/t/logs/trainer-0.log").find(threads(c.trainer)), std::string::npos)
        << ReadFile(dir + "/t/logs/trainer-0.log");
    EXPECT_NE(ReadFile(dir + "/t/logs/rollout-1.log").find(threads(c.rollout)), std::string::npos)
        << ReadFile(dir + "/t/logs/rollout-1.log");
  }
}

// model.dtype: bfloat16 on real workers, over gRPC with a relay and over Gloo: rollout workers run
// the model in bfloat16, the trainer keeps float32 master weights (its checkpoint is float32) and
// publishes bfloat16 versions of half the bytes, and the rollout-vs-trainer mismatch of the same
// tokens is measured and small (the trainer computes in bfloat16 on the very weights it sent).
TEST(TrainTest, Bfloat16JobsPublishHalfTheBytesAndMeasureTheMismatch) {
  for (const std::string transport : {"grpc", "gloo"}) {
    SCOPED_TRACE(transport);
    const std::string dir = MakeTempDir("bf16_" + transport);
    auto args = SmallJob(dir, 3);
    args.insert(
        args.end(),
        {"--set", "model.dtype=bfloat16", "--set", "cluster.weight_transport=" + transport, "--set",
         "cluster.weight_relay_fanout=" + std::string(transport == "grpc" ? "1" : "0"), "--set",
         "trainer.checkpoint_every=3"});
    std::string out;
    const auto steps = TrainAndReadSteps(args, dir, &out);
    ASSERT_EQ(steps.size(), 3u) << out;
    double outside = 0, abs_diff = 0;
    for (const auto& s : steps) {
      EXPECT_EQ(s["samples"], 64) << s.dump();
      outside += s["mismatch_ratio_outside"].get<double>() / 3;
      abs_diff += s["mismatch_abs_logprob"].get<double>() / 3;
    }
    // Not float32's exact zero, and far from the 7.5% of ratios outside [0.9, 1.1] that a rollout
    // engine with other kernels shows in bfloat16 (TRL #6789). Measured: |d| 5e-4, outside 1e-5.
    EXPECT_GT(abs_diff, 0.0);
    EXPECT_LT(abs_diff, 0.02);
    EXPECT_LT(outside, 0.01);
    for (const std::string w : {"rollout-0", "rollout-1"}) {
      const std::string log = ReadFile(dir + "/t/logs/" + w + ".log");
      EXPECT_NE(log.find("parameters on cpu ("), std::string::npos) << log;
      EXPECT_NE(log.find(") in bfloat16"), std::string::npos) << log;
      // 406400 parameters in 2 bytes each (float32 would be 1625600).
      EXPECT_NE(log.find(transport == "grpc" ? "received policy version 0 (812800 bytes"
                                             : "received policy version 0 over gloo (812800 bytes"),
                std::string::npos)
          << log;
    }
    EXPECT_NE(ReadFile(dir + "/t/logs/trainer-0.log")
                  .find("float32 (master weights), computing in bfloat16"),
              std::string::npos);
    const std::string ckpt = ReadFile(dir + "/t/checkpoints/step-000003/trainer/model.safetensors");
    EXPECT_NE(ckpt.find("\"F32\""), std::string::npos);
    EXPECT_EQ(ckpt.find("\"BF16\""), std::string::npos);
    EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  }
}

// cluster.weight_transport: gloo: every publish goes to each rollout worker over its own Gloo
// group (met through the controller's rendezvous store), with receipts checked by the controller.
// A rollout worker killed mid-job is detected, restarted and caught up over a fresh Gloo group,
// and the job finishes with every sample accounted for and the same policy versions as over gRPC.
TEST(TrainTest, GlooWeightTransportTrainsAndSurvivesARolloutDeath) {
  const std::string dir = MakeTempDir("gloo");
  auto args = SmallJob(dir, 30);
  args.insert(args.end(), {"--set", "cluster.weight_transport=gloo", "--set",
                           "cluster.weight_bucket_bytes=4096"});
  auto p = GyreProcess::Start(args, dir);
  std::string out;
  auto m = p.WaitForOutput("started rollout-1 \\(pid ([0-9]+)\\)", 60, &out);
  ASSERT_FALSE(m.empty()) << out;
  const pid_t victim = std::stoi(m[1]);
  ASSERT_FALSE(p.WaitForOutput("step    3/30", 120, &out).empty()) << out;
  ::kill(victim, SIGKILL);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("weight rendezvous store on 127.0.0.1:"), std::string::npos) << out;
  EXPECT_NE(
      out.find("worker rollout-1 died: pid " + std::to_string(victim) + " killed by signal 9"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("step   30/30"), std::string::npos) << out;
  ExpectRestartedAndCaughtUp(dir, out, victim, 30);
}

// A worker that stops answering (SIGSTOP: alive, silent) is declared dead after the heartbeat
// timeout, its in-flight calls are cancelled, it is killed, and the job goes on without it.
TEST(TrainTest, SilentWorkerIsDeclaredDeadAndTheJobContinues) {
  const std::string dir = MakeTempDir("silent");
  auto args = SmallJob(dir, 40);
  args.insert(args.end(), {"--set", "cluster.heartbeat_interval_s=0.5", "--set",
                           "cluster.heartbeat_timeout_s=3"});
  auto p = GyreProcess::Start(args, dir);
  std::string out;
  auto m = p.WaitForOutput("started rollout-0 \\(pid ([0-9]+)\\)", 60, &out);
  ASSERT_FALSE(m.empty()) << out;
  const pid_t victim = std::stoi(m[1]);
  ASSERT_FALSE(p.WaitForOutput("step    3/40", 120, &out).empty()) << out;
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(victim, SIGSTOP);
  ASSERT_TRUE(p.Wait(120)) << p.Output();
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("worker rollout-0 died: pid " + std::to_string(victim) +
                     " missed heartbeats for 3 s; killed it"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("step   40/40"), std::string::npos) << out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 90);
  EXPECT_FALSE(ProcessAlive(victim));
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
}

// With on_worker_failure: fail the job stops with one line naming the worker, pid and signal.
TEST(TrainTest, WorkerDeathFailsTheJobWhenConfiguredTo) {
  const std::string dir = MakeTempDir("fail");
  auto args = SmallJob(dir, 200);
  args.insert(args.end(), {"--set", "cluster.on_worker_failure=fail"});
  ExpectKilledTrainerFailsTheJob(dir, args, 2, 200);
}

// SIGTERM to the controller stops the job and every worker promptly.
TEST(TrainTest, SigtermStopsControllerAndWorkers) {
  const std::string dir = MakeTempDir("sigterm");
  auto p = GyreProcess::Start(SmallJob(dir, 500), dir);
  std::string out;
  ASSERT_FALSE(p.WaitForOutput("step    2/500", 120, &out).empty()) << out;
  ::kill(p.pid, SIGTERM);
  ASSERT_TRUE(p.Wait(30)) << p.Output();
  out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 130) << out;
  EXPECT_NE(out.find("interrupted by SIGTERM"), std::string::npos) << out;
  EXPECT_TRUE(AllGone(WorkerPids(out), 10)) << "orphaned workers";
}

// kill -9 of the controller: its workers notice (parent death signal) and exit.
TEST(TrainTest, WorkersDieWithAKilledController) {
  const std::string dir = MakeTempDir("sigkill");
  auto p = GyreProcess::Start(SmallJob(dir, 500), dir);
  std::string out;
  ASSERT_FALSE(p.WaitForOutput("step    2/500", 120, &out).empty()) << out;
  ::kill(p.pid, SIGKILL);
  ASSERT_TRUE(p.Wait(10));
  EXPECT_TRUE(AllGone(WorkerPids(out), 15)) << "orphaned workers";
}

// A JSONL dataset ({"prompt", "answer"} per line) feeds the same job loop and verifier.
TEST(TrainTest, JsonlDatasetTrainsWithTheBuiltinVerifier) {
  const std::string dir = MakeTempDir("jsonl");
  {
    std::ofstream train(dir + "/train.jsonl"), eval(dir + "/eval.jsonl");
    for (int a = 0; a < 20; ++a) {
      const std::string line = "{\"prompt\": \"" + std::to_string(a) + "+" + std::to_string(a % 7) +
                               "=\", \"answer\": \"" + std::to_string(a + a % 7) + "\"}\n";
      (a < 15 ? train : eval) << line;
    }
  }
  auto args = SmallJob(dir, 2);
  args.insert(args.end(), {"--set", "data.train_path=" + dir + "/train.jsonl", "--set",
                           "data.eval_path=" + dir + "/eval.jsonl"});
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(180)) << p.Output();
  const std::string out = p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("/5, greedy"), std::string::npos) << "eval set = the 5-line file: " << out;
  EXPECT_EQ(MetricsRecords(dir + "/t/metrics.jsonl", "grpo").size(), 2u);

  // A broken dataset is a one-line error naming file and line, before any worker starts.
  std::ofstream(dir + "/bad.jsonl") << "{\"prompt\": \"1+1=\"}\n{\"prompt\": 3}\n";
  args = SmallJob(dir, 2);
  args.insert(args.end(), {"--set", "data.train_path=" + dir + "/bad.jsonl"});
  p = GyreProcess::Start(args, dir + "/t");
  ASSERT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  EXPECT_NE(p.Output().find(dir + "/bad.jsonl:2: missing string field \"prompt\""),
            std::string::npos)
      << p.Output();
  EXPECT_TRUE(WorkerPids(p.Output()).empty()) << "workers started for a bad dataset";
}

// cluster.mode: external: the controller waits; workers started by hand (as a cluster launcher
// would) dial its address, register, and the job runs.
TEST(TrainTest, ExternalWorkersDialTheController) {
  const std::string dir = MakeTempDir("external");
  auto port = rpc_port();
  auto args = SmallJob(dir, 2);
  args.insert(args.end(), {"--set", "cluster.mode=external", "--set",
                           "cluster.controller_port=" + std::to_string(port)});
  auto controller = GyreProcess::Start(args, dir);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<GyreProcess> workers;
  const std::vector<std::pair<std::string, int>> roles = {
      {"trainer", 0}, {"rollout", 0}, {"rollout", 1}};
  for (size_t i = 0; i < roles.size(); ++i) {
    const std::string wdir = dir + "/w" + std::to_string(i);
    ASSERT_TRUE(MakeDirs(wdir).ok());
    workers.push_back(GyreProcess::Start({"worker", "--role", roles[i].first, "--index",
                                          std::to_string(roles[i].second), "--controller", address},
                                         wdir));
  }
  ASSERT_TRUE(controller.Wait(180)) << controller.Output();
  EXPECT_EQ(WEXITSTATUS(controller.wait_status), 0) << controller.Output();
  EXPECT_NE(controller.Output().find("step    2/2"), std::string::npos);
  for (auto& w : workers) {
    ASSERT_TRUE(w.Wait(30)) << "worker did not stop with its job: " << w.Output();
    EXPECT_EQ(WEXITSTATUS(w.wait_status), 0) << w.Output();
  }
}

// Workers as a cluster launcher starts them (docs/cluster.md): no --controller or --index, only
// the environment (GYRE_CONTROLLER; the index from JOB_COMPLETION_INDEX as a Kubernetes Indexed
// Job sets it, or SLURM_PROCID as srun does), listening on every interface and advertising this
// host's routable address.
TEST(TrainTest, LaunchedWorkersFindTheirPlaceFromTheEnvironment) {
  const std::string dir = MakeTempDir("env_workers");
  auto port = rpc_port();
  auto args = SmallJob(dir, 2);
  args.insert(args.end(), {"--set", "cluster.mode=external", "--set",
                           "cluster.controller_port=" + std::to_string(port)});
  auto controller = GyreProcess::Start(args, dir);
  ::setenv("GYRE_CONTROLLER", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  std::vector<GyreProcess> workers;
  const std::vector<std::tuple<std::string, const char*, const char*>> launched = {
      {"trainer", "JOB_COMPLETION_INDEX", "0"},
      {"rollout", "JOB_COMPLETION_INDEX", "1"},
      {"rollout", "SLURM_PROCID", "0"}};
  for (size_t i = 0; i < launched.size(); ++i) {
    const auto& [role, var, value] = launched[i];
    const std::string wdir = dir + "/w" + std::to_string(i);
    ASSERT_TRUE(MakeDirs(wdir).ok());
    ::setenv(var, value, 1);
    workers.push_back(
        GyreProcess::Start({"worker", "--role", role, "--bind-host", "0.0.0.0"}, wdir));
    ::unsetenv(var);
  }
  ::unsetenv("GYRE_CONTROLLER");
  ASSERT_TRUE(controller.Wait(180)) << controller.Output();
  const std::string out = controller.Output();
  EXPECT_EQ(WEXITSTATUS(controller.wait_status), 0) << out;
  EXPECT_NE(out.find("step    2/2"), std::string::npos) << out;
  // Registered under the advertised address, not the wildcard.
  EXPECT_EQ(out.find("at 0.0.0.0:"), std::string::npos) << out;
  for (auto& w : workers) {
    ASSERT_TRUE(w.Wait(30)) << w.Output();
    EXPECT_EQ(WEXITSTATUS(w.wait_status), 0) << w.Output();
  }
  EXPECT_NE(workers[1].Output().find("index from JOB_COMPLETION_INDEX"), std::string::npos)
      << workers[1].Output();
  EXPECT_NE(workers[2].Output().find("index from SLURM_PROCID"), std::string::npos)
      << workers[2].Output();
}

// `gyre launch slurm --dry-run` needs no Slurm: the job as it will run and the sbatch script,
// with the job's worker counts, GPUs and security flags; bad input is a clear error.
TEST(LaunchTest, SlurmDryRunWritesTheJobAndAHeterogeneousScript) {
  const std::string dir = MakeTempDir("launch");
  std::ofstream(dir + "/token") << "0123456789abcdef0123456789abcdef\n";
  auto run = [&](const std::vector<std::string>& args) {
    auto p = GyreProcess::Start(args, dir);
    EXPECT_TRUE(p.Wait(60));
    return std::make_pair(WEXITSTATUS(p.wait_status), p.Output());
  };
  auto [rc, out] = run({"launch", "slurm", kQuickstart, "--dry-run", "--set",
                        "job.output_dir=" + dir, "--set", "rollout.workers=3", "--partition", "gpu",
                        "--gpus-per-worker", "2", "--sbatch", "--qos=high"});
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("#SBATCH --ntasks=1 --cpus-per-task=2 --partition=gpu --qos=high\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("#SBATCH --ntasks=3 --cpus-per-task=2 --gpus-per-task=2 --partition=gpu"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("srun --het-group=2 --kill-on-bad-exit=0 \"$GYRE\" worker --role trainer"),
            std::string::npos)
      << out;
  auto job = ReadFile(dir + "/quickstart/slurm/job.yaml");
  EXPECT_NE(job.find("mode: \"external\""), std::string::npos) << job;
  EXPECT_NE(job.find("bind_host: \"0.0.0.0\""), std::string::npos) << job;
  // The script is valid bash.
  EXPECT_EQ(std::system(("bash -n " + dir + "/quickstart/slurm/job.sbatch").c_str()), 0);
  // Bad input: an unknown launcher, a bad number, a bad job; nothing is submitted.
  std::tie(rc, out) = run({"launch", "pbs", kQuickstart});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("LAUNCHER: pbs not in {slurm}"), std::string::npos) << out;
  std::tie(rc, out) = run({"launch", "slurm", kQuickstart, "--gpus-per-worker", "two"});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("--gpus-per-worker: 'two' is not a number"), std::string::npos) << out;
  std::tie(rc, out) = run({"launch", "slurm", kQuickstart, "--cpus-per-worker", "0"});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("--cpus-per-worker: 0 is not in [1, 1024]"), std::string::npos) << out;
  std::tie(rc, out) = run({"launch", "slurm", kQuickstart, "--sbatch", "qos=high"});
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("--sbatch: 'qos=high' is not an sbatch option"), std::string::npos) << out;
  std::tie(rc, out) = run({"launch", "slurm", kQuickstart, "--dry-run", "--set",
                           "cluster.auth_token_file=" + dir + "/token"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("cluster.auth_token_file needs TLS"), std::string::npos) << out;
}

// Mutual TLS and the cluster token (docs/security.md), with files from tools/make-certs.sh: a
// local job whose controller passes them to its workers trains; in external mode a worker
// without TLS, or with TLS but without the token, is refused with a message on both sides, and
// the workers that have them run the job.
std::string MakeCerts(const std::string& dir) {
  const std::string certs = dir + "/certs";
  const std::string cmd =
      std::string(GYRE_SOURCE_DIR) + "/tools/make-certs.sh " + certs + " > /dev/null";
  return std::system(cmd.c_str()) == 0 ? certs : "";
}

std::vector<std::string> SecureJob(const std::string& dir, const std::string& certs) {
  auto args = SmallJob(dir, 2);
  args.insert(args.end(), {"--set", "cluster.tls_cert=" + certs + "/node.pem", "--set",
                           "cluster.tls_key=" + certs + "/node.key", "--set",
                           "cluster.tls_ca=" + certs + "/ca.pem", "--set",
                           "cluster.auth_token_file=" + certs + "/token"});
  return args;
}

TEST(TrainTest, MutualTlsAndTheTokenOnEveryChannelOfALocalJob) {
  const std::string dir = MakeTempDir("tls_local");
  const std::string certs = MakeCerts(dir);
  ASSERT_FALSE(certs.empty());
  auto p = GyreProcess::Start(SecureJob(dir, certs), dir);
  ASSERT_TRUE(p.Wait(180)) << p.Output();
  const std::string out = p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("gRPC: mutual TLS"), std::string::npos) << out;
  EXPECT_NE(out.find("step    2/2"), std::string::npos) << out;
  EXPECT_EQ(out.find("refused"), std::string::npos) << out;
}

TEST(TrainTest, AWorkerWithoutTheCertificateOrTheTokenIsRefused) {
  const std::string dir = MakeTempDir("tls_external");
  const std::string certs = MakeCerts(dir);
  ASSERT_FALSE(certs.empty());
  auto port = rpc_port();
  auto args = SecureJob(dir, certs);
  args.insert(args.end(), {"--set", "cluster.mode=external", "--set",
                           "cluster.controller_port=" + std::to_string(port)});
  auto controller = GyreProcess::Start(args, dir);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto worker = [&](const std::string& sub, const std::string& role, int index,
                    std::vector<std::string> extra) {
    const std::string wdir = dir + "/" + sub;
    EXPECT_TRUE(MakeDirs(wdir).ok());
    std::vector<std::string> a = {"worker",       "--role", role, "--index", std::to_string(index),
                                  "--controller", address};
    a.insert(a.end(), extra.begin(), extra.end());
    return GyreProcess::Start(a, wdir);
  };
  // No TLS: its connection never completes; it gives up with a hint.
  auto plain = worker("plain", "rollout", 0, {"--register-timeout", "4"});
  ASSERT_TRUE(plain.Wait(60)) << plain.Output();
  EXPECT_NE(WEXITSTATUS(plain.wait_status), 0);
  EXPECT_NE(plain.Output().find("could not register with the controller"), std::string::npos)
      << plain.Output();
  EXPECT_NE(plain.Output().find("--tls-cert"), std::string::npos) << plain.Output();
  // TLS but no token: refused at once.
  const std::vector<std::string> tls = {"--tls-cert", certs + "/node.pem",
                                        "--tls-key",  certs + "/node.key",
                                        "--tls-ca",   certs + "/ca.pem"};
  auto no_token = worker("no_token", "rollout", 0, tls);
  ASSERT_TRUE(no_token.Wait(60)) << no_token.Output();
  EXPECT_NE(WEXITSTATUS(no_token.wait_status), 0);
  EXPECT_NE(no_token.Output().find("needs the cluster token: the call carried none"),
            std::string::npos)
      << no_token.Output();
  std::string controller_out;
  EXPECT_TRUE(controller
                  .WaitForOutput(
                      "refused a call to /gyre.v1.Controller/Register: the call carried no token",
                      30, &controller_out)
                  .size() > 0)
      << controller_out;
  EXPECT_NE(controller_out.find("tried to connect; it was refused"), std::string::npos)
      << controller_out;
  // The workers with everything run the job.
  std::vector<std::string> full = tls;
  full.insert(full.end(), {"--token-file", certs + "/token"});
  std::vector<GyreProcess> workers;
  workers.push_back(worker("t0", "trainer", 0, full));
  workers.push_back(worker("r0", "rollout", 0, full));
  workers.push_back(worker("r1", "rollout", 1, full));
  ASSERT_TRUE(controller.Wait(180)) << controller.Output();
  EXPECT_EQ(WEXITSTATUS(controller.wait_status), 0) << controller.Output();
  EXPECT_NE(controller.Output().find("step    2/2"), std::string::npos) << controller.Output();
  for (auto& w : workers) {
    ASSERT_TRUE(w.Wait(30)) << w.Output();
    EXPECT_EQ(WEXITSTATUS(w.wait_status), 0) << w.Output();
  }
}

// cluster.mode: external: nothing is spawned, but a rollout worker that a launcher starts again
// after it was declared dead registers with the same id and is caught up before it gets work.
TEST(TrainTest, ExternalWorkerThatRegistersAgainIsCaughtUp) {
  const std::string dir = MakeTempDir("external_restart");
  auto port = rpc_port();
  auto args = SmallJob(dir, 80);
  args.insert(
      args.end(),
      {"--set", "cluster.mode=external", "--set", "cluster.controller_port=" + std::to_string(port),
       "--set", "cluster.heartbeat_interval_s=0.5", "--set", "cluster.heartbeat_timeout_s=2"});
  auto controller = GyreProcess::Start(args, dir);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto start = [&](const std::string& role, int index, const std::string& tag) {
    const std::string wdir = dir + "/" + tag;
    if (!MakeDirs(wdir).ok()) std::abort();
    return GyreProcess::Start(
        {"worker", "--role", role, "--index", std::to_string(index), "--controller", address},
        wdir);
  };
  std::vector<GyreProcess> workers = {start("trainer", 0, "t0"), start("rollout", 0, "r0"),
                                      start("rollout", 1, "r1")};
  std::string out;
  ASSERT_FALSE(controller.WaitForOutput("step    3/80", 120, &out).empty()) << out;
  ::kill(workers[2].pid, SIGKILL);
  workers[2].Wait(10);
  ASSERT_FALSE(controller.WaitForOutput("worker rollout-1 died", 30, &out).empty()) << out;
  workers.push_back(start("rollout", 1, "r1b"));
  ASSERT_TRUE(controller.Wait(180)) << controller.Output();
  out = controller.Output();
  EXPECT_EQ(WEXITSTATUS(controller.wait_status), 0) << out;
  EXPECT_EQ(out.find("will be restarted"), std::string::npos) << "external mode spawns nothing";
  EXPECT_NE(out.find("rollout-1 registered again (pid " + std::to_string(workers[3].pid)),
            std::string::npos)
      << out;
  std::smatch m;
  const std::regex re("rollout-1 restarted \\(pid ([0-9]+)\\), caught up to policy v([0-9]+)");
  ASSERT_TRUE(std::regex_search(out, m, re)) << out;
  EXPECT_EQ(std::stoi(m[1]), workers[3].pid);
  const std::string log = workers[3].Output();
  const size_t received = log.find("received policy version " + std::string(m[2]) + " ");
  const size_t generated = log.find("first generate request, holding policy version " + m[2].str());
  ASSERT_NE(received, std::string::npos) << log;
  ASSERT_NE(generated, std::string::npos) << "the re-registered worker got no work: " << log;
  EXPECT_LT(received, generated) << log;
  for (const auto& s : MetricsRecords(dir + "/t/metrics.jsonl", "grpo")) {
    EXPECT_EQ(s["samples"], 64) << s.dump();
  }
  EXPECT_EQ(nlohmann::json::parse(ReadFile(dir + "/t/summary.json"))["worker_restarts"], 1);
  for (size_t i : {0, 1, 3}) {
    ASSERT_TRUE(workers[i].Wait(30)) << "worker did not stop with its job: " << workers[i].Output();
    EXPECT_EQ(WEXITSTATUS(workers[i].wait_status), 0) << workers[i].Output();
  }
}

// The model-directory commands on a directory `gyre init-model` writes.
TEST(ModelCommandsTest, InitModelTokenizeAndGenerate) {
  const std::string dir = MakeTempDir("modelcmds");
  const std::string model = dir + "/qwen2";
  auto p = GyreProcess::Start({"init-model", "--arch", "qwen2", "--out", model}, dir);
  ASSERT_TRUE(p.Wait(60));
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  EXPECT_TRUE(PathExists(model + "/tokenizer.json"));
  // Refuses to overwrite without --force.
  p = GyreProcess::Start({"init-model", "--arch", "qwen2", "--out", model}, dir + "/qwen2");
  ASSERT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);

  ASSERT_TRUE(MakeDirs(dir + "/t").ok());
  p = GyreProcess::Start({"tokenize", "--tokenizer", model, "--text", "Hi <|im_end|>"}, dir + "/t");
  ASSERT_TRUE(p.Wait(60));
  EXPECT_EQ(p.Output(), "[72,105,32,258]\n");  // bytes of "Hi ", then the special token

  ASSERT_TRUE(MakeDirs(dir + "/g").ok());
  p = GyreProcess::Start(
      {"generate", "--model", model, "--prompt", "Hello", "--max-new-tokens", "12", "--benchmark"},
      dir + "/g");
  ASSERT_TRUE(p.Wait(120));
  const std::string out = p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("12 generated (length)"), std::string::npos) << out;
  EXPECT_NE(out.find("(greedy tokens identical)"), std::string::npos) << out;

  ASSERT_TRUE(MakeDirs(dir + "/e").ok());
  p = GyreProcess::Start({"generate", "--model", dir + "/missing", "--prompt", "x"}, dir + "/e");
  ASSERT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  EXPECT_NE(p.Output().find("cannot open " + dir + "/missing/config.json"), std::string::npos)
      << p.Output();
}

// Partial rollouts: twice the groups in flight, each step stops at prompts_per_step finished
// groups and carries the rest (with their tokens) into the next step. A small running batch
// makes sure some groups are cut mid-generation.
TEST(TrainTest, PartialRolloutsCarryUnfinishedGroupsAcrossSteps) {
  const std::string dir = MakeTempDir("partial");
  auto args = SmallJob(dir, 3);
  for (const char* kv :
       {"rollout.partial_rollouts=true", "rollout.over_provision=2", "algorithm.max_staleness=1",
        "rollout.max_running=16", "rollout.weight_update_kv=keep",
        "rollout.stop_strings=[\"++\", \"==\"]"}) {
    args.push_back("--set");
    args.push_back(kv);
  }
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(240)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), 3u);
  int64_t resumed = 0, carried = 0;
  for (const auto& s : steps) {
    // Every step trains on at least prompts_per_step finished groups (minus stale samples).
    EXPECT_GE(s["samples"].get<int>() + s["stale_dropped"].get<int>(), 8 * 8) << s.dump();
    EXPECT_GT(s["prefix_shared_tokens"].get<int64_t>(), 0) << s.dump();
    resumed += s["partial_resumed_samples"].get<int64_t>();
    carried += s["partial_carried_groups"].get<int64_t>();
  }
  EXPECT_GT(carried, 0) << "no group was cut: the test does not exercise partial rollouts";
  EXPECT_GT(resumed, 0);

  // Without max_staleness the configuration is refused before anything starts.
  const std::string dir2 = MakeTempDir("partial_bad");
  auto bad = SmallJob(dir2, 1);
  bad.insert(bad.end(), {"--set", "rollout.partial_rollouts=true"});
  p = GyreProcess::Start(bad, dir2);
  ASSERT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  EXPECT_NE(p.Output().find("rollout.partial_rollouts needs algorithm.max_staleness >= 1"),
            std::string::npos)
      << p.Output();
}

// `gyre bench rollout` on a tiny model with small sizes: every figure is in the JSON.
TEST(BenchTest, RolloutWritesTheTableAndJson) {
  const std::string dir = MakeTempDir("bench_rollout");
  auto p = GyreProcess::Start(
      {"init-model", "--arch", "qwen2", "--out", dir + "/m", "--preset", "tiny"}, dir);
  ASSERT_TRUE(p.Wait(60));
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  ASSERT_TRUE(MakeDirs(dir + "/b").ok());
  p = GyreProcess::Start({"bench", "rollout", "--model", dir + "/m", "--groups", "6",
                          "--group-size", "4", "--prompt-len", "8", "--max-new-tokens", "40",
                          "--median-len", "8", "--max-running", "8", "--json", dir + "/b.json"},
                         dir + "/b");
  ASSERT_TRUE(p.Wait(120));
  const std::string out = p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << out;
  EXPECT_NE(out.find("continuous+prefix"), std::string::npos) << out;
  auto j = nlohmann::json::parse(ReadFile(dir + "/b.json"));
  EXPECT_EQ(j["benchmark"], "rollout");
  for (const char* key :
       {"groups", "group_size", "max_running", "kv_blocks", "response_len_mean"}) {
    EXPECT_TRUE(j["context"].contains(key)) << key;
  }
  // On the CPU in float32, a fourth row: continuous+prefix through the forward's ATen path.
  ASSERT_EQ(j["results"].size(), 4u);
  const std::vector<std::string> modes = {"static", "continuous", "continuous+prefix",
                                          "continuous+prefix/aten"};
  const double ceiling = j["context"]["ceiling_tokens_per_s"].get<double>();
  EXPECT_GT(j["context"]["matmul_peak_gflops"].get<double>(), 0.1);
  EXPECT_NEAR(ceiling,
              j["context"]["matmul_peak_gflops"].get<double>() * 1e9 /
                  (2.0 * j["context"]["matmul_params"].get<double>()),
              1e-9 * ceiling);
  for (size_t i = 0; i < modes.size(); ++i) {
    const auto& r = j["results"][i];
    EXPECT_EQ(r["mode"], modes[i]);
    for (const char* key : {"tokens_per_s", "batch_time_s", "speedup", "kv_util_mean",
                            "kv_util_peak", "tail_time_share", "prefill_tokens", "steps"}) {
      EXPECT_TRUE(r.contains(key)) << modes[i] << " " << key;
    }
    EXPECT_GT(r["tokens_per_s"].get<double>(), 0);
    EXPECT_GT(r["kv_util_peak"].get<double>(), 0);
    EXPECT_LE(r["kv_util_peak"].get<double>(), 1.0);
    // Every sample stops at its drawn length, whatever the scheduling.
    EXPECT_EQ(r["generated_tokens"], j["results"][0]["generated_tokens"]);
    // Same seeds and lengths: every mode samples the same tokens as static scheduling.
    EXPECT_EQ(r["samples_same_as_static"], r["samples"]) << modes[i];
    EXPECT_EQ(r["samples"], 6 * 4);
    // Speedups are over static's tokens/s in the same run.
    EXPECT_NEAR(r["speedup"].get<double>(),
                r["tokens_per_s"].get<double>() / j["results"][0]["tokens_per_s"].get<double>(),
                1e-9 * r["speedup"].get<double>());
    // The CPU row's fraction of the matmul ceiling: tokens/s over the ceiling's.
    EXPECT_NEAR(r["matmul_ceiling_fraction"].get<double>(),
                r["tokens_per_s"].get<double>() / ceiling,
                1e-9 * r["matmul_ceiling_fraction"].get<double>());
    EXPECT_TRUE(r["hbm_roofline_fraction"].is_null());
  }
  // Prefix sharing prefills each of the 6 prompts once instead of 4 times.
  EXPECT_EQ(j["results"][2]["prefill_tokens"], 6 * 8);
  EXPECT_EQ(j["results"][3]["prefill_tokens"], 6 * 8);
  EXPECT_EQ(j["results"][1]["prefill_tokens"], 6 * 4 * 8);

  auto [bad_rc, bad_out] =
      RunGyre({"bench", "rollout", "--model", dir + "/m", "--groups", "0"}, dir, 30);
  EXPECT_EQ(bad_rc, 2);
  EXPECT_EQ(bad_out,
            "gyre bench rollout: --groups: Value 0 not in range 1 to 1048576 (see gyre bench "
            "rollout --help)\n");
  std::tie(bad_rc, bad_out) = RunGyre({"bench", "rollout", "--groups", "2"}, dir, 30);
  EXPECT_EQ(bad_rc, 2);
  EXPECT_EQ(bad_out, "gyre bench rollout: --model is required (see gyre bench rollout --help)\n");
}

// `--help` of every benchmark and of sim-workers lists each of its options with its default (or,
// where the default depends on the device, says what it is), and nothing internal.
TEST(BenchTest, EveryHelpListsEachOptionWithItsDefault) {
  struct Command {
    std::vector<std::string> args;
    // An option (or positional) and a text its entry in the help must hold: "=DEFAULT" as
    // CLI11 shows a default, or the words that stand for one.
    std::vector<std::pair<std::string, std::string>> options;
  };
  const std::vector<std::pair<std::string, std::string>> cost = {
      {"--max-running", "=256"},           {"--step-base-s", "=0.015"},
      {"--step-per-seq-s", "=4e-05"},      {"--prefill-tokens-per-s", "=50000"},
      {"--length-median", "=600"},         {"--length-sigma", "=1"},
      {"--train-s-per-token", "=3.3e-05"}, {"--model-gb", "=15"},
      {"--publish-gb-per-s", "=25"}};
  std::vector<Command> commands = {
      {{"bench", "kernels"},
       {{"--device", "=auto"},
        {"--batch", "(default: 1,64,256,1024 on a GPU, 1,64 on a CPU)"},
        {"--vocab", "=151936"},
        {"--tokens", "=8192"},
        {"--response-len", "=1024"},
        {"--dtype", "(default: bf16 on a GPU, fp32 on a CPU)"},
        {"--min-time", "=0.2"},
        {"--only", "(default: all)"},
        {"--json", "FILE"}}},
      {{"bench", "weight-sync"},
       {{"--size", "=1GB"},
        {"--bucket-mb", "=16,64,256"},
        {"--receivers", "=1"},
        {"--transports", "=grpc,gloo"},
        {"--reps", "=3"},
        {"--deadline-s", "=300"},
        {"--json", "FILE"}}},
      {{"bench", "rollout"},
       {{"--model", "DIR REQUIRED"},
        {"--groups", "=32"},
        {"--group-size", "=8"},
        {"--prompt-len", "=32"},
        {"--median-len", "=24"},
        {"--sigma", "=1"},
        {"--max-new-tokens", "=256"},
        {"--max-running", "=64"},
        {"--block-size", "=16"},
        {"--max-step-tokens", "=512"},
        {"--kv-cache-mb", "=0"},
        {"--temperature", "=1"},
        {"--seed", "=1"},
        {"--threads", "=1"},
        {"--device", "=cpu"},
        {"--cuda-graphs", "=1"},
        {"--json", "FILE"}}},
      {{"bench", "train"},
       {{"--model", "(default: a random model)"},
        {"--vocab", "=4096"},
        {"--hidden", "=256"},
        {"--layers", "=4"},
        {"--batch", "=64"},
        {"--group", "=8"},
        {"--prompt-len", "=32"},
        {"--median-len", "=48"},
        {"--sigma", "=1"},
        {"--max-len", "=512"},
        {"--micro-batch", "=0"},
        {"--dtype", "=float32"},
        {"--steps", "=3"},
        {"--rounds", "=2"},
        {"--threads", "=0"},
        {"--seed", "=1"},
        {"--json", "FILE"}}},
      {{"bench", "memory"},
       {{"--vocab", "=32768"},
        {"--hidden", "=256"},
        {"--layers", "=2"},
        {"--batch", "=32"},
        {"--prompt-len", "=32"},
        {"--median-len", "=64"},
        {"--max-len", "=512"},
        {"--chunk", "=1024"},
        {"--threads", "=1"},
        {"--intermediate", "=0"},
        {"--configs", "=padded,unchunked,chunked,checkpointed"},
        {"--layouts", "SHARD:N"},
        {"--json", "FILE"}}},
      {{"bench", "dp-step"},
       {{"--ranks", "=2"},
        {"--vocab", "=4096"},
        {"--hidden", "=256"},
        {"--layers", "=4"},
        {"--batch", "=8"},
        {"--seq-len", "=64"},
        {"--micro-batches", "=1"},
        {"--mini-batches", "=1"},
        {"--bucket-mb", "=4"},
        {"--steps", "=5"},
        {"--rounds", "=3"},
        {"--threads", "=1"},
        {"--json", "FILE"}}},
      {{"bench", "e2e"},
       {{"--simulate", "simulated workers"},
        {"--config", "JOB.yaml"},
        {"--set", "KEY=VALUE"},
        {"--staleness", "=0,1,2,4"},
        {"--weight-updates", "=lockstep,between_steps"},
        {"--steps", "=4"},
        {"--out", "(default: a temporary directory, removed after)"},
        {"--json", "FILE"},
        {"--rollout-workers", "=64"},
        {"--trainer-workers", "=8"},
        {"--prompts-per-step", "=256"},
        {"--group-size", "=8"},
        {"--max-new-tokens", "=8192"},
        {"--time-scale", "=0.05"}}},
      {{"bench", "compare"},
       {{"A.json", "REQUIRED"}, {"B.json", "REQUIRED"}, {"--threshold", "=0.1"}}},
      {{"bench", "docs"}, {{"FILE.md", "REQUIRED"}, {"--check", "change nothing"}}},
      {{"sim-workers"},
       {{"--controller", "HOST:PORT REQUIRED"},
        {"--rollout", "=1"},
        {"--trainer", "=1"},
        {"--bind-host", "=127.0.0.1"},
        {"--register-timeout-s", "=60"},
        {"--time-scale", "=1"}}},
  };
  for (Command& c : commands) {
    if (c.args.back() == "e2e" || c.args.back() == "sim-workers") {
      c.options.insert(c.options.end(), cost.begin(), cost.end());
    }
  }
  const std::string dir = MakeTempDir("bench_help");
  for (const Command& c : commands) {
    std::vector<std::string> args = c.args;
    args.push_back("--help");
    const std::string name =
        "gyre " + (c.args.size() == 2 ? c.args[0] + " " + c.args[1] : c.args[0]);
    SCOPED_TRACE(name);
    const auto [rc, help] = RunGyre(args, dir, 30);
    EXPECT_EQ(rc, 0) << help;
    EXPECT_EQ(help.rfind("Usage: " + name + " ", 0), 0u) << help;
    // The help's entries: a line "  OPTION ..." and the lines under it indented further.
    std::vector<std::string> lines;
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    auto entry = [&](const std::string& option) -> std::string {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (lines[i].rfind("  " + option + " ", 0) != 0) continue;
        std::string text = lines[i];
        while (i + 1 < lines.size() && lines[i + 1].rfind("    ", 0) == 0) text += lines[++i];
        return text;
      }
      return "";
    };
    std::set<std::string> listed;
    for (const auto& [option, want] : c.options) {
      listed.insert(option);
      const std::string text = entry(option);
      EXPECT_NE(text, "") << option << " is not in the help:\n" << help;
      EXPECT_NE(text.find(want), std::string::npos) << option << ": " << text;
    }
    // Every option the help shows is one of the above: none without a checked default, no
    // internal ones (--child, --serve-receiver, ...).
    for (const std::string& line : lines) {
      if (line.rfind("  --", 0) != 0 || line.rfind("  --help", 0) == 0) continue;
      const std::string option = line.substr(2, line.find(' ', 2) - 2);
      EXPECT_TRUE(listed.count(option)) << option << " is not checked";
    }
  }
  (void)RemoveTree(dir);
}

// `gyre bench` itself lists its subcommands; an unknown or missing one is a usage error.
TEST(BenchTest, DispatcherHelpAndUsageErrors) {
  const std::string dir = MakeTempDir("bench_dispatch");
  auto [rc, help] = RunGyre({"bench", "--help"}, dir, 30);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(help.rfind("Usage: gyre bench ", 0), 0u) << help;
  for (const char* sub : {"kernels", "weight-sync", "rollout", "train", "memory", "dp-step", "e2e",
                          "compare", "docs"}) {
    EXPECT_NE(help.find(std::string("\n  ") + sub + " "), std::string::npos) << sub << "\n" << help;
  }
  auto [rc2, out] = RunGyre({"bench", "nonsense"}, dir, 30);
  EXPECT_EQ(rc2, 2);
  EXPECT_EQ(out, "gyre bench: unknown subcommand 'nonsense' (see gyre bench --help)\n");
  std::tie(rc2, out) = RunGyre({"bench"}, dir, 30);
  EXPECT_EQ(rc2, 2);
  EXPECT_NE(out.find("(see gyre bench --help)"), std::string::npos) << out;
  (void)RemoveTree(dir);
}

TEST(WorkerTest, WorkerWithoutControllerGivesUpWithAClearError) {
  const std::string dir = MakeTempDir("worker");
  auto p = GyreProcess::Start(
      {"worker", "--role", "rollout", "--controller", "127.0.0.1:1", "--register-timeout", "1"},
      dir);
  ASSERT_TRUE(p.Wait(30));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  EXPECT_NE(p.Output().find("could not register with the controller at 127.0.0.1:1"),
            std::string::npos)
      << p.Output();
}

}  // namespace
}  // namespace gyre::testing
