#include "kernels/device_info.h"

#include <gtest/gtest.h>

namespace gyre::kernels {
namespace {

// The CPU path must be choosable on any host: no GPU, no driver, or a CPU-only build all read as
// zero devices rather than an error or a crash.
TEST(DeviceInfoTest, CountIsNonNegativeAndStable) {
  const int count = CudaDeviceCount();
  EXPECT_GE(count, 0);
  EXPECT_EQ(CudaDeviceCount(), count);
#if !(defined(GYRE_WITH_CUDA) && GYRE_WITH_CUDA)
  EXPECT_EQ(count, 0);
#endif
}

}  // namespace
}  // namespace gyre::kernels
