#pragma once
// CUDA IPC for colocated weight updates: a trainer and a rollout worker in different processes
// on the same GPU. The trainer exports a handle to its flat, device-resident weight buffer once
// (64 bytes, passed over the control plane); the rollout worker maps it and copies the new
// version device-to-device, with no host round trip.
//
// Built only with CUDA (GYRE_WITH_CUDA); otherwise every function returns kFailedPrecondition.
// Thread-safety: a CudaIpcMapping is used by one thread at a time.

#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "gyre/status.h"

namespace gyre::comm {

bool CudaIpcCompiled();

// The IPC handle (cudaIpcGetMemHandle) of the allocation that holds `device_ptr`, as raw bytes.
// The allocation must come from cudaMalloc and stay alive while peers use the handle.
StatusOr<std::string> ExportCudaIpcHandle(const void* device_ptr);

// A peer's buffer mapped into this process (cudaIpcOpenMemHandle); unmapped on destruction.
class CudaIpcMapping {
 public:
  // `handle`: bytes from ExportCudaIpcHandle in another process; `device`: this process's
  // CUDA device (the GPU the buffer lives on).
  static StatusOr<std::unique_ptr<CudaIpcMapping>> Open(const std::string& handle, int device);
  ~CudaIpcMapping();
  CudaIpcMapping(const CudaIpcMapping&) = delete;
  CudaIpcMapping& operator=(const CudaIpcMapping&) = delete;

  const void* data() const { return ptr_; }

  // Copies `bytes` bytes starting `offset` bytes into the mapped buffer to `dst` (device memory
  // of this process), then waits for the copy until `deadline` (kDeadlineExceeded after it).
  Status CopyTo(void* dst, size_t offset, size_t bytes, Deadline deadline);

 private:
  CudaIpcMapping(void* ptr, void* stream, int device)
      : ptr_(ptr), stream_(stream), device_(device) {}
  void* ptr_;
  void* stream_;  // cudaStream_t
  int device_;
};

}  // namespace gyre::comm
