// model.device end to end: on a host without a usable GPU, `cuda` fails at worker start with an
// error that says what to do and `auto` trains on the CPU; on a GPU host, a job runs on the GPU
// (the CUDA kernels end to end) and reports where its workers put the model.

#include <gtest/gtest.h>

#include "integration/run_util.h"
#include "kernels/device_info.h"
#include "test_paths.h"

namespace gyre::testing {
namespace {

const std::string kQuickstart = std::string(GYRE_SOURCE_DIR) + "/configs/quickstart.yaml";

std::vector<std::string> Job(const std::string& dir, const std::string& device) {
  return {"train", kQuickstart,
          "--set", "job.output_dir=" + dir,
          "--set", "job.name=t",
          "--set", "model.device=" + device,
          "--set", "trainer.warmup_sft_steps=2",
          "--set", "trainer.steps=1",
          "--set", "rollout.prompts_per_step=4",
          "--set", "rollout.workers=1",
          "--set", "data.eval_size=8",
          "--set", kEveryGroupTrains};
}

TEST(DeviceTest, CudaWithoutAGpuIsAClearErrorAndAutoFallsBackToTheCpu) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "this host has a GPU";
  const std::string dir = MakeTempDir("device_cuda");
  auto p = GyreProcess::Start(Job(dir, "cuda"), dir);
  ASSERT_TRUE(p.Wait(120)) << p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1) << p.Output();
  EXPECT_NE(p.Output().find("model.device is cuda but this worker sees no usable CUDA device"),
            std::string::npos)
      << p.Output();

  const std::string dir2 = MakeTempDir("device_auto");
  auto q = GyreProcess::Start(Job(dir2, "auto"), dir2);
  ASSERT_TRUE(q.Wait(180)) << q.Output();
  ASSERT_EQ(WEXITSTATUS(q.wait_status), 0) << q.Output();
  EXPECT_NE(ReadFile(dir2 + "/t/logs/trainer-0.log").find("parameters on cpu"), std::string::npos);
}

TEST(DeviceTest, AJobRunsOnTheGpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = MakeTempDir("device_gpu");
  auto p = GyreProcess::Start(Job(dir, "cuda"), dir);
  ASSERT_TRUE(p.Wait(300)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  EXPECT_NE(ReadFile(dir + "/t/logs/trainer-0.log").find("parameters on cuda:0"),
            std::string::npos);
  EXPECT_NE(ReadFile(dir + "/t/logs/rollout-0.log").find("parameters on cuda:0"),
            std::string::npos);
}

// Colocated weight updates over CUDA IPC: the trainer and the rollout worker share GPU 0; every
// version goes device to device and is checked bucket by bucket on the GPU.
TEST(DeviceTest, AJobPublishesOverCudaIpc) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = MakeTempDir("device_ipc");
  auto args = Job(dir, "cuda");
  for (const char* kv : {"cluster.weight_transport=cuda_ipc", "trainer.steps=2",
                         "cluster.weight_bucket_bytes=65536"}) {
    args.push_back("--set");
    args.push_back(kv);
  }
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(300)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  EXPECT_NE(ReadFile(dir + "/t/logs/rollout-0.log").find("over cuda_ipc"), std::string::npos)
      << ReadFile(dir + "/t/logs/rollout-0.log");
}

// Disaggregated GPUs over NCCL: the trainer on GPU 0, the rollout worker on GPU 1.
TEST(DeviceTest, AJobPublishesOverNcclBetweenTwoGpus) {
  if (kernels::CudaDeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const std::string dir = MakeTempDir("device_nccl");
  auto args = Job(dir, "cuda");
  for (const char* kv : {"cluster.weight_transport=nccl", "cluster.placement=disaggregated",
                         "trainer.steps=2", "cluster.weight_bucket_bytes=65536"}) {
    args.push_back("--set");
    args.push_back(kv);
  }
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(300)) << p.Output();
  ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
  EXPECT_NE(ReadFile(dir + "/t/logs/rollout-0.log").find("parameters on cuda:1"),
            std::string::npos);
  EXPECT_NE(ReadFile(dir + "/t/logs/rollout-0.log").find("over nccl"), std::string::npos);
}

// With one GPU, disaggregated placement has no GPU left for the rollout worker: a clear error.
TEST(DeviceTest, DisaggregatedPlacementOnOneGpuIsAClearError) {
  if (kernels::CudaDeviceCount() != 1) GTEST_SKIP() << "needs exactly one CUDA device";
  const std::string dir = MakeTempDir("device_one_gpu");
  auto args = Job(dir, "cuda");
  args.push_back("--set");
  args.push_back("cluster.placement=disaggregated");
  auto p = GyreProcess::Start(args, dir);
  ASSERT_TRUE(p.Wait(120)) << p.Output();
  EXPECT_EQ(WEXITSTATUS(p.wait_status), 1) << p.Output();
  EXPECT_NE(p.Output().find("would share GPU 0 with a trainer"), std::string::npos) << p.Output();
}

// rollout.tensor_parallel on the GPU: the worker's two ranks each hold half of the model on a
// device (one each with two GPUs or more, over an NCCL group; sharing GPU 0 over Gloo through host
// memory on a one-GPU host), and sample with the trainer's log-probs, over both weight transports
// that serve them (gloo: each rank its slices from the trainer; grpc: through rank 0).
TEST(DeviceTest, ATensorParallelRolloutWorkerRunsOnTheGpu) {
  const int gpus = kernels::CudaDeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device";
  for (const std::string transport : {"gloo", "grpc"}) {
    const std::string dir = MakeTempDir("device_tp_" + transport);
    auto args = Job(dir, "cuda");
    for (const std::string& kv :
         std::vector<std::string>{"rollout.tensor_parallel=2", "trainer.steps=2",
                                  "cluster.weight_transport=" + transport}) {
      args.push_back("--set");
      args.push_back(kv);
    }
    auto p = GyreProcess::Start(args, dir);
    ASSERT_TRUE(p.Wait(300)) << p.Output();
    ASSERT_EQ(WEXITSTATUS(p.wait_status), 0) << p.Output();
    const std::string group = gpus >= 2 ? "nccl group" : "gloo group";
    const std::string rank0 = ReadFile(dir + "/t/logs/rollout-0.log");
    EXPECT_NE(rank0.find("tensor-parallel rank 0 of 2"), std::string::npos) << rank0;
    EXPECT_NE(rank0.find("on cuda:0, " + group), std::string::npos) << rank0;
    const std::string rank1 = ReadFile(dir + "/t/logs/rollout-0-tp1.log");
    EXPECT_NE(rank1.find("on cuda:" + std::to_string(1 % gpus) + ", " + group), std::string::npos)
        << rank1;
    const auto steps = MetricsRecords(dir + "/t/metrics.jsonl", "grpo");
    ASSERT_EQ(steps.size(), 2u) << transport;
    for (const auto& step : steps) {
      // Float32 on both sides; the rollout's paged attention and the trainer's differ in order.
      EXPECT_LT(step["mismatch_abs_logprob"].get<double>(), 1e-4) << transport << step.dump();
    }
  }
}

}  // namespace
}  // namespace gyre::testing
