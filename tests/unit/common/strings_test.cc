#include "common/strings.h"

#include <gtest/gtest.h>

namespace gyre {
namespace {

TEST(StringsTest, EditDistanceCountsSingleEdits) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("steps", "steps"), 0);
  EXPECT_EQ(EditDistance("tmperature", "temperature"), 1);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
}

TEST(StringsTest, NearestWordSuggestsOnlyCloseMatches) {
  std::vector<std::string> keys = {"temperature", "top_k", "top_p", "min_p"};
  EXPECT_EQ(NearestWord("tempreature", keys), "temperature");
  EXPECT_EQ(NearestWord("top_q", keys), "top_k");  // first of equal distance
  EXPECT_EQ(NearestWord("learning_rate", keys), "");
}

TEST(StringsTest, SplitTrimAndBytes) {
  EXPECT_EQ(SplitString("a.b.c", '.'), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(SplitString("", '.'), (std::vector<std::string>{""}));
  EXPECT_EQ(TrimString("  42 \r\n"), "42");
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
}

}  // namespace
}  // namespace gyre
