#include "common/strings.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

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

TEST(StringsTest, DecodeUtf8ReadsEachCharacterLength) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a, é, €, 😀
  std::vector<std::pair<char32_t, size_t>> got;
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = DecodeUtf8(s, i);
    ASSERT_EQ(c.status, Utf8Char::kValid) << i;
    got.emplace_back(c.code_point, c.length);
    i += c.length;
  }
  const std::vector<std::pair<char32_t, size_t>> want = {
      {U'a', 1}, {0xE9, 2}, {0x20AC, 3}, {0x1F600, 4}};
  EXPECT_EQ(got, want);
}

// Ill-formed bytes as Unicode's well-formedness table has them, in the units that lossy decoders
// (Python, Rust's from_utf8_lossy) replace with one U+FFFD each.
TEST(StringsTest, DecodeUtf8MarksMaximalSubpartsAndCutCharacters) {
  struct Case {
    std::string bytes;
    Utf8Char::Status status;
    size_t length;
  };
  const Case cases[] = {
      {"\x80", Utf8Char::kInvalid, 1},              // a continuation byte alone
      {"\xC0\xA0", Utf8Char::kInvalid, 1},          // an overlong space
      {"\xE0\x80\x80", Utf8Char::kInvalid, 1},      // overlong: E0 needs A0..BF next
      {"\xED\xA0\x80", Utf8Char::kInvalid, 1},      // a surrogate
      {"\xF4\x90\x80\x80", Utf8Char::kInvalid, 1},  // past U+10FFFF
      {"\xF5\x80\x80\x80", Utf8Char::kInvalid, 1},  // no character starts with F5
      {"\xE2\x82!", Utf8Char::kInvalid, 2},         // a character broken off by '!'
      {"\xF0\x9F\x98!", Utf8Char::kInvalid, 3},
      {"\xC3", Utf8Char::kTruncated, 1},  // the text ends inside a character
      {"\xE2\x82", Utf8Char::kTruncated, 2},
      {"\xF0\x9F\x98", Utf8Char::kTruncated, 3},
  };
  for (const Case& c : cases) {
    const Utf8Char got = DecodeUtf8(c.bytes, 0);
    EXPECT_EQ(got.status, c.status) << testing::PrintToString(c.bytes);
    EXPECT_EQ(got.length, c.length) << testing::PrintToString(c.bytes);
  }
  EXPECT_EQ(DecodeUtf8("ab\xC3", 2).status, Utf8Char::kTruncated);  // from `pos`, to the end
}

TEST(StringsTest, AppendUtf8RoundTripsThroughDecodeUtf8) {
  for (char32_t cp : {0x0, 0x41, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000,
                      0x1F600, 0x10FFFF}) {
    std::string s;
    AppendUtf8(cp, &s);
    const Utf8Char c = DecodeUtf8(s, 0);
    EXPECT_EQ(c.status, Utf8Char::kValid) << cp;
    EXPECT_EQ(c.code_point, cp);
    EXPECT_EQ(c.length, s.size());
  }
  std::string euro;
  AppendUtf8(0x20AC, &euro);
  EXPECT_EQ(euro, "\xE2\x82\xAC");
}

}  // namespace
}  // namespace gyre
