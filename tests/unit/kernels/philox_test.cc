#include "kernels/philox.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>

namespace gyre::kernels {
namespace {

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123's known-answer vectors for philox4x32_10 (kat_vectors).
constexpr Kat kKats[] = {
    {{0u, 0u, 0u, 0u}, {0u, 0u}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(PhiloxTest, MatchesRandom123KnownAnswers) {
  for (const Kat& kat : kKats) {
    uint32_t out[4];
    Philox4x32_10(kat.ctr, kat.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], kat.expected[i]) << "word " << i;
  }
}

TEST(PhiloxTest, OutputMayAliasCounter) {
  uint32_t buf[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  Philox4x32_10(buf, kKats[2].key, buf);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(buf[i], kKats[2].expected[i]);
}

TEST(PhiloxTest, UniformUsesTop24BitsOfFirstWord) {
  // seed 0, position 0, lane 0 is the all-zero counter and key of the first known answer.
  EXPECT_EQ(PhiloxUniform(0, 0), static_cast<float>(0x6627e8d5u >> 8) / 16777216.0f);
  // Seed words map to key {lo, hi} and position words to counter {lo, hi}.
  const uint64_t seed = (uint64_t{0x299f31d0u} << 32) | 0xa4093822u;
  const uint64_t position = (uint64_t{0x85a308d3u} << 32) | 0x243f6a88u;
  uint32_t out[4];
  const uint32_t ctr[4] = {0x243f6a88u, 0x85a308d3u, 7u, 0u};
  Philox4x32_10(ctr, kKats[2].key, out);
  EXPECT_EQ(PhiloxUniform(seed, position, 7), static_cast<float>(out[0] >> 8) / 16777216.0f);
}

TEST(PhiloxTest, UniformIsPureAndDependsOnEveryInput) {
  EXPECT_EQ(PhiloxUniform(42, 1000), PhiloxUniform(42, 1000));
  EXPECT_NE(PhiloxUniform(42, 1000), PhiloxUniform(43, 1000));
  EXPECT_NE(PhiloxUniform(42, 1000), PhiloxUniform(42, 1001));
  EXPECT_NE(PhiloxUniform(42, 1000), PhiloxUniform(42, 1000, 1));
  // High words are not dropped.
  EXPECT_NE(PhiloxUniform(42, 5), PhiloxUniform(42, 5 + (uint64_t{1} << 32)));
  EXPECT_NE(PhiloxUniform(42, 5), PhiloxUniform(42 + (uint64_t{1} << 32), 5));
}

TEST(PhiloxTest, UniformIsInUnitIntervalAndRoughlyUniform) {
  constexpr int kDraws = 100000;
  constexpr int kBins = 10;
  int bins[kBins] = {};
  double sum = 0.0;
  std::set<float> distinct;
  for (int i = 0; i < kDraws; ++i) {
    const float u = PhiloxUniform(7, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ++bins[static_cast<int>(u * kBins)];
    distinct.insert(u);
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005);
  for (int b = 0; b < kBins; ++b) EXPECT_NEAR(bins[b], kDraws / kBins, 500) << "bin " << b;
  EXPECT_GT(distinct.size(), kDraws * 99 / 100);
}

}  // namespace
}  // namespace gyre::kernels
