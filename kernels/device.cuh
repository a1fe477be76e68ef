// CUDA device discovery that tolerates hosts without a GPU or driver.
//
// Compiled only when Gyre is built with CUDA. Code that must also build without CUDA calls
// gyre::kernels::CudaDeviceCount() from kernels/device_info.h instead.
#pragma once

#include <cuda_runtime_api.h>

namespace gyre::kernels {

// Writes the number of visible CUDA devices to *count. A host with no device, no driver, or a
// driver older than the runtime is not an error: *count is 0 and cudaSuccess is returned, after
// cudaGetLastError() has been called to clear the runtime's last-error slot. (Without a usable
// driver the runtime cannot initialise and keeps reporting that from every later call, so callers
// that see 0 devices must not touch CUDA at all.) Any other failure sets *count to 0 and returns
// the error.
cudaError_t GyreCudaDeviceCount(int* count);

}  // namespace gyre::kernels
