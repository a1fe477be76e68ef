#include "controller/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace gyre::controller {
namespace {

TEST(ShardBatchTest, EverySampleOnceBalancedAndInMiniBatchOrder) {
  std::vector<int64_t> tokens = {50, 10, 10, 40, 30, 20, 20, 5, 5, 60};
  const DpShards s = ShardBatch(tokens, 3, 2);
  ASSERT_EQ(s.samples.size(), 3u);
  std::vector<size_t> all;
  for (int r = 0; r < 3; ++r) {
    all.insert(all.end(), s.samples[r].begin(), s.samples[r].end());
    int32_t total = 0;
    for (int32_t n : s.mini_batch_sizes[r]) total += n;
    EXPECT_EQ(total, static_cast<int32_t>(s.samples[r].size()));
    // Mini-batch 0 is samples [0, 5), mini-batch 1 is [5, 10).
    for (int32_t i = 0; i < s.mini_batch_sizes[r][0]; ++i) EXPECT_LT(s.samples[r][i], 5u);
    for (size_t i = s.mini_batch_sizes[r][0]; i < s.samples[r].size(); ++i) {
      EXPECT_GE(s.samples[r][i], 5u);
    }
  }
  std::sort(all.begin(), all.end());
  std::vector<size_t> want(10);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
  // Mini-batch 0 = {50, 10, 10, 40, 30}: LPT gives loads {50, 40, 30+10+10}.
  std::vector<int64_t> load(3, 0);
  for (int r = 0; r < 3; ++r) {
    for (int32_t i = 0; i < s.mini_batch_sizes[r][0]; ++i) load[r] += tokens[s.samples[r][i]];
  }
  std::sort(load.begin(), load.end());
  EXPECT_EQ(load, (std::vector<int64_t>{40, 50, 50}));
}

TEST(ShardBatchTest, MoreRanksThanSamplesLeavesSomeEmptyAndIsDeterministic) {
  const DpShards a = ShardBatch({3, 3}, 4, 1);
  const DpShards b = ShardBatch({3, 3}, 4, 1);
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.samples[0], std::vector<size_t>{0});
  EXPECT_EQ(a.samples[1], std::vector<size_t>{1});
  EXPECT_TRUE(a.samples[2].empty());
  EXPECT_EQ(a.mini_batch_sizes[3], std::vector<int32_t>{0});
}

}  // namespace
}  // namespace gyre::controller
