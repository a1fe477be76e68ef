#include "controller/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/file_util.h"
#include "config/config.h"
#include "controller/task.h"

namespace gyre::controller {
namespace {

std::string TempDir(const std::string& tag) {
  const std::string dir =
      TempDirectory() + "/gyre_checkpoint_" + tag + "_" + std::to_string(::getpid());
  EXPECT_TRUE(RemoveTree(dir).ok());
  EXPECT_TRUE(MakeDirs(dir).ok());
  return dir;
}

ControllerState SampleState() {
  ControllerState s;
  s.grpo_step = 12;
  s.policy_version = 217;
  s.next_group_id = 1234567890123ULL;
  s.problem_stream = "cursor 3 mt19937_64 1 2 3";
  s.accuracy_before_rl = 0.4125;
  s.final_mean_reward = 0.1 + 0.2;  // not representable exactly in decimal: must round-trip
  s.wall_seconds = 81.5;
  s.data_fingerprints = {{"data.train_path", "10 bytes, fnv1a64 0123456789abcdef"}};
  s.config_yaml = config::DumpJobConfig(JobConfig());
  s.metrics_jsonl = "{\"phase\":\"grpo\",\"step\":1}\n{\"phase\":\"grpo\",\"step\":2}\n";
  return s;
}

// Writes a complete-looking checkpoint directory for `step` (controller part only).
void MakeCheckpoint(const std::string& root, int step) {
  const std::string dir = root + "/" + CheckpointName(step);
  ASSERT_TRUE(MakeDirs(dir + ".tmp/trainer").ok());
  ControllerState s = SampleState();
  s.grpo_step = step;
  ASSERT_TRUE(WriteControllerState(dir + ".tmp", s).ok());
  ASSERT_TRUE(CommitCheckpoint(dir + ".tmp", dir, 1000).ok());
}

TEST(CheckpointTest, NamesSortAndParse) {
  EXPECT_EQ(CheckpointName(0), "step-000000");
  EXPECT_EQ(CheckpointName(42), "step-000042");
  EXPECT_EQ(CheckpointName(1234567), "step-1234567");
  int step = -1;
  EXPECT_TRUE(ParseCheckpointName("step-000042", &step));
  EXPECT_EQ(step, 42);
  EXPECT_TRUE(ParseCheckpointName("step-1234567", &step));
  EXPECT_EQ(step, 1234567);
  for (const char* bad : {"step-000042.tmp", "step-42", "step-00004x", "steps-000042", "latest",
                          "step-0000000000042"}) {
    EXPECT_FALSE(ParseCheckpointName(bad, &step)) << bad;
  }
}

TEST(CheckpointTest, ControllerStateRoundTrips) {
  const std::string dir = TempDir("roundtrip");
  const ControllerState a = SampleState();
  ASSERT_TRUE(WriteControllerState(dir, a).ok());
  auto b = ReadControllerState(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->grpo_step, a.grpo_step);
  EXPECT_EQ(b->policy_version, a.policy_version);
  EXPECT_EQ(b->next_group_id, a.next_group_id);
  EXPECT_EQ(b->problem_stream, a.problem_stream);
  EXPECT_EQ(b->accuracy_before_rl, a.accuracy_before_rl);
  EXPECT_EQ(b->final_mean_reward, a.final_mean_reward);
  EXPECT_EQ(b->wall_seconds, a.wall_seconds);
  EXPECT_EQ(b->data_fingerprints, a.data_fingerprints);
  EXPECT_EQ(b->config_yaml, a.config_yaml);
  EXPECT_EQ(b->metrics_jsonl, a.metrics_jsonl);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(CheckpointTest, CorruptControllerStateIsRejectedNamingTheFile) {
  const std::string dir = TempDir("corrupt");
  ASSERT_TRUE(WriteControllerState(dir, SampleState()).ok());
  const std::string good = *ReadFileToString(dir + "/controller.json");
  struct Case {
    std::string json, why;
  };
  std::string missing_field = good;
  missing_field.replace(missing_field.find("\"next_group_id\""), 15, "\"next_group_ix\"");
  std::string negative = good;
  negative.replace(negative.find("\"policy_version\": 217"), 21, "\"policy_version\": -1");
  for (const Case& c :
       std::vector<Case>{{"{\"format\": \"gyre.controller_state\"", "not valid JSON"},
                         {"[]", "not a controller state"},
                         {missing_field, "next_group_id"},
                         {negative, "policy_version"}}) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", c.json).ok());
    auto s = ReadControllerState(dir);
    ASSERT_FALSE(s.ok()) << c.why;
    EXPECT_NE(s.status().message().find(dir + "/controller.json"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(c.why), std::string::npos) << s.status();
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", good).ok());
  ASSERT_TRUE(ReadControllerState(dir).ok());
  ASSERT_TRUE(RemoveTree(dir + "/metrics.jsonl").ok());
  auto s = ReadControllerState(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(dir + "/metrics.jsonl"), std::string::npos) << s.status();
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// The newest complete checkpoint wins; an unfinished .tmp write and unrelated files are ignored.
TEST(CheckpointTest, LatestIgnoresUnfinishedWrites) {
  const std::string root = TempDir("latest");
  auto none = FindLatestCheckpoint(root);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(root), std::string::npos);
  EXPECT_EQ(FindLatestCheckpoint(root + "/missing").status().code(), StatusCode::kNotFound);

  MakeCheckpoint(root, 2);
  MakeCheckpoint(root, 10);
  MakeCheckpoint(root, 9);
  ASSERT_TRUE(MakeDirs(root + "/step-000011.tmp/trainer").ok());  // a write cut short
  ASSERT_TRUE(WriteFileAtomic(root + "/step-000099", "a file, not a checkpoint").ok());
  ASSERT_TRUE(MakeDirs(root + "/notes").ok());
  auto latest = FindLatestCheckpoint(root);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, root + "/step-000010");
  EXPECT_TRUE(RemoveTree(root).ok());
}

// Committing keeps the newest K, deletes older ones only after the new one is in place, and
// clears leftovers of interrupted writes.
TEST(CheckpointTest, CommitKeepsTheLastK) {
  const std::string root = TempDir("keep");
  ASSERT_TRUE(MakeDirs(root + "/step-000003.tmp").ok());  // left by a crash
  for (int step : {1, 2, 4, 5, 6}) {
    const std::string dir = root + "/" + CheckpointName(step);
    ASSERT_TRUE(MakeDirs(dir + ".tmp/trainer").ok());
    ASSERT_TRUE(WriteControllerState(dir + ".tmp", SampleState()).ok());
    ASSERT_TRUE(CommitCheckpoint(dir + ".tmp", dir, 2).ok());
    EXPECT_TRUE(IsDirectory(dir));
    EXPECT_FALSE(PathExists(dir + ".tmp"));
  }
  auto names = ListDirectory(root);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"step-000005", "step-000006"}));
  EXPECT_TRUE(PathExists(root + "/step-000006/controller.json"));
  EXPECT_TRUE(PathExists(root + "/step-000006/trainer"));
  EXPECT_TRUE(RemoveTree(root).ok());
}

TEST(CheckpointTest, ResumeNeedsTheSettingsThatChangeResults) {
  JobConfig saved;
  JobConfig current = saved;
  // Where and how the run is recorded, connected or how long it runs: allowed to change.
  current.job.log_level = "debug";
  current.job.output_dir = "/elsewhere";
  current.trainer.steps = saved.trainer.steps + 100;
  current.trainer.checkpoint_every = 7;
  current.trainer.checkpoint_keep_last = 1;
  current.cluster.rpc_timeout_s = 5;
  current.cluster.controller_port = 4242;
  EXPECT_TRUE(CheckResumeCompatible(saved, current, "ckpt/config.yaml").ok());

  current.trainer.lr = saved.trainer.lr * 2;
  Status s = CheckResumeCompatible(saved, current, "ckpt/config.yaml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ckpt/config.yaml"), std::string::npos) << s;
  EXPECT_NE(s.message().find("trainer.lr: 0.001, this job has 0.002"), std::string::npos) << s;

  current = saved;
  current.job.seed = saved.job.seed + 1;
  s = CheckResumeCompatible(saved, current, "x");
  EXPECT_NE(s.message().find("job.seed"), std::string::npos) << s;
  current = saved;
  current.rollout.sampling.temperature = 0.7;
  s = CheckResumeCompatible(saved, current, "x");
  EXPECT_NE(s.message().find("rollout.sampling.temperature"), std::string::npos) << s;
}

TEST(CheckpointTest, DataFingerprintsFollowTheFiles) {
  const std::string dir = TempDir("data");
  DataSection data;
  auto none = DataFingerprints(data);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  data.train_path = dir + "/train.jsonl";
  ASSERT_TRUE(WriteFileAtomic(data.train_path, "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n").ok());
  auto a = DataFingerprints(data);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->count("data.train_path"), 1u);
  ASSERT_TRUE(WriteFileAtomic(data.train_path, "{\"prompt\": \"1+1=\", \"answer\": \"3\"}\n").ok());
  auto b = DataFingerprints(data);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);  // same size, other content
  ASSERT_TRUE(RemoveTree(data.train_path).ok());
  EXPECT_FALSE(DataFingerprints(data).ok());
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// The problem stream continues exactly where it was saved, for generated and dataset problems.
TEST(CheckpointTest, ProblemStreamStateRoundTrips) {
  const std::string dir = TempDir("stream");
  DataSection generated;
  generated.max_digits = 3;
  DataSection dataset;
  dataset.train_path = dir + "/train.jsonl";
  std::string lines;
  for (int i = 0; i < 7; ++i) {
    lines += "{\"prompt\": \"" + std::to_string(i) + "+1=\", \"answer\": \"" +
             std::to_string(i + 1) + "\"}\n";
  }
  ASSERT_TRUE(WriteFileAtomic(dataset.train_path, lines).ok());
  for (const DataSection& data : {generated, dataset}) {
    auto a = ProblemSource::Create(data, 5);
    ASSERT_TRUE(a.ok()) << a.status();
    for (int i = 0; i < 11; ++i) a->Next();
    const std::string state = a->SaveState();
    auto b = ProblemSource::Create(data, 5);
    ASSERT_TRUE(b.ok());
    const std::string fresh = b->SaveState();
    EXPECT_FALSE(b->RestoreState("cursor 3 mt19937_64 garbage").ok());
    EXPECT_FALSE(b->RestoreState("").ok());
    EXPECT_EQ(b->SaveState(), fresh) << "a rejected state changed the stream";
    ASSERT_TRUE(b->RestoreState(state).ok());
    for (int i = 0; i < 20; ++i) EXPECT_EQ(a->Next().prompt, b->Next().prompt) << i;
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre::controller
