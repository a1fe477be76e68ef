#include "controller/sharding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
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

// With group keys, a mini-batch with at least two groups per rank is split by whole groups
// (every group on one rank, loads balanced by group); with fewer groups, samples are placed one
// by one as without keys.
TEST(ShardBatchTest, GroupsStayTogetherWhenThereAreEnoughOfThem) {
  // 6 groups of 4 samples (keys 10..15, interleaved as a batch may be), 2 ranks, 1 mini-batch.
  std::vector<int64_t> tokens;
  std::vector<uint64_t> groups;
  for (int i = 0; i < 24; ++i) {
    groups.push_back(10 + static_cast<uint64_t>(i % 6));
    tokens.push_back(5 + i % 6 + (i % 4));
  }
  const DpShards s = ShardBatch(tokens, 2, 1, groups);
  std::vector<int> rank_of_group(6, -1);
  std::vector<int64_t> load(2, 0);
  size_t placed = 0;
  for (int r = 0; r < 2; ++r) {
    placed += s.samples[r].size();
    for (size_t i : s.samples[r]) {
      const int g = static_cast<int>(groups[i] - 10);
      if (rank_of_group[g] < 0) rank_of_group[g] = r;
      EXPECT_EQ(rank_of_group[g], r) << "group " << g << " is split";
      load[r] += tokens[i];
    }
    EXPECT_TRUE(std::is_sorted(s.samples[r].begin(), s.samples[r].end()));
  }
  EXPECT_EQ(placed, 24u);
  EXPECT_EQ(s.samples[0].size(), 12u);            // 3 groups each
  EXPECT_LE(std::abs(load[0] - load[1]), 4 + 4);  // within one group's spread
  // 3 groups on 2 ranks: fewer than two per rank, so samples are balanced one by one.
  const std::vector<int64_t> three_tokens(tokens.begin(), tokens.begin() + 12);
  const std::vector<uint64_t> few = {1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
  EXPECT_EQ(ShardBatch(three_tokens, 2, 1, few).samples, ShardBatch(three_tokens, 2, 1).samples);
}

}  // namespace
}  // namespace gyre::controller
