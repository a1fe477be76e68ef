// Device discovery. This file launches no kernels, so there is no parallel decomposition or launch
// configuration to describe: it only wraps cudaGetDeviceCount so that "no GPU here" is an answer
// (0 devices) rather than an error.
#include "kernels/device.cuh"

namespace gyre::kernels {

cudaError_t GyreCudaDeviceCount(int* count) {
  *count = 0;
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  switch (err) {
    case cudaSuccess:
      *count = devices;
      return cudaSuccess;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    // The toolkit's stub libcuda answers this when no real driver is installed.
    case cudaErrorStubLibrary:
      cudaGetLastError();
      return cudaSuccess;
    default:
      cudaGetLastError();
      return err;
  }
}

}  // namespace gyre::kernels
