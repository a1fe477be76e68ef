#include "controller/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

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
  s.ledger_sequence = 4242;
  s.data_fingerprints = {{"data.train_path", "10 bytes, fnv1a64 0123456789abcdef"}};
  s.config_yaml = config::DumpJobConfig(JobConfig());
  s.metrics_jsonl = "{\"phase\":\"grpo\",\"step\":1}\n{\"phase\":\"grpo\",\"step\":2}\n";
  return s;
}

// A sample of `group` as a rollout worker returns it: `tokens` response tokens drawn at policy
// versions 215, 216, ... (capped at 217).
v1::Sample MakeSample(const v1::PromptGroup& group, int index, int tokens, bool finished) {
  v1::Sample s;
  s.set_sample_id(group.first_sample_id() + static_cast<uint64_t>(index));
  s.set_group_id(group.group_id());
  *s.mutable_prompt_ids() = group.prompt_ids();
  for (int t = 0; t < tokens; ++t) {
    s.add_response_ids(3 + (index * 7 + t) % 11);
    s.add_logprobs(-0.1f * static_cast<float>(t + 1) - 1e-7f * static_cast<float>(index));
    s.add_kept_mass(1.0f - 0.01f * static_cast<float>(t));
    s.add_versions(std::min<int64_t>(215 + t, 217));
    s.add_loss_mask(1.0f);
  }
  s.set_seed(group.seed() + static_cast<uint64_t>(index));
  s.set_kv_version(215);
  s.set_finish_reason(finished ? (index % 2 ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH)
                               : v1::FINISH_REASON_ABORT);
  return s;
}

// Two carried groups of n = 4: one with two finished and two unfinished samples (one of them
// with no token yet), one never started.
std::vector<v1::CarriedGroup> SampleCarried() {
  std::vector<v1::CarriedGroup> out;
  for (uint64_t gid : {1234567890100ULL, 1234567890105ULL}) {
    v1::CarriedGroup cg;
    v1::PromptGroup* g = cg.mutable_group();
    g->set_group_id(gid);
    for (int32_t id : {1, 17, 4, 9}) g->add_prompt_ids(id);
    g->set_n(4);
    g->set_first_sample_id(gid * 4);
    g->set_seed(0x9e3779b97f4a7c15ULL ^ gid);
    cg.set_prompt("17+4=");
    cg.set_answer("21");
    cg.set_worker("rollout-1");
    if (gid == 1234567890100ULL) {
      *cg.add_finished() = MakeSample(*g, 0, 3, true);
      *cg.add_finished() = MakeSample(*g, 2, 2, true);
      *cg.add_unfinished() = MakeSample(*g, 1, 4, false);
      *cg.add_unfinished() = MakeSample(*g, 3, 0, false);
    } else {
      cg.set_prompt("[{\"role\": \"user\", \"content\": \"17+4=\"}]");
      cg.set_prompt_is_messages(true);
      cg.set_worker("");
    }
    out.push_back(std::move(cg));
  }
  return out;
}

bool SameProto(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return a.SerializeAsString() == b.SerializeAsString();
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
  EXPECT_TRUE(b->carried_groups.empty());
  EXPECT_EQ(b->format_version, 5);
  EXPECT_TRUE(b->sampling_policy.is_null());
  EXPECT_EQ(b->generated_tokens, 0);
  EXPECT_EQ(b->ledger_sequence, a.ledger_sequence);
  EXPECT_EQ(b->async_admitted, -1);  // a synchronous job's
  ControllerState async = a;
  async.async_admitted = 96;
  ASSERT_TRUE(WriteControllerState(dir, async).ok());
  b = ReadControllerState(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->async_admitted, 96);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// Partial rollouts: the groups in flight come back field for field (tokens, log-probs to the
// bit, per-token versions, seeds, finish reasons, the problem and the preferred worker).
TEST(CheckpointTest, CarriedGroupsRoundTripExactly) {
  const std::string dir = TempDir("carried");
  ControllerState a = SampleState();
  a.carried_groups = SampleCarried();
  ASSERT_TRUE(CheckCarriedGroups(a.carried_groups, a.policy_version, a.next_group_id, "x").ok());
  ASSERT_TRUE(WriteControllerState(dir, a).ok());
  EXPECT_TRUE(PathExists(dir + "/carried_groups.pb"));
  auto b = ReadControllerState(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->carried_groups.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(SameProto(b->carried_groups[i], a.carried_groups[i]))
        << b->carried_groups[i].DebugString();
  }
  const v1::CarriedGroup& g = b->carried_groups[0];
  EXPECT_EQ(g.unfinished(0).response_ids_size(), 4);
  EXPECT_EQ(g.unfinished(0).logprobs(3), a.carried_groups[0].unfinished(0).logprobs(3));
  EXPECT_EQ(g.unfinished(0).versions(3), 217);
  EXPECT_EQ(g.worker(), "rollout-1");
  EXPECT_TRUE(b->carried_groups[1].prompt_is_messages());
  // controller.json records what the carry section holds.
  const std::string json = *ReadFileToString(dir + "/controller.json");
  EXPECT_NE(json.find("\"groups\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"unfinished_samples\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"unfinished_tokens\": 4"), std::string::npos) << json;
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// A damaged carry section is refused with an error naming the file and the problem; the state
// is not returned at all, so nothing is resumed from it.
TEST(CheckpointTest, CorruptOrTruncatedCarrySectionIsRejected) {
  const std::string dir = TempDir("carried_bad");
  ControllerState a = SampleState();
  a.carried_groups = SampleCarried();
  ASSERT_TRUE(WriteControllerState(dir, a).ok());
  const std::string path = dir + "/carried_groups.pb";
  const std::string good = *ReadFileToString(path);
  ASSERT_GT(good.size(), 100u);
  auto expect_error = [&](const std::string& bytes, const std::string& why) {
    ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
    auto s = ReadControllerState(dir);
    ASSERT_FALSE(s.ok()) << why;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
    EXPECT_NE(s.status().message().find(path), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
  };
  expect_error(good.substr(0, good.size() / 2),
               std::to_string(good.size() / 2) + " bytes, but controller.json records " +
                   std::to_string(good.size()) + " (a truncated or replaced file)");
  expect_error("", "0 bytes, but controller.json records");
  std::string flipped = good;
  flipped[good.size() / 3] ^= 0x10;
  expect_error(flipped, "(the file is corrupt)");
  ASSERT_TRUE(RemoveTree(path).ok());
  auto missing = ReadControllerState(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos) << missing.status();

  // A manifest that disagrees with the file, or is damaged itself.
  ASSERT_TRUE(WriteFileAtomic(path, good).ok());
  ASSERT_TRUE(ReadControllerState(dir).ok());
  const std::string json = *ReadFileToString(dir + "/controller.json");
  for (const auto& [from, to, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"groups\": 2", "\"groups\": 3",
            "holds 2 groups with 2 unfinished samples of 4 "
            "tokens, but controller.json records 3, 2 and 4"},
           {"\"unfinished_tokens\": 4", "\"unfinished_tokens\": -4",
            "\"carried_groups.unfinished_tokens\" must be a non-negative integer"},
           {"\"carried_groups\": {", "\"carried_groups_\": {", "\"carried_groups\" is missing"}}) {
    std::string edited = json;
    ASSERT_NE(edited.find(from), std::string::npos) << from;
    edited.replace(edited.find(from), from.size(), to);
    ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", edited).ok());
    auto s = ReadControllerState(dir);
    ASSERT_FALSE(s.ok()) << why;
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status();
  }
  EXPECT_TRUE(RemoveTree(dir).ok());
}

// Carried groups that could not have been written by a consistent run are refused, naming the
// group and what is wrong.
TEST(CheckpointTest, InconsistentCarriedGroupsAreRejected) {
  const ControllerState st = SampleState();
  auto error = [&](const std::function<void(std::vector<v1::CarriedGroup>*)>& edit) {
    std::vector<v1::CarriedGroup> groups = SampleCarried();
    edit(&groups);
    Status s = CheckCarriedGroups(groups, st.policy_version, st.next_group_id, "ckpt/c.pb");
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    return s.message();
  };
  const std::string g0 = "ckpt/c.pb: carried group 1234567890100: ";
  EXPECT_EQ(error([](auto* g) { std::swap((*g)[0], (*g)[1]); }),
            "ckpt/c.pb: carried groups out of order (group 1234567890105 before 1234567890100; "
            "they are kept by increasing group id)");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_group()->set_group_id(1234567890123ULL); }),
            "ckpt/c.pb: carried group 1234567890123: its id is not below next_group_id "
            "1234567890123");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished()->RemoveLast(); }),
            g0 + "2 finished and 1 unfinished samples; a started group has all n = 4");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(0)->set_group_id(7); }),
            g0 + "sample 4938271560401 belongs to group 7");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(0)->set_sample_id(4938271560404ULL); }),
            g0 + "sample 4938271560404 is outside the group's sample ids 4938271560400 + [0, 4)");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(1)->set_sample_id(4938271560400ULL); }),
            g0 + "sample 4938271560400 appears twice");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(0)->set_seed(5); }),
            g0 + "sample 4938271560401 has seed 5, its group gives " +
                std::to_string((0x9e3779b97f4a7c15ULL ^ 1234567890100ULL) + 1));
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_finished(1)->set_prompt_ids(0, 2); }),
            g0 + "sample 4938271560402 has another prompt than its group");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(0)->mutable_logprobs()->RemoveLast(); }),
            g0 + "sample 4938271560401 has 4 response tokens but 3 log-probs, 4 kept masses, 4 "
                 "versions and 4 loss-mask entries");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(0)->set_versions(1, 218); }),
            g0 + "sample 4938271560401 has a token of policy version 218, outside [0, 217]");
  EXPECT_EQ(error([](auto* g) { (*g)[0].mutable_unfinished(0)->set_response_ids(0, -3); }),
            g0 + "sample 4938271560401 has token id -3");
  EXPECT_EQ(error([](auto* g) {
              (*g)[0].mutable_unfinished(0)->set_finish_reason(v1::FINISH_REASON_STOP);
            }),
            g0 + "unfinished sample 4938271560401 has finish reason FINISH_REASON_STOP");
  EXPECT_EQ(error([](auto* g) {
              (*g)[0].mutable_finished(0)->set_finish_reason(v1::FINISH_REASON_ABORT);
            }),
            g0 + "finished sample 4938271560400 has finish reason FINISH_REASON_ABORT");
  EXPECT_EQ(
      error([](auto* g) { std::swap(*(*g)[0].mutable_finished(0), *(*g)[0].mutable_finished(1)); }),
      g0 + "sample 4938271560400 after sample 4938271560402 (samples are kept by "
           "increasing id)");
  EXPECT_EQ(error([](auto* g) { (*g)[1].mutable_group()->set_n(0); }),
            "ckpt/c.pb: carried group 1234567890105: n is 0");

  // Through ReadControllerState: the same checks, naming the file.
  const std::string dir = TempDir("carried_inconsistent");
  ControllerState a = SampleState();
  a.carried_groups = SampleCarried();
  a.carried_groups[0].mutable_unfinished(0)->set_versions(0, 300);
  ASSERT_TRUE(WriteControllerState(dir, a).ok());
  auto s = ReadControllerState(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), dir +
                                      "/carried_groups.pb: carried group 1234567890100: sample "
                                      "4938271560401 has a token of policy version 300, outside "
                                      "[0, 217]");
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(CheckpointTest, CarriedGroupsMustFitTheJob) {
  const std::vector<v1::CarriedGroup> groups = SampleCarried();
  JobConfig cfg;
  cfg.rollout.partial_rollouts = true;
  cfg.algorithm.max_staleness = 1;
  cfg.rollout.group_size = 4;
  cfg.rollout.max_new_tokens = 5;
  EXPECT_TRUE(CheckCarriedGroupsFit(groups, cfg, "c.pb").ok());
  EXPECT_TRUE(CheckCarriedGroupsFit({}, JobConfig{}, "c.pb").ok());
  JobConfig off = cfg;
  off.rollout.partial_rollouts = false;
  EXPECT_EQ(CheckCarriedGroupsFit(groups, off, "c.pb").message(),
            "c.pb: holds 2 carried groups, but rollout.partial_rollouts and rollout.async are "
            "off");
  // rollout.async carries whole groups only: finished or never sent.
  JobConfig async = off;
  async.rollout.async = true;
  const Status unfinished = CheckCarriedGroupsFit(groups, async, "c.pb");
  EXPECT_NE(unfinished.message().find("unfinished samples, which rollout.async cannot continue"),
            std::string::npos)
      << unfinished;
  std::vector<v1::CarriedGroup> whole = groups;
  for (auto& g : whole) g.clear_unfinished();
  whole[0].clear_finished();  // never sent
  EXPECT_TRUE(CheckCarriedGroupsFit(whole, async, "c.pb").ok());
  JobConfig n8 = cfg;
  n8.rollout.group_size = 8;
  EXPECT_EQ(CheckCarriedGroupsFit(groups, n8, "c.pb").message(),
            "c.pb: carried group 1234567890100 has n = 4, rollout.group_size is 8");
  JobConfig short_limit = cfg;
  short_limit.rollout.max_new_tokens = 4;
  EXPECT_EQ(CheckCarriedGroupsFit(groups, short_limit, "c.pb").message(),
            "c.pb: carried group 1234567890100: unfinished sample 4938271560401 already has 4 "
            "tokens, rollout.max_new_tokens is 4");
}

// A controller.json of format 1 (before carried groups) still reads, with none.
TEST(CheckpointTest, FormatOneStateReadsWithoutCarriedGroups) {
  const std::string dir = TempDir("format1");
  ASSERT_TRUE(WriteControllerState(dir, SampleState()).ok());
  std::string json = *ReadFileToString(dir + "/controller.json");
  json.replace(json.find("\"format_version\": 5"), 19, "\"format_version\": 1");
  const size_t carried = json.find(",\n \"carried_groups\"");
  ASSERT_NE(carried, std::string::npos) << json;
  json.erase(carried, json.find('}', carried) + 1 - carried);
  ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", json).ok());
  ASSERT_TRUE(RemoveTree(dir + "/carried_groups.pb").ok());
  auto s = ReadControllerState(dir);
  ASSERT_TRUE(s.ok()) << s.status() << "\n" << json;
  EXPECT_EQ(s->format_version, 1);
  EXPECT_TRUE(s->carried_groups.empty());
  EXPECT_EQ(s->ledger_sequence, -1);  // no ledger then
  EXPECT_EQ(s->async_admitted, -1);
  EXPECT_EQ(s->grpo_step, 12);
  json.replace(json.find("\"format_version\": 1"), 19, "\"format_version\": 6");
  ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", json).ok());
  s = ReadControllerState(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("unsupported format_version 6 (this build reads 1 to 5)"),
            std::string::npos)
      << s.status();
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

// Found by fuzz_controller_state (docs/reliability.md): a "format" that is not a string threw out
// of ReadControllerState (nlohmann's value() with a string default) and aborted the resume.
TEST(CheckpointTest, NonStringFormatIsAnErrorNotAnException) {
  const std::string dir = TempDir("format_type");
  for (const char* json : {"{\"format\": 7}", "{\"format\": null}", "{\"format\": [\"gyre\"]}"}) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", json).ok());
    auto s = ReadControllerState(dir);
    ASSERT_FALSE(s.ok()) << json;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
    EXPECT_NE(s.status().message().find("not a controller state"), std::string::npos) << s.status();
  }
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

  // trainer.steps may grow on resume, except under a cosine schedule, which spans it.
  current = saved;
  current.trainer.steps = saved.trainer.steps + 10;
  EXPECT_TRUE(CheckResumeCompatible(saved, current, "x").ok());
  saved.trainer.lr_schedule = "cosine";
  current.trainer.lr_schedule = "cosine";
  s = CheckResumeCompatible(saved, current, "x");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("trainer.lr_schedule: cosine"), std::string::npos) << s;
  current.trainer.steps = saved.trainer.steps;
  EXPECT_TRUE(CheckResumeCompatible(saved, current, "x").ok());
  current.trainer.lr_warmup_steps = 3;  // the schedule's settings change the results
  s = CheckResumeCompatible(saved, current, "x");
  EXPECT_NE(s.message().find("trainer.lr_warmup_steps"), std::string::npos) << s;
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

// Format 5: the sampling policy's state and the generated-token count round-trip; a format-4
// file without them reads as no state and 0 tokens; a format-5 file missing them is refused.
TEST(CheckpointTest, SamplingPolicyStateAndGeneratedTokensRoundTrip) {
  const std::string dir = TempDir("policy_state");
  ControllerState a = SampleState();
  a.sampling_policy = {{"policy", "greso"}, {"skip_probability", 0.5}, {"streaks", {{"1+2=", 3}}}};
  a.generated_tokens = 123456;
  ASSERT_TRUE(WriteControllerState(dir, a).ok());
  auto b = ReadControllerState(dir);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->sampling_policy, a.sampling_policy);
  EXPECT_EQ(b->generated_tokens, 123456);

  const std::string good = *ReadFileToString(dir + "/controller.json");
  nlohmann::json j = nlohmann::json::parse(good);
  j.erase("sampling_policy");
  j.erase("generated_tokens");
  ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", j.dump(1)).ok());
  auto missing = ReadControllerState(dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("\"sampling_policy\" is missing"), std::string::npos)
      << missing.status();
  j["format_version"] = 4;
  ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", j.dump(1)).ok());
  auto old = ReadControllerState(dir);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->sampling_policy.is_null());
  EXPECT_EQ(old->generated_tokens, 0);
  j = nlohmann::json::parse(good);
  j["generated_tokens"] = -5;
  ASSERT_TRUE(WriteFileAtomic(dir + "/controller.json", j.dump(1)).ok());
  EXPECT_FALSE(ReadControllerState(dir).ok());
  EXPECT_TRUE(RemoveTree(dir).ok());
}

}  // namespace
}  // namespace gyre::controller
