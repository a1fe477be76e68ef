// CPU reference of the chunked CRC-32 that kernels/crc32.cuh computes on the GPU: each chunk's
// raw register independently, then the combination described in kernels/crc32_parallel.h. The
// result equals gyre::Crc32 of the same bytes for every chunk size (tests check that), which is
// what makes the GPU checksums of weight buckets comparable with host ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gyre::kernels {

// The bytes a GPU thread checksums on its own.
constexpr uint64_t kCrc32ChunkBytes = 4096;

// raw(M): the register after feeding `n` bytes into a zero register, no final inversion.
uint32_t Crc32RawRef(const uint8_t* data, uint64_t n);

// CRC-32 of `n` bytes, computed chunk by chunk (`chunk_bytes` > 0) and combined.
uint32_t Crc32ChunkedRef(const uint8_t* data, uint64_t n, uint64_t chunk_bytes = kCrc32ChunkBytes);

// The CRC-32 of each bucket of `bucket_bytes` (> 0) of a `total`-byte payload: one entry per
// bucket, at least one (an empty payload has one empty bucket, CRC 0), as the weight plane cuts it.
std::vector<uint32_t> BucketCrc32Ref(const uint8_t* data, uint64_t total, uint64_t bucket_bytes,
                                     uint64_t chunk_bytes = kCrc32ChunkBytes);

}  // namespace gyre::kernels
