// The CUDA transports in a build without CUDA: each entry point says so.
#include "comm/cuda_ipc.h"
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

}  // namespace gyre::comm
