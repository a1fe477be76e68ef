#include "text/tokenizer.h"

#include <gtest/gtest.h>

namespace gyre::text {
namespace {

TEST(CharTokenizerTest, RoundTripsPrintableAscii) {
  CharTokenizer tok;
  std::string text;
  for (char c = ' '; c <= '~'; ++c) text.push_back(c);
  auto ids = tok.Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->size(), text.size());
  EXPECT_EQ(tok.Decode(*ids), text);
  EXPECT_EQ(tok.vocab_size(), 98);
}

TEST(CharTokenizerTest, SpecialsDecodeToNothingAndBadBytesAreErrors) {
  CharTokenizer tok;
  auto ids = tok.Encode("12+3=");
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> with_specials = {tok.bos_id()};
  with_specials.insert(with_specials.end(), ids->begin(), ids->end());
  with_specials.push_back(tok.eos_id());
  EXPECT_EQ(tok.Decode(with_specials), "12+3=");
  auto bad = tok.Encode("caf\xc3\xa9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("0xc3 at byte 3"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace gyre::text
