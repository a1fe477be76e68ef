// Data-parallel PolicyTrainer: M ranks (threads of this process, each with its own Gloo group
// member over loopback) holding token-balanced shards take the same optimizer steps as one
// trainer on the whole batch, up to floating-point summation order.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/gloo_communicator.h"
#include "controller/sharding.h"
#include "testing/tiny_model.h"
#include "trainer/policy_trainer.h"

namespace gyre::trainer {
namespace {

model::ModelSpec Spec() { return testing::TinySpec(24, 32, 2, 4, 2, 48); }

std::vector<TrainSample> Batch() {
  std::vector<TrainSample> b;
  for (int i = 0; i < 11; ++i) {
    TrainSample s;
    s.prompt = {1, static_cast<int32_t>(3 + i % 9), 5};
    s.response.assign(2 + (i * 7) % 5, static_cast<int32_t>(7 + i));
    s.rollout_logprobs.assign(s.response.size(), -1.0f);
    s.advantage = (i % 2 == 0 ? 1.0f : -0.5f) * (1 + i % 4);
    b.push_back(s);
  }
  b[2].loss_mask.assign(b[2].response.size(), 1.0f);
  b[2].loss_mask[1] = 0;
  return b;
}

at::Tensor Flat(const PolicyTrainer& t) {
  std::vector<at::Tensor> parts;
  for (const auto& [n, p] : t.model().NamedParameters()) parts.push_back(p.detach().flatten());
  return at::cat(parts);
}

struct RunResult {
  at::Tensor params;
  std::vector<std::map<std::string, double>> metrics;  // per step, rank 0
};

// Two steps (one policy-gradient with `minis` mini-batches, one SFT) on `ranks` ranks.
RunResult TrainRanks(int ranks, int minis, int64_t bucket_bytes) {
  std::unique_ptr<comm::StoreServer> store;
  if (ranks > 1) {
    auto s = comm::StoreServer::Start("127.0.0.1");
    EXPECT_TRUE(s.ok()) << s.status().message();
    store = std::move(*s);
  }
  const std::vector<TrainSample> batch = Batch();
  std::vector<int64_t> tokens;
  for (const auto& s : batch) tokens.push_back(s.prompt.size() + s.response.size());
  std::vector<std::future<RunResult>> futures;
  for (int r = 0; r < ranks; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r] {
      RunResult out;
      PolicyTrainer t(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0.01, 0.9, 0.999);
      std::unique_ptr<comm::Communicator> group;
      if (ranks > 1) {
        comm::GlooOptions o;
        o.store_address = store->address();
        o.group = "dp-test-" + std::to_string(ranks) + "-" + std::to_string(minis);
        o.rank = r;
        o.size = ranks;
        auto g = comm::CreateGlooCommunicator(o);
        EXPECT_TRUE(g.ok()) << g.status().message();
        if (!g.ok()) return out;
        group = std::move(*g);
        t.SetDataParallel(group.get(), bucket_bytes, 60);
      }
      for (auto objective : {Objective::kPolicyGradient, Objective::kSft}) {
        const int m = objective == Objective::kSft ? 1 : minis;
        TrainOptions opts;
        opts.micro_batch_size = 2;
        opts.grad_clip = 0.5;  // the clip must use the global norm
        opts.mini_batches = m;
        std::vector<TrainSample> shard = batch;
        if (ranks > 1) {
          const auto shards = controller::ShardBatch(tokens, ranks, m);
          shard.clear();
          for (size_t i : shards.samples[r]) shard.push_back(batch[i]);
          opts.mini_batch_sizes.assign(shards.mini_batch_sizes[r].begin(),
                                       shards.mini_batch_sizes[r].end());
        }
        auto metrics = t.Step(shard, objective, 1e-2, opts);
        EXPECT_TRUE(metrics.ok()) << metrics.status().message();
        if (metrics.ok()) out.metrics.push_back(*metrics);
      }
      out.params = Flat(t);
      return out;
    }));
  }
  std::vector<RunResult> results;
  for (auto& f : futures) results.push_back(f.get());
  // Every rank ends with the same weights, bit for bit (they apply the same summed gradient).
  for (int r = 1; r < ranks; ++r) EXPECT_TRUE(at::equal(results[r].params, results[0].params));
  return results[0];
}

TEST(DataParallelTrainerTest, TwoAndFourRanksMatchOneRank) {
  for (int minis : {1, 3}) {
    const RunResult one = TrainRanks(1, minis, 32 << 20);
    for (int ranks : {2, 4}) {
      // A small bucket forces several all-reduce buckets per step.
      const RunResult dp = TrainRanks(ranks, minis, 4096);
      ASSERT_EQ(dp.metrics.size(), one.metrics.size());
      EXPECT_TRUE(at::allclose(dp.params, one.params, 1e-5, 1e-6))
          << "ranks " << ranks << " minis " << minis << ": max diff "
          << (dp.params - one.params).abs().max().item<float>();
      for (size_t s = 0; s < one.metrics.size(); ++s) {
        for (const char* k : {"loss", "grad_norm", "tokens", "entropy", "token_accuracy"}) {
          EXPECT_NEAR(dp.metrics[s].at(k), one.metrics[s].at(k),
                      1e-4 * (1 + std::abs(one.metrics[s].at(k))))
              << k << " at step " << s << " with " << ranks << " ranks, " << minis << " minis";
        }
      }
      // And the update is not trivially zero.
      EXPECT_GT((one.params - Flat(PolicyTrainer(model::Transformer::Create(Spec(), 3, 0.1), 1e-2,
                                                 0.01, 0.9, 0.999)))
                    .abs()
                    .max()
                    .item<float>(),
                1e-4);
    }
  }
}

TEST(DataParallelTrainerTest, BadShardOnOneRankFailsEveryRankWithoutHanging) {
  auto store = comm::StoreServer::Start("127.0.0.1");
  ASSERT_TRUE(store.ok());
  std::vector<std::future<Status>> futures;
  for (int r = 0; r < 2; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r]() -> Status {
      PolicyTrainer t(model::Transformer::Create(Spec(), 3, 0.1), 1e-2, 0, 0.9, 0.999);
      comm::GlooOptions o;
      o.store_address = (*store)->address();
      o.group = "dp-bad";
      o.rank = r;
      o.size = 2;
      GYRE_ASSIGN_OR_RETURN(auto group, comm::CreateGlooCommunicator(o));
      t.SetDataParallel(group.get(), 1 << 20, 30);
      std::vector<TrainSample> shard = Batch();
      if (r == 1) shard[0].response.push_back(999);  // out of the vocabulary
      TrainOptions opts;
      const auto before = Flat(t);
      auto m = t.Step(shard, Objective::kPolicyGradient, 1e-2, opts);
      EXPECT_TRUE(at::equal(before, Flat(t)));  // nothing changed on either rank
      return m.status();
    }));
  }
  const Status s0 = futures[0].get(), s1 = futures[1].get();
  EXPECT_FALSE(s0.ok());
  EXPECT_NE(s0.message().find("another data-parallel rank"), std::string::npos) << s0.message();
  EXPECT_FALSE(s1.ok());
  EXPECT_EQ(s1.message().find("another data-parallel rank"), std::string::npos) << s1.message();
}

}  // namespace
}  // namespace gyre::trainer
