// GPU: src/ops dispatches CUDA tensors to the kernels, with the same meaning as the CPU path
// (label gpu; skips without a device).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/device_info.h"
#include "model/transformer.h"
#include "ops/ops.h"
#include "rollout/rollout_engine.h"
#include "testing/tiny_model.h"
#include "trainer/policy_trainer.h"

namespace gyre::ops {
namespace {

class OpsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(OpsGpuTest, SampleRowsOnTheGpuMatchesTheCpu) {
  at::manual_seed(5);
  const int64_t B = 256, V = 5003;
  at::Tensor logits = at::randn({B, V}) * 3;
  std::vector<kernels::SamplingRowParams> params(B);
  for (int64_t r = 0; r < B; ++r) {
    params[r] = {r % 7 == 0 ? 0.f : 1.f,
                 static_cast<int32_t>(r % 2 ? 40 : 0),
                 r % 3 ? 0.9f : 1.f,
                 0.f,
                 static_cast<uint64_t>(r * 31),
                 11};
  }
  auto cpu = SampleRows(logits, params);
  auto gpu = SampleRows(logits.cuda(), params);
  auto gpu_bf16 = SampleRows(logits.to(at::kBFloat16).cuda(), params);
  ASSERT_TRUE(cpu.ok() && gpu.ok() && gpu_bf16.ok());
  int same = 0;
  for (int64_t r = 0; r < B; ++r) same += cpu->tokens[r] == gpu->tokens[r];
  EXPECT_GE(same, B - 1);
  auto cpu_bf16 = SampleRows(logits.to(at::kBFloat16), params);
  ASSERT_TRUE(cpu_bf16.ok());
  same = 0;
  for (int64_t r = 0; r < B; ++r) same += cpu_bf16->tokens[r] == gpu_bf16->tokens[r];
  EXPECT_GE(same, B - 1);
}

TEST_F(OpsGpuTest, TokenLogprobsForwardAndBackwardMatchTheCpu) {
  at::manual_seed(6);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor base = (at::randn({2, 33, 4099}) * 2).to(dtype);
    at::Tensor targets = at::randint(0, 4099, {2, 33}, at::kLong);
    at::Tensor g = at::randn({2, 33});
    at::Tensor cpu_logits = base.to(at::kFloat).set_requires_grad(true);
    at::Tensor cpu_lp = TokenLogprobs(cpu_logits, targets, 0.8);
    (cpu_lp * g).sum().backward();
    at::Tensor gpu_logits = base.cuda().set_requires_grad(true);
    at::Tensor gpu_lp = TokenLogprobs(gpu_logits, targets.cuda(), 0.8);
    (gpu_lp * g.cuda()).sum().backward();
    EXPECT_TRUE(at::allclose(gpu_lp.cpu(), cpu_lp.detach(), 1e-4, 1e-4));
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    EXPECT_TRUE(at::allclose(gpu_logits.grad().cpu().to(at::kFloat), cpu_logits.grad(), tol, tol));
  }
}

TEST_F(OpsGpuTest, PolicyLossOnTheGpuMatchesTheCpu) {
  at::manual_seed(7);
  at::Tensor logp = at::randn({8, 64}) * 0.1 - 1;
  at::Tensor old = logp + at::randn({8, 64}) * 0.1;
  at::Tensor rollout = old + at::randn({8, 64}) * 0.05;
  at::Tensor ref = old + at::randn({8, 64}) * 0.05;
  at::Tensor adv = at::randn({8, 64});
  at::Tensor mask = (at::rand({8, 64}) > 0.2).to(at::kFloat);
  kernels::PolicyLossParams p;
  p.correction = kernels::Correction::kTis;
  p.kl = kernels::KlKind::kK3;
  p.kl_coef = 0.01f;
  auto cpu = PolicyLoss(logp, old, rollout, ref, adv, mask, p);
  auto gpu =
      PolicyLoss(logp.cuda(), old.cuda(), rollout.cuda(), ref.cuda(), adv.cuda(), mask.cuda(), p);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status().message();
  EXPECT_NEAR(gpu->stats.loss, cpu->stats.loss, 1e-9 + 1e-9 * std::abs(cpu->stats.loss));
  EXPECT_NEAR(gpu->stats.clip_frac, cpu->stats.clip_frac, 1e-12);
  EXPECT_TRUE(at::allclose(gpu->grad_logp.cpu(), cpu->grad_logp, 1e-6, 1e-30));
  auto mixed = PolicyLoss(logp.cuda(), old, rollout, ref, adv, mask, p);
  EXPECT_FALSE(mixed.ok());
}

// model.device = cuda: the same model moved to the GPU gives the same logits, the same greedy
// tokens through the engine (CUDA sampling kernel), and the same optimizer step (fused log-prob
// and loss kernels) as on the CPU.
TEST_F(OpsGpuTest, ModelEngineAndTrainerOnTheGpuMatchTheCpu) {
  const model::ModelSpec spec = testing::TinySpec(64, 64, 2, 4, 2, 96, 64);
  auto cpu_model = model::Transformer::Create(spec, 7, 0.05);
  auto gpu_model = model::Transformer::Create(spec, 7, 0.05);
  gpu_model->To(at::Device(at::kCUDA, 0));
  ASSERT_TRUE(gpu_model->device().is_cuda());
  at::Tensor tokens = at::randint(0, 64, {3, 17}, at::kLong);
  {
    at::NoGradGuard ng;
    EXPECT_TRUE(at::allclose(gpu_model->Forward(tokens.cuda()).cpu(), cpu_model->Forward(tokens),
                             1e-4, 1e-4));
  }
  // Static scheduling of the paged engine, eager on the GPU (the graph test is below).
  rollout::EngineConfig fixed;
  fixed.block_size = 4;
  fixed.num_blocks = 64;
  fixed.max_running = 8;
  fixed.scheduling = rollout::Scheduling::kStatic;
  fixed.cuda_graphs = false;
  auto cpu_engine = rollout::RolloutEngine::Create(cpu_model.get(), fixed);
  auto gpu_engine = rollout::RolloutEngine::Create(gpu_model.get(), fixed);
  ASSERT_TRUE(cpu_engine.ok() && gpu_engine.ok());
  std::vector<rollout::Request> reqs(4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].id = i;
    reqs[i].prompt = {1, static_cast<int32_t>(5 + i), 9};
    reqs[i].sampling.temperature = 0;  // greedy: deterministic on both devices
    reqs[i].sampling.max_new_tokens = 12;
  }
  auto a = (*cpu_engine)->Generate(reqs);
  auto b = (*gpu_engine)->Generate(reqs);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ((*a)[i].response.tokens, (*b)[i].response.tokens) << i;
  }

  trainer::PolicyTrainer cpu_t(std::move(cpu_model), 1e-2, 0, 0.9, 0.999);
  trainer::PolicyTrainer gpu_t(std::move(gpu_model), 1e-2, 0, 0.9, 0.999);
  std::vector<trainer::TrainSample> batch;
  for (int i = 0; i < 6; ++i) {
    trainer::TrainSample s;
    s.prompt = {1, 2 + i, 3};
    s.response = {4 + i, 5, 6 + i};
    s.rollout_logprobs = {-1.f, -1.f, -1.f};
    s.advantage = i % 2 ? 1.f : -1.f;
    batch.push_back(s);
  }
  trainer::TrainOptions opts;
  auto ma = cpu_t.Step(batch, trainer::Objective::kPolicyGradient, 1e-2, opts);
  auto mb = gpu_t.Step(batch, trainer::Objective::kPolicyGradient, 1e-2, opts);
  ASSERT_TRUE(ma.ok() && mb.ok()) << mb.status().message();
  EXPECT_NEAR((*mb)["loss"], (*ma)["loss"], 1e-5);
  const auto pa = cpu_t.model().NamedParameters(), pb = gpu_t.model().NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::allclose(pb[i].second.detach().cpu(), pa[i].second.detach(), 1e-4, 1e-5))
        << pa[i].first;
  }
}

// The continuous-batching engine on the GPU with decode steps replayed from CUDA graphs gives
// the same greedy tokens as without graphs and as on the CPU, for batches that exercise several
// padded shapes (rows join and leave, contexts cross block boundaries); sampled tokens with the
// same seeds agree between graphs and no graphs.
TEST_F(OpsGpuTest, RolloutEngineWithCudaGraphsMatchesEagerAndCpu) {
  const model::ModelSpec spec = testing::TinySpec(64, 64, 2, 4, 2, 96, 128);
  auto cpu_model = model::Transformer::Create(spec, 11, 0.05);
  auto gpu_model = model::Transformer::Create(spec, 11, 0.05);
  gpu_model->To(at::Device(at::kCUDA, 0));
  rollout::EngineConfig c;
  c.block_size = 8;
  c.num_blocks = 256;
  c.max_running = 32;
  c.max_step_tokens = 256;
  auto run = [&](const model::Transformer* m, bool graphs, float temperature,
                 int64_t* graph_steps) {
    rollout::EngineConfig cfg = c;
    cfg.cuda_graphs = graphs;
    auto engine = rollout::RolloutEngine::Create(m, cfg);
    EXPECT_TRUE(engine.ok()) << engine.status();
    std::vector<rollout::Request> reqs;
    for (int i = 0; i < 20; ++i) {
      rollout::Request r;
      r.id = static_cast<uint64_t>(i);
      r.group = static_cast<uint64_t>(i);
      r.prompt = {1, static_cast<int32_t>(3 + i), 9, static_cast<int32_t>(40 - i)};
      r.seed = 1000 + static_cast<uint64_t>(i);
      r.n = i % 3 == 0 ? 2 : 1;
      r.sampling.temperature = temperature;
      r.sampling.max_new_tokens = 10 + 3 * (i % 7);  // different lengths: rows leave
      reqs.push_back(r);
    }
    EXPECT_TRUE((*engine)->Add(reqs).ok());
    auto out = (*engine)->Run();
    EXPECT_TRUE(out.ok()) << out.status();
    if (graph_steps) *graph_steps = (*engine)->stats().graph_steps;
    std::vector<std::vector<int32_t>> tokens;
    auto results = out.ok() ? *out : std::vector<rollout::SampleResult>{};
    std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) {
      return std::make_pair(a.id, a.index) < std::make_pair(b.id, b.index);
    });
    for (const auto& r : results) tokens.push_back(r.response.tokens);
    return tokens;
  };
  int64_t graph_steps = 0, eager_steps = 0;
  const auto with_graphs = run(gpu_model.get(), true, 0.0f, &graph_steps);
  const auto eager = run(gpu_model.get(), false, 0.0f, &eager_steps);
  const auto cpu = run(cpu_model.get(), true, 0.0f, nullptr);
  EXPECT_GT(graph_steps, 10);
  EXPECT_EQ(eager_steps, 0);
  EXPECT_EQ(with_graphs, eager);
  EXPECT_EQ(with_graphs, cpu);
  EXPECT_EQ(run(gpu_model.get(), true, 1.0f, nullptr), run(gpu_model.get(), false, 1.0f, nullptr));
}

}  // namespace
}  // namespace gyre::ops
