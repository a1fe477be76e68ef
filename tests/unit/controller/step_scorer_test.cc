// StepScorer on a real ledger (SQLite) and the built-in character tokenizer: stale samples,
// failed rewards and zero-variance groups leave the batch with their reasons in the ledger;
// the rest are scored and get their group advantages.

#include "controller/step_scorer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "common/file_util.h"
#include "controller/task.h"
#include "text/tokenizer.h"

namespace gyre::controller {
namespace {

// Exact match, except that the response "boom" makes the reward fail.
class FlakyReward final : public RewardFn {
 public:
  StatusOr<double> Score(const RewardInput& in) override {
    if (in.response == "boom") return Unavailable("reward service down");
    return exact_.Score(in);
  }

 private:
  ExactMatchReward exact_;
};

class StepScorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "gyre_step_scorer_" + std::to_string(::getpid()) + ".db";
    Clean();
    auto ledger = SampleLedger::Open(path_, true);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ledger_ = std::move(*ledger);
    auto tok = text::MakeTextTokenizer(ModelSection());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
  }
  void TearDown() override {
    ledger_.reset();
    Clean();
  }
  void Clean() {
    for (const char* suffix : {"", "-wal", "-shm"}) (void)RemoveTree(path_ + suffix);
  }

  // Group `g` of 3 samples answering `answer`, its samples ids 10g..10g+2, queued and generated
  // in the ledger.
  GroupJob Group(uint64_t g, const std::string& answer) {
    GroupJob job;
    job.group.set_group_id(g);
    job.group.set_n(3);
    job.group.set_first_sample_id(10 * g);
    job.problem.prompt = "q" + std::to_string(g);
    job.problem.answer = answer;
    std::vector<NewSample> queued;
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 3; ++i) {
      queued.push_back({10 * g + i, g, job.problem.prompt});
      ids.push_back(10 * g + i);
    }
    EXPECT_TRUE(ledger_->Add(queued, {1, 5, "", ""}).ok());
    EXPECT_TRUE(ledger_->Move(ids, SampleState::kGenerating, {1, 5, "rollout-0", ""}).ok());
    EXPECT_TRUE(ledger_->Move(ids, SampleState::kFinished, {1, 5, "rollout-0", ""}).ok());
    return job;
  }
  v1::Sample Sample(uint64_t id, uint64_t g, const std::string& response, int64_t version) {
    v1::Sample s;
    s.set_sample_id(id);
    s.set_group_id(g);
    auto ids = tokenizer_->Encode(response);
    EXPECT_TRUE(ids.ok());
    for (int32_t t : *ids) {
      s.add_response_ids(t);
      s.add_versions(version);
    }
    s.add_response_ids(text::CharTokenizer::kEos);
    s.add_versions(5);
    s.set_finish_reason(v1::FINISH_REASON_STOP);
    return s;
  }
  std::string LastReason(uint64_t id, SampleState* state) {
    auto h = ledger_->History(id);
    EXPECT_TRUE(h.ok());
    *state = h->back().to;
    return h->back().context.reason;
  }

  std::string path_;
  std::unique_ptr<SampleLedger> ledger_;
  std::unique_ptr<text::TextTokenizer> tokenizer_;
};

TEST_F(StepScorerTest, LeavesOutWhatCannotTrainAndScoresTheRest) {
  AlgorithmSection algo;
  algo.max_staleness = 1;
  algo.filter_zero_variance = true;
  algo.advantage = "grpo";
  FlakyReward reward;
  StepScorer scorer(algo, 3, tokenizer_.get(), &reward);
  const std::vector<GroupJob> jobs = {Group(0, "12"), Group(1, "7"), Group(2, "4")};
  std::vector<v1::Sample> samples = {
      Sample(0, 0, "12", 5),    Sample(1, 0, "13", 4), Sample(2, 0, "12", 3),  // 2: stale
      Sample(10, 1, "7", 5),    Sample(11, 1, "7", 5), Sample(12, 1, "7", 5),  // all correct
      Sample(20, 2, "boom", 5), Sample(21, 2, "4", 5), Sample(22, 2, "5", 5)};
  StepScores out;
  ASSERT_TRUE(scorer.Score(jobs, &samples, 3, 5, ledger_.get(), &out).ok());
  EXPECT_EQ(out.stale, 1);
  EXPECT_EQ(out.reward_errors, 1);
  EXPECT_EQ(out.filtered_groups, 1);
  EXPECT_EQ(out.scored, 7);  // the filtered group's 3 included
  EXPECT_EQ(out.correct, 5);
  EXPECT_DOUBLE_EQ(out.reward_sum, 5.0);
  ASSERT_EQ(out.group_sizes, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(out.rewards, (std::vector<float>{1, 0, 1, 0}));
  std::vector<uint64_t> kept;
  for (const auto& s : out.kept) kept.push_back(s.sample_id());
  EXPECT_EQ(kept, (std::vector<uint64_t>{0, 1, 21, 22}));
  EXPECT_EQ(out.staleness, (std::map<int64_t, int64_t>{{0, 3}, {1, 1}}));

  SampleState st;
  EXPECT_EQ(LastReason(2, &st), "stale: tokens older than algorithm.max_staleness 1 versions");
  EXPECT_EQ(st, SampleState::kDropped);
  EXPECT_EQ(LastReason(20, &st), "reward failed: UNAVAILABLE: reward service down");
  EXPECT_EQ(st, SampleState::kDropped);
  EXPECT_NE(LastReason(11, &st).find("zero reward variance: all 3 rewards 1.0"), std::string::npos);
  EXPECT_EQ(st, SampleState::kFiltered);
  for (uint64_t id : {0, 1, 21, 22}) {
    EXPECT_EQ(LastReason(id, &st), "");
    EXPECT_EQ(st, SampleState::kScored) << id;
  }

  // GRPO advantages per kept group: (r - mean) / (std + 1e-6), std with n - 1.
  auto zero = scorer.SetAdvantages(&out);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(*zero, 0);
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  for (size_t i = 0; i < out.kept.size(); ++i) {
    EXPECT_NEAR(out.kept[i].advantage(), i % 2 == 0 ? a : -a, 1e-6) << i;
  }
}

// reward.on_failure and reward.retries, through one batch per step (RewardFn::ScoreBatch).
TEST_F(StepScorerTest, FailurePoliciesAndRetriesOfFailedRewards) {
  // Fails "boom" every time and "flaky" on its first attempt; counts batches and item ids.
  class Batching final : public RewardFn {
   public:
    StatusOr<double> Score(const RewardInput&) override { return Internal("batches only"); }
    std::vector<StatusOr<double>> ScoreBatch(const std::vector<RewardInput>& in) override {
      ++batches;
      std::vector<StatusOr<double>> out;
      for (const RewardInput& i : in) {
        ids.push_back(i.id);
        if (i.response == "boom" || (i.response == "flaky" && flaky_seen++ == 0)) {
          out.push_back(DeadlineExceeded("item timed out"));
        } else {
          out.push_back(i.response == i.answer ? 1.0 : 0.0);
        }
      }
      return out;
    }
    int batches = 0, flaky_seen = 0;
    std::vector<std::string> ids;
  };
  AlgorithmSection algo;
  algo.advantage = "grpo";
  SampleState st;
  {  // drop_group: the group with a failure leaves whole; one batch for the step.
    Batching reward;
    StepScorer scorer(algo, 3, tokenizer_.get(), &reward);
    scorer.SetFailurePolicy("drop_group", 0);
    const std::vector<GroupJob> jobs = {Group(0, "1"), Group(1, "2")};
    std::vector<v1::Sample> samples = {Sample(0, 0, "1", 5),  Sample(1, 0, "boom", 5),
                                       Sample(2, 0, "3", 5),  Sample(10, 1, "2", 5),
                                       Sample(11, 1, "0", 5), Sample(12, 1, "2", 5)};
    StepScores out;
    ASSERT_TRUE(scorer.Score(jobs, &samples, 1, 5, ledger_.get(), &out).ok());
    EXPECT_EQ(reward.batches, 1);
    EXPECT_EQ(reward.ids,
              (std::vector<std::string>{"g0/s0", "g0/s1", "g0/s2", "g1/s10", "g1/s11", "g1/s12"}));
    EXPECT_EQ(out.reward_errors, 1);
    EXPECT_EQ(out.reward_group_drops, 2);
    EXPECT_EQ(out.group_sizes, (std::vector<int32_t>{3}));
    EXPECT_NE(LastReason(0, &st).find("of its group (reward.on_failure: drop_group)"),
              std::string::npos);
    EXPECT_EQ(st, SampleState::kDropped);
    EXPECT_NE(LastReason(1, &st).find("item timed out"), std::string::npos);
  }
  {  // zero with one retry: "flaky" succeeds the second time, "boom" counts as 0 with a flag.
    Batching reward;
    StepScorer scorer(algo, 3, tokenizer_.get(), &reward);
    scorer.SetFailurePolicy("zero", 1);
    const std::vector<GroupJob> jobs = {Group(5, "flaky")};
    std::vector<v1::Sample> samples = {Sample(50, 5, "flaky", 5), Sample(51, 5, "boom", 5),
                                       Sample(52, 5, "x", 5)};
    StepScores out;
    ASSERT_TRUE(scorer.Score(jobs, &samples, 1, 5, ledger_.get(), &out).ok());
    EXPECT_EQ(reward.batches, 2);  // the step's batch, then the two failures again
    EXPECT_EQ(reward.ids,
              (std::vector<std::string>{"g5/s50", "g5/s51", "g5/s52", "g5/s50", "g5/s51"}));
    EXPECT_EQ(out.reward_errors, 1);
    EXPECT_EQ(out.reward_zeroed, 1);
    ASSERT_EQ(out.kept.size(), 3u);
    EXPECT_EQ(out.rewards, (std::vector<float>{1, 0, 0}));
    EXPECT_EQ(out.kept[0].reward_status(), v1::REWARD_STATUS_OK);
    EXPECT_EQ(out.kept[1].reward_status(), v1::REWARD_STATUS_ERROR);
  }
}

// Without filtering, a group whose rewards are equal is kept with zero advantages, and counted.
TEST_F(StepScorerTest, ZeroVarianceGroupsTrainWithZeroAdvantageUnlessFiltered) {
  AlgorithmSection algo;
  algo.max_staleness = 0;
  ExactMatchReward reward;
  StepScorer scorer(algo, 3, tokenizer_.get(), &reward);
  const std::vector<GroupJob> jobs = {Group(1, "7")};
  std::vector<v1::Sample> samples = {Sample(10, 1, "7", 5), Sample(11, 1, "7", 5),
                                     Sample(12, 1, "7", 5)};
  StepScores out;
  ASSERT_TRUE(scorer.Score(jobs, &samples, 1, 5, ledger_.get(), &out).ok());
  EXPECT_EQ(out.filtered_groups, 0);
  ASSERT_EQ(out.kept.size(), 3u);
  auto zero = scorer.SetAdvantages(&out);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 1);
  for (const auto& s : out.kept) EXPECT_EQ(s.advantage(), 0.0f);
}

// MC-GRPO: with algorithm.advantage median and groups of 3 (G + 1 = 3), the first sample whose
// reward is the median is left out with advantage 0; the caller records it from pivot_ids.
TEST_F(StepScorerTest, MedianLeavesOutEachOddGroupsPivot) {
  AlgorithmSection algo;
  algo.advantage = "median";
  ExactMatchReward reward;
  StepScorer scorer(algo, 3, tokenizer_.get(), &reward);
  const std::vector<GroupJob> jobs = {Group(1, "7"), Group(2, "4")};
  std::vector<v1::Sample> samples = {Sample(10, 1, "7", 5), Sample(11, 1, "8", 5),
                                     Sample(12, 1, "7", 5),  // rewards 1 0 1: median 1
                                     Sample(20, 2, "5", 5), Sample(21, 2, "4", 5),
                                     Sample(22, 2, "6", 5)};  // rewards 0 1 0: median 0
  StepScores out;
  ASSERT_TRUE(scorer.Score(jobs, &samples, 1, 5, ledger_.get(), &out).ok());
  auto zero = scorer.SetAdvantages(&out);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(*zero, 0);
  EXPECT_EQ(out.pivot_ids, (std::vector<uint64_t>{10, 20}));
  EXPECT_EQ(out.group_sizes, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(out.rewards, (std::vector<float>{0, 1, 1, 0}));
  std::vector<uint64_t> kept;
  std::vector<float> adv;
  for (const auto& k : out.kept) {
    kept.push_back(k.sample_id());
    adv.push_back(k.advantage());
  }
  EXPECT_EQ(kept, (std::vector<uint64_t>{11, 12, 21, 22}));
  EXPECT_EQ(adv, (std::vector<float>{-1, 0, 1, 0}));
}

TEST(OverlongPenaltyTest, RampsOverTheBufferBeforeTheLimit) {
  // L = 10, buffer 4: nothing up to 6 tokens, then -1/4 per token to -1 at 10.
  EXPECT_EQ(OverlongPenalty(6, 10, 4, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(OverlongPenalty(7, 10, 4, 1.0), -0.25);
  EXPECT_DOUBLE_EQ(OverlongPenalty(9, 10, 4, 2.0), -1.5);
  EXPECT_DOUBLE_EQ(OverlongPenalty(10, 10, 4, 1.0), -1.0);
  EXPECT_DOUBLE_EQ(OverlongPenalty(12, 10, 4, 1.0), -1.0);  // capped at the full penalty
  EXPECT_EQ(OverlongPenalty(10, 10, 0, 1.0), 0.0);          // off
}

// DAPO's overlong shaping lowers the reward the advantages see, not correctness.
TEST_F(StepScorerTest, OverlongPenaltyShapesTheRewardButNotCorrectness) {
  AlgorithmSection algo;
  algo.overlong_buffer = 2;
  algo.overlong_penalty = 1.0;
  ExactMatchReward reward;
  StepScorer scorer(algo, 3, tokenizer_.get(), &reward, /*max_new_tokens=*/4);
  const std::vector<GroupJob> jobs = {Group(1, "77")};
  // Response tokens (with the end token): 2, 3 and 4; the penalty starts after 4 - 2 = 2.
  std::vector<v1::Sample> samples = {Sample(10, 1, "7", 5), Sample(11, 1, "77", 5),
                                     Sample(12, 1, "777", 5)};
  StepScores out;
  ASSERT_TRUE(scorer.Score(jobs, &samples, 1, 5, ledger_.get(), &out).ok());
  EXPECT_EQ(out.rewards, (std::vector<float>{0.0f, 0.5f, -1.0f}));
  EXPECT_EQ(out.correct, 1);  // "77" is right, though shaped down to 0.5
  EXPECT_EQ(out.overlong, 2);
  EXPECT_DOUBLE_EQ(out.reward_sum, -0.5);
  EXPECT_FLOAT_EQ(out.kept[1].reward(), 0.5f);
}

// rollout.budget: groups of different sizes in one call (jobs' n), and a reward PeekReward kept
// is used instead of a second call.
TEST_F(StepScorerTest, GroupsOfDifferentSizesAndPeekedRewards) {
  AlgorithmSection algo;
  int calls = 0;
  class Counting final : public RewardFn {
   public:
    explicit Counting(int* calls) : calls_(calls) {}
    StatusOr<double> Score(const RewardInput& in) override {
      ++*calls_;
      return exact_.Score(in);
    }

   private:
    int* calls_;
    ExactMatchReward exact_;
  } reward(&calls);
  StepScorer scorer(algo, 3, tokenizer_.get(), &reward);
  std::vector<GroupJob> jobs = {Group(1, "7"), Group(2, "4")};
  jobs[0].group.set_n(2);  // samples 10, 11
  jobs[1].group.set_n(3);  // samples 20, 21, 22
  std::vector<v1::Sample> samples = {Sample(10, 1, "7", 5), Sample(11, 1, "8", 5),
                                     Sample(20, 2, "4", 5), Sample(21, 2, "4", 5),
                                     Sample(22, 2, "5", 5)};
  auto peeked = scorer.PeekReward(jobs[1].problem, samples[4]);
  ASSERT_TRUE(peeked.ok());
  EXPECT_EQ(*peeked, 0.0);
  EXPECT_EQ(calls, 1);
  StepScores out;
  ASSERT_TRUE(scorer.Score(jobs, &samples, 1, 5, ledger_.get(), &out).ok());
  EXPECT_EQ(calls, 5);  // 5 samples, one reward each
  EXPECT_EQ(out.group_sizes, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(out.rewards, (std::vector<float>{1, 0, 1, 1, 0}));
  // Fewer samples than the groups claim is an error, not a read past the end.
  std::vector<v1::Sample> short_samples = {Sample(10, 1, "7", 5)};
  StepScores out2;
  EXPECT_FALSE(scorer.Score(jobs, &short_samples, 1, 5, ledger_.get(), &out2).ok());
}

}  // namespace
}  // namespace gyre::controller
