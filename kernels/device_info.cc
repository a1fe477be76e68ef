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

}  // namespace gyre::kernels
