// trainer.shard on a GPU: the sharded optimizer (ZeRO-1/2) and the split parameters (ZeRO-3)
// over an NCCL group of one rank (the GPU host has one GPU; NCCL allows one rank per device) make
// the unsharded trainer's update on the same GPU. The reduce-scatters and all-gathers really run
// through NCCL on device memory (a group of one still issues them); ZeRO-3's run on its
// collective thread. Skips without a CUDA device.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/nccl_communicator.h"
#include "testing/tensor_compare.h"
#include "testing/tiny_model.h"
#include "testing/train_batch.h"
#include "trainer/policy_trainer.h"

namespace gyre::trainer {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::vector<TrainSample> Batch() { return testing::SmallTrainBatch(9, /*mask_one=*/false); }

std::unique_ptr<PolicyTrainer> GpuTrainer() {
  auto model = model::Transformer::Create(testing::TinySpec(24, 32, 2, 4, 2, 48), 3, 0.1);
  model->To(at::Device(at::kCUDA, 0));
  return std::make_unique<PolicyTrainer>(std::move(model), 1e-2, 0.01, 0.9, 0.999);
}

// Two steps: one mini-batch, then three (the second reads and updates the first's moments).
at::Tensor TrainTwoSteps(PolicyTrainer* t, std::vector<std::map<std::string, double>>* metrics) {
  for (int minis : {1, 3}) {
    TrainOptions opts;
    opts.micro_batch_size = 4;
    opts.grad_clip = 0.5;
    opts.mini_batches = minis;
    auto m = t->Step(Batch(), Objective::kPolicyGradient, 1e-2, opts);
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (m.ok()) metrics->push_back(*m);
  }
  auto weights = t->FullWeights();  // gathered from the slices with ZeRO-3
  EXPECT_TRUE(weights.ok()) << weights.status().message();
  std::vector<at::Tensor> parts;
  if (weights.ok()) {
    for (const auto& [n, p] : *weights) parts.push_back(p.detach().flatten());
  }
  return parts.empty() ? at::Tensor() : at::cat(parts).cpu();
}

TEST(ShardedGpuTest, ZeroOneTwoAndThreeOverNcclMatchUnshardedOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::map<std::string, double>> plain_metrics;
  auto plain = GpuTrainer();
  const at::Tensor want = TrainTwoSteps(plain.get(), &plain_metrics);
  for (Shard shard : {Shard::kOptimizer, Shard::kGradients, Shard::kParameters}) {
    auto id = comm::NewNcclUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    comm::NcclOptions o;
    o.unique_id = *id;
    auto group = comm::CreateNcclCommunicator(o);
    ASSERT_TRUE(group.ok()) << group.status();
    auto t = GpuTrainer();
    ASSERT_TRUE(t->SetSharding(shard).ok());
    DataParallelOptions dp;
    dp.timeout_s = 60;
    ASSERT_TRUE(t->SetDataParallel(group->get(), dp).ok());
    std::vector<std::map<std::string, double>> metrics;
    const at::Tensor got = TrainTwoSteps(t.get(), &metrics);
    EXPECT_TRUE(testing::AllClose(got, want, {1e-5, 1e-6, 1e-5})) << ShardName(shard);
    ASSERT_EQ(metrics.size(), plain_metrics.size());
    for (size_t s = 0; s < metrics.size(); ++s) {
      EXPECT_NEAR(metrics[s].at("grad_norm"), plain_metrics[s].at("grad_norm"),
                  1e-4 * (1 + plain_metrics[s].at("grad_norm")))
          << ShardName(shard) << " step " << s;
      // One rank owns everything: the same moments as unsharded.
      EXPECT_NEAR(metrics[s].at("optimizer_state_mib"), plain_metrics[s].at("optimizer_state_mib"),
                  1e-9);
    }
    EXPECT_TRUE(t->sharded()->Get().exp_avg.abs().sum().item<double>() > 0);
    EXPECT_TRUE(t->SetDataParallel(nullptr, {}).ok());
    EXPECT_FALSE((*group)->aborted());
  }
}

}  // namespace
}  // namespace gyre::trainer
