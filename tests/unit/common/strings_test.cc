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

TEST(StringsTest, HostAndPort) {
  std::string host;
  int port = -1;
  EXPECT_TRUE(ParseHostPort("127.0.0.1:9400", &host, &port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 9400);
  EXPECT_TRUE(ParseHostPort("[::1]:0", &host, &port));  // the last colon splits
  EXPECT_EQ(host, "[::1]");
  EXPECT_EQ(port, 0);
  EXPECT_TRUE(ParseHostPort("node-3:65535", &host, &port));
  host = "unchanged";
  for (const char* bad : {"9400", ":9400", "host:", "host:65536", "host:94a0", "host:123456",
                          "host:-1", "host: 80"}) {
    EXPECT_FALSE(ParseHostPort(bad, &host, &port)) << bad;
  }
  EXPECT_EQ(host, "unchanged");  // nothing is written for a bad address
}

}  // namespace
}  // namespace gyre
