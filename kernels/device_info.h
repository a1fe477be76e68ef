// Device queries that compile with or without CUDA, for code that must not include CUDA headers.
#pragma once

namespace gyre::kernels {

// Number of usable CUDA devices: 0 when Gyre was built without CUDA, when the host has no GPU or
// driver, or when the CUDA runtime cannot be queried.
int CudaDeviceCount();

}  // namespace gyre::kernels
