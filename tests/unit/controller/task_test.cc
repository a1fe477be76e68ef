#include "controller/task.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "common/file_util.h"

namespace gyre::controller {
namespace {

TEST(AdditionTaskTest, ProblemsAreCorrectReproducibleAndHeldOut) {
  DataSection d;
  d.min_digits = 1;
  d.max_digits = 3;
  d.eval_size = 50;
  auto a = ProblemSource::Create(d, 7);
  auto b = ProblemSource::Create(d, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  std::set<std::string> eval;
  for (const auto& p : a->eval_set()) eval.insert(p.prompt);
  for (int i = 0; i < 500; ++i) {
    Problem p = a->Next();
    EXPECT_EQ(p.prompt, b->Next().prompt);
    EXPECT_EQ(eval.count(p.prompt), 0u) << "held-out problem in training: " << p.prompt;
    const auto plus = p.prompt.find('+');
    ASSERT_NE(plus, std::string::npos);
    const long x = std::stol(p.prompt.substr(0, plus));
    const long y = std::stol(p.prompt.substr(plus + 1, p.prompt.size() - plus - 2));
    EXPECT_EQ(p.prompt.back(), '=');
    EXPECT_EQ(p.answer, std::to_string(x + y));
    EXPECT_LT(x, 1000);
    EXPECT_LT(y, 1000);
  }
}

// data.task: copy. "c<digits>=" -> the digits; lengths lognormal with median min_digits
// (sigma 0.75), within [min_digits, max_digits]: mostly short, with a long tail.
TEST(CopyTaskTest, AnswersRepeatThePromptWithLongTailLengths) {
  DataSection d;
  d.task = "copy";
  d.min_digits = 3;
  d.max_digits = 18;
  d.eval_size = 20;
  auto a = ProblemSource::Create(d, 11);
  auto b = ProblemSource::Create(d, 11);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<size_t> lengths;
  for (int i = 0; i < 4000; ++i) {
    Problem p = a->Next();
    EXPECT_EQ(p.prompt, b->Next().prompt);
    ASSERT_GE(p.prompt.size(), 3u);
    EXPECT_EQ(p.prompt.front(), 'c');
    EXPECT_EQ(p.prompt.back(), '=');
    EXPECT_EQ(p.answer, p.prompt.substr(1, p.prompt.size() - 2));
    EXPECT_EQ(p.answer.find_first_not_of("0123456789"), std::string::npos) << p.answer;
    ASSERT_GE(p.answer.size(), 3u);
    ASSERT_LE(p.answer.size(), 18u);
    lengths.push_back(p.answer.size());
  }
  std::sort(lengths.begin(), lengths.end());
  EXPECT_EQ(lengths[lengths.size() / 2], 3u);  // the median (half the draws clamp up to 3)
  // P(L >= 10) = P(z >= ln(9.5 / 3) / 0.75) = P(z >= 1.54), about 6%: a tail well past the median.
  const auto tail = std::count_if(lengths.begin(), lengths.end(), [](size_t l) { return l >= 10; });
  EXPECT_GT(tail, 4000 * 0.03);
  EXPECT_LT(tail, 4000 * 0.10);
}

TEST(ExactMatchRewardTest, OnlyAFinishedExactAnswerScores) {
  ExactMatchReward r;
  EXPECT_EQ(*r.Score({"2+2=", "4", "4", true}), 1.0);
  EXPECT_EQ(*r.Score({"2+2=", "4", "4", false}), 0.0);  // cut off at max tokens
  EXPECT_EQ(*r.Score({"2+2=", "41", "4", true}), 0.0);
  EXPECT_EQ(*r.Score({"2+2=", " 4 ", "4", true}), 1.0);
}

// data.task: word_problems: every answer is the operation its template names, on the numbers in
// the prompt; differences are never negative, multipliers are 2-9; all six templates occur.
TEST(WordProblemsTaskTest, AnswersAreTheArithmeticTheWordsDescribe) {
  DataSection d;
  d.task = "word_problems";
  d.min_digits = 1;
  d.max_digits = 2;
  d.eval_size = 30;
  auto a = ProblemSource::Create(d, 5);
  auto b = ProblemSource::Create(d, 5);
  ASSERT_TRUE(a.ok() && b.ok());
  std::set<std::string> eval, shapes;
  for (const auto& p : a->eval_set()) eval.insert(p.prompt);
  for (int i = 0; i < 600; ++i) {
    Problem p = a->Next();
    EXPECT_EQ(p.prompt, b->Next().prompt);
    EXPECT_EQ(eval.count(p.prompt), 0u);
    std::vector<long> nums;
    std::string shape;
    for (size_t k = 0; k < p.prompt.size();) {
      if (std::isdigit(static_cast<unsigned char>(p.prompt[k]))) {
        size_t e = k;
        while (e < p.prompt.size() && std::isdigit(static_cast<unsigned char>(p.prompt[e]))) ++e;
        nums.push_back(std::stol(p.prompt.substr(k, e - k)));
        shape += '#';
        k = e;
      } else {
        shape += p.prompt[k++];
      }
    }
    ASSERT_EQ(nums.size(), 2u) << p.prompt;
    const long x = nums[0], y = nums[1], ans = std::stol(p.answer);
    EXPECT_LT(x, 100);
    EXPECT_LT(y, 100);
    if (p.prompt.find("more") != std::string::npos ||
        p.prompt.find("in all") != std::string::npos) {
      EXPECT_EQ(ans, x + y) << p.prompt;
    } else if (p.prompt.find("left") != std::string::npos ||
               p.prompt.find("took") != std::string::npos) {
      EXPECT_EQ(ans, x - y) << p.prompt;
      EXPECT_GE(ans, 0) << p.prompt;
    } else {
      // "holds a ... in b boxes" and "packs b bags with a each": b is the multiplier.
      const long mult = p.prompt.find("box holds") != std::string::npos ? y : x;
      EXPECT_GE(mult, 2) << p.prompt;
      EXPECT_LE(mult, 9) << p.prompt;
      EXPECT_EQ(ans, x * y) << p.prompt;
    }
    // Names, pronouns and things vary; the template is what is left with them masked out.
    auto mask = [&](const char* w, const char* with) {
      for (size_t at; (at = shape.find(w)) != std::string::npos;)
        shape.replace(at, std::strlen(w), with);
    };
    for (const char* w : {"apples", "marbles", "stickers", "books", "pencils", "shells"})
      mask(w, "X");
    for (const char* w : {"Mia", "Noah", "Ava", "Liam", "Zoe", "Omar"}) mask(w, "N");
    for (const char* w : {". She ", ". He "}) mask(w, ". P ");
    shapes.insert(shape);
  }
  EXPECT_EQ(shapes.size(), 6u);
  // The longest prompts: one per template, operands at their largest.
  const auto longest = a->LongestPrompts();
  ASSERT_EQ(longest.size(), 6u);
  for (const auto& p : longest) EXPECT_NE(p.prompt.find("99"), std::string::npos) << p.prompt;
}

// reward.type: math. The final answer is the last \boxed{} or else the last number; numbers
// compare by value.
TEST(MathRewardTest, TheFinalNumberDecides) {
  MathReward r;
  auto score = [&](const std::string& response, const std::string& answer, bool finished = true) {
    auto s = r.Score({"q", response, answer, finished});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : -1.0;
  };
  EXPECT_EQ(score("48 + 27 = 75", "75"), 1.0);
  EXPECT_EQ(score("48 + 27 = 74", "75"), 0.0);
  EXPECT_EQ(score("The answer is 75.", "75"), 1.0);
  EXPECT_EQ(score("75 apples, then 3 more: 78", "75"), 0.0);  // the last number counts
  EXPECT_EQ(score("So $\\boxed{1,234}$ in total, not 7", "1234"), 1.0);
  EXPECT_EQ(score("It is 3.50", "3.5"), 1.0);
  EXPECT_EQ(score("It drops to -12", "-12"), 1.0);
  EXPECT_EQ(score("Step 2-1 gives 1", "1"), 1.0);  // "2-1": a minus between digits is not a sign
  EXPECT_EQ(score("no number here", "5"), 0.0);
  EXPECT_EQ(score("75", "75", false), 0.0);  // cut off at max_new_tokens
  EXPECT_EQ(r.Score({"q", "75", "seventy-five", true}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NormaliseNumber("007"), "7");
  EXPECT_EQ(NormaliseNumber("1,000.00"), "1000");
  EXPECT_EQ(NormaliseNumber("-0"), "0");
  EXPECT_EQ(NormaliseNumber("0.25"), "0.25");
  EXPECT_EQ(NormaliseNumber("1.2.3"), "");
  EXPECT_EQ(FinalNumber("a 1 b 22 c"), "22");
}

TEST(JsonlTest, LoadsRecordsAndNamesTheBadLine) {
  const std::string dir = TempDirectory() + "/gyre_task_test_" + std::to_string(::getpid());
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string good = dir + "/good.jsonl";
  std::ofstream(good) << "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n\n{\"prompt\": \"hi\"}\n"
                      << "{\"prompt\": [{\"role\": \"user\", \"content\": \"2+2=\"}], "
                         "\"answer\": \"4\"}\n";
  auto ok = LoadJsonl(good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 3u);
  EXPECT_EQ((*ok)[1].answer, "");
  EXPECT_FALSE((*ok)[0].is_messages);
  EXPECT_TRUE((*ok)[2].is_messages);  // a chat conversation, rendered by data.chat_template

  const std::string bad_chat = dir + "/bad_chat.jsonl";
  std::ofstream(bad_chat) << "{\"prompt\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n";
  auto c = LoadJsonl(bad_chat);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(bad_chat + ":1: prompt: "), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("robot"), std::string::npos) << c.status();

  const std::string bad = dir + "/bad.jsonl";
  std::ofstream(bad) << "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"answer\": \"3\"}\n";
  auto e = LoadJsonl(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().message(),
            bad + ":2: missing string field \"prompt\" (or a list of chat messages)");
  std::ofstream(bad) << "{\"prompt\": 5}\n";
  std::ofstream(bad, std::ios::trunc) << "not json\n";
  e = LoadJsonl(bad);
  EXPECT_NE(e.status().message().find(bad + ":1: not valid JSON"), std::string::npos);
  EXPECT_EQ(LoadJsonl(dir + "/missing.jsonl").status().code(), StatusCode::kNotFound);
  (void)RemoveTree(dir);
}

}  // namespace
}  // namespace gyre::controller
