// The CUDA transports in a build without CUDA: each entry point says so.
#include "comm/cuda_ipc.h"
#include "comm/device_weights.h"
#include "comm/nccl_communicator.h"

namespace gyre::comm {
namespace {

Status NoCuda(const char* what) {
  return FailedPrecondition(std::string(what) + " needs a build with CUDA (GYRE_WITH_CUDA)");
}

}  // namespace

bool NcclCompiled() { return false; }
StatusOr<std::string> NewNcclUniqueId() { return NoCuda("NCCL"); }
StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const NcclOptions&) {
  return NoCuda("NCCL");
}

bool CudaIpcCompiled() { return false; }
StatusOr<std::string> ExportCudaIpcHandle(const void*) { return NoCuda("CUDA IPC"); }
StatusOr<std::unique_ptr<CudaIpcMapping>> CudaIpcMapping::Open(const std::string&, int) {
  return NoCuda("CUDA IPC");
}
CudaIpcMapping::~CudaIpcMapping() = default;
Status CudaIpcMapping::CopyTo(void*, size_t, size_t, Deadline) { return NoCuda("CUDA IPC"); }

bool DeviceWeightsCompiled() { return false; }
StatusOr<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(uint64_t, int) {
  return NoCuda("a device weight buffer");
}
DeviceBuffer::~DeviceBuffer() = default;
Status EnsureDeviceBuffer(uint64_t, int, std::unique_ptr<DeviceBuffer>*, bool*) {
  return NoCuda("a device weight buffer");
}
Status CopyHostToDevice(void*, const void*, uint64_t, int, Deadline) {
  return NoCuda("a device copy");
}
Status CopyDeviceToDevice(void*, const void*, uint64_t, int, Deadline) {
  return NoCuda("a device copy");
}
Status SynchronizeDevice(int, Deadline) { return NoCuda("device synchronisation"); }
StatusOr<std::vector<uint32_t>> DeviceBucketCrc32(const void*, uint64_t, int64_t, int, Deadline) {
  return NoCuda("device checksums");
}

}  // namespace gyre::comm
