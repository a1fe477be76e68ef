// GradReducer against a fake two-rank group (every rank holds the same gradient, so the sum is
// twice the local one): bucket layout, the order of collectives, overlap with backward, unused
// parameters, and errors. Every test runs in the blocking and in the overlapped mode unless it is
// about overlap itself.
#include "trainer/grad_reducer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "testing/fake_communicator.h"

namespace gyre::trainer {
namespace {

using Buckets = std::vector<std::vector<size_t>>;

TEST(PlanGradBucketsTest, ReverseOrderBoundedSizeLargeTensorsAlone) {
  // 10 floats per bucket. From the last parameter: {4} (2 floats), then 100 floats alone, then
  // 5 + 3, then 10.
  EXPECT_EQ(PlanGradBuckets({10, 3, 5, 100, 2}, 40), (Buckets{{4}, {3}, {2, 1}, {0}}));
  EXPECT_EQ(PlanGradBuckets({10, 3, 5, 100, 2}, 1 << 20), (Buckets{{4, 3, 2, 1, 0}}));
  EXPECT_EQ(PlanGradBuckets({1, 1}, 0), (Buckets{{1}, {0}}));
  EXPECT_TRUE(PlanGradBuckets({}, 1024).empty());
}

at::Tensor Param(int64_t n, float start) {
  return at::arange(start, start + static_cast<float>(n), at::kFloat).div(7).requires_grad_();
}

std::vector<at::Tensor> Params(const std::vector<int64_t>& sizes) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < sizes.size(); ++i) out.push_back(Param(sizes[i], 1.0f + i));
  return out;
}

std::vector<std::string> Names(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back("p" + std::to_string(i));
  return out;
}

// Clones with fresh autograd state, for a reference run without any reducer.
std::vector<at::Tensor> Fresh(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// A chain over p[0..2] in which autograd finishes p[0]'s gradient first and p[2]'s last:
// loss = sum(p0 * sum(p1 * sum(x * p2))). p[3], if present, is unused.
at::Tensor ChainLoss(const std::vector<at::Tensor>& p, float scale) {
  at::Tensor x = at::arange(1.0, 1.0 + static_cast<double>(p[2].numel()), at::kFloat) * scale;
  at::Tensor s2 = (x * p[2]).sum();
  at::Tensor s1 = (s2 * p[1]).sum();
  return (s1 * p[0]).sum();
}

void ZeroGrads(const std::vector<at::Tensor>& params) {
  for (const auto& p : params) p.mutable_grad() = at::Tensor();
}

class GradReducerTest : public ::testing::TestWithParam<bool> {
 protected:
  bool overlap() const { return GetParam(); }
};

TEST_P(GradReducerTest, CollectivesFollowBucketOrderNotGradientOrder) {
  // Autograd finishes p0 (2 floats), then p1 (3), then p2 (5). One parameter per bucket; the
  // buckets run from the last parameter, so the collectives must be 5, 3, 2 whatever the hooks.
  const auto params = Params({2, 3, 5});
  testing::FakeCommunicator group(2);
  GradReducer reducer(params, Names(3), &group, 4, 30, overlap());
  ASSERT_EQ(reducer.buckets(), (Buckets{{2}, {1}, {0}}));
  for (int step = 0; step < 2; ++step) {  // and the same again on the next step
    group.Reset();
    ZeroGrads(params);
    reducer.Arm();
    ChainLoss(params, 1).backward();
    ASSERT_TRUE(reducer.Finish().ok());
    EXPECT_EQ(group.counts(), (std::vector<size_t>{5, 3, 2})) << "step " << step;
  }
}

TEST_P(GradReducerTest, SumsTheGradientAccumulatedOverMicroBatches) {
  const auto params = Params({2, 3, 5});
  const auto ref = Fresh(params);
  ChainLoss(ref, 1).backward();
  ChainLoss(ref, -0.5).backward();
  testing::FakeCommunicator group(2);
  GradReducer reducer(params, Names(3), &group, 20, 30, overlap());  // 5 floats a bucket
  ASSERT_EQ(reducer.buckets(), (Buckets{{2}, {1, 0}}));
  ChainLoss(params, 1).backward();  // an earlier micro-batch: local accumulation only
  EXPECT_TRUE(group.calls().empty());
  reducer.Arm();
  ChainLoss(params, -0.5).backward();
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.counts(), (std::vector<size_t>{5, 5}));
  for (size_t i = 0; i < params.size(); ++i) {
    // Two equal shards summed: exact in binary floating point.
    EXPECT_TRUE(at::equal(params[i].grad(), ref[i].grad() * 2)) << "p" << i;
  }
}

TEST_P(GradReducerTest, UnusedParametersAndRanksWithoutBackwardJoinWithZeros) {
  const auto params = Params({2, 3, 5, 4});  // p3 is not in the chain
  const auto ref = Fresh(params);
  ChainLoss(ref, 1).backward();
  testing::FakeCommunicator group(2);
  GradReducer reducer(params, Names(4), &group, 4, 30, overlap());
  reducer.Arm();
  ChainLoss(params, 1).backward();
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.counts(), (std::vector<size_t>{4, 5, 3, 2}));
  ASSERT_TRUE(params[3].grad().defined());
  EXPECT_TRUE(at::equal(params[3].grad(), at::zeros({4})));
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(params[i].grad(), ref[i].grad() * 2));

  // A rank whose shard is empty runs no backward at all; it still joins every collective.
  group.Reset();
  ZeroGrads(params);
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.counts(), (std::vector<size_t>{4, 5, 3, 2}));
  for (const auto& p : params) EXPECT_TRUE(at::equal(p.grad(), at::zeros_like(p)));
}

TEST_P(GradReducerTest, FailedCollectiveFailsFinishWithoutTouchingGradients) {
  const auto params = Params({2, 3, 5});
  testing::FakeCommunicator group(2);
  GradReducer reducer(params, Names(3), &group, 4, 30, overlap());
  group.FailCall(1, DeadlineExceeded("fake all-reduce timed out"));
  reducer.Arm();
  ChainLoss(params, 1).backward();
  std::vector<at::Tensor> local;
  for (const auto& p : params) local.push_back(p.grad().clone());
  const Status s = reducer.Finish();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("gradient bucket 2 of 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("fake all-reduce timed out"), std::string::npos) << s.message();
  EXPECT_EQ(group.counts(), (std::vector<size_t>{5, 3}));  // nothing after the failure
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i].grad(), local[i]));

  // The reducer is ready for the next step (over a group formed again).
  group.Reset();
  ZeroGrads(params);
  reducer.Arm();
  ChainLoss(params, 1).backward();
  EXPECT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.counts(), (std::vector<size_t>{5, 3, 2}));
}

INSTANTIATE_TEST_SUITE_P(Modes, GradReducerTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Overlapped" : "Blocking";
                         });

TEST(GradReducerOverlapTest, FirstBucketIsReducedWhileBackwardRuns) {
  // p2's gradient (bucket 0) is final long before p0's, which autograd computes last here:
  // loss = sum(p2 * sum(x * p0)). p0's gradient hook holds backward until the group has seen the
  // first collective, which only an overlapped reducer issues while backward is still running.
  const auto params = Params({3, 1, 4});
  testing::FakeCommunicator group(2);
  std::promise<std::thread::id> first_call;
  std::future<std::thread::id> first = first_call.get_future();
  group.OnCall([&](size_t index) {
    if (index == 0) first_call.set_value(std::this_thread::get_id());
  });
  GradReducer reducer(params, Names(3), &group, 4, 30, /*overlap=*/true);
  bool seen_during_backward = false;
  params[0].register_hook([&](const at::Tensor&) {
    seen_during_backward = first.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  });
  reducer.Arm();
  at::Tensor x = at::arange(1.0, 4.0, at::kFloat);
  ((x * params[0]).sum() * params[2] + params[1]).sum().backward();
  EXPECT_TRUE(seen_during_backward);
  ASSERT_TRUE(reducer.Finish().ok());
  EXPECT_NE(first.get(), std::this_thread::get_id());  // issued by the communication thread
  EXPECT_EQ(group.counts(), (std::vector<size_t>{4, 1, 3}));
}

TEST(GradReducerOverlapTest, BackwardThatThrowsIsCancelledCleanly) {
  const auto params = Params({2, 3, 5});
  testing::FakeCommunicator group(2);
  GradReducer reducer(params, Names(3), &group, 4, 30, /*overlap=*/true);
  // p2's gradient is the last autograd computes; p0's bucket may already be in flight.
  const auto handle = params[2].register_hook(
      [](const at::Tensor&) -> void { throw std::runtime_error("out of memory (simulated)"); });
  reducer.Arm();
  EXPECT_ANY_THROW(ChainLoss(params, 1).backward());
  reducer.Cancel();
  EXPECT_LE(group.calls().size(), 2u);  // the buckets of p0 and p1 at most; never p2's
  params[2].remove_hook(handle);

  group.Reset();
  ZeroGrads(params);
  reducer.Arm();
  ChainLoss(params, 1).backward();
  EXPECT_TRUE(reducer.Finish().ok());
  EXPECT_EQ(group.counts(), (std::vector<size_t>{5, 3, 2}));
}

TEST(GradReducerOverlapTest, DestructorRemovesItsHooks) {
  const auto params = Params({2, 3, 5});
  testing::FakeCommunicator group(2);
  {
    GradReducer reducer(params, Names(3), &group, 4, 30, /*overlap=*/true);
    for (const auto& p : params) EXPECT_NE(torch::autograd::impl::post_acc_grad_hooks(p), nullptr);
  }
  for (const auto& p : params) EXPECT_EQ(torch::autograd::impl::post_acc_grad_hooks(p), nullptr);
  // A new reducer can take the same parameters (a data-parallel group formed again).
  GradReducer again(params, Names(3), &group, 4, 30, /*overlap=*/true);
  again.Arm();
  ChainLoss(params, 1).backward();
  EXPECT_TRUE(again.Finish().ok());
  EXPECT_EQ(group.counts(), (std::vector<size_t>{5, 3, 2}));
}

}  // namespace
}  // namespace gyre::trainer
