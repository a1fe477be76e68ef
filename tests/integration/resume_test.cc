// Checkpoint and resume with real processes: a job killed with SIGKILL (controller and workers at
// once) and resumed with `gyre train --resume` ends with the same weights, byte for byte, and the
// same metrics as the same job run without interruption; also with partial rollouts, whose groups
// in flight at the checkpoint must be carried through it.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "integration/run_util.h"
#include "test_paths.h"

namespace gyre::testing {
namespace {

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";
constexpr int kSteps = 6;

// A small job with an evaluation and a checkpoint every 2 GRPO steps.
std::vector<std::string> Job(const std::string& output_dir) {
  return {
      "train", kQuickstart, "--set", "job.output_dir=" + output_dir, "--set", "job.name=t", "--set",
      "trainer.warmup_sft_steps=5", "--set", "trainer.steps=" + std::to_string(kSteps), "--set",
      "rollout.prompts_per_step=8", "--set", "data.eval_size=20", "--set", "metrics.eval_every=2",
      "--set", "trainer.checkpoint_every=2", "--set", "trainer.checkpoint_keep_last=2",
      // The KL term's reference policy is part of the state a resume must restore.
      "--set", "algorithm.kl=k3", "--set", "algorithm.kl_coef=0.05", "--set", kEveryGroupTrains};
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Runs `gyre args...` as a process group (output in dir_b/gyre.out), waits up to `timeout_s` for
// its run's checkpoint after GRPO step 2, `linger_ms` more, then SIGKILLs the whole group and
// reaps it. Returns the job's output; *wait_status is its leader's wait status.
std::string KillOnceCheckpointed(const std::vector<std::string>& args, const std::string& dir_b,
                                 int timeout_s, int linger_ms, int* wait_status) {
  const std::string checkpoint = dir_b + "/t/checkpoints/step-000002";
  const pid_t job = StartGroupLeader(args, dir_b + "/gyre.out");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (!IsDirectory(checkpoint) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
  EXPECT_EQ(::kill(-job, SIGKILL), 0);
  EXPECT_EQ(::waitpid(job, wait_status, 0), job);
  return ReadFile(dir_b + "/gyre.out");
}

// `gyre ledger args...` as JSON (the command must succeed).
nlohmann::json Ledger(const std::vector<std::string>& args, const std::string& dir) {
  std::vector<std::string> all = {"ledger"};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("--json");
  const std::string out_dir = dir + "/ledger-cmd";  // GyreProcess appends to out_dir/gyre.out
  EXPECT_TRUE(MakeDirs(out_dir).ok());
  (void)RemoveTree(out_dir + "/gyre.out");
  auto p = GyreProcess::Start(all, out_dir);
  EXPECT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  try {
    return nlohmann::json::parse(p.Output());
  } catch (const std::exception& e) {
    ADD_FAILURE() << "gyre ledger printed no JSON: " << p.Output();
    return nlohmann::json();
  }
}

// `gyre ledger RUN --sample ID`: the sample's history has exactly one trained event.
void ExpectOneTrainedEvent(const std::string& run, const std::string& dir, uint64_t id) {
  const auto h = Ledger({run, "--sample", std::to_string(id)}, dir);
  int trained = 0;
  for (const auto& e : h["events"]) trained += e["to"] == "trained";
  EXPECT_EQ(trained, 1) << h.dump();
}

// Each sample of the run's ledger trained exactly once, and which prompts: what a resume must
// neither lose nor repeat.
void ExpectEveryPromptTrainedOnceAsIn(const std::string& run_a, const std::string& run_b,
                                      const std::string& dir, int64_t samples) {
  const auto ca = Ledger({run_a}, dir);
  const auto cb = Ledger({run_b}, dir);
  EXPECT_EQ(ca["by_state"]["trained"], samples);
  EXPECT_EQ(cb["by_state"]["trained"], samples) << cb.dump();
  EXPECT_EQ(cb["samples"], ca["samples"]) << "samples lost or added by the resume";
  EXPECT_EQ(cb["by_state"], ca["by_state"]);
  const auto pa = Ledger({run_a, "--prompts", "--top", "0"}, dir);
  const auto pb = Ledger({run_b, "--prompts", "--top", "0"}, dir);
  EXPECT_EQ(pa["rows"], pb["rows"]) << "prompts trained a different number of times";
  const auto ta = Ledger({run_b, "--state", "trained", "--top", "0"}, dir);
  ASSERT_EQ(ta["rows"].size(), static_cast<size_t>(samples));
  // One sample's whole history: one trained event, none repeated.
  ExpectOneTrainedEvent(run_b, dir, ta["rows"][0]["sample_id"].get<uint64_t>());
}

// A metrics line without its wall-clock fields.
nlohmann::json Deterministic(nlohmann::json j) {
  for (const char* k : {"tokens_per_s", "step_time_s", "generate_s", "train_s", "publish_s",
                        "step_compute_s", "seconds", "wall_seconds", "rollout_busy_s",
                        "rollout_idle_fraction", "rollout_step_idle_fraction"}) {
    j.erase(k);
  }
  return j;
}

TEST(ResumeTest, KilledJobResumesToTheUninterruptedResult) {
  const std::string dir = MakeTempDir("resume");
  ASSERT_TRUE(MakeDirs(dir + "/a").ok() && MakeDirs(dir + "/b").ok());

  // The reference: the same job, uninterrupted, in a directory where an earlier run left a
  // checkpoint (a new run without --resume drops it).
  ASSERT_TRUE(MakeDirs(dir + "/a/t/checkpoints/step-000099/trainer").ok());
  auto a = GyreProcess::Start(Job(dir + "/a"), dir + "/a");
  ASSERT_TRUE(a.Wait(120)) << a.Output();
  ASSERT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();
  const std::string run_a = dir + "/a/t";
  auto listing = ListDirectory(run_a + "/checkpoints");
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(*listing, (std::vector<std::string>{"step-000004", "step-000006"})) << "keep_last 2";

  // Kill the whole job (controller and workers, SIGKILL) once it has a checkpoint after step 2.
  const std::string run_b = dir + "/b/t";
  int st = 0;
  const std::string killed_output = KillOnceCheckpointed(Job(dir + "/b"), dir + "/b", 90, 0, &st);
  ASSERT_TRUE(IsDirectory(run_b + "/checkpoints/step-000002")) << killed_output;
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << killed_output;
  const auto workers = WorkerPids(killed_output);
  EXPECT_EQ(workers.size(), 3u) << killed_output;
  EXPECT_TRUE(AllGone(workers, 10));
  ASSERT_FALSE(PathExists(run_b + "/final")) << "the job finished before it was killed";
  const size_t steps_before_kill = MetricsRecords(run_b + "/metrics.jsonl", "grpo").size();
  EXPECT_LT(steps_before_kill, static_cast<size_t>(kSteps));

  // A setting that changes results is refused, and nothing in the run directory changes.
  const std::string metrics_before = ReadFile(run_b + "/metrics.jsonl");
  auto refused =
      GyreProcess::Start(With(Job(dir + "/b"), {"--resume", "--set", "trainer.lr=0.01"}), dir);
  ASSERT_TRUE(refused.Wait(60));
  EXPECT_EQ(WEXITSTATUS(refused.wait_status), 1);
  EXPECT_NE(refused.Output().find("config.yaml: the checkpoint was written with trainer.lr: "
                                  "0.0005, this job has 0.01"),
            std::string::npos)
      << refused.Output();
  EXPECT_EQ(ReadFile(run_b + "/metrics.jsonl"), metrics_before);

  // Resume to the end.
  ASSERT_TRUE(MakeDirs(dir + "/b2").ok());
  auto b = GyreProcess::Start(With(Job(dir + "/b"), {"--resume"}), dir + "/b2");
  ASSERT_TRUE(b.Wait(120)) << b.Output();
  const std::string out = b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << out;
  EXPECT_NE(out.find("resumed from " + run_b + "/checkpoints/step-00000"), std::string::npos)
      << out;
  EXPECT_EQ(out.find("warmup"), std::string::npos) << "the warm-up ran again: " << out;

  // Bit-identical weights, and the same metrics for every step, restored or recomputed.
  const std::string final_a = ReadFile(run_a + "/final/model.safetensors");
  ASSERT_GT(final_a.size(), 100000u);
  EXPECT_TRUE(final_a == ReadFile(run_b + "/final/model.safetensors"))
      << "resumed weights differ from the uninterrupted run's";
  for (const char* phase : {"warmup", "grpo", "eval"}) {
    const auto ma = MetricsRecords(run_a + "/metrics.jsonl", phase);
    const auto mb = MetricsRecords(run_b + "/metrics.jsonl", phase);
    ASSERT_EQ(ma.size(), mb.size()) << phase;
    for (size_t i = 0; i < ma.size(); ++i) {
      EXPECT_EQ(Deterministic(ma[i]), Deterministic(mb[i])) << phase << " line " << i;
    }
  }
  EXPECT_EQ(MetricsRecords(run_a + "/metrics.jsonl", "grpo").size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(MetricsRecords(run_b + "/metrics.jsonl", "resume").size(), 1u);
  auto sa = nlohmann::json::parse(ReadFile(run_a + "/summary.json"));
  auto sb = nlohmann::json::parse(ReadFile(run_b + "/summary.json"));
  EXPECT_EQ(Deterministic(sa), Deterministic(sb));
  EXPECT_EQ(sb["grpo_steps"], kSteps);
  // The sample ledger: as many samples, each trained once, from the same prompts.
  ExpectEveryPromptTrainedOnceAsIn(run_a, run_b, dir, int64_t{kSteps} * 8 * 8);
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// Partial rollouts: each step launches twice the groups it trains on and carries the unfinished
// ones, with their tokens, into the next step. A small running batch makes sure groups are cut
// mid-generation, so the checkpoint the job resumes from holds carried samples with tokens.
// One-digit sums after a longer warm-up earn rewards (about a third of the samples), so the
// updates, and with them the final weights, depend on which samples each step trains on.
std::vector<std::string> PartialJob(const std::string& output_dir) {
  return With(Job(output_dir),
              {"--set", "rollout.partial_rollouts=true", "--set", "rollout.over_provision=2",
               "--set", "algorithm.max_staleness=1", "--set", "rollout.max_running=16", "--set",
               "data.max_digits=1", "--set", "trainer.warmup_sft_steps=60"});
}

TEST(ResumeTest, KilledPartialRolloutJobResumesItsCarriedGroupsExactly) {
  const std::string dir = MakeTempDir("resume_partial");
  ASSERT_TRUE(MakeDirs(dir + "/a").ok() && MakeDirs(dir + "/b").ok());

  // The reference, uninterrupted.
  auto a = GyreProcess::Start(PartialJob(dir + "/a"), dir + "/a");
  ASSERT_TRUE(a.Wait(180)) << a.Output();
  ASSERT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();
  const std::string run_a = dir + "/a/t";
  int64_t carried_a = 0, resumed_a = 0;
  for (const auto& m : MetricsRecords(run_a + "/metrics.jsonl", "grpo")) {
    carried_a += m["partial_carried_groups"].get<int64_t>();
    resumed_a += m["partial_resumed_samples"].get<int64_t>();
  }
  ASSERT_GT(carried_a, 0) << "no group was carried: the test does not exercise partial rollouts";
  ASSERT_GT(resumed_a, 0);
  for (const auto& m : MetricsRecords(run_a + "/metrics.jsonl", "grpo")) {
    EXPECT_GT(m["mean_reward"].get<double>(), 0) << "a step without rewards leaves the weights "
                                                    "independent of its samples: "
                                                 << m.dump();
  }

  // Kill the whole job once it has a checkpoint after a GRPO step.
  const std::string run_b = dir + "/b/t";
  int st = 0;
  const std::string killed_output =
      KillOnceCheckpointed(PartialJob(dir + "/b"), dir + "/b", 120, 0, &st);
  ASSERT_TRUE(IsDirectory(run_b + "/checkpoints/step-000002")) << killed_output;
  ASSERT_FALSE(PathExists(run_b + "/final")) << "the job finished before it was killed";

  // The checkpoint the resume will take holds carried groups, some with tokens generated.
  auto names = ListDirectory(run_b + "/checkpoints");
  ASSERT_TRUE(names.ok());
  std::string newest;
  for (const auto& n : *names) {
    if (n.size() == 11 && n.rfind("step-", 0) == 0) newest = n;
  }
  const std::string ckpt = run_b + "/checkpoints/" + newest;
  const auto manifest =
      nlohmann::json::parse(ReadFile(ckpt + "/controller.json"))["carried_groups"];
  EXPECT_GT(manifest["groups"].get<int64_t>(), 0) << manifest.dump();
  EXPECT_GT(manifest["unfinished_tokens"].get<int64_t>(), 0) << manifest.dump();
  const std::string carried_path = ckpt + "/carried_groups.pb";
  const std::string carried = ReadFile(carried_path);
  ASSERT_EQ(carried.size(), manifest["bytes"].get<size_t>());

  // A truncated carry section is refused with an error naming it, and nothing changes.
  const std::string metrics_before = ReadFile(run_b + "/metrics.jsonl");
  ASSERT_TRUE(WriteFileAtomic(carried_path, carried.substr(0, carried.size() - 7)).ok());
  auto refused = GyreProcess::Start(With(PartialJob(dir + "/b"), {"--resume"}), dir);
  ASSERT_TRUE(refused.Wait(60));
  EXPECT_EQ(WEXITSTATUS(refused.wait_status), 1);
  EXPECT_NE(refused.Output().find(carried_path + ": " + std::to_string(carried.size() - 7) +
                                  " bytes, but controller.json records " +
                                  std::to_string(carried.size()) +
                                  " (a truncated or replaced "
                                  "file)"),
            std::string::npos)
      << refused.Output();
  EXPECT_EQ(ReadFile(run_b + "/metrics.jsonl"), metrics_before);
  EXPECT_TRUE(WorkerPids(refused.Output()).empty()) << "workers started for a refused resume";
  ASSERT_TRUE(WriteFileAtomic(carried_path, carried).ok());

  // Resume to the end: the carried groups continue, and everything matches the reference.
  ASSERT_TRUE(MakeDirs(dir + "/b2").ok());
  auto b = GyreProcess::Start(With(PartialJob(dir + "/b"), {"--resume"}), dir + "/b2");
  ASSERT_TRUE(b.Wait(180)) << b.Output();
  const std::string out = b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << out;
  EXPECT_NE(out.find("resumed from " + ckpt), std::string::npos) << out;
  EXPECT_NE(out.find("continuing " + std::to_string(manifest["groups"].get<int64_t>()) +
                     " carried partial-rollout group(s)"),
            std::string::npos)
      << out;
  const std::string final_a = ReadFile(run_a + "/final/model.safetensors");
  ASSERT_GT(final_a.size(), 100000u);
  EXPECT_TRUE(final_a == ReadFile(run_b + "/final/model.safetensors"))
      << "resumed weights differ from the uninterrupted run's";
  for (const char* phase : {"warmup", "grpo", "eval"}) {
    const auto ma = MetricsRecords(run_a + "/metrics.jsonl", phase);
    const auto mb = MetricsRecords(run_b + "/metrics.jsonl", phase);
    ASSERT_EQ(ma.size(), mb.size()) << phase;
    for (size_t i = 0; i < ma.size(); ++i) {
      EXPECT_EQ(Deterministic(ma[i]), Deterministic(mb[i])) << phase << " line " << i;
    }
  }
  EXPECT_EQ(MetricsRecords(run_b + "/metrics.jsonl", "grpo").size(), static_cast<size_t>(kSteps));
  int64_t trained = 0;
  for (const auto& m : MetricsRecords(run_a + "/metrics.jsonl", "grpo"))
    trained += m["samples"].get<int64_t>();
  ExpectEveryPromptTrainedOnceAsIn(run_a, run_b, dir, trained);
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// rollout.async: kill -9 of the whole job after a checkpoint, then --resume. Generation ran
// ahead, so the checkpoint holds admitted groups not yet trained (finished or never sent); the
// resumed job trains them and admits no group twice. Timing decides which groups each step
// trains, so the runs are not bit-identical; the ledger's account must be exact: the admission
// rule's 64 groups (8 per step for k + 6 steps), every sample trained once or dropped at the end.
TEST(ResumeTest, KilledAsyncJobResumesWithoutLosingOrRepeatingASample) {
  const std::string dir = MakeTempDir("resume_async");
  ASSERT_TRUE(MakeDirs(dir + "/b").ok());
  const std::vector<std::string> async_flags = {"--set", "rollout.async=true", "--set",
                                                "algorithm.max_staleness=2"};
  const std::string run_b = dir + "/b/t";
  // Killed 100 ms after the step-2 checkpoint, so the ledger has events past it (a GRPO step of
  // this job takes about 50 ms here; the whole job ends about 350 ms after that checkpoint).
  int st = 0;
  const std::string killed_output =
      KillOnceCheckpointed(With(Job(dir + "/b"), async_flags), dir + "/b", 90, 100, &st);
  ASSERT_TRUE(IsDirectory(run_b + "/checkpoints/step-000002")) << killed_output;
  ASSERT_FALSE(PathExists(run_b + "/final")) << "the job finished before it was killed";
  EXPECT_TRUE(AllGone(WorkerPids(killed_output), 10));
  const auto saved =
      nlohmann::json::parse(ReadFile(run_b + "/checkpoints/step-000002/controller.json"));
  EXPECT_EQ(saved["async_admitted"], (2 + 2) * 8) << saved.dump();  // admitted by step 2
  EXPECT_GT(saved["carried_groups"]["groups"].get<int64_t>(), 0) << saved.dump();
  EXPECT_EQ(saved["carried_groups"]["unfinished_samples"], 0) << saved.dump();

  ASSERT_TRUE(MakeDirs(dir + "/b2").ok());
  auto b = GyreProcess::Start(With(With(Job(dir + "/b"), async_flags), {"--resume"}), dir + "/b2");
  ASSERT_TRUE(b.Wait(180)) << b.Output();
  const std::string out = b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << out;
  EXPECT_NE(out.find("resumed from " + run_b + "/checkpoints/step-00000"), std::string::npos)
      << out;
  EXPECT_NE(out.find("admitted group(s) not yet trained (rollout.async)"), std::string::npos)
      << out;
  const auto steps = MetricsRecords(run_b + "/metrics.jsonl", "grpo");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (const auto& s : steps) {
    EXPECT_EQ(s["samples"], 64) << s.dump();
    for (const auto& [age, count] : s["staleness"].items()) EXPECT_LE(std::stoi(age), 2);
  }
  const auto counts = Ledger({run_b}, dir);
  EXPECT_EQ(counts["samples"], (2 + kSteps) * 8 * 8) << counts.dump();
  EXPECT_EQ(counts["by_state"]["trained"], kSteps * 8 * 8) << counts.dump();
  EXPECT_EQ(counts["by_state"]["dropped"], 2 * 8 * 8) << counts.dump();
  const auto trained = Ledger({run_b, "--state", "trained", "--top", "0"}, dir);
  std::set<uint64_t> ids;
  for (const auto& r : trained["rows"]) ids.insert(r["sample_id"].get<uint64_t>());
  EXPECT_EQ(ids.size(), static_cast<size_t>(kSteps * 8 * 8)) << "a sample was trained twice";
  ExpectOneTrainedEvent(run_b, dir, trained["rows"][0]["sample_id"].get<uint64_t>());
  EXPECT_TRUE(AllGone(WorkerPids(out), 10));
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(ResumeTest, ResumeWithoutCheckpointsFailsClearly) {
  const std::string dir = MakeTempDir("noresume");
  auto p = GyreProcess::Start(With(Job(dir), {"--resume"}), dir);
  ASSERT_TRUE(p.Wait(60));
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1);
  EXPECT_NE(p.Output().find("gyre: job failed: no checkpoints to resume from: " + dir +
                            "/t/checkpoints does not exist (the first checkpoint is written "
                            "after the warm-up)"),
            std::string::npos)
      << p.Output();
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre::testing
