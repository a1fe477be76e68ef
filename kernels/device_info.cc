#include "kernels/device_info.h"

#if defined(GYRE_WITH_CUDA) && GYRE_WITH_CUDA
#include "kernels/device.cuh"
#endif

namespace gyre::kernels {

int CudaDeviceCount() {
#if defined(GYRE_WITH_CUDA) && GYRE_WITH_CUDA
  int count = 0;
  // Any error other than "no device" is still reported as 0 usable devices: callers use this to
  // choose a code path, and the CPU path is always available.
  if (GyreCudaDeviceCount(&count) != cudaSuccess) return 0;
  return count;
#else
  return 0;
#endif
}

bool CudaDeviceMemory(int device, int64_t* free_bytes, int64_t* total_bytes) {
#if defined(GYRE_WITH_CUDA) && GYRE_WITH_CUDA
  if (device < 0 || device >= CudaDeviceCount()) return false;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return false;
  size_t free = 0, total = 0;
  const bool ok =
      cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess;
  cudaSetDevice(previous);
  if (!ok) {
    cudaGetLastError();
    return false;
  }
  *free_bytes = static_cast<int64_t>(free);
  *total_bytes = static_cast<int64_t>(total);
  return true;
#else
  (void)device;
  (void)free_bytes;
  (void)total_bytes;
  return false;
#endif
}

}  // namespace gyre::kernels
