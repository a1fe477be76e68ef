#include <algorithm>
#include <cstdint>

#include "kernels/crc32.cuh"
#include "kernels/crc32_parallel.h"
#include "kernels/reference/crc32_ref.h"

namespace gyre::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t Min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

__global__ void BucketCrc32RawKernel(const uint8_t* __restrict__ data, uint64_t total,
                                     uint64_t bucket_bytes, uint64_t chunks_per_bucket,
                                     uint64_t num_chunks, uint32_t* __restrict__ raw_out) {
  __shared__ uint32_t table[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) table[i] = crc32::TableEntry(i);
  __syncthreads();
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < num_chunks;
       g += stride) {
    const uint64_t bucket = g / chunks_per_bucket;
    const uint64_t chunk = g % chunks_per_bucket;
    const uint64_t bucket_start = bucket * bucket_bytes;
    const uint64_t bucket_end = Min64(total, bucket_start + bucket_bytes);
    const uint64_t start = bucket_start + chunk * kCrc32ChunkBytes;
    if (start >= bucket_end) continue;
    const uint64_t end = Min64(bucket_end, start + kCrc32ChunkBytes);
    uint32_t reg = 0;
    uint64_t i = start;
    // Whole aligned 16-byte words when the chunk allows it (cudaMalloc'd payloads and the usual
    // bucket sizes), bytes otherwise.
    while (i < end && ((reinterpret_cast<uintptr_t>(data) + i) & 15u) != 0) {
      reg = table[(reg ^ data[i++]) & 0xFFu] ^ (reg >> 8);
    }
    for (; i + 16 <= end; i += 16) {
      const uint4 w = *reinterpret_cast<const uint4*>(data + i);
      const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t v = words[k];  // little-endian: the lowest byte comes first in memory
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          reg = table[(reg ^ v) & 0xFFu] ^ (reg >> 8);
          v >>= 8;
        }
      }
    }
    while (i < end) reg = table[(reg ^ data[i++]) & 0xFFu] ^ (reg >> 8);
    const uint32_t contribution = crc32::ShiftRaw(reg, bucket_end - end);
    if (contribution != 0) atomicXor(raw_out + bucket, contribution);
  }
}

}  // namespace

cudaError_t LaunchBucketCrc32Raw(const void* data, uint64_t total, uint64_t bucket_bytes,
                                 uint32_t* raw_out, uint64_t num_buckets, cudaStream_t stream) {
  if (bucket_bytes == 0 || raw_out == nullptr || (data == nullptr && total > 0)) {
    return cudaErrorInvalidValue;
  }
  const uint64_t expected = std::max<uint64_t>(1, (total + bucket_bytes - 1) / bucket_bytes);
  if (num_buckets != expected) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(raw_out, 0, num_buckets * sizeof(uint32_t), stream);
  if (e != cudaSuccess || total == 0) return e;
  // Chunks cover the data, not a bucket size far larger than the payload.
  const uint64_t span = std::min(bucket_bytes, total);
  const uint64_t chunks_per_bucket = (span + kCrc32ChunkBytes - 1) / kCrc32ChunkBytes;
  const uint64_t num_chunks = chunks_per_bucket * num_buckets;
  const uint64_t blocks = std::min<uint64_t>((num_chunks + kThreads - 1) / kThreads, 1u << 16);
  BucketCrc32RawKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(data), total, bucket_bytes, chunks_per_bucket, num_chunks,
      raw_out);
  return cudaGetLastError();
}

}  // namespace gyre::kernels
