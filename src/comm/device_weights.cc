#include "comm/device_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "kernels/crc32.cuh"
#include "kernels/crc32_parallel.h"

namespace gyre::comm {
namespace {

std::string DeviceCudaError(cudaError_t e) { return cudaGetErrorString(e); }

// Polls `event` until it completed or `deadline` passed.
Status WaitEvent(cudaEvent_t event, Deadline deadline, const std::string& what) {
  for (int i = 0;; ++i) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return Unavailable(what + ": " + DeviceCudaError(e));
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded(what + " did not finish within its deadline");
    }
    if (i < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

// An event recorded on the legacy default stream, which waits for every blocking stream of the
// device (torch's current stream by default) and orders later work after it.
Status WaitDefaultStream(Deadline deadline, const std::string& what) {
  cudaEvent_t event = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(event, nullptr);
  if (e != cudaSuccess) {
    if (event != nullptr) cudaEventDestroy(event);
    return Unavailable(what + ": " + DeviceCudaError(e));
  }
  Status s = WaitEvent(event, deadline, what);
  cudaEventDestroy(event);
  return s;
}

}  // namespace

bool DeviceWeightsCompiled() { return true; }

StatusOr<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(uint64_t bytes, int device) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    return FailedPrecondition("cuda device " + std::to_string(device) + ": " + DeviceCudaError(e));
  }
  void* ptr = nullptr;
  e = cudaMalloc(&ptr, std::max<uint64_t>(bytes, 1));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Unavailable("cannot allocate " + std::to_string(bytes) + " bytes on cuda device " +
                       std::to_string(device) + " for the weight buffer: " + DeviceCudaError(e));
  }
  return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(ptr, bytes, device));
}

DeviceBuffer::~DeviceBuffer() {
  cudaSetDevice(device_);
  cudaFree(ptr_);
}

Status EnsureDeviceBuffer(uint64_t bytes, int device, std::unique_ptr<DeviceBuffer>* buffer,
                          bool* reallocated) {
  if (reallocated != nullptr) *reallocated = false;
  if (*buffer && (*buffer)->size() >= bytes && (*buffer)->device() == device) {
    return Status::Ok();
  }
  buffer->reset();  // free first: the old and new buffers need not fit together
  GYRE_ASSIGN_OR_RETURN(*buffer, DeviceBuffer::Allocate(bytes, device));
  if (reallocated != nullptr) *reallocated = true;
  return Status::Ok();
}

Status SynchronizeDevice(int device, Deadline deadline) {
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return Unavailable("cudaSetDevice: " + DeviceCudaError(e));
  return WaitDefaultStream(deadline, "device synchronisation");
}

namespace {

Status Copy(void* dst, const void* src, uint64_t bytes, int device, cudaMemcpyKind kind,
            Deadline deadline) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return Unavailable("device copy: " + DeviceCudaError(e));
  return WaitDefaultStream(deadline, "device copy");
}

}  // namespace

Status CopyHostToDevice(void* dst, const void* src, uint64_t bytes, int device, Deadline deadline) {
  return Copy(dst, src, bytes, device, cudaMemcpyHostToDevice, deadline);
}

Status CopyDeviceToDevice(void* dst, const void* src, uint64_t bytes, int device,
                          Deadline deadline) {
  return Copy(dst, src, bytes, device, cudaMemcpyDeviceToDevice, deadline);
}

StatusOr<std::vector<uint32_t>> DeviceBucketCrc32(const void* data, uint64_t total,
                                                  int64_t bucket_bytes, int device,
                                                  Deadline deadline) {
  if (bucket_bytes <= 0) return InvalidArgument("bucket_bytes must be positive");
  const uint64_t bucket = static_cast<uint64_t>(bucket_bytes);
  const uint64_t buckets = std::max<uint64_t>(1, (total + bucket - 1) / bucket);
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return Unavailable("cudaSetDevice: " + DeviceCudaError(e));
  uint32_t* raw = nullptr;
  e = cudaMalloc(reinterpret_cast<void**>(&raw), buckets * sizeof(uint32_t));
  if (e != cudaSuccess) return Unavailable("checksum scratch: " + DeviceCudaError(e));
  std::vector<uint32_t> out(buckets);
  // On the legacy default stream: ordered after the copies that filled `data` on any blocking
  // stream of this process.
  e = kernels::LaunchBucketCrc32Raw(data, total, bucket, raw, buckets, nullptr);
  Status s = e == cudaSuccess ? WaitDefaultStream(deadline, "bucket checksums")
                              : Unavailable("bucket checksum kernel: " + DeviceCudaError(e));
  if (s.ok()) {
    e = cudaMemcpy(out.data(), raw, buckets * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) s = Unavailable("bucket checksums: " + DeviceCudaError(e));
  }
  cudaFree(raw);
  GYRE_RETURN_IF_ERROR(s);
  for (uint64_t b = 0; b < buckets; ++b) {
    const uint64_t n = std::min(bucket, total - std::min(total, b * bucket));
    out[b] = kernels::crc32::Finish(out[b], n);
  }
  return out;
}

}  // namespace gyre::comm
