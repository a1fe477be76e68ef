#pragma once
// Device memory for the GPU weight transports (NCCL broadcast, CUDA IPC): a flat buffer that
// holds one policy version on a CUDA device, and the per-bucket CRC-32 of such a buffer computed
// on that device (kernels/crc32.cuh), equal to gyre::Crc32 of the same bytes, so receipts from
// GPU and CPU transports are checked the same way.
//
// Built only with CUDA (GYRE_WITH_CUDA); otherwise Allocate and DeviceBucketCrc32 return
// kFailedPrecondition. Thread-safety: a DeviceBuffer is used by one thread at a time.

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "gyre/status.h"

namespace gyre::comm {

bool DeviceWeightsCompiled();

// `bytes` of cudaMalloc'd memory on `device` (its own allocation, so that a CUDA IPC handle to it
// covers exactly this buffer). Freed on destruction.
class DeviceBuffer {
 public:
  static StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(uint64_t bytes, int device);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  uint64_t size() const { return bytes_; }
  int device() const { return device_; }

 private:
  DeviceBuffer(void* ptr, uint64_t bytes, int device) : ptr_(ptr), bytes_(bytes), device_(device) {}
  void* ptr_;
  uint64_t bytes_;
  int device_;
};

// Makes *buffer hold at least `bytes` on `device`, reallocating only when it is missing, too
// small or on another device. Returns true in *reallocated when a new allocation was made (a
// CUDA IPC handle to the old one is then stale).
Status EnsureDeviceBuffer(uint64_t bytes, int device, std::unique_ptr<DeviceBuffer>* buffer,
                          bool* reallocated = nullptr);

// Waits until all work queued on `device` finished (cudaDeviceSynchronize), polling so that
// `deadline` bounds the wait (kDeadlineExceeded after it).
Status SynchronizeDevice(int device, Deadline deadline);

// Copies `bytes` into memory of `device` (from host memory, or from memory of the same device)
// and waits for the copy until `deadline`.
Status CopyHostToDevice(void* dst, const void* src, uint64_t bytes, int device, Deadline deadline);
Status CopyDeviceToDevice(void* dst, const void* src, uint64_t bytes, int device,
                          Deadline deadline);

// The CRC-32 of each bucket of `bucket_bytes` of the `total` bytes at `data` (memory of
// `device`), computed on that device; waits for the result until `deadline`. One entry per
// bucket, at least one.
StatusOr<std::vector<uint32_t>> DeviceBucketCrc32(const void* data, uint64_t total,
                                                  int64_t bucket_bytes, int device,
                                                  Deadline deadline);

}  // namespace gyre::comm
