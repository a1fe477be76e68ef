#include "common/crc32.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

namespace gyre {
namespace {

uint32_t ZlibCrc(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), p, static_cast<uInt>(n)));
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// CRC-32C one bit at a time, straight from the definition: the reference for the library.
uint32_t BitwiseCrc32c(const uint8_t* p, size_t n, uint32_t crc = 0) {
  uint32_t reg = ~crc;
  for (size_t i = 0; i < n; ++i) {
    reg ^= p[i];
    for (int k = 0; k < 8; ++k) reg = (reg & 1) ? (reg >> 1) ^ 0x82F63B78u : reg >> 1;
  }
  return ~reg;
}

TEST(Crc32Test, KnownValues) {
  EXPECT_EQ(Crc32("", 0), 0u);
  EXPECT_EQ(Crc32(nullptr, 0, 0x12345678u), 0x12345678u);  // nothing more leaves a CRC as it is
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);           // the CRC-32 check value
}

// Every length up to a few folding rounds, at every alignment, against zlib (an implementation
// of its own: the library's folding, table and tail code all meet it here).
TEST(Crc32Test, MatchesZlibForEveryLengthAndAlignment) {
  const auto data = RandomBytes(4096 + 16, 7);
  for (size_t align = 0; align < 16; ++align) {
    for (size_t n = 0; n <= 1100; ++n) {
      const uint8_t* p = data.data() + align;
      ASSERT_EQ(Crc32(p, n), ZlibCrc(p, n)) << "n=" << n << " align=" << align;
    }
  }
}

TEST(Crc32Test, LargeBuffersAndContinuationMatchZlib) {
  const auto data = RandomBytes((8 << 20) + 77, 11);
  EXPECT_EQ(Crc32(data.data(), data.size()), ZlibCrc(data.data(), data.size()));
  // A CRC continued over a split equals the CRC of the whole, for splits on either path.
  for (size_t split : {size_t{1}, size_t{255}, size_t{256}, size_t{100000}, data.size() - 3}) {
    const uint32_t first = Crc32(data.data(), split);
    EXPECT_EQ(Crc32(data.data() + split, data.size() - split, first),
              ZlibCrc(data.data(), data.size()))
        << "split " << split;
  }
}

TEST(Crc32Test, OneFlippedBitChangesTheChecksum) {
  auto data = RandomBytes(1 << 20, 3);
  const uint32_t before = Crc32(data.data(), data.size());
  data[123457] ^= 0x10;
  EXPECT_NE(Crc32(data.data(), data.size()), before);
}

// CRC-32C: the published check value and RFC 3720's test vectors (iSCSI, B.4), then the
// library against the bitwise definition for every length and alignment, and continuation.
TEST(Crc32cTest, KnownValuesAndTheBitwiseDefinitionAgree) {
  EXPECT_EQ(Crc32c("", 0), 0u);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(BitwiseCrc32c(reinterpret_cast<const uint8_t*>("123456789"), 9), 0xE3069283u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  std::vector<uint8_t> ascending(32);
  for (size_t i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending.data(), 32), 0x46DD794Eu);
  const auto data = RandomBytes(600, 13);
  for (size_t align = 0; align < 8; ++align) {
    for (size_t n = 0; n <= 520; ++n) {
      const uint8_t* p = data.data() + align;
      ASSERT_EQ(Crc32c(p, n), BitwiseCrc32c(p, n)) << "n=" << n << " align=" << align;
    }
  }
  const uint32_t first = Crc32c(data.data(), 77);
  EXPECT_EQ(Crc32c(data.data() + 77, 400, first), Crc32c(data.data(), 477));
  const auto large = RandomBytes((1 << 20) + 5, 17);
  EXPECT_EQ(Crc32c(large.data(), large.size()), BitwiseCrc32c(large.data(), large.size()));
}

// Not a pass/fail figure (the machine may be loaded): prints the speed against zlib's.
TEST(Crc32Test, ReportsThroughputAgainstZlib) {
  const auto data = RandomBytes(64 << 20, 5);
  auto time = [&](auto fn) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile uint32_t sink = fn();
    (void)sink;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double fast = time([&] { return Crc32(data.data(), data.size()); });
  const double zlib = time([&] { return ZlibCrc(data.data(), data.size()); });
  std::printf("crc32 64 MiB: gyre %.2f GB/s, zlib %.2f GB/s\n", 0.0671 / fast, 0.0671 / zlib);
  EXPECT_EQ(Crc32(data.data(), data.size()), ZlibCrc(data.data(), data.size()));
}

}  // namespace
}  // namespace gyre
