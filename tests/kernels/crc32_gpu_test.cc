// The GPU bucket CRC-32 against the CPU reference and the plain CRC-32: every bucket size, odd
// lengths and misaligned starts, a 256 MiB payload, and a single flipped bit.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/crc32.h"
#include "gpu_test_util.h"
#include "kernels/crc32.cuh"
#include "kernels/crc32_parallel.h"
#include "kernels/device_info.h"
#include "kernels/reference/crc32_ref.h"

namespace gyre::kernels {
namespace {

using gpu_test::DeviceArray;

std::vector<uint32_t> GpuBucketCrc32(const uint8_t* dev, uint64_t total, uint64_t bucket) {
  const uint64_t buckets = std::max<uint64_t>(1, (total + bucket - 1) / bucket);
  DeviceArray<uint32_t> raw(buckets);
  EXPECT_EQ(LaunchBucketCrc32Raw(dev, total, bucket, raw.get(), buckets, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint32_t> out(buckets);
  EXPECT_EQ(cudaMemcpy(out.data(), raw.get(), buckets * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint64_t b = 0; b < buckets; ++b) {
    const uint64_t n = std::min(bucket, total - std::min(total, b * bucket));
    out[b] = crc32::Finish(out[b], n);
  }
  return out;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t k = 0; k < 8 && i + k < n; ++k) v[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  return v;
}

TEST(Crc32GpuTest, MatchesTheReferenceForManyShapes) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const auto host = RandomBytes((1 << 20) + 77, 1);
  DeviceArray<uint8_t> dev(host);
  for (uint64_t offset : {0ull, 1ull, 5ull, 16ull}) {
    for (uint64_t total : {0ull, 1ull, 15ull, 4096ull, 4097ull, 100000ull, (1ull << 20)}) {
      for (uint64_t bucket : {1ull, 7ull, 4096ull, 65536ull, 1000003ull, 4ull << 20}) {
        if (bucket == 1 && total > 4096) continue;
        const auto gpu = GpuBucketCrc32(dev.get() + offset, total, bucket);
        EXPECT_EQ(gpu, BucketCrc32Ref(host.data() + offset, total, bucket))
            << "offset " << offset << " total " << total << " bucket " << bucket;
      }
    }
  }
}

TEST(Crc32GpuTest, LargePayloadAndOneFlippedBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto host = RandomBytes(256u << 20, 2);
  DeviceArray<uint8_t> dev(host);
  const uint64_t bucket = 16u << 20;
  const auto gpu = GpuBucketCrc32(dev.get(), host.size(), bucket);
  ASSERT_EQ(gpu.size(), 16u);
  for (size_t b = 0; b < gpu.size(); ++b) {
    EXPECT_EQ(gpu[b], Crc32(host.data() + b * bucket, bucket)) << "bucket " << b;
  }
  const uint8_t flipped = host[5 * bucket + 12345] ^ 0x10;
  ASSERT_EQ(cudaMemcpy(dev.get() + 5 * bucket + 12345, &flipped, 1, cudaMemcpyHostToDevice),
            cudaSuccess);
  const auto after = GpuBucketCrc32(dev.get(), host.size(), bucket);
  for (size_t b = 0; b < gpu.size(); ++b) {
    if (b == 5) {
      EXPECT_NE(after[b], gpu[b]);
    } else {
      EXPECT_EQ(after[b], gpu[b]) << "bucket " << b;
    }
  }
}

TEST(Crc32GpuTest, BadArgumentsAreRefused) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  DeviceArray<uint32_t> raw(1);
  EXPECT_EQ(LaunchBucketCrc32Raw(nullptr, 10, 4, raw.get(), 3, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchBucketCrc32Raw(nullptr, 0, 0, raw.get(), 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchBucketCrc32Raw(nullptr, 0, 4, nullptr, 1, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace gyre::kernels
