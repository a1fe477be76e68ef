#include "comm/cuda_ipc.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace gyre::comm {
namespace {

std::string IpcCudaError(cudaError_t e) { return cudaGetErrorString(e); }

}  // namespace

bool CudaIpcCompiled() { return true; }

StatusOr<std::string> ExportCudaIpcHandle(const void* device_ptr) {
  cudaIpcMemHandle_t handle;
  const cudaError_t e = cudaIpcGetMemHandle(&handle, const_cast<void*>(device_ptr));
  if (e != cudaSuccess) return Unavailable("cudaIpcGetMemHandle: " + IpcCudaError(e));
  return std::string(handle.reserved, sizeof(handle.reserved));
}

StatusOr<std::unique_ptr<CudaIpcMapping>> CudaIpcMapping::Open(const std::string& handle,
                                                               int device) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h.reserved)) {
    return InvalidArgument("cuda ipc handle has " + std::to_string(handle.size()) +
                           " bytes, expected " + std::to_string(sizeof(h.reserved)));
  }
  std::memcpy(h.reserved, handle.data(), sizeof(h.reserved));
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return FailedPrecondition("cudaSetDevice: " + IpcCudaError(e));
  void* ptr = nullptr;
  e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) return Unavailable("cudaIpcOpenMemHandle: " + IpcCudaError(e));
  cudaStream_t stream = nullptr;
  e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cudaIpcCloseMemHandle(ptr);
    return Unavailable("cudaStreamCreate: " + IpcCudaError(e));
  }
  return std::unique_ptr<CudaIpcMapping>(new CudaIpcMapping(ptr, stream, device));
}

CudaIpcMapping::~CudaIpcMapping() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaIpcCloseMemHandle(ptr_);
}

Status CudaIpcMapping::CopyTo(void* dst, size_t offset, size_t bytes, Deadline deadline) {
  auto stream = static_cast<cudaStream_t>(stream_);
  cudaError_t e = cudaSetDevice(device_);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(dst, static_cast<const char*>(ptr_) + offset, bytes,
                        cudaMemcpyDeviceToDevice, stream);
  }
  if (e != cudaSuccess) return Unavailable("cuda ipc copy: " + IpcCudaError(e));
  for (int i = 0;; ++i) {
    e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return Unavailable("cuda ipc copy: " + IpcCudaError(e));
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded("cuda ipc copy of " + std::to_string(bytes) +
                              " bytes did not finish within its deadline");
    }
    if (i < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace gyre::comm
