// The chunked CRC-32 that the GPU computes, on the CPU: its algebra must reproduce the plain
// CRC-32 (gyre::Crc32, itself checked against zlib) for every length and chunk size, or GPU
// receipts would never match host ones.
#include "kernels/reference/crc32_ref.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/crc32.h"
#include "kernels/crc32_parallel.h"

namespace gyre::kernels {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Crc32RefTest, KnownValues) {
  const std::string s = "123456789";
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  EXPECT_EQ(Crc32ChunkedRef(p, s.size(), 1), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(Crc32ChunkedRef(p, s.size(), 4), 0xCBF43926u);
  EXPECT_EQ(Crc32ChunkedRef(p, 0, 4), 0u);
}

TEST(Crc32RefTest, PolynomialArithmetic) {
  using namespace crc32;
  EXPECT_EQ(MulMod(kOne, 0x12345678u), 0x12345678u);
  EXPECT_EQ(MulMod(0x12345678u, kOne), 0x12345678u);
  EXPECT_EQ(MulMod(0, 0xFFFFFFFFu), 0u);
  EXPECT_EQ(XPow8N(0), kOne);
  EXPECT_EQ(XPow8N(1), kXPow8);
  // x^(8(a+b)) = x^(8a) x^(8b), and multiplication commutes.
  for (uint64_t a : {1ull, 7ull, 4096ull, 123457ull, (1ull << 33) + 5}) {
    for (uint64_t b : {0ull, 3ull, 65536ull, 999983ull}) {
      EXPECT_EQ(XPow8N(a + b), MulMod(XPow8N(a), XPow8N(b))) << a << " " << b;
      EXPECT_EQ(MulMod(XPow8N(a), XPow8N(b)), MulMod(XPow8N(b), XPow8N(a)));
    }
  }
  // Shifting a raw register by n bytes equals feeding n zero bytes.
  const std::vector<uint8_t> zeros(1000, 0);
  const auto data = RandomBytes(77, 5);
  uint32_t reg = Crc32RawRef(data.data(), data.size());
  std::vector<uint8_t> padded = data;
  padded.insert(padded.end(), zeros.begin(), zeros.end());
  EXPECT_EQ(ShiftRaw(reg, zeros.size()), Crc32RawRef(padded.data(), padded.size()));
}

TEST(Crc32RefTest, ChunkedEqualsPlainCrc32ForAnyLengthAndChunk) {
  const auto data = RandomBytes(70000, 11);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t chunk = std::vector<uint64_t>{1, 3, 16, 100, 4096, 65536}[trial % 6];
    // Tiny chunks cost a power of x per byte: keep their inputs short.
    const size_t n = trial < 20 ? trial : rng() % (chunk < 16 ? 3000 : data.size());
    EXPECT_EQ(Crc32ChunkedRef(data.data(), n, chunk), Crc32(data.data(), n))
        << "n=" << n << " chunk=" << chunk;
  }
}

TEST(Crc32RefTest, BucketsMatchThePerBucketCrc32OfTheWeightPlane) {
  const auto data = RandomBytes(3 * 10000 + 123, 17);
  const auto crcs = BucketCrc32Ref(data.data(), data.size(), 10000);
  ASSERT_EQ(crcs.size(), 4u);
  for (size_t b = 0; b < crcs.size(); ++b) {
    const size_t off = b * 10000, n = std::min<size_t>(10000, data.size() - off);
    EXPECT_EQ(crcs[b], Crc32(data.data() + off, n)) << "bucket " << b;
  }
  EXPECT_EQ(BucketCrc32Ref(data.data(), 0, 64), std::vector<uint32_t>{0u});
  EXPECT_TRUE(BucketCrc32Ref(data.data(), data.size(), 0).empty());
  // A flipped byte changes exactly its own bucket's checksum.
  auto flipped = data;
  flipped[15000] ^= 0x01;
  const auto after = BucketCrc32Ref(flipped.data(), flipped.size(), 10000);
  EXPECT_EQ(after[0], crcs[0]);
  EXPECT_NE(after[1], crcs[1]);
  EXPECT_EQ(after[2], crcs[2]);
}

}  // namespace
}  // namespace gyre::kernels
