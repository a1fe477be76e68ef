// Device queries that compile with or without CUDA, for code that must not include CUDA headers.
#pragma once

#include <cstdint>

namespace gyre::kernels {

// Number of usable CUDA devices: 0 when Gyre was built without CUDA, when the host has no GPU or
// driver, or when the CUDA runtime cannot be queried.
int CudaDeviceCount();

// Free and total memory of CUDA device `device` in bytes (cudaMemGetInfo); false when there is
// no such usable device or the build has no CUDA.
bool CudaDeviceMemory(int device, int64_t* free_bytes, int64_t* total_bytes);

}  // namespace gyre::kernels
