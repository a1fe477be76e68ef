// The job loop (controller/job_runner.h) end to end over fake workers (tests/fakes/): a real
// JobRunner with its cluster in external mode, whose rollout and trainer workers are fakes that
// register in-process. A short GRPO job of the built-in addition task runs synchronously and
// with rollout.async; the tests check what a user of the job sees: the steps ran, the policy
// version advanced with each train call, every rollout worker was sent every version,
// metrics.jsonl and summary.json record the run, and a trainer that fails ends the job with an
// error that names it.

#include "controller/job_runner.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "config/config.h"
#include "fakes/fake_job.h"
#include "text/tokenizer.h"

namespace gyre::controller {
namespace {

using testing::FakeCluster;
using testing::FakeJobConfig;
using testing::FakeRollout;

constexpr int kSteps = 2;
constexpr int kWarmupSteps = 2;

// A short job of the addition task over 2 fake rollout workers and 1 fake trainer, in a run
// directory of its own.
JobConfig ShortJob(const std::string& name, bool async) {
  JobConfig cfg = FakeJobConfig(2, 1);
  cfg.job.name = name;
  cfg.job.output_dir = ::testing::TempDir() + "/job_runner_test";
  cfg.trainer.steps = kSteps;
  cfg.trainer.warmup_sft_steps = kWarmupSteps;
  cfg.trainer.warmup_sft_batch = 2;
  cfg.rollout.prompts_per_step = 4;
  cfg.rollout.group_size = 2;
  cfg.data.eval_size = 3;
  cfg.metrics.tensorboard = false;
  cfg.rollout.async = async;
  if (async) cfg.algorithm.max_staleness = 1;
  return cfg;
}

// The answers of an engine that can add: in each group, even-numbered samples answer the
// prompt ("12+34=") right and odd-numbered ones one too high, so a group's rewards differ and
// greedy evaluation (one sample per group) is always right. Tokens carry the fake's version.
Status AnswerAdditions(const FakeRollout& fake, const v1::GenerateRequest& req,
                       v1::GenerateResponse* resp) {
  const text::CharTokenizer chars;
  for (const v1::PromptGroup& g : req.groups()) {
    const std::string prompt =
        chars.Decode(std::vector<int32_t>(g.prompt_ids().begin(), g.prompt_ids().end()));
    const size_t plus = prompt.find('+');
    if (plus == std::string::npos) return InvalidArgument("not an addition: " + prompt);
    const int sum = std::stoi(prompt.substr(0, plus)) + std::stoi(prompt.substr(plus + 1));
    for (int i = 0; i < g.n(); ++i) {
      GYRE_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                            chars.Encode(std::to_string(i % 2 == 0 ? sum : sum + 1)));
      ids.push_back(text::CharTokenizer::kEos);
      v1::Sample* s = resp->add_samples();
      s->set_sample_id(g.first_sample_id() + static_cast<uint64_t>(i));
      s->set_group_id(g.group_id());
      *s->mutable_prompt_ids() = g.prompt_ids();
      for (int32_t id : ids) {
        s->add_response_ids(id);
        s->add_logprobs(-0.5f);
        s->add_versions(fake.version.load());
        s->add_kept_mass(1.0f);
        s->add_loss_mask(1.0f);
      }
      s->set_finish_reason(v1::FINISH_REASON_STOP);
      s->set_seed(g.seed() + static_cast<uint64_t>(i));
      resp->set_generated_tokens(resp->generated_tokens() + s->response_ids_size());
    }
  }
  resp->set_policy_version(fake.version.load());
  return Status::Ok();
}

// Runs `cfg` over `cluster`'s fakes: rollout fakes answer additions and hold whatever version
// the trainer last sent them, as real workers would.
StatusOr<JobResult> RunOverFakes(const JobConfig& cfg, FakeCluster* cluster) {
  GYRE_RETURN_IF_ERROR(config::ValidateJobConfig(cfg));
  (void)RemoveTree(cfg.job.output_dir + "/" + cfg.job.name);
  for (auto& r : cluster->rollout) {
    FakeRollout* fake = r.get();
    fake->on_generate = [fake](const v1::GenerateRequest& req, v1::GenerateResponse* resp) {
      return AnswerAdditions(*fake, req, resp);
    };
  }
  for (auto& t : cluster->trainer) {
    t->on_publish = [cluster](const v1::PublishWeightsRequest& req,
                              v1::PublishWeightsResponse* resp) {
      for (uint32_t c : testing::kFakeCrcs) resp->add_bucket_crc32(c);
      testing::AddFakeResults(req.rollout_ids(), req.version(), testing::kFakeCrcs, resp);
      for (const std::string& id : req.rollout_ids()) {
        const size_t index = std::stoul(id.substr(id.rfind('-') + 1));
        cluster->rollout.at(index)->version = req.version();
      }
      return Status::Ok();
    };
  }
  RunOptions options;
  options.print_progress = false;
  options.install_signal_handlers = false;
  JobDeps deps;
  deps.clients = cluster->Factory();
  deps.death_grace_s = 0.2;  // fakes fail at once; no process to wait for
  deps.on_workers_expected = [cluster](ControllerService* service) {
    return cluster->RegisterAll(service);
  };
  return RunJobImpl(cfg, options, std::move(deps));
}

// metrics.jsonl of a run, one record per line.
std::vector<nlohmann::json> ReadMetrics(const std::string& run_dir) {
  std::vector<nlohmann::json> records;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

std::vector<nlohmann::json> Phase(const std::vector<nlohmann::json>& records,
                                  const std::string& phase) {
  std::vector<nlohmann::json> out;
  for (const auto& r : records) {
    if (r.value("phase", "") == phase) out.push_back(r);
  }
  return out;
}

// What every finished short job shows, in either step mode.
void ExpectFinishedShortJob(const JobResult& result, const FakeCluster& cluster) {
  // Each train call (warm-up and GRPO) is one policy version.
  constexpr int kVersions = kWarmupSteps + kSteps;
  EXPECT_EQ(result.grpo_steps, kSteps);
  EXPECT_EQ(result.policy_version, kVersions);
  const auto train = cluster.trainer[0]->train_calls();
  ASSERT_EQ(train.size(), static_cast<size_t>(kVersions));
  for (int i = 0; i < kVersions; ++i) EXPECT_EQ(train[i].expected_version(), i);

  // v0, the warmed-up version, then each GRPO step's: to both rollout workers every time.
  const auto publishes = cluster.trainer[0]->publish_calls();
  ASSERT_EQ(publishes.size(), static_cast<size_t>(2 + kSteps));
  EXPECT_EQ(publishes.front().version(), 0);
  EXPECT_EQ(publishes.back().version(), kVersions);
  for (const auto& p : publishes) {
    EXPECT_EQ(std::vector<std::string>(p.rollout_ids().begin(), p.rollout_ids().end()),
              (std::vector<std::string>{"rollout-0", "rollout-1"}))
        << "publish of v" << p.version();
  }
  for (const auto& r : cluster.rollout) EXPECT_EQ(r->version.load(), kVersions);

  const auto metrics = ReadMetrics(result.run_dir);
  EXPECT_EQ(Phase(metrics, "warmup").size(), static_cast<size_t>(kWarmupSteps));
  const auto steps = Phase(metrics, "grpo");
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(steps[i]["step"], i + 1);
    EXPECT_EQ(steps[i]["policy_version"], kWarmupSteps + i + 1);
  }
  const auto evals = Phase(metrics, "eval");
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(Phase(metrics, "summary").size(), 1u);
  // The engine answers greedy evaluation right.
  EXPECT_DOUBLE_EQ(result.accuracy_before_rl, 1.0);
  EXPECT_DOUBLE_EQ(result.accuracy_after_rl, 1.0);

  auto summary = ReadFileToString(result.run_dir + "/summary.json");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(nlohmann::json::parse(*summary)["grpo_steps"], kSteps);
  EXPECT_TRUE(PathExists(result.run_dir + "/controller.address"));
}

TEST(JobRunnerTest, SynchronousJobTrainsPublishesAndRecordsEachStep) {
  FakeCluster cluster(2, 1);
  auto result = RunOverFakes(ShortJob("sync", false), &cluster);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ExpectFinishedShortJob(*result, cluster);
  // Half of each group answers right.
  EXPECT_DOUBLE_EQ(result->final_mean_reward, 0.5);
  // Each GRPO step trains its 4 groups of 2 samples.
  const auto train = cluster.trainer[0]->train_calls();
  for (int i = kWarmupSteps; i < kWarmupSteps + kSteps; ++i) {
    EXPECT_EQ(train[i].samples_size(), 8) << "train call " << i;
  }
}

TEST(JobRunnerTest, AsynchronousJobTrainsPublishesAndRecordsEachStep) {
  FakeCluster cluster(2, 1);
  auto result = RunOverFakes(ShortJob("async", true), &cluster);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ExpectFinishedShortJob(*result, cluster);
  // Generation went through the asynchronous scheduler's streaming calls.
  size_t streams = 0;
  for (const auto& r : cluster.rollout) streams += r->stream_calls().size();
  EXPECT_GT(streams, 0u);
  for (const auto& step : Phase(ReadMetrics(result->run_dir), "grpo")) {
    EXPECT_TRUE(step.contains("async_wait_s")) << step.dump();
  }
}

TEST(JobRunnerTest, FailingTrainerFailsTheJobWithItsError) {
  FakeCluster cluster(2, 1);
  cluster.trainer[0]->on_train_step = [](const v1::TrainStepRequest&, v1::TrainStepResponse*) {
    return Internal("CUDA out of memory");
  };
  JobConfig cfg = ShortJob("failing_trainer", false);
  cfg.trainer.warmup_sft_steps = 0;
  auto result = RunOverFakes(cfg, &cluster);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("trainer-0"), std::string::npos)
      << result.status().ToString();
  EXPECT_NE(result.status().message().find("CUDA out of memory"), std::string::npos)
      << result.status().ToString();
  const std::string run_dir = AbsolutePath(cfg.job.output_dir + "/" + cfg.job.name);
  EXPECT_TRUE(Phase(ReadMetrics(run_dir), "grpo").empty());
  EXPECT_FALSE(PathExists(run_dir + "/summary.json"));
}

}  // namespace
}  // namespace gyre::controller
