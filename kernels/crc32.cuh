// CUDA CRC-32 of the buckets of a device-resident payload: the GPU side of the weight plane's
// per-bucket checksums (NCCL and CUDA IPC transports), equal bit for bit to gyre::Crc32 and to
// kernels/reference/crc32_ref.h (same chunking, same algebra: kernels/crc32_parallel.h).
//
// Each thread feeds one chunk of kCrc32ChunkBytes through a byte table held in shared memory,
// moves its register past the bytes that follow it in its bucket, and xors the result into the
// bucket's accumulator; the xor makes the result independent of thread scheduling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gyre::kernels {

// raw_out: [num_buckets] uint32 on the device; zeroed here on `stream`, then filled with each
// bucket's raw register (crc32::Finish turns it into the CRC). `data` (device, `total` bytes) is
// cut into buckets of `bucket_bytes` (> 0); num_buckets = max(1, ceil(total / bucket_bytes)).
// Enqueued on `stream`, not synchronised. Returns cudaErrorInvalidValue for bad arguments.
cudaError_t LaunchBucketCrc32Raw(const void* data, uint64_t total, uint64_t bucket_bytes,
                                 uint32_t* raw_out, uint64_t num_buckets, cudaStream_t stream);

}  // namespace gyre::kernels
