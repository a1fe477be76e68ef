// Data-parallel trainers end to end: the same job with trainer.workers = 1 and = 2 (real worker
// processes, a Gloo group over loopback) ends with the same model up to floating-point
// summation order, and the two ranks really ran; so does a job with sharded optimizer state
// (trainer.shard) whose checkpoint resumes onto another number of trainers.

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/file_util.h"
#include "integration/run_util.h"
#include "test_paths.h"

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

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The 8 log-probs of the unsharded single-trainer run of Job(), computed once.
const std::vector<double>& OneTrainerLogprobs() {
  static const std::vector<double> lps = [] {
    const std::string dir = MakeTempDir("dp1-reference");
    auto p = GyreProcess::Start(Job(dir, 1), dir);
    EXPECT_TRUE(p.Wait(240)) << p.Output();
    EXPECT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
    return Logprobs(dir + "/t/final", dir);
  }();
  return lps;
}

void ExpectSameModel(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(got.size(), want.size());
  // Ranks sum gradients in another order over 10 optimizer steps: rounding that grows with the
  // steps, relative to the log-prob's size.
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 2e-4 + 2e-4 * std::fabs(want[i])) << i;
  }
}

// trainer.shard=gradients (ZeRO-2) on 2 trainers, checkpointed after the first GRPO step and
// resumed on 3 trainers with trainer.shard=optimizer (ZeRO-1): the moments are resharded from
// 2 slices to 3 and the job ends with the single unsharded trainer's model.
TEST(DataParallelTest, ShardedJobResumesOntoThreeTrainersAndMatchesOne) {
  const std::string dir = MakeTempDir("dp-shard");
  auto a = GyreProcess::Start(
      With(Job(dir, 2), {"--set", "trainer.shard=gradients", "--set", "trainer.steps=1", "--set",
                         "trainer.checkpoint_every=1"}),
      dir);
  ASSERT_TRUE(a.Wait(240)) << a.Output();
  ASSERT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();
  const std::string ckpt = dir + "/t/checkpoints/step-000001/trainer";
  EXPECT_TRUE(PathExists(ckpt + "/optimizer-rank-00000-of-00002.safetensors")) << ckpt;
  EXPECT_TRUE(PathExists(ckpt + "/optimizer-rank-00001-of-00002.safetensors")) << ckpt;
  const auto first = GrpoMetrics(dir + "/t/metrics.jsonl");
  ASSERT_EQ(first.size(), 1u);
  // Rank 0's slice of the moments: half of the unsharded optimizer's (2 floats per weight).
  EXPECT_GT(first[0]["optimizer_state_mib"].get<double>(), 0);
  auto b = GyreProcess::Start(With(Job(dir, 3), {"--resume", "--set", "trainer.shard=optimizer",
                                                 "--set", "trainer.checkpoint_every=1"}),
                              MakeTempDir("dp-shard-resume"));
  ASSERT_TRUE(b.Wait(240)) << b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << b.Output();
  EXPECT_NE(ReadFile(dir + "/t/logs/trainer-2.log").find("joined data-parallel group"),
            std::string::npos);
  const auto all = GrpoMetrics(dir + "/t/metrics.jsonl");
  ASSERT_EQ(all.size(), 2u);
  // Each of 3 ranks holds a third of the moments, 2 of them held a half.
  EXPECT_NEAR(all[1]["optimizer_state_mib"].get<double>() * 3,
              first[0]["optimizer_state_mib"].get<double>() * 2, 1e-3);
  ExpectSameModel(Logprobs(dir + "/t/final", dir), OneTrainerLogprobs());
}

// A job whose trainers hold slices of the model (`layout`: trainer.shard=parameters or
// trainer.tensor_parallel=2) on 2 trainers, checkpointed after its first GRPO step, then resumed
// on `resume_trainers` trainers with `resume_layout` publishing over Gloo: the checkpoint is the
// whole float32 model written from the slices, trainer-1's log names its part (`log_part`), each
// trainer held about half of the weights, and the job ends with the single trainer's model.
// Returns the run directory (for more checks of the resumed run).
std::string SplitJobCheckpointsAndResumes(const std::string& name, const std::string& layout,
                                          const std::string& log_part, int resume_trainers,
                                          const std::vector<std::string>& resume_layout,
                                          double held_most,
                                          const std::vector<std::string>& more = {}) {
  const std::string dir = MakeTempDir(name);
  auto a = GyreProcess::Start(With(With(Job(dir, 2), {"--set", layout, "--set", "trainer.steps=1",
                                                      "--set", "trainer.checkpoint_every=1"}),
                                   more),
                              dir);
  EXPECT_TRUE(a.Wait(240)) << a.Output();
  EXPECT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();
  EXPECT_NE(ReadFile(dir + "/t/logs/trainer-1.log").find(log_part), std::string::npos) << log_part;
  const std::string ckpt = dir + "/t/checkpoints/step-000001/trainer";
  EXPECT_TRUE(PathExists(ckpt + "/model.safetensors")) << ckpt;
  EXPECT_TRUE(PathExists(ckpt + "/optimizer.safetensors")) << ckpt;
  // The whole float32 model, as written, against the weights each trainer held.
  auto whole = FileSize(ckpt + "/model.safetensors");
  EXPECT_TRUE(whole.ok());
  const auto first = GrpoMetrics(dir + "/t/metrics.jsonl");
  EXPECT_EQ(first.size(), 1u);
  if (!whole.ok() || first.size() != 1) return dir;
  const double held = first[0]["weights_mib"].get<double>() * (1 << 20);
  EXPECT_LT(held, held_most * static_cast<double>(*whole));
  EXPECT_GT(held, 0.45 * static_cast<double>(*whole));
  auto b = GyreProcess::Start(With(With(With(Job(dir, resume_trainers), resume_layout),
                                        {"--resume", "--set", "cluster.weight_transport=gloo",
                                         "--set", "trainer.checkpoint_every=1"}),
                                   more),
                              MakeTempDir(name + "-resume"));
  EXPECT_TRUE(b.Wait(240)) << b.Output();
  EXPECT_EQ(WEXITSTATUS(b.wait_status), 0) << b.Output();
  EXPECT_EQ(GrpoMetrics(dir + "/t/metrics.jsonl").size(), 2u);
  // The rollout worker sampled with the versions published from the slices: its log-probs are
  // the trainer's.
  for (const nlohmann::json& m : GrpoMetrics(dir + "/t/metrics.jsonl")) {
    EXPECT_LT(m["mismatch_abs_logprob"].get<double>(), 1e-5) << m.dump();
  }
  ExpectSameModel(Logprobs(dir + "/t/final", dir), OneTrainerLogprobs());
  return dir;
}

// What trainer-0 logged of the first publish of each run (from its slices): the most bytes of
// the version it held at once, with 4 KiB buckets.
std::vector<int64_t> PublishPeaks(const std::string& dir) {
  const std::string log = ReadFile(dir + "/t/logs/trainer-0.log");
  const std::string mark = "bytes of it held at once (bucket 4096 bytes)";
  std::vector<int64_t> peaks;
  for (size_t at = log.find(mark); at != std::string::npos; at = log.find(mark, at + 1)) {
    const size_t most = log.rfind("at most ", at);
    if (most != std::string::npos) peaks.push_back(std::stoll(log.substr(most + 8)));
  }
  return peaks;
}

// trainer.shard=parameters (ZeRO-3) on 2 trainers: each holds half of the weights (each unit
// padded to an even number of elements at most); every version is published from the slices
// over gRPC, the checkpoint is written from them, and the job resumed on 2 trainers publishing
// over Gloo ends with the single trainer's model. A version is gathered a bucket at a time (4 KiB
// here, a thirtieth of a layer): trainer-0 never held more than one bucket of it, over either.
TEST(DataParallelTest, FullyShardedJobPublishesCheckpointsAndResumes) {
  const std::string dir = SplitJobCheckpointsAndResumes(
      "dp-zero3", "trainer.shard=parameters", "trainer.shard: parameters", 2,
      {"--set", "trainer.shard=parameters"}, 0.51, {"--set", "cluster.weight_bucket_bytes=4096"});
  const std::vector<int64_t> peaks = PublishPeaks(dir);
  EXPECT_EQ(peaks.size(), 2u);  // the first publish of each run
  for (int64_t peak : peaks) {
    EXPECT_GT(peak, 0);
    EXPECT_LE(peak, 4096);
  }
}

// trainer.tensor_parallel=2 on 2 trainers: each holds half of every layer and of the vocabulary
// (the norms whole; tensor parallelism, no data parallelism), published and checkpointed from
// the slices as above; resumed on 4 trainers (2 data-parallel ranks of 2) with ZeRO-2 over the
// slices (each data-parallel group splits its slice's gradients and moments), which checkpoint
// again (the moments summed from the data-parallel ranks' parts); resumed once more with shard:
// parameters (each data-parallel group splits the units of its slices) for a third step.
TEST(DataParallelTest, TensorParallelJobPublishesCheckpointsAndResumesOntoTwoByTwo) {
  const std::vector<std::string> buckets = {"--set", "cluster.weight_bucket_bytes=4096"};
  const std::string dir = SplitJobCheckpointsAndResumes(
      "dp-tp", "trainer.tensor_parallel=2", "tensor-parallel rank 1 of 2", 4,
      {"--set", "trainer.tensor_parallel=2", "--set", "trainer.shard=gradients"}, 0.55, buckets);
  // Trainer-3: tensor-parallel rank 1 of data-parallel rank 1, in the group of the slice 1s.
  EXPECT_NE(ReadFile(dir + "/t/logs/trainer-3.log")
                .find("-dp1 as rank 1 of 2 (trainer 3 of 4, tensor-parallel rank 1 of 2; gloo, "
                      "trainer.shard: gradients)"),
            std::string::npos);
  EXPECT_TRUE(PathExists(dir + "/t/checkpoints/step-000002/trainer/optimizer.safetensors"));
  auto c = GyreProcess::Start(
      With(With(Job(dir, 4), {"--resume", "--set", "trainer.shard=parameters", "--set",
                              "trainer.tensor_parallel=2", "--set", "trainer.steps=3", "--set",
                              "trainer.checkpoint_every=1"}),
           buckets),
      MakeTempDir("dp-tp-zero3"));
  ASSERT_TRUE(c.Wait(240)) << c.Output();
  ASSERT_EQ(WEXITSTATUS(c.wait_status), 0) << c.Output();
  EXPECT_EQ(GrpoMetrics(dir + "/t/metrics.jsonl").size(), 3u);
  EXPECT_NE(ReadFile(dir + "/t/logs/trainer-3.log")
                .find("(trainer 3 of 4, tensor-parallel rank 1 of 2; gloo, trainer.shard: "
                      "parameters)"),
            std::string::npos);
  EXPECT_TRUE(PathExists(dir + "/t/checkpoints/step-000003/trainer/model.safetensors"));
  // Each version was gathered a bucket at a time from the slices (and, in the third run, from
  // the slices' shards): trainer-0 held at most one bucket of it.
  const std::vector<int64_t> peaks = PublishPeaks(dir);
  EXPECT_EQ(peaks.size(), 3u);
  for (int64_t peak : peaks) {
    EXPECT_GT(peak, 0);
    EXPECT_LE(peak, 4096);
  }
}

// rollout.tensor_parallel=2: the rollout worker is two processes, each holding half of every
// layer, of the vocabulary and of the KV cache, drawing vocabulary-parallel. Rank 0 takes each
// version bucket by bucket (grpc, then gloo after a resume) and scatters rank 1 its slices as the
// tensors complete, and rank 1 followed rank 0
// from start to stop in its own log. Every GRPO step's samples carry the log-probs the trainer
// computes for them with the whole model (mismatch_abs_logprob, the mean |rollout - trainer|
// log-prob, about 1e-7 here): a rank holding a stale or wrong slice would put it near 0.2.
TEST(DataParallelTest, TensorParallelRolloutWorkerSamplesWithTheTrainersLogprobs) {
  const std::string dir = MakeTempDir("rollout-tp");
  const std::vector<std::string> tp = {"--set", "rollout.tensor_parallel=2"};
  auto a = GyreProcess::Start(With(With(Job(dir, 1), tp), {"--set", "trainer.steps=1", "--set",
                                                           "trainer.checkpoint_every=1"}),
                              dir);
  ASSERT_TRUE(a.Wait(240)) << a.Output();
  ASSERT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();
  const std::string rank0 = ReadFile(dir + "/t/logs/rollout-0.log");
  EXPECT_NE(rank0.find("tensor-parallel rank 0 of 2"), std::string::npos) << rank0;
  const std::string rank1 = ReadFile(dir + "/t/logs/rollout-0-tp1.log");
  EXPECT_NE(rank1.find("tensor-parallel rank 1 of 2"), std::string::npos) << rank1;
  EXPECT_NE(rank1.find("on cpu, gloo group"), std::string::npos) << rank1;
  EXPECT_NE(rank1.find("rank 0 stopped the worker"), std::string::npos) << rank1;
  auto b = GyreProcess::Start(
      With(With(Job(dir, 1), tp), {"--resume", "--set", "cluster.weight_transport=gloo", "--set",
                                   "trainer.checkpoint_every=1"}),
      MakeTempDir("rollout-tp-resume"));
  ASSERT_TRUE(b.Wait(240)) << b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << b.Output();
  const auto steps = GrpoMetrics(dir + "/t/metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& step : steps) {
    EXPECT_GT(step["samples"].get<double>(), 0);
    EXPECT_LT(step["mismatch_abs_logprob"].get<double>(), 1e-5) << step.dump();
  }
  // Over gloo each rank took its own slices from the trainer: rank 1 received about half the
  // version from it and nothing but a few control words from rank 0.
  const std::string resumed0 = ReadFile(dir + "/t/logs/rollout-0.log");
  std::smatch total;
  ASSERT_TRUE(
      std::regex_search(resumed0, total, std::regex("over gloo \\(([0-9]+) bytes to 2 ranks")))
      << resumed0;
  const std::string resumed1 = ReadFile(dir + "/t/logs/rollout-0-tp1.log");
  std::smatch own;
  ASSERT_TRUE(std::regex_search(
      resumed1, own,
      std::regex("([0-9]+) bytes of its slices straight from the trainer, ([0-9]+) bytes from "
                 "the other ranks: OK")))
      << resumed1;
  const double whole = std::stod(total[1]), mine = std::stod(own[1]);
  EXPECT_GT(mine, 0.4 * whole) << resumed1;
  EXPECT_LT(mine, 0.6 * whole) << resumed1;
  EXPECT_LT(std::stod(own[2]), 4096) << resumed1;
}

// trainer.memory_limit_gb: a 99 M-parameter model whose unsharded training state (1.48 GiB of
// float32 weights, gradients and AdamW moments) exceeds the 1.45 GiB each trainer may use. One
// trainer is refused before anything starts, with the memory needed and what would fit; 4
// trainers with shard: parameters (0.37 GiB of state each) train under the kernel's limit,
// publish, checkpoint and resume.
TEST(DataParallelTest, AModelTooBigForOneTrainerTrainsShardedUnderTheMemoryLimit) {
  const std::string dir = MakeTempDir("memory-limit");
  auto job = [&](int trainers, const std::string& shard, int steps) {
    return With(Job(dir, trainers), {"--set", "model.hidden_size=640",
                                     "--set", "model.num_layers=13",
                                     "--set", "model.num_heads=10",
                                     "--set", "model.num_kv_heads=2",
                                     "--set", "model.intermediate_size=3456",
                                     "--set", "trainer.memory_limit_gb=1.45",
                                     "--set", "trainer.shard=" + shard,
                                     "--set", "trainer.warmup_sft_steps=0",
                                     "--set", "trainer.mini_batches=1",
                                     "--set", "rollout.prompts_per_step=4",
                                     "--set", "rollout.group_size=4",
                                     "--set", "data.eval_size=4",
                                     "--set", "trainer.steps=" + std::to_string(steps),
                                     "--set", "trainer.checkpoint_every=1"});
  };
  auto refused = GyreProcess::Start(job(1, "none", 1), dir);
  ASSERT_TRUE(refused.Wait(60)) << refused.Output();
  EXPECT_NE(WEXITSTATUS(refused.wait_status), 0);
  EXPECT_NE(refused.Output().find("trainer.memory_limit_gb is 1.45 GiB, but each trainer would "
                                  "need about 1.48 GiB with trainer.shard: none"),
            std::string::npos)
      << refused.Output();
  EXPECT_NE(refused.Output().find("trainer.shard: parameters over 2 trainers"), std::string::npos)
      << refused.Output();
  EXPECT_FALSE(PathExists(dir + "/t/logs")) << "a refused job started processes";
  EXPECT_FALSE(PathExists(dir + "/t/checkpoints"));

  auto a = GyreProcess::Start(job(4, "parameters", 1), dir);
  ASSERT_TRUE(a.Wait(400)) << a.Output();
  ASSERT_EQ(WEXITSTATUS(a.wait_status), 0) << a.Output();
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(ReadFile(dir + "/t/logs/trainer-" + std::to_string(r) + ".log")
                  .find("memory limited to 1.45 GiB"),
              std::string::npos)
        << r;
  }
  EXPECT_TRUE(PathExists(dir + "/t/checkpoints/step-000001/trainer/optimizer.safetensors"));
  auto b = GyreProcess::Start(With(job(4, "parameters", 2), {"--resume"}),
                              MakeTempDir("memory-limit-resume"));
  ASSERT_TRUE(b.Wait(400)) << b.Output();
  ASSERT_EQ(WEXITSTATUS(b.wait_status), 0) << b.Output();
  const auto steps = GrpoMetrics(dir + "/t/metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  // A quarter of the float32 weights on each rank.
  EXPECT_NEAR(steps[1]["weights_mib"].get<double>(), 99.1e6 * 4 / 4 / (1 << 20), 2.0);
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
